"""What the tests of from_torch's lowerings assert, in one place: a case that agrees on the tape, torch and jax,
and a wrong lowering caught by the node-by-node check (the tape and jax unavailable, naming the op, and torch not
blamed); and a functional call as a module (``Fn``).  Imported, after torch is found, by the from_torch tests.
"""

from __future__ import annotations

from torch import nn

from gradcheck.check.runner import RunOptions, run_case

ALL = ("tape", "torch", "jax")


def failing(res) -> str:
    lines = [f"{leaf.path} [{leaf.role}] {leaf.verdict} blame={leaf.blame}: {leaf.message}"
             for leaf in res.leaves if leaf.verdict not in ("agree", "vacuous")]
    return "\n".join(lines + [f"{k}: {v}" for k, v in res.errors.items()] + res.notes)


def assert_agree(res):
    assert not res.errors, failing(res)
    assert sorted(res.timings) == sorted(ALL), res.unavailable
    assert not res.unavailable, res.unavailable
    assert res.verdict == "agree", failing(res)


def assert_caught(res, op):
    """The wrong lowering is caught by the node-by-node check: the tape and jax cannot run, torch is not blamed."""
    assert set(res.unavailable) == {"tape", "jax"}, (res.unavailable, res.errors)
    assert all(f"the lowering of {op} disagrees with torch's {op}" in why for why in res.unavailable.values()), \
        res.unavailable
    assert not any("torch" in leaf.blame for leaf in res.leaves), failing(res)


def checked(monkeypatch, module, *inputs):
    """``module`` at ``inputs`` through from_torch (float64, seed 0) and the runner on all three backends."""
    from gradcheck.frontends.torch import from_torch

    monkeypatch.setenv("GRADCHECK_NO_CACHE", "1")  # captured again with the table as patched, not read back
    return run_case(from_torch(module, *inputs, dtype="float64", seed=0), RunOptions(backends=ALL))



class Fn(nn.Module):
    """A functional call as a module's forward: the function is the thing checked."""

    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, *xs):
        return self.f(*xs)

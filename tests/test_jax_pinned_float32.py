"""jax's float32 run of a from_jax model, pinned to the float64 reference's kinks as the tape's and torch's are.

jax runs the user's own code, which no pin reaches, so its float32 forward took whichever side of a relu its
rounding put it on: where a relu input lies within float32's rounding of 0 (a BatchNorm over two values in the
last block of a ResNet at 32x32: flaxmodels', haiku's ResNet-18 and MobileNetV1 at seed 1), one element on the
other side moved a whole term of an upstream gradient, and jax's float32 was called imprecise against the
tape's and torch's, which were pinned.  Its pinned float32 run (``Program._pinned``, ``interpreter.run_pinned``)
binds jax's own primitives and the user's custom rules equation by equation, and takes only the kink-taking
equations through gradcheck.ops, which the pin reaches.

Here a relu's input is ``exp(x) - c`` with ``c`` the float32 ``exp(x)`` numpy computes: in float64 it lies
within float32's rounding of 0, on a side float64 decides; in float32 each backend's ``exp`` rounds its own way
(XLA's, numpy's and torch's differ in the last place at a third of these inputs).
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("torch")

import jax.numpy as jnp  # noqa: E402

from gradcheck.check.runner import RunOptions, run_case  # noqa: E402
from gradcheck.frontends.jax import from_jax  # noqa: E402
from gradcheck.frontends.jax.model import Program  # noqa: E402

FACTOR = 1 + 1e-3  # a rule wrong in float32 alone: far past float32's rounding


def _model(rule=lambda v: v):
    def exp_relu(params, state, x):
        z = jnp.exp(x) - state["c"]  # within float32's rounding of 0 wherever float32 computes it
        h = jax.nn.relu(rule(z))
        return jnp.tanh(x @ params["v"]) + (h + x) @ params["w"], state

    return exp_relu


def _point(seed: int):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (4, 6)).astype(np.float32)
    params = {"v": (rng.standard_normal((6, 3)) / 2).astype(np.float32),
              "w": (rng.standard_normal((6, 3)) / 2).astype(np.float32)}
    return params, {"c": np.exp(x)}, x


def _case(seed: int, rule=lambda v: v):
    params, state, x = _point(seed)
    return from_jax(_model(rule), params, x, state=state, seed=seed)


def _jax_crossings(res) -> int:
    return sum(k.crossed.get("jax", 0) for k in res.kinks)


def _failing(res) -> str:
    lines = [f"{leaf.path} {leaf.verdict}/{leaf.float32.verdict if leaf.float32 else '-'} blame={leaf.blame}: "
             f"{leaf.message} {leaf.float32.message if leaf.float32 else ''}" for leaf in res.leaves]
    return "\n".join(lines + [f"{k}: {v}" for k, v in {**res.errors, **res.unavailable}.items()] + res.notes)


@pytest.mark.parametrize("seed", range(3))
def test_jax_float32_pinned_at_the_reference_kinks_is_not_imprecise(monkeypatch, seed):
    """Pinned, jax's float32 gradients are as near float64 as the tape's and torch's, and its crossings are
    counted; negative control: jax's float32 run as the user's own code, unpinned, is called imprecise."""
    case = _case(seed)
    res = run_case(case, RunOptions(repeat=False))
    assert res.verdict == "agree" and not res.errors and not res.unavailable, _failing(res)
    assert res.float32 == "ok" and "jax" not in res.unpinned, _failing(res)
    assert _jax_crossings(res) > 0, res.kinks  # XLA's float32 exp put some relu inputs on the other side

    monkeypatch.setattr(Program, "_pinned_here", lambda self, floats: False)
    res = run_case(case, RunOptions(repeat=False))
    imprecise = {leaf.path for leaf in res.leaves if leaf.float32 and leaf.float32.verdict == "imprecise"}
    assert "input" in imprecise and res.float32 == "imprecise", _failing(res)
    assert all("jax float32" in leaf.float32.message for leaf in res.leaves if leaf.path in imprecise)


@jax.custom_vjp
def _wrong_in_float32(v):
    return v


def _wrong_fwd(v):
    return v, None


def _wrong_bwd(_, g):
    return (g * FACTOR if g.dtype == jnp.float32 else g,)


_wrong_in_float32.defvjp(_wrong_fwd, _wrong_bwd)


@pytest.mark.parametrize("wrong", [False, True], ids=["clean", "float32 rule 0.1% wrong"])
def test_the_users_rule_still_runs_in_jaxs_pinned_float32(wrong):
    """The pinned float32 run binds the user's custom_vjp whole: a rule 0.1 % wrong in float32 alone (float64
    agrees) makes jax's float32 imprecise at the input, and the clean rule does not."""
    res = run_case(_case(0, _wrong_in_float32 if wrong else (lambda v: v)), RunOptions(repeat=False))
    assert res.verdict == "agree" and not res.errors, _failing(res)
    imprecise = {leaf.path for leaf in res.leaves if leaf.float32 and leaf.float32.verdict == "imprecise"}
    if wrong:
        assert imprecise == {"input"} and "jax float32" in next(
            leaf.float32.message for leaf in res.leaves if leaf.path == "input"), _failing(res)
    else:
        assert not imprecise and res.float32 == "ok", _failing(res)


def test_a_pinned_run_that_fails_is_run_again_unpinned_with_a_note(monkeypatch):
    """Where jax's float32 jaxpr cannot be run pinned, jax's float32 run is the user's own code again, said in the
    notes and in ``unpinned``, and the case still runs on every backend (here: imprecise, as unpinned above)."""
    from gradcheck.frontends.jax import interpreter

    def broken(*args, **kwargs):
        raise RuntimeError("an equation the pinned walk cannot bind")

    monkeypatch.setattr(interpreter, "run_pinned", broken)
    res = run_case(_case(0), RunOptions(repeat=False))
    assert res.verdict == "agree" and not res.errors and not res.unavailable, _failing(res)
    assert res.unpinned == ["jax"], _failing(res)
    assert any(n.startswith("jax: float32 not pinned") and "could not be run pinned" in n for n in res.notes), res.notes

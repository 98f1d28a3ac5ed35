"""A wrong gradient in a jax model is named by the module it starts in, on every backend, in every framework.

The model is one model written three ways (``jax_models``'s squash nets: Dense, a tanh with a learnt scale,
Dense) as flax.linen, flax.nnx and equinox.  Each backend's gradient of tanh is made wrong where that backend
computes it (``faults.wrong_jax_tanh``): the tape's and torch's lowering of jax's ``tanh``, and jax's own rule for
its ``tanh`` primitive (the differentiation rule jax registers for it), as a bug in jax would be.  No custom
rule is involved, so the origin can only come from the module spans (``frontends/jax/regions.py``): the
squash module, under the framework's own path, blamed on the backend that is wrong.  The control: each model,
unchanged, agrees with no origin.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("equinox")
torch = pytest.importorskip("torch")

import faults  # noqa: E402
from test_from_jax import assert_agree, check_model, failing  # noqa: E402

FACTOR = 1.001
# Where each framework's squash module is: its path (linen's name stack starts with the model's class) and class.
SQUASH = {"linen_squash_net": ("LinenSquashNet/squash", "LinenSquash"),
          "nnx_squash_net": ("squash", "NnxSquash"), "equinox_squash_net": (".squash", "EqxSquash")}


def _wrong_tanh(monkeypatch, backend: str) -> None:
    faults.wrong_jax_tanh(monkeypatch, backend, FACTOR)


@pytest.fixture(autouse=True)
def _nothing_traced_under_a_fault_outlives_it():
    yield
    jax.clear_caches()


@pytest.mark.parametrize("name", sorted(SQUASH))
@pytest.mark.parametrize("backend", ["tape", "torch", "jax"])
def test_a_wrong_gradient_is_named_by_the_module_it_starts_in(monkeypatch, name, backend):
    _wrong_tanh(monkeypatch, backend)
    res = check_model(name, dtype="float64")
    wrong = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert wrong and all(leaf.blame == [backend] for leaf in wrong), failing(res)
    path, cls = SQUASH[name]
    origin = res.origin
    assert origin is not None and origin.kind == "vjp", (origin, res.notes)
    assert (origin.path, origin.layer, origin.blame) == (path, cls, [backend]), origin
    # The layer before the squash and the model's input only inherit its error; the squash's own scale is its own.
    inherited = {leaf.path for leaf in wrong if leaf.inherited}
    assert inherited and all("inner" in p or p == "input" for p in inherited), failing(res)
    assert not any(leaf.inherited for leaf in wrong if leaf.path.endswith("a")), failing(res)


@pytest.mark.parametrize("name", sorted(SQUASH))
def test_the_same_models_unchanged_agree_with_no_origin(name):
    res = check_model(name, dtype="float64")
    assert_agree(res)
    assert res.origin is None


def test_a_module_origin_writes_a_reproducer_that_says_it_cannot_rebuild_the_span(monkeypatch, tmp_path):
    """A span is a piece of the model's jaxpr, no importable function: the folder holds the numbers, and the
    script prints the stored reference against each backend and exits 2 (it must not claim a replay)."""
    import subprocess
    import sys

    from test_from_jax import made

    from gradcheck.check.runner import RunOptions, run_case
    from gradcheck.frontends.jax import from_jax

    _wrong_tanh(monkeypatch, "tape")
    target, args, kwargs = made("nnx_squash_net")
    res = run_case(from_jax(target, *args, **kwargs, dtype="float64"), RunOptions(repro=tmp_path))
    assert res.origin is not None and res.origin.path == "squash", res.origin
    script = next(tmp_path.rglob("repro_jax.py"))
    run = subprocess.run([sys.executable, script.name], cwd=script.parent, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "cannot replay squash with jax here" in run.stdout and "STORED input.0 disagree blame=tape" in run.stdout


@pytest.mark.parametrize("name", ["nnx_squash_net", "equinox_squash_net"])
def test_the_module_scopes_leave_the_model_classes_as_they_were(name):
    """gradcheck wraps each module class's ``__call__`` only while it traces: afterwards every class holds the
    very object it held before (equinox keeps a descriptor there), and the model's own call is unchanged."""
    from test_from_jax import made

    from gradcheck.frontends.jax import from_jax

    target, args, kwargs = made(name)
    classes = {type(target), type(target.squash), type(target.inner)}
    before = {cls: vars(cls).get("__call__") for cls in classes}
    out = np.asarray(target(*args))
    case = from_jax(target, *args, **kwargs, dtype="float64")
    case.build(None)
    assert {cls: vars(cls).get("__call__") for cls in classes} == before
    assert np.array_equal(np.asarray(target(*args)), out)

"""jax's compiled-function cache never changes a result: one function object re-traced when what its trace reads
is rebound (an op implementation, a jax function, a layer class's method), and the first compile reused when the
change is undone.  The per-layer replay runs one function (``localise._layer_loss``) for every layer, so a key on
the function and the arguments' structure alone handed back a replay compiled before a fault was injected."""

from __future__ import annotations

import numpy as np
import pytest

import gradcheck.layers as L
from gradcheck import ops
from gradcheck.case import cast_floats

jax = pytest.importorskip("jax")

from gradcheck.backends.jax import driver as jax_driver  # noqa: E402  (after the importorskip: it imports jax)
from gradcheck.backends.jax import ops as jax_ops  # noqa: E402
from gradcheck.backends.jax.driver import JaxBackend  # noqa: E402


def loss(m, x):
    """One module-level function for every call, as the per-layer replay's ``_layer_loss`` is."""
    return ops.sum(ops.mul(m(x), 1.5))


def model():
    return cast_floats(L.Chain(L.Dense(3, 4, activation=ops.gelu, rng=0), L.Dense(4, 2, rng=1)), np.float64)


X = np.random.default_rng(0).standard_normal((2, 3))


def grads(driver, m, jit=True):
    ev = driver.evaluate(loss, (m, X), jit=jit)
    return {p: np.array(g) for p, g in ev.grads.items()}


def same_as_uncached(driver, m):
    """The cached call's gradients, checked against an uncompiled run of the same function (the oracle)."""
    got, want = grads(driver, m), grads(JaxBackend(), m, jit=False)
    assert got.keys() == want.keys()
    for path in want:
        np.testing.assert_allclose(got[path], want[path], rtol=1e-12, atol=1e-14, err_msg=path)
    return got


def changed(a, b):
    return any(not np.allclose(a[p], b[p]) for p in a)


def test_a_replaced_op_implementation_recompiles_and_the_undone_one_reuses_its_compile(monkeypatch):
    driver, m = JaxBackend(), model()
    before = same_as_uncached(driver, m)
    same_as_uncached(driver, m)
    assert driver.traces == 1  # the control: nothing changed, nothing traced again
    original = jax_ops.linear
    monkeypatch.setattr(jax_ops, "linear", lambda x, w, bias=None: ops.mul(original(x, w, bias), 2.0))
    assert changed(same_as_uncached(driver, m), before)
    assert driver.traces == 2
    monkeypatch.undo()
    again = same_as_uncached(driver, m)
    assert driver.traces == 2  # the state before the patch is known: its compiled entry is handed back
    assert not changed(again, before)


def test_a_replaced_jax_function_recompiles(monkeypatch):
    driver, m = JaxBackend(), model()
    before = same_as_uncached(driver, m)
    gelu = jax.nn.gelu  # what jax_ops.gelu calls
    monkeypatch.setattr(jax.nn, "gelu", lambda x, approximate=False: gelu(x, approximate=approximate) * 3.0)
    assert changed(same_as_uncached(driver, m), before)
    assert driver.traces == 2


def test_a_replaced_layer_method_recompiles(monkeypatch):
    driver, m = JaxBackend(), model()
    before = same_as_uncached(driver, m)
    call = L.Dense.__call__
    monkeypatch.setattr(L.Dense, "__call__", lambda self, x: ops.tanh(call(self, x)))
    assert changed(same_as_uncached(driver, m), before)
    assert driver.traces == 2


def test_namespace_tokens_follow_the_attributes_by_identity():
    states = jax_driver._NamespaceStates()

    class Space:
        pass

    ns = Space()
    ns.f = f = lambda: 1
    first = states.token(ns)
    assert states.token(ns) == first
    ns.f = lambda: 1  # equal code, another object: another state
    second = states.token(ns)
    assert second != first
    ns.f = f  # undone: the first state's token again
    assert states.token(ns) == first
    ns.g = f  # an attribute added
    assert states.token(ns) not in (first, second)

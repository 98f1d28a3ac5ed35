"""Adding a backend is one registry row plus its package: a toy backend registered from this file alone.

``mirror`` is a fourth backend: its arrays are ``Mirror``, a shell around a
tape tensor, and its ops run the tape's on what the shells hold, so it
computes what the tape computes through a backend of its own (its own array
type, ops module and driver, found by ``gradcheck.ops`` dispatch and by the
runner from its row).  Run next to the tape through the runner, it agrees on
every leaf (the clean control), and its float32 run is pinned to the float64
reference's relu branches like any backend's.  ``skewed`` is the same
backend with one gradient 1 % too large: the runner catches it, and the
referee blames ``skewed`` alone.
"""

from __future__ import annotations

import contextlib
import types

import numpy as np
import pytest

import gradcheck.layers as L
from gradcheck import backends, ops, results
from gradcheck.backends.base import Backend, Evaluation, evaluate_eagerly
from gradcheck.backends.tape import ops as tape_ops
from gradcheck.backends.tape import tape
from gradcheck.case import Case
from gradcheck.check.runner import RunOptions, run_case

SKEWED_LEAF = "0.bias"  # the leaf whose gradient ``skewed`` gets 1 % too large
FACTOR = 1.01


class Mirror:
    """The toy backend's array: a tape tensor in a shell of its own type (what dispatch routes on)."""

    __array_ufunc__ = None  # numpy hands mixed expressions (ndarray * Mirror) to the operators below

    def __init__(self, t):
        self.t = t

    shape = property(lambda self: self.t.shape)
    dtype = property(lambda self: self.t.dtype)
    ndim = property(lambda self: self.t.ndim)
    size = property(lambda self: self.t.size)
    T = property(lambda self: ops.transpose(self))

    def __len__(self):
        return len(self.t)

    __add__ = lambda self, o: ops.add(self, o)
    __radd__ = lambda self, o: ops.add(o, self)
    __sub__ = lambda self, o: ops.sub(self, o)
    __rsub__ = lambda self, o: ops.sub(o, self)
    __mul__ = lambda self, o: ops.mul(self, o)
    __rmul__ = lambda self, o: ops.mul(o, self)
    __truediv__ = lambda self, o: ops.div(self, o)
    __rtruediv__ = lambda self, o: ops.div(o, self)
    __pow__ = lambda self, o: ops.pow(self, o)
    __matmul__ = lambda self, o: ops.matmul(self, o)
    __neg__ = lambda self: ops.neg(self)
    __getitem__ = lambda self, index: ops.getitem(self, index)


def _inside(x):
    """Arguments for the tape: every shell opened (in lists, tuples and dicts too)."""
    if isinstance(x, Mirror):
        return x.t
    if type(x) in (list, tuple):
        return type(x)(_inside(v) for v in x)
    if isinstance(x, dict):
        return {k: _inside(v) for k, v in x.items()}
    return x


def _outside(x):
    """Results for the caller: every tape tensor in a shell."""
    if isinstance(x, tape.Tensor):
        return Mirror(x)
    if type(x) in (list, tuple):
        return type(x)(_outside(v) for v in x)
    return x


def _mirrored(fn):
    def run(*args, **kwargs):
        return _outside(fn(*_inside(args), **_inside(kwargs)))

    return run


def _ops_module() -> types.ModuleType:
    """Every op the tape implements, run on what the shells hold; the rest fall back to their derived bodies."""
    module = types.ModuleType("mirror_ops")
    for name in ops.__all__:
        if hasattr(tape_ops, name):
            setattr(module, name, _mirrored(getattr(tape_ops, name)))
    module.to_numpy = lambda x: np.asarray(tape.raw(_inside(x)))
    return module


class MirrorBackend(Backend):
    name = "mirror"
    skew: dict[str, float] = {}  # leaf path -> the factor its gradient is wrong by

    def evaluate(self, f, args, prefixes=None) -> Evaluation:
        ev = evaluate_eagerly(f, args, prefixes, _lift, _differentiate, lambda x: np.asarray(tape.raw(_inside(x))))
        for path, factor in self.skew.items():
            if path in ev.grads:
                ev.grads[path] = ev.grads[path] * np.asarray(factor, ev.grads[path].dtype)
        return ev


class SkewedBackend(MirrorBackend):
    name = "skewed"
    skew = {SKEWED_LEAF: FACTOR}


def _lift(value, trainable):
    if not trainable and np.asarray(value).dtype.kind != "f":
        return np.asarray(value), False  # integer leaves stay numpy constants, as on the tape
    return Mirror(tape.Tensor(np.asarray(value), requires_grad=trainable)), False


def _differentiate(loss, wrt, create_graph):
    return tape.grad(_inside(loss), [m.t for m in wrt], create_graph=create_graph) if wrt else []


def _row(name: str, driver: type) -> backends.Row:
    return backends.Row(name, lambda t: t is Mirror, _ops_module(), driver, rank=3,
                        concrete=lambda x: x.t.value)


@contextlib.contextmanager
def registered(name: str, driver: type):
    """The toy backend registered as ``name`` inside the block, and gone after it (both toys own ``Mirror``)."""
    row = backends.register(_row(name, driver))
    try:
        yield row
    finally:
        backends.unregister(name)


def _case(dtype: str) -> Case:
    def build(rng):
        return L.Chain(L.Dense(3, 4, activation=ops.relu, rng=rng), L.Dense(4, 2, activation=ops.tanh, rng=rng))

    return Case("toy", build, lambda rng: (rng.standard_normal((5, 3)),), dtype=dtype)


def test_a_registered_backend_is_found_by_dispatch_and_by_name():
    with registered("mirror", MirrorBackend):
        _found()


def _found():
    x = Mirror(tape.Tensor(np.array([-1.0, 2.0]), requires_grad=True))
    y = ops.relu(x) * 3.0 + np.ones(2)
    assert backends.backend_of(y) == "mirror" and isinstance(y, Mirror)
    np.testing.assert_array_equal(ops.to_numpy(y), [1.0, 7.0])
    assert backends.get_backend("mirror").name == "mirror" and backends.reference_rank("mirror") == 3
    assert backends.concrete(x).tolist() == [-1.0, 2.0]
    assert "mirror" not in backends.default_backends()  # not a default row: checked only when named


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_correct_toy_backend_agrees_with_the_tape_on_every_leaf(dtype):
    with registered("mirror", MirrorBackend):
        r = run_case(_case(dtype), RunOptions(backends=("tape", "mirror"), referee="leaves"))
    assert not r.errors and not r.unavailable and not r.unpinned, (r.errors, r.unavailable, r.notes)
    assert r.verdict == "agree", [(x.path, x.verdict, x.message) for x in r.leaves]
    grads = [x for x in r.leaves if x.role in ("param", "input")]
    assert grads and all({(p.backend, p.reference) for p in x.pairs} == {("mirror", "tape")} for x in grads)
    assert all({c.backend for c in x.referee} == {"tape", "mirror"} for x in grads)


def test_a_wrong_toy_backend_is_caught_and_blamed():
    with registered("skewed", SkewedBackend):
        r = run_case(_case("float64"), RunOptions(backends=("tape", "skewed"), referee="leaves"))
    assert r.failed and not r.errors
    failing = {x.path: x for x in r.leaves if x.verdict in results.FAILING}
    assert set(failing) == {SKEWED_LEAF}, [(x.path, x.verdict, x.message) for x in r.leaves]
    assert failing[SKEWED_LEAF].blame == ["skewed"], failing[SKEWED_LEAF].message


def test_a_row_is_registered_once_and_unregistered_is_gone():
    with registered("mirror", MirrorBackend) as row, pytest.raises(ValueError, match="'mirror' is registered already"):
        backends.register(_row("mirror", MirrorBackend))
    with pytest.raises(ValueError, match="unknown backend 'mirror'; choose from tape, torch, jax"):
        backends.get_backend("mirror")
    assert row.name not in [r.name for r in backends.rows()]


def test_a_registered_backend_can_be_named_in_settings_and_an_unregistered_one_cannot():
    from gradcheck.app.settings import SettingsError, parse_backends

    with registered("mirror", MirrorBackend):
        assert parse_backends("tape,mirror") == ("tape", "mirror")
    with pytest.raises(SettingsError, match="unknown backend 'mirror'; choose from tape, torch, jax"):
        parse_backends("tape,mirror")

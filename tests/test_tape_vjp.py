"""Every op in ``gradcheck.ops``: the tape's VJP against float64 central differences.

The cases are the drawn samples of the op database (``tests/op_db.py``): one
per (op, configuration), each drawing shapes, values and options with
hypothesis and handing ``(f, args)`` to ``check_vjp``.  Every op in
``gradcheck.ops.__all__`` must have one: an op added without a drawn sample
fails ``test_every_op_has_a_row``.  Inputs are kept away from kinks
(relu/abs at 0, ties of max) so that finite differences can referee.
"""

from __future__ import annotations

import numpy as np
import pytest
from draws import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from op_db import OPS, Draw, Drawn, all_drawn
from vjp_check import VjpMismatch, check_vjp

from gradcheck import ops
from gradcheck.backends.tape import ops as tape_ops
from gradcheck.backends.tape import tape
from gradcheck.backends.tape.tape import Tensor

SETTINGS = settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- the tests
def test_every_op_has_a_row():
    missing = sorted(name for name, info in OPS.items() if not info.drawn)
    assert not missing, (
        f"ops without a drawn sample: {missing}; add one to tests/op_db.py "
        "(a `@drawn(\"name\")` builder returning (f, args))"
    )


def _check_float32(row: Drawn, f, args):
    """float32 in -> float32 out and float32 gradients (no silent float64 promotion)."""
    args32 = [a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == np.float64 else a for a in args]
    tensors = [Tensor(a, requires_grad=True) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args32]
    out = f(*tensors)
    assert out.dtype == np.float32, f"{row.label}: float32 inputs gave a {out.dtype} output"
    float_inputs = [t for t in tensors if isinstance(t, Tensor)]
    grads = tape.grad(out, float_inputs, cotangent=np.ones(out.shape, np.float32))
    for i, g in enumerate(grads):
        assert g.dtype == np.float32, f"{row.label}: float32 input {i} got a {g.dtype} gradient"


def _params(drawn):
    """Each drawn sample, a strict xfail where a known defect of the tape makes its VJP wrong."""
    return [pytest.param(d, id=d.label, marks=[pytest.mark.xfail(strict=True, reason=bug)]
                         if (bug := OPS[d.op].bug("tape")) else []) for d in drawn]


VJP_ROWS = [d for d in all_drawn() if not d.constant]
CONSTANT_ROWS = [d for d in all_drawn() if d.constant]


@pytest.mark.parametrize("row", _params(VJP_ROWS))
@SETTINGS
@given(data=st.data())
def test_vjp(row: Drawn, data):
    d = Draw(data)
    f, args = row.build(d)
    check_vjp(f, args, name=row.label, seed=d.seed)
    if row.float32:
        _check_float32(row, f, args)


@pytest.mark.parametrize("row", _params(CONSTANT_ROWS))
@settings(max_examples=examples(5), deadline=None)
@given(data=st.data())
def test_constant_ops_carry_no_gradient(row: Drawn, data):
    f, args = row.build(Draw(data))
    expected = np.asarray(f(*args))
    out = f(*(Tensor(a, requires_grad=True) for a in args))
    assert not (isinstance(out, Tensor) and out.requires_grad), f"{row.label} returned a tensor that requires grad"
    np.testing.assert_array_equal(np.asarray(tape.raw(out)), expected, err_msg=f"{row.label}: tape vs numpy value")


def test_stop_gradient_cuts_one_path_only():
    # d/dx [stop(x) * x] = stop(x): the gradient flows through the second factor only.
    x = np.array([0.5, -2.0, 3.0])
    t = Tensor(x, requires_grad=True)
    (g,) = tape.grad(ops.sum(ops.mul(ops.stop_gradient(t), t)), [t])
    np.testing.assert_allclose(g, x)


@pytest.mark.parametrize("src,dst", [(np.float32, np.float64), (np.float64, np.float32)])
def test_astype_gradient_returns_to_the_source_dtype(src, dst):
    x = Tensor(np.array([0.5, -1.25], src), requires_grad=True)
    y = ops.astype(x, dst)
    assert y.dtype == dst
    (g,) = tape.grad(ops.sum(ops.mul(y, 3.0)), [x])
    assert g.dtype == src
    np.testing.assert_array_equal(g, [3.0, 3.0])


# The documented conventions at kinks and ties, which finite differences
# cannot referee (torch and jax agree on each).
def _grad(f, *xs):
    ts = [Tensor(np.asarray(x, np.float64), requires_grad=True) for x in xs]
    return tape.grad(ops.sum(f(*ts)), ts)


def test_tie_and_kink_conventions():
    np.testing.assert_array_equal(_grad(ops.relu, [0.0, 1.0, -1.0])[0], [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(_grad(ops.abs, [0.0, 2.0, -2.0])[0], [0.0, 1.0, -1.0])
    ga, gb = _grad(ops.maximum, [1.0, 2.0, 3.0], [1.0, 5.0, 0.0])
    np.testing.assert_array_equal(ga, [0.5, 0.0, 1.0])
    np.testing.assert_array_equal(gb, [0.5, 1.0, 0.0])
    ga, gb = _grad(ops.minimum, [1.0, 2.0], [1.0, 5.0])
    np.testing.assert_array_equal(ga, [0.5, 1.0])
    np.testing.assert_array_equal(gb, [0.5, 0.0])
    np.testing.assert_array_equal(_grad(lambda x: ops.max(x, axis=1), [[3.0, 3.0, 1.0, 3.0]])[0],
                                  [[1 / 3, 1 / 3, 0.0, 1 / 3]])
    # d/da a**0 = 0, also at a = 0 (not 0 * 0**-1 = nan), as torch.
    ga, gb = _grad(ops.pow, [0.0, 1.0, 2.0], [0.0, 0.0, 3.0])
    np.testing.assert_array_equal(ga, [0.0, 0.0, 12.0])
    np.testing.assert_allclose(gb, [0.0, 0.0, 8 * np.log(2.0)])
    np.testing.assert_array_equal(_grad(lambda a: ops.pow(a, 0), [0.0, 3.0])[0], [0.0, 0.0])
    # max-pool: the first maximum of each window, as torch.
    x = np.array([[[[2.0, 2.0], [1.0, 2.0]]]])
    np.testing.assert_array_equal(_grad(lambda x: ops.max_pool2d(x, 2), x)[0], [[[[1.0, 0.0], [0.0, 0.0]]]])


# ---------------------------------------------------------------- empty axes
# torch and jax: a softmax over an empty axis is empty, a logsumexp over one is -inf (the log of
# an empty sum), and the gradients are empty too.
@pytest.mark.parametrize("shape, axis", [((3, 0), -1), ((0, 3), 0), ((2, 0, 3), 1), ((3, 0), None)])
def test_softmax_family_over_an_empty_axis_gives_what_torch_and_jax_give(shape, axis):
    for value in (np.zeros(shape, np.float32), Tensor(np.zeros(shape, np.float32), requires_grad=True)):
        lse = ops.logsumexp(value, axis=axis)
        kept = () if axis is None else tuple(s for i, s in enumerate(shape) if i != axis % len(shape))
        np.testing.assert_array_equal(tape.raw(lse), np.full(kept, -np.inf, np.float32))
        assert ops.dtype_of(lse) == np.float32
        for op in (ops.softmax, ops.log_softmax):
            y = op(value, axis=-1 if axis is None else axis)
            assert ops.shape_of(y) == shape and ops.dtype_of(y) == np.float32
    x = Tensor(np.zeros(shape, np.float32), requires_grad=True)
    (g,) = tape.grad(ops.sum(ops.log_softmax(x, axis=-1 if axis is None else axis)), [x])
    assert g.shape == shape and g.dtype == np.float32


# ---------------------------------------------------------------- integer constants and inputs
def test_integer_constants_keep_float32_tensors_in_float32():
    x = Tensor(np.array([[0.5, -1.25, 2.0]], np.float32), requires_grad=True)
    w = Tensor(np.ones((3, 2), np.float32), requires_grad=True)
    ints, scalar = np.array([1, 2, 3]), np.int64(3)
    for y in (ops.mul(x, ints), ops.add(scalar, x), ops.div(x, ints), ops.pow(x, np.array([0, 1, 2])),
              ops.sub(ints, x), ops.maximum(x, np.int64(0)), ops.where(ints > 1, x, ints),
              ops.matmul(np.array([[1, 2, 3]]), w)):
        assert y.dtype == np.float32
        grads = tape.grad(ops.sum(ops.mul(y, y)), [x, w])
        assert [g.dtype for g in grads] == [np.float32, np.float32]


def test_an_integer_input_to_a_float32_model_stays_float32_on_the_tape():
    import gradcheck
    import gradcheck.layers as L

    model = L.Dense(3, 2, rng=0)
    x, k = np.ones((2, 3), np.float32), np.array([[1, 2], [3, 4]])
    value, (_, gx, gk) = gradcheck.withgradient(lambda m, x, k: ops.sum(m(x) * k), model, x, k)
    assert value.dtype == np.float32 and gx.dtype == np.float32 and gk is None


def test_an_integer_input_does_not_blame_the_tape_for_numpys_promotion():
    pytest.importorskip("torch")
    import gradcheck.layers as L
    from gradcheck.case import Case
    from gradcheck.check.runner import RunOptions, run_case

    case = Case("int input", lambda rng: L.Dense(3, 2, rng=rng),
                lambda rng: (rng.standard_normal((2, 3)), rng.integers(1, 4, size=(2, 2))),
                forward=lambda m, x, k: m(x) * k)
    result = run_case(case, RunOptions(backends=("tape", "torch"), repeat=False))
    assert result.verdict == "agree", [(leaf.path, leaf.verdict, leaf.message) for leaf in result.leaves]


# ---------------------------------------------------------------- integer and bool arrays
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_integer_and_bool_tensors_cannot_require_grad(dtype):
    with pytest.raises(TypeError, match=f"dtype {np.dtype(dtype)}.*only float arrays are differentiated"):
        Tensor(np.zeros(3, dtype), requires_grad=True)


def test_integer_results_are_never_differentiated():
    x = Tensor(np.array([0.2, -1.0, 3.0]), requires_grad=True)
    mask = ops.greater(x, 0.0)
    assert mask.dtype == np.bool_ and not isinstance(mask, Tensor)
    # A float op on an int tensor is fine, but nothing integer joins the graph.
    idx = Tensor(np.array([2, 0]))
    assert not ops.add(idx, 1).requires_grad
    (g,) = tape.grad(ops.sum(ops.where(mask, x, 0.0)), [x])
    np.testing.assert_array_equal(g, [1.0, 0.0, 1.0])


# ---------------------------------------------------------------- negative controls
# A checker that cannot fail proves nothing: each deliberately wrong VJP below
# must be caught.  Inputs are fixed so the controls are deterministic.
R = np.random.default_rng(1234)
X34, Y34 = R.standard_normal((3, 4)), R.standard_normal((3, 4))
X14 = R.standard_normal((1, 4))
CONV_X, CONV_W = R.standard_normal((2, 2, 5, 5)), R.standard_normal((3, 2, 3, 3))


def _scaled(vjp, factor=1.01):
    return lambda g, ans, *a, **k: ops.mul(vjp(g, ans, *a, **k), factor)


def _flip_kernel(g, ans, x, w, geom, nd):
    return tape_ops._conv_input_grad(g, w[..., ::-1, ::-1], geom=geom, nd=nd)


NEGATIVE = [
    # (label, primitive, argnum or "any", wrong vjp builder, f, args)
    ("mul scaled by 1.01", tape_ops.mul, 0, lambda old: _scaled(old), ops.mul, (X34, Y34)),
    ("add broadcast not undone in b", tape_ops.add, 1, lambda old: (lambda g, ans, a, b: g), ops.add, (X34, X14)),
    ("tanh drops the ans^2 term", tape_ops.tanh, 0, lambda old: (lambda g, ans, x: g), ops.tanh, (X34,)),
    ("softmax drops the sum term", tape_ops.softmax, 0,
     lambda old: (lambda g, ans, x, axis=-1: ops.mul(ans, g)), ops.softmax, (X34,)),
    ("sum scaled by 1.01", tape_ops.sum, 0, lambda old: _scaled(old), lambda x: ops.sum(x, axis=1), (X34,)),
    ("matmul wrt b without transposing a", tape_ops._matmul, 1,
     lambda old: (lambda g, ans, a, b: ops.matmul(a, g)),
     ops.matmul, (R.standard_normal((3, 3)), R.standard_normal((3, 3)))),
    ("conv input grad with a flipped kernel", tape_ops._conv, 0, lambda old: _flip_kernel,
     lambda x, w: ops.conv(x, w, padding=1), (CONV_X, CONV_W)),
    ("conv weight grad scaled by 1.01", tape_ops._conv, 1, lambda old: _scaled(old),
     lambda x, w: ops.conv(x, w, stride=2), (CONV_X, CONV_W)),
    ("transpose VJP uses the permutation, not its inverse", tape_ops.transpose, 0,
     lambda old: (lambda g, ans, x, axes=None: ops.transpose(g, axes)),
     lambda x: ops.transpose(x, (1, 2, 0)), (R.standard_normal((2, 3, 4)),)),
    ("max_pool2d scaled by 1.01", tape_ops._max_pool, 0, lambda old: _scaled(old),
     lambda x: ops.max_pool2d(x, 2), (R.permutation(50).reshape(1, 2, 5, 5) / 10.0,)),
    ("log VJP 1/x^2", tape_ops.log, 0, lambda old: (lambda g, ans, x: ops.div(g, ops.mul(x, x))),
     ops.log, (R.uniform(0.5, 2.0, (3, 4)),)),
    ("atan VJP 1/(1 + x), the square forgotten", tape_ops.atan, 0,
     lambda old: (lambda g, ans, x: ops.div(g, ops.add(x, 1.0))), ops.atan, (R.uniform(0.5, 2.0, (3, 4)),)),
    ("prod VJP prod/x, wrong at a zero", tape_ops.prod, 0,
     lambda old: (lambda g, ans, x, axis=None, keepdims=False: ops.mul(ops.reshape(g, (-1, 1)), ops.div(
         ops.reshape(ans, (-1, 1)), ops.where(tape.raw(x) == 0, 1.0, x)))),
     lambda x: ops.prod(x, axis=1), (np.where(np.eye(3, 4, dtype=bool), 0.0, R.standard_normal((3, 4))),)),
]


@pytest.mark.parametrize("case", NEGATIVE, ids=[c[0] for c in NEGATIVE])
def test_checker_catches_a_wrong_vjp(case, monkeypatch):
    label, prim, argnum, wrong, f, args = case
    check_vjp(f, args, name=label)  # the control is only meaningful if the right VJP passes
    monkeypatch.setitem(prim.vjps, argnum, wrong(prim.vjps[argnum]))
    with pytest.raises(VjpMismatch, match=rf"wrt arg {argnum}: tape .* vs numeric|gradient shape"):
        check_vjp(f, args, name=label)


def test_checker_catches_a_wrong_variadic_vjp(monkeypatch):
    # einsum and concatenate share one VJP for all operands (vjp_any).
    a, b = R.standard_normal((3, 4)), R.standard_normal((4, 2))
    f = lambda a, b: ops.einsum("ij,jk->ik", a, b)
    check_vjp(f, (a, b), name="einsum")
    old = tape_ops._einsum.vjp_any
    monkeypatch.setattr(tape_ops._einsum, "vjp_any",
                        lambda n, g, ans, *xs, **k: ops.mul(old(n, g, ans, *xs, **k), 1.0 if n == 0 else 1.01))
    with pytest.raises(VjpMismatch, match=r"wrt arg 1: tape"):
        check_vjp(f, (a, b), name="einsum")


def test_checker_catches_a_scatter_that_drops_repeats(monkeypatch):
    # Embedding gradients must add up repeated indices: assignment would keep only one.
    x, idx = R.standard_normal((4, 3)), np.array([1, 1, 2, 1])
    f = lambda x: ops.take(x, idx)
    check_vjp(f, (x,), name="take")

    def assign(g, index, shape):
        out = np.zeros(shape, g.dtype)
        out[index] = g
        return out

    monkeypatch.setattr(tape_ops._index_add, "forward", assign)
    with pytest.raises(VjpMismatch, match="wrt arg 0: tape"):
        check_vjp(f, (x,), name="take")


def test_checker_refuses_a_kink_within_the_step():
    # Inputs 1.5 steps from relu's kink: for many directions the kink falls
    # between the step h and 2h, and the two central differences disagree.
    with pytest.raises(VjpMismatch, match="unstable"):
        check_vjp(ops.relu, (np.full(50, 1.5e-5),), name="relu near 0")


def test_checker_fails_at_a_kink():
    # Exactly at 0 the central difference sees slope 1/2, the tape (as torch) 0.
    with pytest.raises(VjpMismatch, match="wrt arg 0: tape"):
        check_vjp(ops.relu, (np.array([0.0, 1.0, -1.0]),), name="relu at 0")


def test_checker_refuses_a_vacuous_check():
    with pytest.raises(VjpMismatch, match="depends on none"):
        check_vjp(lambda x: ops.mul(x, 0.0), (np.ones(3),), name="times zero")


@pytest.mark.parametrize("error", [1e-3, 1e-5])
def test_checker_sensitivity(error, monkeypatch):
    # The tolerance is about 3e-8 relative for these inputs, so even a 1e-5
    # relative error in a VJP is caught, not only the 1% of the controls above.
    monkeypatch.setitem(tape_ops.tanh.vjps, 0, _scaled(tape_ops.tanh.vjps[0], 1 + error))
    with pytest.raises(VjpMismatch, match="wrt arg 0: tape"):
        check_vjp(ops.tanh, (X34,), name="tanh")


def test_checker_sensitivity_survives_the_measured_jitter(monkeypatch):
    # The rounding allowance takes the larger of a value bound and the jitter seen a hair around x; for ops
    # whose value is not a small difference of large terms the jitter is the smaller, so a 1e-5 relative error
    # in a normalisation's VJP is still caught.
    x = R.standard_normal((2, 3, 4, 4))
    f = lambda x: ops.normalize(x, (0, 2, 3), 1e-5)[0]  # noqa: E731
    check_vjp(f, (x,), name="normalize")
    old = tape_ops._normalize.vjp_joint
    monkeypatch.setattr(tape_ops._normalize, "vjp_joint",
                        lambda argnums, *a, **k: [ops.mul(g, 1 + 1e-5) for g in old(argnums, *a, **k)])
    with pytest.raises(VjpMismatch, match="wrt arg 0: tape"):
        check_vjp(f, (x,), name="normalize")


def test_checker_messages_label_both_sides(monkeypatch):
    monkeypatch.setitem(tape_ops.exp.vjps, 0, _scaled(tape_ops.exp.vjps[0]))
    with pytest.raises(VjpMismatch) as info:
        check_vjp(ops.exp, (X34,), name="exp")
    msg = str(info.value)
    assert msg.startswith("vjp of exp wrt arg 0: tape ") and " vs numeric " in msg and "tol" in msg

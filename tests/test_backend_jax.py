"""The JAX backend: every op against the numpy forward, gradients against the tape, driver contracts.

The op samples are the op database's (``tests/op_db.py``), and each runs two
ways: in float64, compiled, the forward against the numpy backend (tight) and
the gradient of a random-cotangent loss against the tape (~1e-10); in
float32, eager, the forward against numpy (loose).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from op_db import (
    ATT_BIAS_FULL,
    ATT_MASK,
    ATT_MASK_B,
    BCE_POS,
    BCE_W,
    BN_RM,
    BN_RV,
    CE_P,
    CE_T_IGN,
    CE_T_IGN1,
    CE_T_MAP,
    CE_W,
    CE_W3,
    DROP4,
    IDS5,
    OPS,
    REDUCTIONS,
    Sample,
    all_samples,
    running_stats,
    sample,
)

pytest.importorskip("jax")

from gradcheck.backends.jax.driver import JaxBackend, configure_jax  # noqa: E402

jax = configure_jax()
import jax.numpy as jnp  # noqa: E402

import gradcheck  # noqa: E402
from gradcheck import ops  # noqa: E402
from gradcheck.backends import backend_of, get_backend  # noqa: E402
from gradcheck.case import cast_floats  # noqa: E402
from gradcheck.layers import BatchNorm2d, Chain, Conv2d, Dense  # noqa: E402
from gradcheck.module import Module, buffer, param, static  # noqa: E402
from gradcheck.tree import describe, leaves_with_paths  # noqa: E402

FORWARD_TOL = {np.float64: dict(rtol=1e-12, atol=1e-12), np.float32: dict(rtol=2e-5, atol=2e-6)}
GRAD_TOL = dict(rtol=1e-10, atol=1e-12)


def assert_close(actual, expected, what, rtol, atol):
    """Same shape, same dtype, values within tolerance; the message names the stage."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape jax {actual.shape} vs reference {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype jax {actual.dtype} vs reference {expected.dtype}"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=f"{what} (jax vs reference)")


# ---------------------------------------------------------------- the samples
# Every fixed sample of the op database (tests/op_db.py); the framework kernels' samples (F.linear,
# F.batch_norm, attention, losses) check what a jax model runs against the derived composition
# (forward, numpy) and the tape (gradients).
SAMPLES = all_samples()


def _params(samples):
    return [pytest.param(s, id=s.id) for s in samples]


def _float64_params(samples):
    """The samples, each a strict xfail where a known defect of jax (or of the tape) makes its gradient wrong."""
    return [pytest.param(s, id=s.id, marks=[pytest.mark.xfail(strict=True, reason=bug)]
                         if s.grad and (bug := OPS[s.op].bug("jax")) else []) for s in samples]


def test_every_op_has_a_row():
    missing = sorted(set(ops.__all__) - {s.op for s in SAMPLES})
    assert not missing, f"ops without a sample in tests/op_db.py: {missing}"


def check_forward(r: Sample, dtype, seed=0):
    """Eager jax against the numpy backend."""
    arrays = r.arrays(seed, dtype)
    expected = r.fn(*arrays)  # numpy arrays dispatch to the numpy backend
    actual = r.fn(*(jnp.asarray(a) for a in arrays))
    assert backend_of(actual) == "jax", f"{r.id}: the result left jax ({type(actual).__name__})"
    assert_close(actual, expected, f"{r.id} forward {np.dtype(dtype).name}", **FORWARD_TOL[dtype])


def check_float64(r: Sample, seed=2):
    """Compiled forward against numpy, and the gradient of <cot, output> against the tape.

    The loss is a random projection, as the harness uses: a plain sum would
    hide errors (softmax's input gradient of a sum is identically zero).
    """
    arrays = r.arrays(seed)
    expected = np.asarray(r.fn(*arrays))
    if not r.grad or "jax" in r.no_gradient_on:
        return check_forward(r, np.float64, seed)
    cot = np.random.default_rng(seed + 1).standard_normal(expected.shape).astype(expected.dtype)

    def loss(*xs):
        out = r.fn(*xs)
        return ops.sum(ops.mul(out, cot)), out

    (value_jax, out_jax), grads_jax = gradcheck.withgradient(loss, *arrays, backend="jax")
    assert_close(out_jax, expected, f"{r.id} forward float64", **FORWARD_TOL[np.float64])
    (value_tape, _), grads_tape = gradcheck.withgradient(loss, *arrays, backend="tape")
    assert_close(value_jax, value_tape, f"{r.id} loss", **GRAD_TOL)
    for i, (gj, gt) in enumerate(zip(grads_jax, grads_tape, strict=True)):
        assert_close(gj, gt, f"{r.id} gradient of input {i}", **GRAD_TOL)


@pytest.mark.parametrize("r", _float64_params(SAMPLES))
def test_float64_forward_and_gradient(r):
    check_float64(r)


@pytest.mark.parametrize("r", _params(SAMPLES))
def test_float32_forward(r):
    check_forward(r, np.float32)


# ---------------------------------------------------------------- conventions, against torch
def _conv_cases():
    return _params(s for s in SAMPLES if s.op in ("conv", "conv_transpose"))


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")  # torch's perf note
@pytest.mark.parametrize("r", list(_conv_cases()))
def test_convolutions_match_torch(r, monkeypatch):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    arrays = r.arrays(seed=3)
    actual = r.fn(*(jnp.asarray(a) for a in arrays))
    t = lambda a: torch.from_numpy(a) if isinstance(a, np.ndarray) else a  # noqa: E731 (a constant weight)
    # The same call with torch's functional ops in place of gradcheck's.
    with_torch = {
        "conv": lambda x, w, bias=None, stride=1, padding=0, dilation=1, groups=1: (
            F.conv1d if x.ndim == 3 else F.conv2d)(x, t(w), t(bias), stride, padding, dilation, groups),
        "conv_transpose": lambda x, w, bias=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1: (
            F.conv_transpose1d if x.ndim == 3 else F.conv_transpose2d)(x, t(w), t(bias), stride, padding, output_padding, groups, dilation),
    }[r.op]
    monkeypatch.setattr(ops, r.op, with_torch)
    expected = r.fn(*(torch.from_numpy(a) for a in arrays)).numpy()
    assert_close(actual, expected, f"{r.id} vs torch", **FORWARD_TOL[np.float64])


# Points where a derivative is a convention (kinks, ties): (name, torch's, ours, x).
BOUNDARIES = [
    ("relu at 0", lambda t, x: t.relu(x), ops.relu, [0.0, -1.0, 2.0]),
    ("abs at 0", lambda t, x: t.abs(x), ops.abs, [0.0, -1.0, 2.0]),
    ("leaky_relu at 0", lambda t, x: t.nn.functional.leaky_relu(x, 0.2), lambda x: ops.leaky_relu(x, 0.2), [0.0, -1.0, 2.0]),
    ("elu at 0", lambda t, x: t.nn.functional.elu(x, 1.5), lambda x: ops.elu(x, 1.5), [0.0, -1.0, 2.0]),
    ("maximum tie", lambda t, x: t.maximum(x, x.flip(0)), lambda x: ops.maximum(x, x[::-1]), [1.0, 0.0, 1.0]),
    ("max tie", lambda t, x: t.amax(x, 0), lambda x: ops.max(x, axis=0), [2.0, 2.0, 1.0]),
    ("max_pool2d tie", lambda t, x: t.nn.functional.max_pool2d(x.reshape(1, 1, 2, 2), 2),
     lambda x: ops.max_pool2d(ops.reshape(x, (1, 1, 2, 2)), 2), [1.0, 1.0, 0.0, 1.0]),
]


@pytest.mark.parametrize("name, torch_fn, ours, x", BOUNDARIES, ids=[b[0] for b in BOUNDARIES])
def test_boundary_gradients_match_torch(name, torch_fn, ours, x):
    torch = pytest.importorskip("torch")
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    (expected,) = torch.autograd.grad(torch_fn(torch, xt).sum(), xt)
    (actual,) = gradcheck.gradient(lambda x: ops.sum(ours(x)), np.array(x), backend="jax")
    assert_close(actual, expected.numpy(), f"{name} gradient vs torch", **GRAD_TOL)


# The framework kernels against torch.nn.functional itself (their contract), float64, forward and
# gradients; these include what the derived bodies do not cover (a class weight with label smoothing, a
# negative padding_idx, keys of lower rank than the queries).
def _flat(*arrays):
    return ops.concatenate([ops.reshape(a, (-1,)) for a in arrays])


def _torch_batch_norm(F, torch, x, w, b, **kw):
    rm, rv = torch.tensor(BN_RM), torch.tensor(BN_RV)  # updated in place, as torch's layers do
    y = F.batch_norm(x, rm, rv, w, b, **kw)
    return torch.cat([y.reshape(-1), rm, rv])


def _ours_batch_norm(x, w, b, **kw):
    return _flat(*ops.batch_norm(x, ops.asarray(BN_RM, like=x), ops.asarray(BN_RV, like=x), w, b, **kw))


def _sdpa(**kw):
    return lambda q, k, v: ops.scaled_dot_product_attention(q, k, v, **kw)


def _torch_sdpa(**kw):
    return lambda F, torch, q, k, v: F.scaled_dot_product_attention(
        q, k, v, **{n: torch.from_numpy(a) if isinstance(a, np.ndarray) else a for n, a in kw.items()})


def _torch_ids(torch, ids):
    return torch.from_numpy(ids)


QKV4, QKV3 = [(2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 5)], [(2, 4, 3), (2, 6, 3), (2, 6, 3)]
PAD_LAST = np.array([1.0, 1.0, 1.0, 1.0, 0.0])[:, None]  # torch's table holds zeros at padding_idx

TORCH_KERNELS = [
    ("linear", ops.linear, lambda F, t, x, w, b: F.linear(x, w, b), [(2, 3, 4), (5, 4), (5,)]),
    ("batch_norm-train-stats", lambda x, w, b: _ours_batch_norm(x, w, b, momentum=0.3),
     lambda F, t, x, w, b: _torch_batch_norm(F, t, x, w, b, training=True, momentum=0.3), [(3, 4, 2, 3), (4,), (4,)]),
    ("batch_norm-train-1d-stats", lambda x, w, b: _ours_batch_norm(x, w, b),
     lambda F, t, x, w, b: _torch_batch_norm(F, t, x, w, b, training=True), [(5, 4), (4,), (4,)]),
    ("batch_norm-eval", lambda x, w, b: _ours_batch_norm(x, w, b, training=False, eps=1e-3),
     lambda F, t, x, w, b: _torch_batch_norm(F, t, x, w, b, training=False, eps=1e-3), [(3, 4, 5), (4,), (4,)]),
    ("layer_norm", lambda x, w, b: ops.layer_norm(x, (4, 5), w, b),
     lambda F, t, x, w, b: F.layer_norm(x, (4, 5), w, b), [(2, 3, 4, 5), (4, 5), (4, 5)]),
    ("layer_norm-int-shape", lambda x, w, b: ops.layer_norm(x, 5, w, b),
     lambda F, t, x, w, b: F.layer_norm(x, (5,), w, b), [(2, 3, 5), (5,), (5,)]),
    ("group_norm", lambda x, w, b: ops.group_norm(x, 3, w, b),
     lambda F, t, x, w, b: F.group_norm(x, 3, w, b), [(2, 6, 4, 3), (6,), (6,)]),
    ("rms_norm", lambda x, w: ops.rms_norm(x, (3, 5), w), lambda F, t, x, w: F.rms_norm(x, (3, 5), w),
     [(2, 3, 5), (3, 5)]),
    ("sdpa-rank4", _sdpa(), _torch_sdpa(), QKV4),
    ("sdpa-bool-mask", _sdpa(attn_mask=ATT_MASK_B), _torch_sdpa(attn_mask=ATT_MASK_B), QKV4),
    ("sdpa-float-mask-inf", _sdpa(attn_mask=ATT_BIAS_FULL), _torch_sdpa(attn_mask=ATT_BIAS_FULL), QKV4),
    ("sdpa-causal-L<S", _sdpa(is_causal=True), _torch_sdpa(is_causal=True), QKV3),
    ("sdpa-causal-L>S", _sdpa(is_causal=True), _torch_sdpa(is_causal=True), [(2, 6, 3), (2, 4, 3), (2, 4, 3)]),
    ("sdpa-scale-rank3", _sdpa(scale=0.3), _torch_sdpa(scale=0.3), QKV3),
    ("sdpa-value-dim", _sdpa(), _torch_sdpa(), [(2, 4, 3), (2, 6, 3), (2, 6, 2)]),
    ("sdpa-lower-rank-kv", _sdpa(), _torch_sdpa(), [(2, 3, 4, 5), (3, 6, 5), (3, 6, 5)]),
    ("embedding-padding-idx", lambda w: ops.embedding(IDS5, w, padding_idx=1),
     lambda F, t, w: F.embedding(_torch_ids(t, IDS5), w * t.from_numpy(np.roll(PAD_LAST, -3, 0)), padding_idx=1),
     [(5, 3)]),
    ("embedding-negative-padding-idx", lambda w: ops.embedding(IDS5, w, padding_idx=-1),
     lambda F, t, w: F.embedding(_torch_ids(t, IDS5), w * t.from_numpy(PAD_LAST), padding_idx=-1), [(5, 3)]),
    *[(f"cross_entropy-weight-smoothing-ignore-{r}",
       lambda x, r=r: ops.cross_entropy(x, CE_T_IGN, CE_W, reduction=r, label_smoothing=0.2),
       lambda F, t, x, r=r: F.cross_entropy(x, _torch_ids(t, CE_T_IGN), t.tensor(CE_W), reduction=r,
                                            label_smoothing=0.2), [(6, 5)]) for r in REDUCTIONS],
    ("cross_entropy-spatial-weight-smoothing",
     lambda x: ops.cross_entropy(x, CE_T_MAP, CE_W3, label_smoothing=0.1),
     lambda F, t, x: F.cross_entropy(x, _torch_ids(t, CE_T_MAP), t.tensor(CE_W3), label_smoothing=0.1),
     [(2, 3, 4, 5)]),
    ("cross_entropy-probabilities-weight-smoothing",
     lambda x, p: ops.cross_entropy(x, p, CE_W, label_smoothing=0.1),
     lambda F, t, x, p: F.cross_entropy(x, p, t.tensor(CE_W), label_smoothing=0.1), [(6, 5), (6, 5)]),
    ("cross_entropy-ignore-index-1", lambda x: ops.cross_entropy(x, CE_T_IGN1, ignore_index=1),
     lambda F, t, x: F.cross_entropy(x, _torch_ids(t, CE_T_IGN1), ignore_index=1), [(6, 5)]),
    ("nll_loss-weight-ignore", lambda x: ops.nll_loss(x, CE_T_IGN, CE_W),
     lambda F, t, x: F.nll_loss(x, _torch_ids(t, CE_T_IGN), t.tensor(CE_W)), [(6, 5)]),
    ("mse_loss-broadcast-sum", lambda x, y: ops.mse_loss(x, y, reduction="sum"),
     lambda F, t, x, y: F.mse_loss(x, y.expand(3, 4), reduction="sum"), [(3, 4), (4,)]),
    ("bce-weight-pos-weight", lambda x, y: ops.binary_cross_entropy_with_logits(x, y, BCE_W, pos_weight=BCE_POS),
     lambda F, t, x, y: F.binary_cross_entropy_with_logits(x, y, t.tensor(BCE_W), pos_weight=t.tensor(BCE_POS)),
     [(3, 4), (3, 4)]),
]


@pytest.mark.parametrize("name, ours, theirs, shapes", TORCH_KERNELS, ids=[c[0] for c in TORCH_KERNELS])
def test_framework_kernels_match_torch(name, ours, theirs, shapes):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    rng = np.random.default_rng(11)
    arrays = [rng.standard_normal(s) for s in shapes]
    if name.startswith("cross_entropy-probabilities"):
        arrays[1] = CE_P
    out, vjp = jax.vjp(jax.jit(ours), *(jnp.asarray(a) for a in arrays))
    cot = rng.standard_normal(out.shape)
    grads = vjp(jnp.asarray(cot))
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    expected = theirs(F, torch, *tensors)
    expected_grads = torch.autograd.grad(expected, tensors, torch.tensor(cot), allow_unused=True)
    assert_close(out, expected.detach().numpy(), f"{name} forward", **FORWARD_TOL[np.float64])
    for i, (g, e) in enumerate(zip(grads, expected_grads, strict=True)):
        e = np.zeros(arrays[i].shape) if e is None else e.numpy()
        assert_close(g, e, f"{name} gradient of input {i} vs torch", **GRAD_TOL)


# ---------------------------------------------------------------- the comparison can fail
def test_negative_control_perturbed_value_fails():
    a = np.random.default_rng(0).standard_normal((3, 4))
    with pytest.raises(AssertionError):
        assert_close(a * (1 + 1e-8), a, "perturbed", **GRAD_TOL)
    with pytest.raises(AssertionError, match="dtype"):
        assert_close(a.astype(np.float32), a, "cast", rtol=1e-3, atol=1e-3)


def test_negative_control_wrong_gradient_fails(monkeypatch):
    from gradcheck.backends.jax import ops as jax_ops

    # Right value, wrong derivative (1 instead of cos x): only a gradient check sees it.
    monkeypatch.setattr(jax_ops, "sin", lambda x: jax.lax.stop_gradient(jnp.sin(x) - x) + x)
    r = OPS["sin"].samples[0]
    check_forward(r, np.float64)
    with pytest.raises(AssertionError, match=f"{r.id} gradient of input 0"):
        check_float64(r)


def wrong_backward(fn, factor=1.5):
    """``fn`` with its true value and a backward ``factor`` times too large, as a jax.custom_vjp.

    Array keyword arguments (attention's mask and bias) are differentiable
    inputs of the wrapper too; the rest (scale, is_causal) are closed over.
    """

    def call(*args, **kwargs):
        names = [k for k, v in kwargs.items() if isinstance(v, jax.Array)]
        static = {k: v for k, v in kwargs.items() if k not in names}
        n = len(args)

        def plain(*xs):
            return fn(*xs[:n], **dict(zip(names, xs[n:], strict=True)), **static)

        @jax.custom_vjp
        def wrapped(*xs):
            return plain(*xs)

        def bwd(vjp, g):
            return tuple(c if c.dtype == jax.dtypes.float0 else factor * c for c in vjp(g))

        wrapped.defvjp(lambda *xs: jax.vjp(plain, *xs), bwd)
        return wrapped(*args, *(kwargs[k] for k in names))

    return call


ATTENTION_SAMPLES = OPS["scaled_dot_product_attention"].samples


def check_float32_gradient(r: Sample, seed=2, tol=1e-4):
    """Compiled float32 jax gradients against the float64 tape, normwise (float32 is where jax.nn's attention runs)."""
    arrays = r.arrays(seed)
    expected = np.asarray(r.fn(*arrays))
    cot = np.random.default_rng(seed + 1).standard_normal(expected.shape)

    def loss(*xs):
        out = r.fn(*xs)
        return ops.sum(ops.mul(out, ops.asarray(cot, like=out)))

    _, grads32 = gradcheck.withgradient(loss, *(a.astype(np.float32) for a in arrays), backend="jax")
    _, grads64 = gradcheck.withgradient(loss, *arrays, backend="tape")
    for i, (g32, g64) in enumerate(zip(grads32, grads64, strict=True)):
        assert g32.dtype == np.float32, f"{r.id} float32 gradient of input {i}: dtype {g32.dtype}"
        # Relative to the float64 gradient; absolute where that is exactly zero (a dropout mask of zeros).
        err = np.linalg.norm(g32 - g64) / (np.linalg.norm(g64) or 1.0)
        assert err < tol, f"{r.id} float32 gradient of input {i}: normwise error {err:.2e} against float64 > {tol}"


@pytest.mark.parametrize("r", _params(ATTENTION_SAMPLES))
def test_attention_kernel_float32_gradients(r):
    check_float32_gradient(r)


def _counting(fn, counts, name):
    def counted(*args, **kwargs):
        counts[name] += 1
        return fn(*args, **kwargs)

    return counted


def test_attention_routes_through_jax_nn_in_float32_and_flax_in_float64(monkeypatch):
    from gradcheck.backends.jax import ops as jax_ops

    counts = {"kernel": 0, "softmax": 0}
    monkeypatch.setattr(jax_ops, "_attention", _counting(jax_ops._attention, counts, "kernel"))
    monkeypatch.setattr(jax_ops, "_softmax", _counting(jax_ops._softmax, counts, "softmax"))
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in QKV4)
    ops.scaled_dot_product_attention(q, k, v, attn_mask=ATT_MASK)
    assert counts == {"kernel": 1, "softmax": 0}, "float32: jax.nn.dot_product_attention"
    ops.scaled_dot_product_attention(q, k, v, dropout_mask=DROP4)
    assert counts == {"kernel": 1, "softmax": 1}, "a dropout mask: flax's composition"
    ops.scaled_dot_product_attention(*(t.astype(jnp.float64) for t in (q, k, v)))
    assert counts == {"kernel": 1, "softmax": 2}, "float64: flax's composition"


def test_jax_nn_attention_computes_float64_in_float32():
    """Why float64 attention runs flax's composition: jax.nn's softmax is float32 whatever the input.

    If this fails, jax has started computing float64 attention in float64,
    and the kernel can run in float64 too (drop the dtype condition in
    jax_ops.scaled_dot_product_attention).
    """
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 5, 3, 4)) for _ in range(3))
    out = np.asarray(jax.nn.dot_product_attention(q, k, v))
    s = np.einsum("btnh,bsnh->bnts", q, k) / 2.0
    w = np.exp(s - s.max(-1, keepdims=True))
    ref = np.einsum("bnts,bsnh->btnh", w / w.sum(-1, keepdims=True), v)
    assert out.dtype == np.float64
    assert np.abs(out - ref).max() / np.abs(ref).max() > 1e-10


# A wrong backward in each jax function the kernels call is caught by a sample's check: the backend
# really routes through them.  (module attribute, sample id, check)
WRONG_KERNEL_BACKWARDS = [
    ("_rsqrt", "layer_norm-multi-dim", check_float64),
    ("_rsqrt", "batch_norm-train-2d-affine", check_float64),
    ("_softmax", "scaled_dot_product_attention-rank4", check_float64),
    ("_softmax", "scaled_dot_product_attention-rank4-dropout", check_float64),
    ("_attention", "scaled_dot_product_attention-rank4-bool-mask-LS", check_float32_gradient),
    ("_attention", "scaled_dot_product_attention-rank3-causal-L<S", check_float32_gradient),
    ("_log_softmax", "cross_entropy-weight-ignore-mean", check_float64),
    ("_log_sigmoid", "binary_cross_entropy_with_logits-weight-pos-weight-mean", check_float64),
]


@pytest.mark.parametrize("attr, row_id, check", WRONG_KERNEL_BACKWARDS,
                         ids=[f"{a}-{r}" for a, r, _ in WRONG_KERNEL_BACKWARDS])
def test_negative_control_wrong_kernel_backward_fails(attr, row_id, check, monkeypatch):
    from gradcheck.backends.jax import ops as jax_ops

    r = sample(row_id)
    monkeypatch.setattr(jax_ops, attr, wrong_backward(getattr(jax_ops, attr)))
    check_forward(r, np.float64)  # the value is still right: only a gradient check sees it
    with pytest.raises(AssertionError, match="gradient of input"):
        check(r)


# ---------------------------------------------------------------- errors
# Argument rules shared by every backend are tested once, on all of them (tests/test_errors.py); here, what
# jax needs on its own: indices checked where jax would clamp them, and eager values out of jax arrays.
@pytest.mark.parametrize("call, error, match", [
    (lambda x: ops.getitem(x, np.array([0, 3])), IndexError, "out of bounds"),
    (lambda x: ops.take(x, np.array([4]), axis=1), IndexError, "index 4 is out of bounds for axis 1 with size 4"),
    (lambda x: ops.embedding(np.array([-1]), x), IndexError, "ids must be in \\[0, 3\\)"),
    (lambda x: ops.nll_loss(x, np.array([0, -1, 2])), IndexError, "target -1 is out of bounds"),
    (lambda x: ops.to_numpy(x), None, None),
])
def test_errors_name_the_problem(call, error, match):
    x = jnp.asarray(np.ones((3, 4)))
    if error is None:
        assert isinstance(call(x), np.ndarray)
        return
    with pytest.raises(error, match=match):
        call(x)


@pytest.mark.parametrize("f, error, match", [
    (lambda x: ops.mul(x, 2.0), ValueError, "shape \\(3,\\)"),
    (lambda x: ops.sum(ops.greater(x, 0.0)), TypeError, "dtype int64"),
    (lambda x: 1.5, TypeError, "float"),
    (lambda x: np.sum(np.ones(3)), TypeError, "not a jax array"),
])
def test_the_loss_must_be_a_float_scalar(f, error, match):
    with pytest.raises(error, match=match):
        gradcheck.withgradient(f, np.ones(3), backend="jax")


# ---------------------------------------------------------------- structure of gradients
class Unused(Module):
    """A layer with a param its forward ignores, a buffer and a static field."""

    weight: Any = param()
    spare: Any = param()
    count: Any = buffer()
    scale: float = static()

    def __init__(self):
        self.weight = np.linspace(-1, 1, 2)
        self.spare = np.ones(3)
        self.count = np.zeros(())
        self.scale = 2.0

    def __call__(self, x):
        return x * self.weight * self.scale


def _model(dtype=np.float64):
    gradcheck.layers.init.seed(0)
    return cast_floats(Chain(Conv2d(2, 3, 3, padding=1), BatchNorm2d(3), Conv2d(3, 2, 2, stride=2, bias=False)), dtype)


def _flat_grads(grads, prefix):
    return {leaf.path: leaf.value for leaf in leaves_with_paths(grads, prefix)}


def check_same_structure(f, *args):
    v_jax, g_jax = gradcheck.withgradient(f, *args, backend="jax")
    v_tape, g_tape = gradcheck.withgradient(f, *args, backend="tape")
    assert_close(v_jax, v_tape, "loss", **GRAD_TOL)
    for i, (gj, gt) in enumerate(zip(g_jax, g_tape, strict=True)):
        assert describe(gj) == describe(gt), f"argument {i}: gradient structure jax vs tape"
        flat_jax, flat_tape = _flat_grads(gj, str(i)), _flat_grads(gt, str(i))
        assert flat_jax.keys() == flat_tape.keys()
        for path in flat_tape:
            assert_close(flat_jax[path], flat_tape[path], f"gradient {path}", **GRAD_TOL)
    return g_jax


def test_structural_gradients_of_a_chain():
    gradcheck.layers.init.seed(1)
    model = cast_floats(Chain(Dense(3, 4, activation=ops.tanh), Dense(4, 2, bias=False), Unused()), np.float64)
    model.freeze("0.bias")
    x = np.random.default_rng(0).standard_normal((5, 3))
    ids = np.array([[1], [0], [1], [2], [0]])
    cot = np.random.default_rng(1).standard_normal((5, 2))

    def f(m, x, ids, config):
        y = m.layers[2](m.layers[1](m.layers[0](x)))
        return ops.sum(ops.mul(ops.mul(y, ops.astype(ids, np.float64)), cot))

    g = check_same_structure(f, model, x, ids, {"mode": "train", "scale": 3})
    chain = g[0]
    assert chain.layers[0].bias is None, "frozen param"
    assert chain.layers[0].activation is None and chain.layers[2].scale is None, "static fields"
    assert chain.layers[1].bias is None, "disabled bias"
    assert chain.layers[2].count is None, "buffer"
    np.testing.assert_array_equal(chain.layers[2].spare, np.zeros(3))  # unused param: zeros
    assert g[2] is None, "integer input"
    assert g[3] == {"mode": None, "scale": None}, "static argument"


def test_conv_batchnorm_chain_gradients_and_running_stats():
    model = _model()
    x = np.random.default_rng(0).standard_normal((4, 2, 6, 6))
    cot = np.random.default_rng(1).standard_normal((4, 2, 3, 3))

    def f(m, x):
        return ops.sum(ops.mul(m(x), cot))

    check_same_structure(f, model, x)
    ev_jax = get_backend("jax").evaluate(f, (model, x))
    ev_tape = get_backend("tape").evaluate(f, (model, x))
    assert sorted(ev_jax.buffers) == sorted(ev_tape.buffers) == [
        "0.1.num_batches_tracked", "0.1.running_mean", "0.1.running_var"]
    for path, expected in ev_tape.buffers.items():
        assert_close(ev_jax.buffers[path], expected, f"buffer {path}", **GRAD_TOL)
    assert ev_jax.buffers["0.1.num_batches_tracked"] == 1
    assert not np.allclose(ev_jax.buffers["0.1.running_mean"], 0.0), "the running mean did not move"
    np.testing.assert_array_equal(model.layers[1].running_mean, 0.0)  # the argument is not modified


def test_eval_mode_uses_and_keeps_running_stats():
    model = _model().eval()
    model.layers[1].running_mean = np.linspace(-1, 1, 3)
    x = np.random.default_rng(0).standard_normal((2, 2, 4, 4))
    f = lambda m, x: ops.sum(ops.mul(m(x), x[:, :, ::2, ::2]))
    check_same_structure(f, model, x)
    ev = get_backend("jax").evaluate(f, (model, x))
    np.testing.assert_array_equal(ev.buffers["0.1.running_mean"], np.linspace(-1, 1, 3))


def test_tuple_output_comes_back_with_python_values():
    f = lambda x: (ops.sum(ops.mul(x, x)), ops.mul(x, 2.0), "note", None, 3)
    value, (g,) = gradcheck.withgradient(f, np.arange(3.0), backend="jax")
    assert value[2:] == ("note", None, 3)
    np.testing.assert_array_equal(value[1], np.arange(3.0) * 2)
    np.testing.assert_array_equal(g, 2 * np.arange(3.0))


# ---------------------------------------------------------------- dtypes
def test_float32_stays_float32_with_x64_on():
    assert jnp.asarray(np.float64(1.0)).dtype == jnp.float64, "float64 is enabled"
    model = _model(np.float32)
    x = np.random.default_rng(0).standard_normal((2, 2, 4, 4)).astype(np.float32)

    def f(m, x):
        y = m(x)
        half = ops.asarray(np.float64(0.5), like=y)  # a float64 constant must not upcast
        assert ops.dtype_of(half) == np.float32
        return ops.sum(ops.mul(y, half))

    ev = get_backend("jax").evaluate(f, (model, x))
    assert ev.value.dtype == np.float32
    assert {str(g.dtype) for g in ev.grads.values()} == {"float32"}
    assert {str(b.dtype) for p, b in ev.buffers.items() if "running" in p} == {"float32"}


def test_token_ids_as_an_argument_index_a_table():
    table = np.random.default_rng(0).standard_normal((5, 3))
    ids = np.array([[4, 0], [0, 0]])
    f = lambda table, ids: ops.sum(ops.mul(ops.take(table, ids), table[:2, None, :]))
    _, g_ids = check_same_structure(f, table, ids)  # traced integer ids on jax
    assert g_ids is None
    # A numpy table held fixed, indexed by traced ids.
    value, _ = gradcheck.withgradient(lambda ids: ops.sum(ops.take(table, ids)), ids, backend="jax")
    np.testing.assert_allclose(value, table[ids].sum())


def test_integer_targets_and_ids_as_arguments_are_traced():
    """Labels and ids passed as arguments are traced integers inside the compiled function."""
    rng = np.random.default_rng(0)
    logits, table = rng.standard_normal((6, 5)), rng.standard_normal((5, 3))
    cases = [
        (lambda x, t: ops.cross_entropy(x, t, CE_W), logits, CE_T_IGN),
        (lambda x, t: ops.cross_entropy(x, t, reduction="sum", label_smoothing=0.3), logits, CE_T_IGN),
        (lambda x, t: ops.cross_entropy(x, t, ignore_index=1), logits, CE_T_IGN1),
        (lambda x, t: ops.nll_loss(x, t, CE_W, reduction="sum"), logits, CE_T_IGN),
        (lambda w, ids: ops.sum(ops.mul(ops.embedding(ids, w, padding_idx=1), w[:1])), table, IDS5),
    ]
    for f, x, t in cases:
        _, g_t = check_same_structure(f, x, t)
        assert g_t is None


def test_kernels_under_jit_take_traced_masks_momentum_and_labels():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in QKV4)
    x = rng.standard_normal((3, 4, 5))
    logits = rng.standard_normal((6, 5))
    table = rng.standard_normal((5, 3))

    def f(q, k, v, mask, bias, x, momentum, target, ids, table):
        return (ops.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                ops.scaled_dot_product_attention(q, k, v, attn_mask=bias),
                running_stats(ops.batch_norm(x, ops.asarray(BN_RM, like=x), ops.asarray(BN_RV, like=x), momentum=momentum)),
                ops.cross_entropy(logits, target, CE_W, reduction="none"),
                ops.embedding(ids, table, padding_idx=0))

    args = (q, k, v, ATT_MASK_B, ATT_BIAS_FULL, x, np.array(0.25), CE_T_IGN, IDS5, table)
    expected = f(*args)  # numpy: the derived bodies
    actual = jax.jit(f)(*(jnp.asarray(a) for a in args))
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert_close(a, e, f"output {i} under jit", **FORWARD_TOL[np.float64])


def test_traced_out_of_range_labels_and_ids_give_nan_not_a_clamp():
    """Under jit a bad label cannot raise; jax would clamp it into range silently, here it is NaN."""
    logits = jnp.asarray(np.random.default_rng(0).standard_normal((4, 5)))
    loss = jax.jit(lambda x, t: ops.cross_entropy(x, t, CE_W, reduction="none"))(logits, jnp.array([0, 5, -1, -100]))
    assert np.isfinite(loss[0]) and loss[3] == 0.0, "a valid and an ignored label"
    assert np.isnan(loss[1]) and np.isnan(loss[2]), f"labels 5 and -1 of 5 classes: {loss}"
    rows = jax.jit(lambda w, ids: ops.embedding(ids, w))(logits, jnp.array([0, 4, -1]))
    assert np.isfinite(rows[0]).all() and np.isnan(rows[1:]).all(), f"ids 4 and -1 of a 4-row table: {rows}"


# ---------------------------------------------------------------- compilation cache
class Calls:
    """Counts calls of f; an object (compared by identity), so counting changes no cache key."""

    def __init__(self):
        self.n = 0

    def __call__(self):
        self.n += 1


def _counted(fn):
    calls = Calls()

    def f(*args):
        calls()
        return fn(*args)

    return f, calls


def _small_model():
    gradcheck.layers.init.seed(0)
    return cast_floats(Chain(Dense(3, 4, activation=ops.tanh), Dense(4, 2)), np.float64)


def test_second_call_does_not_recompile():
    driver = JaxBackend()
    model = _small_model()
    x = np.random.default_rng(0).standard_normal((2, 3))
    f, calls = _counted(lambda m, x: ops.sum(ops.mul(m(x), 1.5)))
    first = driver.evaluate(f, (model, x))
    second = driver.evaluate(f, (model, x * 2))  # new values, same shapes: no retrace
    assert calls.n == 1 and driver.traces == 1
    assert not np.allclose(first.grads["0.0.weight"], second.grads["0.0.weight"])
    driver.evaluate(f, (model, x[:1]))  # a new shape traces again
    assert calls.n == 2


def test_changed_static_or_closure_recompiles_and_stays_right():
    driver = JaxBackend()
    model = cast_floats(Chain(Dense(3, 2, activation=ops.tanh)), np.float64)
    x = np.ones((1, 3))
    scale = [1.0]

    def f(m, x):
        return ops.sum(ops.mul(m(x), scale[0]))

    def bias_grad():
        return driver.evaluate(f, (model, x)).grads["0.0.bias"]

    base = bias_grad()
    scale = [2.0]  # a closed-over name rebound
    np.testing.assert_allclose(bias_grad(), 2 * base)
    scale[0] = np.full(2, 3.0)  # a closed-over list changed in place
    np.testing.assert_allclose(bias_grad(), 3 * base)
    scale[0][:] = 4.0  # an array inside it changed in place
    np.testing.assert_allclose(bias_grad(), 4 * base)
    model.layers[0].activation = None  # a static field
    np.testing.assert_allclose(bias_grad(), [4.0, 4.0])
    model.freeze("0.bias")  # a frozen param stops being differentiated
    assert "0.0.bias" not in driver.evaluate(f, (model, x)).grads


def test_each_function_object_compiles_once_and_a_fresh_closure_anew():
    driver = JaxBackend()
    x = np.arange(3.0)
    calls = Calls()

    def make_loss(k, cots):  # a runner builds its loss anew for every call
        return lambda x: calls() or ops.sum(ops.mul(ops.sin(x), cots[0] * k))

    ones = [np.ones(3)]
    grads = [driver.evaluate(make_loss(k, cots), (x,)).grads["0"]
             for k, cots in ((1.0, ones), (3.0, ones), (1.0, [np.ones(3)]), (1.0, [-np.ones(3)]))]
    # As jax.jit: a function object is the unit of compilation; equal code and values do not make two
    # functions one (what a closed-over helper computes cannot be read off its code).
    assert calls.n == 4
    loss = make_loss(1.0, ones)
    driver.evaluate(loss, (x,))
    driver.evaluate(loss, (x,))
    assert calls.n == 5, "the same function with the same closed-over values must not recompile"
    np.testing.assert_allclose(grads[1], 3 * grads[0])
    np.testing.assert_allclose(grads[2], grads[0])
    np.testing.assert_allclose(grads[3], -grads[0])


def test_eager_matches_jit():
    model = _small_model().layers[0]
    x = np.random.default_rng(0).standard_normal((2, 3))
    f = lambda m, x: ops.sum(ops.mul(m(x), m(x)))
    jitted = get_backend("jax").evaluate(f, (model, x))
    eager = get_backend("jax").evaluate(f, (model, x), jit=False)
    assert jitted.grads.keys() == eager.grads.keys() == {"0.weight", "0.bias", "1"}
    for path, g in jitted.grads.items():
        assert_close(eager.grads[path], g, f"eager {path}", rtol=1e-12, atol=1e-12)


def test_evaluate_inside_jax_grad_gives_second_derivatives():
    driver = get_backend("jax")
    hvp = jax.grad(lambda x: jnp.sum(driver.evaluate(lambda x: ops.sum(ops.pow(x, 3)), (x,)).grads["0"]))
    x = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(hvp(jnp.asarray(x)), 6 * x)


# ---------------------------------------------------------------- packaging
def test_import_gradcheck_does_not_import_jax():
    code = (
        "import sys, gradcheck, gradcheck.layers\n"
        "from gradcheck.backends import get_backend\n"
        "get_backend('jax')\n"
        "assert 'jax' not in sys.modules, 'jax was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_driver_reports_itself():
    driver = get_backend("jax")
    assert (driver.name, driver.module) == ("jax", "jax")
    assert "pip install jax" in driver.install_hint and "gradcheck[jax]" in driver.install_hint
    ok, version = driver.available()
    assert ok and version == jax.__version__

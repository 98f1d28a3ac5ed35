"""The JAX backend: every op against the numpy forward, gradients against the tape, driver contracts.

Op rows are one line each and run two ways: in float64, compiled, the forward
against the numpy backend (tight) and the gradient of a random-cotangent loss
against the tape (~1e-10); in float32, eager, the forward against numpy (loose).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

pytest.importorskip("jax")

from gradcheck.backends.jax_driver import JaxBackend, configure_jax  # noqa: E402

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


# ---------------------------------------------------------------- the op table
@dataclass
class Row:
    op: str  # the gradcheck.ops name this row covers
    fn: Callable  # (*float arrays) -> array, written with gradcheck.ops; constants are closed over
    inputs: tuple  # shapes (random normal) or arrays (used as given)
    id: str
    grad: bool = True  # False for boolean outputs
    positive: bool = False  # draw inputs from [0.5, 2] (log, sqrt, pow with float exponents)

    def arrays(self, seed):
        rng = np.random.default_rng(seed)
        out = []
        for spec in self.inputs:
            if isinstance(spec, np.ndarray):
                out.append(spec.astype(np.float64))
            elif self.positive:
                out.append(rng.uniform(0.5, 2.0, size=spec))
            else:
                out.append(rng.standard_normal(spec))
        return out


def row(op, fn, *inputs, id="", **kw):
    return Row(op, fn, inputs, f"{op}-{id}" if id else op, **kw)


MASK = np.array([[True, False, True, True], [False, False, True, False], [True, True, False, True]])
IDX = np.array([2, 0, 2, 1])
TIES = np.array([[1.0, 3.0, 3.0, -2.0], [0.5, 0.5, 0.5, 0.5], [0.0, -1.0, 2.0, 2.0]])
POOL_TIES = np.tile(np.array([[1.0, 1.0, 0.0], [1.0, 0.5, 0.0], [0.0, 0.0, 0.0]]), (1, 2, 2, 2))

ROWS = [
    row("asarray", lambda x: ops.mul(x, ops.asarray(np.linspace(0.5, 1.5, 4), like=x)), (3, 4)),
    row("astype", lambda x: ops.astype(x, np.float32), (3, 4), grad=False),  # a float32 loss: see round-trip
    # Back to the input's dtype, so that the loss is summed in float64.
    row("astype", lambda x: ops.astype(ops.astype(x, np.float32), ops.dtype_of(x)), (3, 4), id="round-trip"),
    row("zeros_like", lambda x: ops.add(x, ops.zeros_like(x)), (3, 4)),
    row("stop_gradient", lambda x, y: ops.mul(x, ops.stop_gradient(y)), (3, 4), (3, 4)),
    row("add", ops.add, (2, 1, 4), (3, 4), id="broadcast"),
    row("add", lambda x: ops.add(x, 2.5), (3, 4), id="scalar"),
    row("sub", ops.sub, (3, 4), (4,), id="broadcast"),
    row("sub", lambda x: ops.sub(1.0, x), (3, 4), id="rscalar"),
    row("mul", ops.mul, (2, 3, 1), (1, 4), id="broadcast"),
    row("div", ops.div, (3, 4), (3, 1), id="broadcast", positive=True),
    row("div", lambda x: ops.div(2.0, x), (3, 4), id="rscalar", positive=True),
    row("neg", ops.neg, (3, 4)),
    row("pow", lambda x: ops.pow(x, 3), (3, 4), id="int"),
    row("pow", lambda x: ops.pow(x, 2.5), (3, 4), id="float", positive=True),
    row("pow", ops.pow, (3, 4), (4,), id="array", positive=True),
    row("maximum", ops.maximum, (3, 4), (3, 1), id="broadcast"),
    row("maximum", ops.maximum, TIES, TIES[::-1].copy(), id="ties"),
    row("minimum", ops.minimum, (3, 4), (4,), id="broadcast"),
    row("minimum", lambda x: ops.minimum(x, 0.0), TIES, id="ties"),
    row("where", lambda a, b: ops.where(MASK, a, b), (3, 4), (4,), id="numpy-mask"),
    row("where", lambda a: ops.where(ops.greater(a, 0.0), a, 0.5), (3, 4), id="scalar-branch"),
    row("exp", ops.exp, (3, 4)),
    row("expm1", ops.expm1, (3, 4)),
    row("log", ops.log, (3, 4), positive=True),
    row("log1p", ops.log1p, (3, 4), positive=True),
    row("sqrt", ops.sqrt, (3, 4), positive=True),
    row("rsqrt", ops.rsqrt, (3, 4), positive=True),
    row("abs", ops.abs, (3, 4)),
    row("abs", ops.abs, TIES - 0.5, id="zeros"),
    row("sin", ops.sin, (3, 4)),
    row("cos", ops.cos, (3, 4)),
    row("tanh", ops.tanh, (3, 4)),
    row("sigmoid", ops.sigmoid, np.array([-40.0, -3.0, -0.5, 0.0, 0.7, 4.0, 40.0])),
    row("erf", ops.erf, (3, 4)),
    row("relu", ops.relu, TIES - 1.0),
    row("leaky_relu", lambda x: ops.leaky_relu(x, 0.2), TIES - 1.0),
    row("elu", lambda x: ops.elu(x, alpha=1.5), TIES - 1.0),
    row("elu", ops.elu, np.array([-30.0, -1.0, 0.5, 80.0]), id="extremes"),
    row("gelu", ops.gelu, (3, 4), id="erf"),
    row("gelu", lambda x: ops.gelu(x, approximate="tanh"), (3, 4), id="tanh"),
    row("silu", ops.silu, (3, 4)),
    row("softplus", ops.softplus, np.array([-40.0, -3.0, -0.5, 0.0, 0.7, 4.0, 40.0])),
    row("greater", ops.greater, (3, 4), (4,), grad=False),
    row("less", ops.less, (3, 4), (3, 1), grad=False),
    row("equal", lambda x: ops.equal(x, ops.maximum(x, 0.0)), (3, 4), grad=False),
    row("matmul", ops.matmul, (2, 3, 4), (4, 5), id="batch"),
    row("matmul", ops.matmul, (2, 1, 3, 4), (5, 4, 2), id="broadcast-batch"),
    row("matmul", ops.matmul, (4,), (2, 4, 3), id="vector-left"),
    row("matmul", ops.matmul, (3, 4), (4,), id="vector-right"),
    row("matmul", ops.matmul, (4,), (4,), id="dot"),
    row("einsum", lambda a, b: ops.einsum("ij,jk->ik", a, b), (3, 4), (4, 2), id="matrix"),
    row("einsum", lambda a, b: ops.einsum("bij,bkj->bik", a, b), (2, 3, 4), (2, 5, 4), id="batch"),
    row("einsum", lambda a, b: ops.einsum("nchw,oh->ncow", a, b), (2, 2, 3, 4), (5, 3), id="contract"),
    row("einsum", lambda a: ops.einsum("ijk->ki", a), (2, 3, 4), id="unary"),
    row("sum", ops.sum, (2, 3, 4), id="all"),
    row("sum", lambda x: ops.sum(x, axis=1), (2, 3, 4), id="int"),
    row("sum", lambda x: ops.sum(x, axis=(0, 2), keepdims=True), (2, 3, 4), id="tuple-keepdims"),
    row("sum", lambda x: ops.sum(x, axis=[-1, 0]), (2, 3, 4), id="list"),
    row("mean", ops.mean, (2, 3, 4), id="all"),
    row("mean", lambda x: ops.mean(x, axis=(0, 2), keepdims=True), (2, 3, 4), id="tuple-keepdims"),
    row("var", lambda x: ops.var(x, axis=(0, 2)), (2, 3, 4), id="tuple"),
    row("var", lambda x: ops.var(x, axis=-1, keepdims=True, ddof=1), (2, 3, 4), id="ddof"),
    row("var", ops.var, (2, 3, 4), id="all"),
    row("normalize", lambda x, w, b: ops.normalize(x, (0, 2, 3), 1e-5, weight=w, bias=b)[0], (3, 4, 5, 2),
        (1, 4, 1, 1), (1, 4, 1, 1), id="batchnorm"),
    row("normalize", lambda x, w, b: ops.normalize(x, (-2, -1), 1e-5, weight=w, bias=b)[0], (2, 3, 4, 5), (4, 5),
        (4, 5), id="layernorm"),
    row("normalize", lambda x: ops.normalize(x, (2,), 1e-5)[0], (2, 3, 4), id="groups"),
    row("normalize", lambda x: ops.normalize(x, (0, 2), 1e-5)[1], (3, 4, 2), id="mean", grad=False),
    row("normalize", lambda x: ops.normalize(x, -1, 1e-5)[2], (3, 4, 2), id="var", grad=False),
    row("max", ops.max, (2, 3, 4), id="all"),
    row("max", lambda x: ops.max(x, axis=1, keepdims=True), (2, 3, 4), id="int-keepdims"),
    row("max", lambda x: ops.max(x, axis=1), TIES, id="ties"),
    row("min", lambda x: ops.min(x, axis=(0, 2)), (2, 3, 4), id="tuple"),
    row("min", lambda x: ops.min(x, axis=-1), TIES, id="ties"),
    row("logsumexp", ops.logsumexp, (2, 3, 4), id="all"),
    row("logsumexp", lambda x: ops.logsumexp(x, axis=1, keepdims=True), (2, 3, 4), id="keepdims"),
    row("logsumexp", lambda x: ops.logsumexp(x * 100.0, axis=(0, 2)), (2, 3, 4), id="large"),
    row("softmax", ops.softmax, (2, 3, 4), id="last"),
    row("softmax", lambda x: ops.softmax(x, axis=1), (2, 3, 4), id="axis1"),
    row("log_softmax", ops.log_softmax, (2, 3, 4), id="last"),
    row("log_softmax", lambda x: ops.log_softmax(x * 50.0, axis=0), (2, 3, 4), id="axis0-large"),
    row("reshape", lambda x: ops.reshape(x, (4, -1)), (2, 3, 4)),
    row("transpose", ops.transpose, (2, 3, 4), id="reverse"),
    row("transpose", lambda x: ops.transpose(x, (1, 2, 0)), (2, 3, 4), id="axes"),
    row("broadcast_to", lambda x: ops.broadcast_to(x, (2, 3, 4)), (3, 1)),
    row("concatenate", lambda a, b: ops.concatenate([a, b], axis=1), (2, 3), (2, 2)),
    row("concatenate", lambda a, b: ops.concatenate((a, b)), (2, 3), (1, 3), id="axis0"),
    row("stack", lambda a, b: ops.stack([a, b], axis=-1), (2, 3), (2, 3)),
    row("getitem", lambda x: ops.getitem(x, (slice(1, None), slice(None, None, 2))), (3, 5), id="slices"),
    row("getitem", lambda x: ops.getitem(x, (Ellipsis, None, -1)), (2, 3, 4), id="ellipsis-newaxis"),
    row("getitem", lambda x: ops.getitem(x, 1), (3, 4), id="int"),
    row("getitem", lambda x: ops.getitem(x, IDX), (3, 4), id="int-array-repeats"),
    row("getitem", lambda x: ops.getitem(x, (slice(None), np.array([-1, 1, 1]))), (3, 4), id="negative-array"),
    row("getitem", lambda x: ops.getitem(x, (np.array([0, 2]), np.array([3, 3]))), (3, 4), id="paired-arrays"),
    row("getitem", lambda x: ops.getitem(x, [2, 2, 0]), (3, 4), id="list"),
    row("getitem", lambda x: ops.getitem(x, MASK), (3, 4), id="bool-mask"),
    row("take", lambda x: ops.take(x, IDX), (3, 4), id="embedding"),
    row("take", lambda x: ops.take(x, np.array([[3, 0], [0, 1]]), axis=-1), (3, 4), id="last-2d"),
    row("pad", lambda x: ops.pad(x, ((0, 0), (1, 2))), (3, 4)),
    row("pad", lambda x: ops.pad(x, ((1, 0), (0, 0), (2, 1)), value=0.5), (2, 3, 4), id="value"),
    row("pad", lambda x: ops.pad(x, 1), (2, 3), id="int"),
    row("pad", lambda x: ops.pad(x, ((2, 1),)), (2, 3), id="broadcast-pair"),
    row("conv", ops.conv, (2, 3, 6, 5), (4, 3, 3, 3), id="basic"),
    row("conv", lambda x, w, b: ops.conv(x, w, b, stride=2, padding=1), (2, 3, 7, 6), (4, 3, 3, 3), (4,), id="stride-pad-bias"),
    row("conv", lambda x, w: ops.conv(x, w, stride=(2, 1), padding=(1, 0), dilation=(1, 2)), (1, 2, 7, 8), (3, 2, 3, 2), id="tuples"),
    row("conv", lambda x, w: ops.conv(x, w, dilation=2, groups=2), (2, 4, 7, 7), (6, 2, 3, 3), id="dilation-groups"),
    row("conv", lambda x, w: ops.conv(x, w, groups=3), (1, 3, 5, 5), (3, 1, 3, 3), id="depthwise"),
    row("conv", lambda x, w: ops.conv(x, w, padding="same"), (1, 2, 5, 6), (3, 2, 4, 3), id="same-even"),
    row("conv", lambda x, w: ops.conv(x, w, padding="same", dilation=(2, 1)), (1, 2, 7, 6), (2, 2, 2, 2), id="same-dilated"),
    row("conv", lambda x, w: ops.conv(x, w, padding="valid"), (1, 2, 5, 6), (3, 2, 2, 3), id="valid"),
    row("conv", lambda x, w, b: ops.conv(x, w, b, stride=2, padding=1, dilation=2, groups=2), (2, 4, 11), (6, 2, 3), (6,), id="1d"),
    row("conv", lambda x, w: ops.conv(x, w, padding="same"), (2, 3, 8), (2, 3, 4), id="1d-same"),
    row("conv_transpose", ops.conv_transpose, (2, 3, 4, 5), (3, 2, 3, 3), id="basic"),
    row("conv_transpose", lambda x, w, b: ops.conv_transpose(x, w, b, stride=2, padding=1, output_padding=1), (2, 3, 4, 3), (3, 2, 3, 3), (2,), id="stride-outpad-bias"),
    row("conv_transpose", lambda x, w: ops.conv_transpose(x, w, stride=(2, 3), padding=(0, 1), output_padding=(1, 2), groups=2), (1, 4, 3, 3), (4, 3, 2, 3), id="groups-tuples"),
    row("conv_transpose", lambda x, w: ops.conv_transpose(x, w, dilation=2, padding=1, groups=2), (1, 4, 4, 4), (4, 1, 3, 2), id="dilation"),
    row("conv_transpose", lambda x, w: ops.conv_transpose(x, w, stride=3, padding=2), (1, 2, 4, 4), (2, 2, 2, 2), id="crop"),
    row("conv_transpose", lambda x, w, b: ops.conv_transpose(x, w, b, stride=3, padding=1, output_padding=2, dilation=2, groups=3), (2, 3, 5), (3, 2, 3), (6,), id="1d"),
    row("max_pool2d", lambda x: ops.max_pool2d(x, 2), (2, 3, 6, 5), id="basic"),
    row("max_pool2d", lambda x: ops.max_pool2d(x, 3, stride=2, padding=1), (2, 2, 7, 6), id="pad"),
    row("max_pool2d", lambda x: ops.max_pool2d(x, (3, 2), stride=(1, 2), padding=(1, 1)), (1, 2, 5, 6), id="tuples"),
    row("max_pool2d", lambda x: ops.max_pool2d(x, 2, stride=1), POOL_TIES, id="ties"),
    row("avg_pool2d", lambda x: ops.avg_pool2d(x, 2), (2, 3, 6, 5), id="basic"),
    row("avg_pool2d", lambda x: ops.avg_pool2d(x, 3, stride=2, padding=1), (2, 2, 7, 6), id="pad-include"),
    row("avg_pool2d", lambda x: ops.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False), (2, 2, 7, 6), id="pad-exclude"),
    row("avg_pool2d", lambda x: ops.avg_pool2d(x, (2, 3), stride=(1, 2), padding=(1, 1), count_include_pad=False), (1, 2, 5, 6), id="tuples-exclude"),
    row("adaptive_avg_pool2d", lambda x: ops.adaptive_avg_pool2d(x, 3), (2, 2, 5, 7), id="uneven"),
    row("adaptive_avg_pool2d", lambda x: ops.adaptive_avg_pool2d(x, (2, 3)), (1, 2, 4, 6), id="even"),
    row("adaptive_avg_pool2d", lambda x: ops.adaptive_avg_pool2d(x, 1), (2, 3, 3, 4), id="global"),
]


def _params(rows):
    return [pytest.param(r, id=r.id) for r in rows]


def test_every_op_has_a_row():
    missing = sorted(set(ops.__all__) - {r.op for r in ROWS})
    assert not missing, f"ops without a jax test row: {missing}"


def check_forward(r: Row, dtype, seed=0):
    """Eager jax against the numpy backend."""
    arrays = [a.astype(dtype) for a in r.arrays(seed)]
    expected = r.fn(*arrays)  # numpy arrays dispatch to the numpy backend
    actual = r.fn(*(jnp.asarray(a) for a in arrays))
    assert backend_of(actual) == "jax", f"{r.id}: the result left jax ({type(actual).__name__})"
    assert_close(actual, expected, f"{r.id} forward {np.dtype(dtype).name}", **FORWARD_TOL[dtype])


def check_float64(r: Row, seed=2):
    """Compiled forward against numpy, and the gradient of <cot, output> against the tape.

    The loss is a random projection, as the harness uses: a plain sum would
    hide errors (softmax's input gradient of a sum is identically zero).
    """
    arrays = r.arrays(seed)
    expected = np.asarray(r.fn(*arrays))
    if not r.grad:
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


@pytest.mark.parametrize("r", _params(ROWS))
def test_float64_forward_and_gradient(r):
    check_float64(r)


@pytest.mark.parametrize("r", _params(ROWS))
def test_float32_forward(r):
    check_forward(r, np.float32)


# ---------------------------------------------------------------- conventions, against torch
def _conv_cases():
    for r in ROWS:
        if r.op in ("conv", "conv_transpose"):
            yield pytest.param(r, id=r.id)


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")  # torch's perf note
@pytest.mark.parametrize("r", list(_conv_cases()))
def test_convolutions_match_torch(r, monkeypatch):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    arrays = r.arrays(seed=3)
    actual = r.fn(*(jnp.asarray(a) for a in arrays))
    # The same call with torch's functional ops in place of gradcheck's.
    with_torch = {
        "conv": lambda x, w, bias=None, stride=1, padding=0, dilation=1, groups=1: (
            F.conv1d if x.ndim == 3 else F.conv2d)(x, w, bias, stride, padding, dilation, groups),
        "conv_transpose": lambda x, w, bias=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1: (
            F.conv_transpose1d if x.ndim == 3 else F.conv_transpose2d)(x, w, bias, stride, padding, output_padding, groups, dilation),
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


# ---------------------------------------------------------------- the comparison can fail
def test_negative_control_perturbed_value_fails():
    a = np.random.default_rng(0).standard_normal((3, 4))
    with pytest.raises(AssertionError):
        assert_close(a * (1 + 1e-8), a, "perturbed", **GRAD_TOL)
    with pytest.raises(AssertionError, match="dtype"):
        assert_close(a.astype(np.float32), a, "cast", rtol=1e-3, atol=1e-3)


def test_negative_control_wrong_gradient_fails(monkeypatch):
    from gradcheck.backends import jax_ops

    # Right value, wrong derivative (1 instead of cos x): only a gradient check sees it.
    monkeypatch.setattr(jax_ops, "sin", lambda x: jax.lax.stop_gradient(jnp.sin(x) - x) + x)
    r = next(r for r in ROWS if r.op == "sin")
    check_forward(r, np.float64)
    with pytest.raises(AssertionError, match="sin gradient of input 0"):
        check_float64(r)


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("call, error, match", [
    (lambda x: ops.getitem(x, np.array([0, 3])), IndexError, "out of bounds"),
    (lambda x: ops.take(x, np.array([4]), axis=1), IndexError, "shape \\(3, 4\\)"),
    (lambda x: ops.take(x, np.array([0]), axis=2), ValueError, "axis=2"),
    (lambda x: ops.getitem(x, np.array([0.0, 1.0])), TypeError, "float64"),
    (lambda x: ops.gelu(x, approximate="fast"), ValueError, "approximate"),
    (lambda x: ops.max_pool2d(x, 2), ValueError, "4-d NCHW"),
    (lambda x: ops.conv(ops.reshape(x, (1, 3, 4)), np.ones((2, 2, 3))), ValueError, "channels"),
    (lambda x: ops.conv_transpose(ops.reshape(x, (1, 3, 4)), np.ones((2, 2, 3))), ValueError, "3 channels"),
    (lambda x: ops.conv_transpose(ops.reshape(x, (1, 3, 4)), np.ones((3, 2, 3)), padding="same"), ValueError, "same"),
    (lambda x: ops.conv_transpose(ops.reshape(x, (1, 3, 4)), np.ones((3, 2, 3)), stride=2, output_padding=2), ValueError, "output_padding"),
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


def test_fresh_closures_reuse_a_compilation_only_for_equal_values():
    driver = JaxBackend()
    x = np.arange(3.0)
    calls = Calls()

    def make_loss(k, cots):  # a runner builds its loss anew for every call
        return lambda x: calls() or ops.sum(ops.mul(ops.sin(x), cots[0] * k))

    ones = [np.ones(3)]
    grads = [driver.evaluate(make_loss(k, cots), (x,)).grads["0"]
             for k, cots in ((1.0, ones), (3.0, ones), (1.0, [np.ones(3)]), (1.0, [-np.ones(3)]))]
    assert calls.n == 3, "equal code and closed-over values must not recompile"
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

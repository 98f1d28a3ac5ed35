"""Plain numpy forward implementations of ``gradcheck.ops``.

These are the values the tape computes (each tape primitive calls its forward
here) and what the float64 finite-difference referee evaluates.  No gradients.
Arguments arrive checked (``gradcheck/ops/rules.py`` holds the rules and
the geometry every backend shares).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from gradcheck.backends.numpy import kernels
from gradcheck.ops import rules as common


@functools.cache
def _erf():
    """scipy's erf, exact to float64 rounding; without scipy, ``math.erf`` per element (exact but slow).  Imported
    at the first call: importing scipy.special takes about 0.17 s of every process, and most models never call it."""
    try:
        from scipy.special import erf as scipy_erf
    except ImportError:  # pragma: no cover - exercised only without scipy
        scalar = np.frompyfunc(math.erf, 1, 1)

        def fallback(x):
            x = np.asarray(x)
            return scalar(x).astype(x.dtype if x.dtype.kind == "f" else np.float64)

        return fallback
    return scipy_erf


def to_numpy(x):
    return np.asarray(x)


def asarray(value, like=None, dtype=None):
    value = np.asarray(value)
    dtype = common.asarray_dtype(value, like, dtype)
    return value.astype(dtype, copy=False) if dtype is not None else value


def astype(x, dtype):
    return np.asarray(x).astype(dtype, copy=False)


def zeros_like(x):
    return np.zeros_like(x)


def stop_gradient(x):
    return x


def floats_win(a, b):
    """``a, b`` with an integer or bool array operand cast to the other operand's float dtype.

    numpy computes float32 with int64 (an array, or an ``np.int64`` scalar
    since NEP 50) in float64; torch and jax compute it in float32.  The tape
    runs on these functions, so without this a float32 model fed integer
    inputs or constants would silently compute, and be compared, in float64.
    Python ints and floats are already "weak" in numpy and need nothing.
    """
    da, db = getattr(a, "dtype", None), getattr(b, "dtype", None)
    if da is None or db is None or da == db:
        return a, b
    if da.kind == "f" and db.kind in "biu":
        return a, np.asarray(b, dtype=da)
    if db.kind == "f" and da.kind in "biu":
        return np.asarray(a, dtype=db), b
    return a, b


def _binary(ufunc):
    def run(a, b):
        return ufunc(*floats_win(a, b))

    run.__name__ = ufunc.__name__
    return run


add, sub, mul, div = _binary(np.add), _binary(np.subtract), _binary(np.multiply), _binary(np.true_divide)
maximum, minimum, pow = _binary(np.maximum), _binary(np.minimum), _binary(np.power)
neg = np.negative
exp, expm1, log, log1p, sqrt = np.exp, np.expm1, np.log, np.log1p, np.sqrt
abs, sin, cos, tanh, atan = np.abs, np.sin, np.cos, np.tanh, np.arctan
greater, less, equal = np.greater, np.less, np.equal


def where(condition, a, b):
    return np.where(condition, *floats_win(a, b))


def erf(x):
    x = np.asarray(x)
    return _erf()(x).astype(x.dtype, copy=False)


def sigmoid(x):
    # exp(-|x|) never overflows; both branches are the same function.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(np.result_type(x), copy=False)


def relu(x):
    return np.maximum(x, 0)


def softplus(x):
    return np.logaddexp(0, x).astype(np.result_type(x), copy=False)


def matmul(a, b):
    return np.matmul(*floats_win(a, b))


def einsum(subscripts, *operands):
    # The explicit equation: numpy's own einsum refuses an output that drops '...' (torch sums over those dims).
    equation, targets = common.einsum_plan(subscripts, [np.shape(x) for x in operands])
    operands = [x if t is None else np.broadcast_to(x, t) for x, t in zip(operands, targets, strict=True)]
    return np.einsum(equation, *operands, optimize=len(operands) > 2)


def sum(x, axis=None, keepdims=False):
    return np.sum(x, axis=common.axis_arg(axis), keepdims=keepdims)


def max(x, axis=None, keepdims=False):
    return np.max(x, axis=common.axis_arg(axis), keepdims=keepdims)


def min(x, axis=None, keepdims=False):
    return np.min(x, axis=common.axis_arg(axis), keepdims=keepdims)


def prod(x, axis=None, keepdims=False):
    return np.prod(x, axis=common.axis_arg(axis), keepdims=keepdims)


def topk_indices(x, k, axis=-1, largest=True) -> np.ndarray:
    """The positions along ``axis`` of the ``k`` largest (or smallest) values, best first (int64).

    A stable sort, so that among equal values the first position comes
    first; NaN counts as the largest value, as in torch.
    """
    x = np.asarray(x)
    key = np.where(np.isnan(x), -np.inf, -x) if largest else np.where(np.isnan(x), np.inf, x)
    order = np.argsort(key, axis=axis, kind="stable")
    return np.take(order, np.arange(k), axis=axis).astype(np.int64)


def topk(x, k, axis=-1, largest=True):
    index = topk_indices(x, k, axis, largest)
    return np.take_along_axis(np.asarray(x), index, axis=axis), index


def _shift(x, axis):
    """The max over ``axis`` (kept), the usual shift for exp; -inf over an empty axis.

    An empty axis has no maximum; torch and jax give what the formulas give
    then: an empty softmax and a logsumexp of -inf (the log of an empty sum).
    """
    if np.size(x):
        return np.max(x, axis=axis, keepdims=True)
    return np.max(x, axis=axis, keepdims=True, initial=-np.inf)


def logsumexp(x, axis=None, keepdims=False):
    axis = common.axis_arg(axis)
    m = _shift(x, axis)
    m = np.where(np.isfinite(m), m, 0)
    with np.errstate(divide="ignore"):  # log(0) = -inf is the answer over an empty axis
        out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def softmax(x, axis=-1):
    axis = common.axis_arg(axis)
    e = np.exp(x - _shift(x, axis))
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    return x - logsumexp(x, axis=axis, keepdims=True)


def normalize(x, axes, eps, weight=None, bias=None):
    """The fused forward (the referee's float64 passes go through every BatchNorm)."""
    mean, var, centred, rstd = kernels.normalize_stats(x, common.normal_axes("normalize", axes, x.shape), eps)
    return kernels.normalize_apply(centred, rstd, weight, bias), mean, var


def reshape(x, shape):
    return np.reshape(x, shape)


def transpose(x, axes=None):
    return np.transpose(x, axes)


def broadcast_to(x, shape):
    return np.broadcast_to(x, shape)


def concatenate(xs, axis=0):
    return np.concatenate(xs, axis=axis)


def stack(xs, axis=0):
    return np.stack(xs, axis=axis)


def getitem(x, index):
    return np.asarray(x)[index]


def pad(x, pad_width, value=0.0):
    return np.pad(x, common.pad_pairs(np.shape(x), pad_width), constant_values=value)


# ---------------------------------------------------------------- convolution
def _as2d(x, nd):
    return x[:, :, None, :] if nd == 1 else x


def _from2d(y, nd):
    return y[:, :, 0, :] if nd == 1 else y


def _add_bias(y, bias):
    if bias is None:
        return y
    return y + np.reshape(bias, common.channel_shape(y.ndim))


def conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    g, nd = common.conv_geometry(x.shape, w.shape, stride, padding, dilation, groups)
    return _add_bias(_from2d(kernels.conv2d(_as2d(x, nd), _as2d(w, nd), g), nd), bias)


def conv_transpose(x, w, bias=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    g, nd = common.transposed_geometry(x.shape, w.shape, stride, padding, output_padding, dilation, groups)
    return _add_bias(_from2d(kernels.conv2d_input_grad(_as2d(x, nd), _as2d(w, nd), g), nd), bias)


def max_pool2d(x, kernel_size, stride=None, padding=0):
    return kernels.max_pool2d(x, common.pool_geometry("max_pool2d", x.shape, kernel_size, stride, padding))

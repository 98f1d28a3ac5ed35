"""Plain numpy forward implementations of ``gradcheck.ops``.

These are the values the tape computes (each tape primitive calls its forward
here) and what the float64 finite-difference referee evaluates.  No gradients.
"""

from __future__ import annotations

import builtins
import dataclasses
import math

import numpy as np

from gradcheck import kernels

try:  # scipy's erf is exact to float64 rounding; the fallback is exact but slow.
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover - exercised only without scipy
    _erf_scalar = np.frompyfunc(math.erf, 1, 1)

    def _erf(x):
        x = np.asarray(x)
        return _erf_scalar(x).astype(x.dtype if x.dtype.kind == "f" else np.float64)


def to_numpy(x):
    return np.asarray(x)


def asarray(value, like=None, dtype=None):
    value = np.asarray(value)
    dtype = asarray_dtype(value, like, dtype)
    return value.astype(dtype, copy=False) if dtype is not None else value


def asarray_dtype(value, like=None, dtype=None):
    """The dtype ``asarray`` casts ``value`` to, or None to keep its own.

    ``dtype`` if given; else a float value takes ``like``'s float dtype (a
    float constant next to an int array keeps its own).
    """
    if dtype is not None:
        return np.dtype(dtype)
    if like is None or np.result_type(value).kind != "f":
        return None
    like_dtype = np.asarray(like).dtype if not hasattr(like, "dtype") else np.dtype(like.dtype)
    return like_dtype if like_dtype.kind == "f" else None


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
abs, sin, cos, tanh = np.abs, np.sin, np.cos, np.tanh
greater, less, equal = np.greater, np.less, np.equal


def where(condition, a, b):
    return np.where(condition, *floats_win(a, b))


def erf(x):
    x = np.asarray(x)
    return _erf(x).astype(x.dtype, copy=False)


def sigmoid(x):
    # exp(-|x|) never overflows; both branches are the same function.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(np.result_type(x), copy=False)


def relu(x):
    return np.maximum(x, 0)


def softplus(x):
    return np.logaddexp(0, x).astype(np.result_type(x), copy=False)


def matmul(a, b):
    check_matmul(np.shape(a), np.shape(b))
    return np.matmul(*floats_win(a, b))


def check_matmul(a_shape, b_shape):
    """Refuse operands ``a @ b`` cannot take, naming both shapes and the rule they break."""
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    if not a_shape or not b_shape:
        raise ValueError(f"matmul: shapes {a_shape} and {b_shape}: a 0-d operand cannot be matrix-multiplied; use mul")
    k_a = a_shape[-1]
    k_b = b_shape[0] if len(b_shape) == 1 else b_shape[-2]
    if k_a != k_b:
        which = "only" if len(b_shape) == 1 else "second-to-last"
        raise ValueError(
            f"matmul: shapes {a_shape} and {b_shape} do not match: the first's last axis ({k_a}) "
            f"must equal the second's {which} axis ({k_b})"
        )
    try:
        np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    except ValueError:
        raise ValueError(
            f"matmul: shapes {a_shape} and {b_shape}: batch dimensions {a_shape[:-2]} and {b_shape[:-2]} "
            "do not broadcast"
        ) from None


def einsum(subscripts, *operands):
    return np.einsum(subscripts, *operands, optimize=len(operands) > 2)


def sum(x, axis=None, keepdims=False):
    return np.sum(x, axis=_axis(axis), keepdims=keepdims)


def max(x, axis=None, keepdims=False):
    return np.max(x, axis=_axis(axis), keepdims=keepdims)


def min(x, axis=None, keepdims=False):
    return np.min(x, axis=_axis(axis), keepdims=keepdims)


def _shift(x, axis):
    """The max over ``axis`` (kept), the usual shift for exp; -inf over an empty axis.

    An empty axis has no maximum; torch and jax give what the formulas give
    then: an empty softmax and a logsumexp of -inf (the log of an empty sum).
    """
    if np.size(x):
        return np.max(x, axis=axis, keepdims=True)
    return np.max(x, axis=axis, keepdims=True, initial=-np.inf)


def logsumexp(x, axis=None, keepdims=False):
    axis = _axis(axis)
    m = _shift(x, axis)
    m = np.where(np.isfinite(m), m, 0)
    with np.errstate(divide="ignore"):  # log(0) = -inf is the answer over an empty axis
        out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def softmax(x, axis=-1):
    e = np.exp(x - _shift(x, axis))
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    return x - logsumexp(x, axis=axis, keepdims=True)


def normalize(x, axes, eps, weight=None, bias=None):
    """The fused forward (the referee's float64 passes go through every BatchNorm)."""
    from gradcheck.ops import check_normalize_affine

    check_normalize_affine(x.shape, weight, bias)
    mean, var, centred, rstd = kernels.normalize_stats(x, kernels.reduced_axes(axes, x.ndim), eps)
    return kernels.normalize_apply(centred, rstd, weight, bias), mean, var


def _axis(axis):
    return tuple(axis) if isinstance(axis, list) else axis


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
    return np.asarray(x)[check_index(index)]


def check_index(index, op="getitem"):
    """``index`` unchanged if numpy can index with it; a float array index is refused by name."""
    for item in index if isinstance(index, tuple) else (index,):
        dtype = getattr(item, "dtype", None)
        if dtype is not None and np.dtype(dtype).kind not in "biu":
            raise TypeError(
                f"{op}: an index array of dtype {dtype} (shape {tuple(np.shape(item))}); expected an integer "
                "or bool array, ints or slices (cast float indices with .astype(np.int64))"
            )
    return index


def pad(x, pad_width, value=0.0):
    return np.pad(x, pad_pairs(np.shape(x), pad_width), constant_values=value)


def pad_pairs(shape, pad_width):
    """``pad_width`` in any of numpy's forms as one ``(before, after)`` pair per axis.

    The tape's VJP reads one pair per axis, and torch and jax accept numpy's
    broadcast forms (``1``, ``((1, 2),)``), so every backend normalises alike.
    """
    try:
        pairs = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (len(shape), 2))
    except (ValueError, TypeError):
        raise ValueError(
            f"pad: pad_width {pad_width!r} for an input of shape {tuple(shape)}; expected one "
            f"(before, after) pair of ints per axis ({len(shape)} pairs) or a form numpy broadcasts to that"
        ) from None
    if (pairs < 0).any():
        raise ValueError(f"pad: pad_width {pad_width!r} has a negative width; padding does not crop")
    return tuple((int(b), int(a)) for b, a in pairs)


# ---------------------------------------------------------------- convolution
def conv_geometry(x_shape, w_shape, stride, padding, dilation, groups):
    """Geometry of a 1-d or 2-d convolution, with 1-d lifted to 2-d (unit height)."""
    nd = len(x_shape) - 2
    if nd not in (1, 2) or len(w_shape) != nd + 2:
        raise ValueError(
            f"conv: input {tuple(x_shape)} and weight {tuple(w_shape)}: expected NCL with "
            "(out, in/groups, k) or NCHW with (out, in/groups, kh, kw)"
        )
    if x_shape[1] != w_shape[1] * groups:
        raise ValueError(
            f"conv: input {tuple(x_shape)} has {x_shape[1]} channels but weight {tuple(w_shape)} with "
            f"groups={groups} expects {w_shape[1] * groups}; the weight is (out, in/groups, *kernel)"
        )
    if nd == 1:
        given = (tuple(x_shape), tuple(w_shape))
        x_shape, w_shape = _lift(x_shape), _lift(w_shape)
        stride, dilation = (1, kernels.pair(stride, 1, "stride")[0]), (1, kernels.pair(dilation, 1, "dilation")[0])
        if not isinstance(padding, str):
            padding = (0, kernels.pair(padding, 1, "padding")[0])
        try:
            return kernels.geometry(x_shape, w_shape, stride, padding, dilation, groups), nd
        except ValueError as exc:  # the kernels speak 2-d: say which 1-d shapes were meant
            raise ValueError(f"{exc} [1-d input {given[0]} and weight {given[1]}, lifted to unit height]") from None
    return kernels.geometry(x_shape, w_shape, stride, padding, dilation, groups), nd


def _lift(shape):
    return tuple(shape[:2]) + (1,) + tuple(shape[2:])


def _as2d(x, nd):
    return x[:, :, None, :] if nd == 1 else x


def _from2d(y, nd):
    return y[:, :, 0, :] if nd == 1 else y


def _add_bias(y, bias):
    if bias is None:
        return y
    return y + np.reshape(bias, (1, -1) + (1,) * (y.ndim - 2))


def conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    g, nd = conv_geometry(x.shape, w.shape, stride, padding, dilation, groups)
    return _add_bias(_from2d(kernels.conv2d(_as2d(x, nd), _as2d(w, nd), g), nd), bias)


def transposed_geometry(x_shape, w_shape, stride, padding, output_padding, dilation, groups):
    """The geometry of the convolution that a transposed convolution is the adjoint of."""
    nd = len(x_shape) - 2
    if nd not in (1, 2) or len(w_shape) != nd + 2:
        raise ValueError(
            f"conv_transpose: input {tuple(x_shape)} and weight {tuple(w_shape)}: expected NCL with "
            "(in, out/groups, k) or NCHW with (in, out/groups, kh, kw)"
        )
    if x_shape[1] != w_shape[0]:
        raise ValueError(
            f"conv_transpose: input {tuple(x_shape)} has {x_shape[1]} channels but weight {tuple(w_shape)} "
            f"expects {w_shape[0]}; a transposed convolution's weight is (in, out/groups, *kernel)"
        )
    ks = w_shape[2:]
    s, p, d, op = (kernels.pair(v, nd, name) for v, name in ((stride, "stride"), (padding, "padding"), (dilation, "dilation"), (output_padding, "output_padding")))
    # builtins: this module's own `max` is the numpy reduction.
    if builtins.any(o >= builtins.max(si, di) for o, si, di in zip(op, s, d)):
        raise ValueError(f"conv_transpose: output_padding={op} must be smaller than stride {s} or dilation {d}")
    out_spatial = tuple((i - 1) * si - 2 * pi + di * (k - 1) + oi + 1 for i, si, pi, di, k, oi in zip(x_shape[2:], s, p, d, ks, op))
    if builtins.min(out_spatial) < 1:
        raise ValueError(
            f"conv_transpose: input {tuple(x_shape)} with weight {tuple(w_shape)}, stride {s}, padding {p}, "
            f"dilation {d}, output_padding {op} gives an empty output {out_spatial}; reduce the padding"
        )
    y_shape = (x_shape[0], w_shape[1] * groups) + out_spatial
    geom, nd = conv_geometry(y_shape, w_shape, s, p, d, groups)
    # The adjoint convolution crops `padding` before and `padding - output_padding`
    # after, so that it maps the output back onto exactly the input's size.  A
    # negative crop (output_padding > padding, possible when dilation > stride)
    # means rows past every window: zeros in the transposed convolution.
    pads = tuple((pi, pi - oi) for pi, oi in zip(p, op))
    return dataclasses.replace(geom, pads=((0, 0),) + pads if nd == 1 else pads), nd


def conv_transpose(x, w, bias=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    g, nd = transposed_geometry(x.shape, w.shape, stride, padding, output_padding, dilation, groups)
    return _add_bias(_from2d(kernels.conv2d_input_grad(_as2d(x, nd), _as2d(w, nd), g), nd), bias)


def max_pool2d(x, kernel_size, stride=None, padding=0):
    return kernels.max_pool2d(x, kernels.pool_geometry(x.shape, kernel_size, stride, padding))

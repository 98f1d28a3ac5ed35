"""JAX implementations of ``gradcheck.ops`` (jax.numpy, jax.lax, jax.nn).

Semantics follow PyTorch and numpy exactly, including at the points where
JAX's own conventions differ:

* ``abs``: jax differentiates ``|x|`` at 0 as 1; torch (and the tape) as 0.
* ``leaky_relu``: ``jax.nn.leaky_relu`` takes the identity branch at 0;
  torch takes the sloped one (gradient ``negative_slope`` at 0).
* integer-array indexing: jax clamps out-of-bounds indices silently; numpy
  raises, and so do we whenever the index is a concrete array.

Convolutions take their geometry (and its validation and error messages)
from the numpy backend, so both backends accept and reject the same
arguments.  This module is imported only when a jax array reaches an op or
the jax backend is asked for.
"""

from __future__ import annotations

import builtins

import jax
import jax.numpy as jnp
import jax.scipy.special
import numpy as np
from jax import lax

from gradcheck import kernels
from gradcheck.backends import numpy_ops as npo

# Full float32/float64 accuracy in products: the point is to compare numbers.
_HIGHEST = lax.Precision.HIGHEST
_CONV_DIMS = {1: ("NCH", "OIH", "NCH"), 2: ("NCHW", "OIHW", "NCHW")}


def _is_traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


# ---------------------------------------------------------------- arrays
def to_numpy(x):
    if _is_traced(x):
        raise TypeError(
            f"to_numpy: got a traced jax value ({type(x).__name__}, shape {tuple(x.shape)}) inside a "
            "transformed function; its value is not known yet. Compute with gradcheck.ops instead, "
            "or evaluate with jit=False if the value is needed eagerly"
        )
    return np.asarray(x)


def asarray(value, like=None, dtype=None):
    """``value`` as a jax array; a float value takes ``like``'s float dtype.

    With float64 enabled, a Python or numpy float64 constant would otherwise
    promote float32 activations to float64.
    """
    if dtype is None and like is not None:
        value_kind = np.dtype(value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype).kind
        like_dtype = np.dtype(like.dtype)
        if value_kind == "f" and like_dtype.kind == "f":
            dtype = like_dtype
    return jnp.asarray(value, dtype=dtype)


def astype(x, dtype):
    return jnp.asarray(x).astype(dtype)


def zeros_like(x):
    return jnp.zeros_like(x)


def stop_gradient(x):
    return lax.stop_gradient(x)


# ---------------------------------------------------------------- elementwise
add, sub, mul, div, neg = jnp.add, jnp.subtract, jnp.multiply, jnp.true_divide, jnp.negative
maximum, minimum = jnp.maximum, jnp.minimum  # jax splits the gradient evenly at ties, as torch
exp, expm1, log, log1p, sqrt = jnp.exp, jnp.expm1, jnp.log, jnp.log1p, jnp.sqrt
sin, cos, tanh = jnp.sin, jnp.cos, jnp.tanh
sigmoid, relu, silu, softplus = jax.nn.sigmoid, jax.nn.relu, jax.nn.silu, jax.nn.softplus
erf = jax.scipy.special.erf
greater, less, equal = jnp.greater, jnp.less, jnp.equal


def pow(a, b):
    # A Python int exponent becomes lax.integer_pow; the gradient in b at
    # a == 0 is 0 in jax, as in torch.
    return jnp.power(a, b)


def where(cond, a, b):
    return jnp.where(cond, a, b)


def abs(x):
    # x * sign(x) is |x| exactly, and its derivative is sign(x), which is 0
    # at 0 as in torch; jnp.abs would give 1 there.
    return x * lax.stop_gradient(jnp.sign(x))


def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


def elu(x, alpha=1.0):
    # The inner where keeps expm1 away from large positive x, whose overflow
    # would turn the unused branch's gradient into 0 * inf = nan.
    positive = x > 0
    return jnp.where(positive, x, alpha * jnp.expm1(jnp.where(positive, 0.0, x)))


def gelu(x, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate={approximate!r}; expected 'none' or 'tanh'")
    return jax.nn.gelu(x, approximate=approximate == "tanh")


# ---------------------------------------------------------------- linear algebra
def matmul(a, b):
    return jnp.matmul(a, b, precision=_HIGHEST)


def einsum(subscripts, *operands):
    return jnp.einsum(subscripts, *operands, precision=_HIGHEST)


# ---------------------------------------------------------------- reductions
def _axis(axis):
    return tuple(axis) if isinstance(axis, list) else axis


def sum(x, axis=None, keepdims=False):
    return jnp.sum(x, axis=_axis(axis), keepdims=keepdims)


def mean(x, axis=None, keepdims=False):
    return jnp.mean(x, axis=_axis(axis), keepdims=keepdims)


def var(x, axis=None, keepdims=False, ddof=0):
    return jnp.var(x, axis=_axis(axis), keepdims=keepdims, ddof=ddof)


def max(x, axis=None, keepdims=False):
    # jax's reduce_max gradient splits evenly among tied maxima, like torch.amax.
    return jnp.max(x, axis=_axis(axis), keepdims=keepdims)


def min(x, axis=None, keepdims=False):
    return jnp.min(x, axis=_axis(axis), keepdims=keepdims)


def logsumexp(x, axis=None, keepdims=False):
    return jax.nn.logsumexp(x, axis=_axis(axis), keepdims=keepdims)


def softmax(x, axis=-1):
    return jax.nn.softmax(x, axis=axis)


def log_softmax(x, axis=-1):
    return jax.nn.log_softmax(x, axis=axis)


# ---------------------------------------------------------------- shapes
def reshape(x, shape):
    return jnp.reshape(x, shape)


def transpose(x, axes=None):
    return jnp.transpose(x, axes)


def broadcast_to(x, shape):
    return jnp.broadcast_to(x, shape)


def concatenate(xs, axis=0):
    return jnp.concatenate(xs, axis=axis)


def stack(xs, axis=0):
    return jnp.stack(xs, axis=axis)


def getitem(x, index):
    index = npo.check_index(_normalise_index(index))
    _check_bounds(x, index)
    # x may be a numpy constant indexed by traced ids (an embedding table held fixed).
    return jnp.asarray(x)[index]


def take(x, indices, axis=0):
    ndim = len(x.shape)
    if not -ndim <= axis < ndim:
        raise ValueError(f"take: axis={axis} is out of range for an array of shape {tuple(x.shape)}")
    return getitem(x, (slice(None),) * (axis % ndim) + (indices,))


def _normalise_index(index):
    """numpy treats a list in an index as an integer (or boolean) array; jax rejects lists."""
    if isinstance(index, list):
        return np.asarray(index)
    if isinstance(index, tuple):
        return tuple(np.asarray(i) if isinstance(i, list) else i for i in index)
    return index


def _check_bounds(x, index):
    """Validate a concrete index with numpy, which raises where jax would clamp silently.

    Indexing a zero-stride view of ``x``'s shape costs no memory for slices
    and one byte per selected element for integer arrays.
    """
    items = index if isinstance(index, tuple) else (index,)
    if builtins.any(_is_traced(i) for i in items):
        return  # a traced index (token ids inside jit) cannot be checked here
    items = tuple(np.asarray(i) if isinstance(i, jax.Array) else i for i in items)
    probe = np.broadcast_to(np.zeros((), dtype=bool), tuple(x.shape))
    try:
        probe[items if isinstance(index, tuple) else items[0]]
    except IndexError as exc:
        raise IndexError(
            f"getitem: index {_describe_index(index)} is invalid for shape {tuple(x.shape)}: {exc}"
        ) from None


def _describe_index(index):
    items = index if isinstance(index, tuple) else (index,)
    parts = [f"{i.dtype} array{tuple(np.shape(i))}" if hasattr(i, "dtype") and np.ndim(i) else repr(i) for i in items]
    return "[" + ", ".join(parts) + "]"


def pad(x, pad_width, value=0.0):
    return jnp.pad(x, pad_width, mode="constant", constant_values=value)


# ---------------------------------------------------------------- convolution
def _shape(x):
    return tuple(int(d) for d in x.shape)


def _common_float(x, w):
    """lax convolutions need one dtype; promote as numpy (and the other backends) would."""
    dtype = jnp.result_type(x, w)
    return jnp.asarray(x, dtype), jnp.asarray(w, dtype)


def _add_bias(y, bias):
    if bias is None:
        return y
    return y + jnp.reshape(bias, (1, -1) + (1,) * (y.ndim - 2))


def conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    # The numpy geometry validates the arguments and resolves torch's padding
    # forms; 1-d is lifted to 2-d there, so keep the last nd entries.
    g, nd = npo.conv_geometry(_shape(x), _shape(w), stride, padding, dilation, groups)
    x, w = _common_float(x, w)
    y = lax.conv_general_dilated(
        x, w,
        window_strides=g.stride[-nd:],
        padding=g.pads[-nd:],
        rhs_dilation=g.dilation[-nd:],
        dimension_numbers=_CONV_DIMS[nd],
        feature_group_count=groups,
        precision=_HIGHEST,
    )
    return _add_bias(y, bias)


def conv_transpose(x, w, bias=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    """torch's ``conv_transpose{1,2}d``: a stride-1 convolution of the ``stride``-dilated input.

    The kernel is flipped spatially and regrouped from torch's
    ``(in, out/groups, k...)`` to the forward layout ``(out, in/groups, k...)``;
    each side is padded by ``dilation*(k-1) - padding`` (negative values crop),
    plus ``output_padding`` at the end.
    """
    if isinstance(padding, str):
        raise ValueError(
            f"conv_transpose: padding={padding!r}; torch's transposed convolutions take an int or "
            "a tuple of ints, not 'same'/'valid'"
        )
    xs, ws = _shape(x), _shape(w)
    if len(xs) == len(ws) and len(xs) > 1 and xs[1] != ws[0]:
        raise ValueError(
            f"conv_transpose: input {xs} has {xs[1]} channels but weight {ws} expects {ws[0]}; "
            "a transposed-convolution weight is (in, out/groups, *kernel)"
        )
    npo.transposed_geometry(xs, ws, stride, padding, output_padding, dilation, groups)  # validates the rest
    nd = len(xs) - 2
    s, p, d, op = (kernels.pair(v, nd, name) for v, name in (
        (stride, "stride"), (padding, "padding"), (dilation, "dilation"), (output_padding, "output_padding")))
    kernel = ws[2:]
    pads = [(di * (k - 1) - pi, di * (k - 1) - pi + oi) for k, pi, di, oi in zip(kernel, p, d, op, strict=True)]
    x, w = _common_float(x, w)
    cin, cout_g = ws[0], ws[1]
    w = jnp.reshape(w, (groups, cin // groups, cout_g) + kernel)
    w = jnp.reshape(jnp.swapaxes(w, 1, 2), (groups * cout_g, cin // groups) + kernel)
    w = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
    y = lax.conv_general_dilated(
        x, w,
        window_strides=(1,) * nd,
        padding=pads,
        lhs_dilation=s,
        rhs_dilation=d,
        dimension_numbers=_CONV_DIMS[nd],
        feature_group_count=groups,
        precision=_HIGHEST,
    )
    return _add_bias(y, bias)


# ---------------------------------------------------------------- pooling
def _pool_geometry(x, kernel_size, stride, padding, name):
    if len(x.shape) != 4:
        raise ValueError(f"{name}: input of shape {_shape(x)}; expected 4-d NCHW")
    return kernels.pool_geometry(_shape(x), kernel_size, stride, padding)


def _window_reduce(x, g, init, op):
    return lax.reduce_window(
        x, np.array(init, dtype=x.dtype), op,
        window_dimensions=(1, 1, g.kh, g.kw),
        window_strides=(1, 1) + g.stride,
        padding=((0, 0), (0, 0)) + g.pads,
    )


def max_pool2d(x, kernel_size, stride=None, padding=0):
    # reduce_window with a -inf identity is jax's differentiable window max;
    # its gradient goes to the first maximum of each window, as torch's does.
    g = _pool_geometry(x, kernel_size, stride, padding, "max_pool2d")
    return _window_reduce(x, g, -np.inf, lax.max)


def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    g = _pool_geometry(x, kernel_size, stride, padding, "avg_pool2d")
    scale = np.full((g.oh, g.ow), 1.0 / (g.kh * g.kw))
    if not count_include_pad:
        scale = scale * kernels.avg_pool_correction(g)
    return _window_reduce(x, g, 0, lax.add) * jnp.asarray(scale, dtype=x.dtype)

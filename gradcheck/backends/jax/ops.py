"""JAX implementations of ``gradcheck.ops`` (jax.numpy, jax.lax, jax.nn).

Semantics follow PyTorch and numpy exactly, including at the points where
JAX's own conventions differ:

* ``abs``: jax differentiates ``|x|`` at 0 as 1; torch (and the tape) as 0.
* ``leaky_relu``: ``jax.nn.leaky_relu`` takes the identity branch at 0;
  torch takes the sloped one (gradient ``negative_slope`` at 0).
* integer-array indexing: jax clamps out-of-bounds indices silently; numpy
  raises, and so does every backend whenever the index is concrete (the
  rule in ``common`` checks it before jax sees it).

Activations are jax.nn's own (``jax.nn.elu`` included: its gradient at 0 is
``alpha``, as torch's), except for the two kinks above.  Convolutions are
``lax.conv_general_dilated`` and pools ``lax.reduce_window``; their geometry
is ``common``'s, the one every backend computes with.  Arguments arrive
checked by ``common``'s rules, so jax refuses what the others refuse, in the
same words.

The framework kernels (``linear``, the normalisations, attention,
``embedding``, the losses) are written as the jax model libraries write
them, each naming the library it follows: flax's ``Dense``, ``BatchNorm``,
``RMSNorm`` and ``Embed``, equinox's ``LayerNorm`` and ``GroupNorm``,
``jax.nn.dot_product_attention`` (flax's ``dot_product_attention`` where
that cannot run: float64, a given dropout mask), optax's losses.  A check of
them is then a check of what a jax model runs, not of a composition that
agrees more easily.

This module is imported only when a jax array reaches an op or the jax
backend is asked for.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.special
import numpy as np
from jax import lax

from gradcheck.backends.numpy import kernels
from gradcheck.ops import rules as common

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
    return jnp.asarray(value, dtype=common.asarray_dtype(value, like, dtype))


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
sin, cos, tanh, atan = jnp.sin, jnp.cos, jnp.tanh, jnp.arctan
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
    # jax.nn.elu takes the expm1 branch at 0 (gradient alpha, as torch's
    # elu_backward) and keeps expm1 away from large positive x.
    return jax.nn.elu(x, alpha)


def gelu(x, approximate="none"):
    return jax.nn.gelu(x, approximate=approximate == "tanh")


# ---------------------------------------------------------------- linear algebra
def matmul(a, b):
    return jnp.matmul(a, b, precision=_HIGHEST)


def einsum(subscripts, *operands):
    return jnp.einsum(subscripts, *operands, precision=_HIGHEST)


# ---------------------------------------------------------------- reductions
def sum(x, axis=None, keepdims=False):
    return jnp.sum(x, axis=common.axis_arg(axis), keepdims=keepdims)


def mean(x, axis=None, keepdims=False):
    return jnp.mean(x, axis=common.axis_arg(axis), keepdims=keepdims)


def var(x, axis=None, keepdims=False, ddof=0):
    return jnp.var(x, axis=common.axis_arg(axis), keepdims=keepdims, ddof=ddof)


def max(x, axis=None, keepdims=False):
    # jax's reduce_max gradient splits evenly among tied maxima, like torch.amax.
    return jnp.max(x, axis=common.axis_arg(axis), keepdims=keepdims)


def min(x, axis=None, keepdims=False):
    return jnp.min(x, axis=common.axis_arg(axis), keepdims=keepdims)


def prod(x, axis=None, keepdims=False):
    # jax's reduce_prod differentiates with the products of the others, so zeros are exact, as in torch.
    return jnp.prod(x, axis=common.axis_arg(axis), keepdims=keepdims)


def topk(x, k, axis=-1, largest=True):
    """``lax.top_k`` (largest, along the last axis) with the axis moved there, negated for the smallest."""
    moved = jnp.moveaxis(x, axis, -1)
    values, indices = lax.top_k(moved if largest else -moved, int(k))
    values = values if largest else -values
    return jnp.moveaxis(values, -1, axis), jnp.moveaxis(indices.astype(jnp.int64), -1, axis)


def logsumexp(x, axis=None, keepdims=False):
    return jax.nn.logsumexp(x, axis=common.axis_arg(axis), keepdims=keepdims)


def softmax(x, axis=-1):
    return jax.nn.softmax(x, axis=common.axis_arg(axis))


def log_softmax(x, axis=-1):
    return jax.nn.log_softmax(x, axis=common.axis_arg(axis))


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
    index = _normalise_index(index)
    # x may be a numpy constant indexed by traced ids (an embedding table held fixed).
    return jnp.asarray(x)[index]


def take(x, indices, axis=0):
    ndim = len(x.shape)
    return getitem(x, (slice(None),) * (axis % ndim) + (indices,))


def _normalise_index(index):
    """numpy treats a list in an index as an integer (or boolean) array; jax rejects lists."""
    if isinstance(index, list):
        return np.asarray(index)
    if isinstance(index, tuple):
        return tuple(np.asarray(i) if isinstance(i, list) else i for i in index)
    return index


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
    return y + jnp.reshape(bias, common.channel_shape(y.ndim))


def conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    # The shared geometry resolves torch's padding forms; 1-d is lifted to 2-d
    # there, so keep the last nd entries.
    g, nd = common.conv_geometry(_shape(x), _shape(w), stride, padding, dilation, groups)
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
    xs, ws = _shape(x), _shape(w)
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
    g = common.pool_geometry("max_pool2d", _shape(x), kernel_size, stride, padding)
    return _window_reduce(x, g, -np.inf, lax.max)


def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    g = common.pool_geometry("avg_pool2d", _shape(x), kernel_size, stride, padding)
    scale = np.full((g.oh, g.ow), 1.0 / (g.kh * g.kw))
    if not count_include_pad:
        scale = scale * kernels.avg_pool_correction(g)
    return _window_reduce(x, g, 0, lax.add) * jnp.asarray(scale, dtype=x.dtype)


# ---------------------------------------------------------------- framework kernels
# What the kernels call from jax, as module names: a test swaps one for a
# version with a wrong backward and sees the checks fail, which shows the
# backend routes through it.  jax.nn.dot_product_attention is jax >= 0.4.31.
_attention = getattr(jax.nn, "dot_product_attention", None)
_softmax = jax.nn.softmax
_log_softmax = jax.nn.log_softmax
_log_sigmoid = jax.nn.log_sigmoid
_rsqrt = lax.rsqrt


def _constant_like(c, x):
    """A numpy (or Python) float constant in ``x``'s float dtype, as ``ops.asarray(c, like=x)``; jax arrays as given."""
    if c is None or isinstance(c, jax.Array):
        return c
    c = np.asarray(c)
    return jnp.asarray(c, dtype=x.dtype if c.dtype.kind == "f" and jnp.issubdtype(x.dtype, jnp.floating) else None)


def _feature_shape(x):
    """(1, C, 1, ...): a per-channel vector broadcast along axis 1 of an (N, C, ...) array."""
    return common.channel_shape(x.ndim, x.shape[1])


def linear(x, weight, bias=None):
    """flax.linen.Dense: ``lax.dot_general`` contracting x's last axis, then the bias along the last axis.

    The weight is torch's ``(out, in)``, so its axis 1 is contracted where
    flax's ``(in, out)`` kernel contracts axis 0.
    """
    x, weight = _common_float(x, weight)
    y = lax.dot_general(x, weight, (((x.ndim - 1,), (weight.ndim - 1,)), ((), ())), precision=_HIGHEST)
    if bias is None:
        return y
    return y + jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,)) if y.ndim else y + bias


def _flax_normalize(x, mean, var, eps, weight, bias):
    """flax.linen.normalization._normalize: ``(x - mean) * (rsqrt(var + eps) * scale) + bias``."""
    y = x - mean
    mul = _rsqrt(var + eps)
    if weight is not None:
        mul = mul * weight
    y = y * mul
    return y if bias is None else y + bias


def batch_norm(x, running_mean=None, running_var=None, weight=None, bias=None, training=True, momentum=0.1,
               eps=1e-5):
    """flax.linen.BatchNorm's formulation on torch's (N, C, ...) layout and torch's running-statistics rule.

    Training: flax's ``_compute_stats`` with ``use_fast_variance=False``
    (the mean, then the mean of squared deviations; flax's default
    ``E[x^2] - E[x]^2`` loses float32 digits that the two-pass form keeps),
    then ``_normalize``.  Evaluation: ``_normalize`` with the running
    statistics.  The running statistics update as torch's (``momentum`` is the
    weight of the new batch, the opposite of flax's, and the variance is
    unbiased), under ``stop_gradient`` as torch updates them under no_grad,
    and keep their own dtype; ``momentum`` may be a 0-d array.
    """
    axes = (0,) + tuple(range(2, x.ndim))
    fshape = _feature_shape(x)
    w = None if weight is None else jnp.reshape(weight, fshape)
    b = None if bias is None else jnp.reshape(bias, fshape)
    if not training:
        y = _flax_normalize(x, jnp.reshape(running_mean, fshape), jnp.reshape(running_var, fshape), eps, w, b)
        return y, running_mean, running_var
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(lax.square(x - mean), axis=axes, keepdims=True)
    y = _flax_normalize(x, mean, var, eps, w, b)
    if running_mean is None or running_var is None:
        return y, running_mean, running_var
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    m = momentum if isinstance(momentum, (int, float)) else jnp.asarray(momentum, dtype=jnp.result_type(running_mean))
    mean, var = lax.stop_gradient(jnp.reshape(mean, (-1,))), lax.stop_gradient(jnp.reshape(var, (-1,)))
    new_mean = running_mean * (1.0 - m) + mean * m
    new_var = running_var * (1.0 - m) + var * (m * (n / (n - 1 if n > 1 else 1)))
    return y, new_mean.astype(jnp.result_type(running_mean)), new_var.astype(jnp.result_type(running_var))


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """equinox.nn.LayerNorm over the trailing ``normalized_shape`` dims (equinox vmaps over the rest).

    ``jnp.mean``, ``jnp.var``, ``lax.rsqrt``; ``weight * out + bias``.
    """
    axes = common.trailing_axes("layer_norm", _shape(x), normalized_shape)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    variance = jnp.var(x, axis=axes, keepdims=True)
    inv = _rsqrt(variance + eps)
    out = (x - mean) * inv
    if weight is not None:
        out = weight * out
    if bias is not None:
        out = out + bias
    return out


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """equinox.nn.GroupNorm on (N, C, ...) (equinox's is per sample, (C, ...); here batched over N).

    Channels split into ``num_groups`` groups; ``jnp.mean``/``jnp.var`` over
    each group, ``lax.rsqrt``, then the per-channel ``weight * out + bias``.
    """
    y = jnp.reshape(x, (x.shape[0], num_groups, x.shape[1] // num_groups) + _shape(x)[2:])
    axes = tuple(range(2, y.ndim))
    mean = jnp.mean(y, axis=axes, keepdims=True)
    variance = jnp.var(y, axis=axes, keepdims=True)
    inv = _rsqrt(variance + eps)
    out = jnp.reshape((y - mean) * inv, x.shape)
    if weight is not None:
        out = jnp.reshape(weight, _feature_shape(x)) * out
    if bias is not None:
        out = out + jnp.reshape(bias, _feature_shape(x))
    return out


def rms_norm(x, normalized_shape, weight=None, eps=None):
    """flax.linen.RMSNorm: ``_compute_stats(use_mean=False)`` (the mean of ``x^2``), then ``_normalize``.

    ``x * (rsqrt(mean(x^2) + eps) * scale)``; ``eps=None`` is the dtype's
    machine epsilon, as torch's.
    """
    axes = common.trailing_axes("rms_norm", _shape(x), normalized_shape)
    eps = float(jnp.finfo(x.dtype).eps) if eps is None else eps
    var = jnp.mean(lax.square(x), axis=axes, keepdims=True)
    mul = _rsqrt(var + eps)
    if weight is not None:
        mul = mul * weight
    return x * mul


# -- attention ---------------------------------------------------------------
def _is_bool(a) -> bool:
    return np.dtype(a.dtype) == np.bool_


def _heads_layout(batch):
    """Our batch dims (..., L, E) as jax's (B, N): the last batch dim is the heads, the rest the batch."""
    if len(batch) == 0:
        return 1, 1
    if len(batch) == 1:
        return batch[0], 1
    return int(np.prod(batch[:-1], dtype=np.int64)), batch[-1]


def _to_btnh(t, batch, bn):
    """(..., T, H) with batch dims broadcasting to ``batch`` -> jax's (B, T, N, H)."""
    t = jnp.broadcast_to(t, batch + _shape(t)[-2:])
    return jnp.swapaxes(jnp.reshape(t, bn + _shape(t)[-2:]), 1, 2)


def _to_bnts(m, batch, bn):
    """A mask or bias broadcastable to (..., L, S) -> 4-d, broadcastable to jax's (B, N, T, S)."""
    m = jnp.asarray(m)
    shape = (1,) * (len(batch) + 2 - m.ndim) + _shape(m)  # one entry per batch dim, then (L, S)
    if len(batch) == 0:
        return jnp.reshape(m, (1, 1) + shape)
    if len(batch) == 1:  # the batch dim is B; jax's heads dim N is 1
        return jnp.reshape(m, shape[:1] + (1,) + shape[1:])
    if len(batch) == 2:  # size-1 dims keep broadcasting
        return jnp.reshape(m, shape)
    return jnp.reshape(jnp.broadcast_to(m, batch + shape[-2:]), bn + shape[-2:])


def _flax_attention(q, k, v, bias, mask, dropout, scale):
    """flax.linen.dot_product_attention in (B, T, N, H): einsums, ``where(mask, w, finfo.min)``, jax.nn.softmax.

    The softmax runs in the inputs' dtype, and the dropout factors multiply
    the weights, as flax's dropout does with its own Bernoulli mask.
    """
    dtype = q.dtype
    q = q / jnp.sqrt(q.shape[-1]).astype(dtype) if scale is None else q * jnp.asarray(scale, dtype)
    w = jnp.einsum("...qhd,...khd->...hqk", q, k, precision=_HIGHEST)
    if bias is not None:
        w = w + bias
    if mask is not None:
        w = jnp.where(mask, w, jnp.finfo(dtype).min)
    w = _softmax(w).astype(dtype)
    if dropout is not None:
        w = w * dropout
    return jnp.einsum("...hqk,...khd->...qhd", w, v, precision=_HIGHEST)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_mask=None, is_causal=False,
                                 scale=None):
    """``jax.nn.dot_product_attention``, around torch's (..., L, E) layout.

    Our batch dims become jax's (B, N) (the last one the heads) and the
    arrays are transposed to its (B, T, N, H); a boolean ``attn_mask`` is
    its ``mask`` (True attends, as torch), a float one its additive
    ``bias``, both reshaped to 4-d (B, N, T, S) broadcasting; ``is_causal``
    is its top-left causal mask, as torch's.

    Where it cannot be used, flax.linen.dot_product_attention's composition
    (``_flax_attention``, jax.nn.softmax) runs instead, in the same layout:
    with a ``dropout_mask`` (jax.nn's attention takes no dropout); in
    float64, because jax.nn.dot_product_attention always computes its softmax
    in float32 (its outputs and gradients are then float32-accurate, ~6e-8
    relative, and float64 is where the harness decides correctness; flax's
    attention, the default of its MultiHeadDotProductAttention, keeps
    float64); and when values and keys differ in head size (jax.nn's needs
    them equal, torch's does not).

    A query whose mask row admits no key gets zeros and passes no gradient,
    as in torch (jax's and flax's masks are a large finite negative, which
    would give it the mean of the values; an all -inf bias, NaN).
    """
    dtype = jnp.result_type(query, key, value)
    q, k, v = (jnp.asarray(t, dtype) for t in (query, key, value))
    L, S = q.shape[-2], k.shape[-2]
    extra = [_shape(m)[:-2] for m in (attn_mask, dropout_mask) if m is not None]
    batch = tuple(jnp.broadcast_shapes(_shape(q)[:-2], _shape(k)[:-2], _shape(v)[:-2], *extra))
    bn = _heads_layout(batch)
    qb, kb, vb = _to_btnh(q, batch, bn), _to_btnh(k, batch, bn), _to_btnh(v, batch, bn)
    mask = bias = None
    empty = None if attn_mask is None else _attends_to_nothing(attn_mask)
    if empty is not None and not _is_bool(attn_mask):
        attn_mask = jnp.where(empty, jnp.zeros((), dtype), _constant_like(attn_mask, q))
    if attn_mask is not None:
        if _is_bool(attn_mask):
            mask = _to_bnts(attn_mask, batch, bn)
        else:
            bias = _to_bnts(_constant_like(attn_mask, q), batch, bn)
    use_kernel = (_attention is not None and dropout_mask is None and np.dtype(dtype).itemsize < 8
                  and v.shape[-1] == q.shape[-1])
    if use_kernel:
        out = _attention(qb, kb, vb, bias=bias, mask=mask, scale=scale, is_causal=is_causal)
    else:
        if is_causal:
            mask = jnp.asarray(np.tril(np.ones((L, S), dtype=bool)))[None, None]
        dropout = None if dropout_mask is None else _to_bnts(_constant_like(dropout_mask, q), batch, bn)
        out = _flax_attention(qb, kb, vb, bias, mask, dropout, scale)
    out = jnp.reshape(jnp.swapaxes(out, 1, 2), batch + (L, v.shape[-1]))
    return out if empty is None else jnp.where(empty, jnp.zeros((), out.dtype), out)


def _attends_to_nothing(attn_mask):
    """``ops.attends_to_nothing`` for a mask that may be traced: (..., L, 1), or None when none is empty."""
    if not _is_traced(attn_mask):
        from gradcheck import ops

        return ops.attends_to_nothing(np.asarray(attn_mask))
    m = jnp.asarray(attn_mask)
    return ~jnp.any(m, axis=-1, keepdims=True) if _is_bool(m) else jnp.all(jnp.isneginf(m), axis=-1, keepdims=True)


# -- embedding ---------------------------------------------------------------
def embedding(ids, weight, padding_idx=None):
    """flax.linen.Embed: ``jnp.take(weight, ids, axis=0)``, plus the contract's zeros at ``padding_idx``.

    A negative ``padding_idx`` counts from the end, as torch's.  Concrete ids
    outside ``[0, num)`` were refused by the op's rule; traced ones cannot be
    checked, and give NaN rows (jnp.take's fill mode; negatives are sent out
    of range first, since jnp.take would wrap them).
    """
    ids = jnp.asarray(ids) if isinstance(ids, (list, tuple)) else ids
    weight = jnp.asarray(weight)
    num = weight.shape[0]
    out = jnp.take(weight, jnp.where(ids < 0, num, ids), axis=0, mode="fill")
    if padding_idx is None:
        return out
    pad = jnp.expand_dims(ids == (padding_idx % num), -1)
    return jnp.where(pad, jnp.zeros((), out.dtype), out)


# -- losses (optax's formulations, torch's arguments and reductions) ---------
def _reduce_loss(loss, reduction, denominator=None):
    if reduction == "none":
        return loss
    if reduction == "sum":
        return jnp.sum(loss)
    return jnp.mean(loss) if denominator is None else jnp.sum(loss) / denominator  # "mean"


def _class_targets(target, num_classes, ignore_index):
    """(ignored, safe): where the label is ignored, and labels safe to gather with.

    Ignored labels gather class 0 (their loss is masked out), so
    ``ignore_index`` (-100 by default) never indexes; concrete labels out of
    range were refused by the op's rule; traced ones are sent past the last
    class, where jnp.take_along_axis's fill mode makes the loss NaN instead of
    clamping.
    """
    target = jnp.asarray(target) if isinstance(target, (list, tuple, np.ndarray)) else target
    ignored = target == ignore_index
    safe = jnp.where(ignored, 0, jnp.where(target < 0, num_classes, target))
    return ignored, safe


def _nll(logp, target, weight, ignore_index):
    """optax.softmax_cross_entropy_with_integer_labels' gather (``jnp.take_along_axis``) with torch's weights.

    Returns the per-element loss (0 where ignored), each element's weight
    (the target class's weight, 0 where ignored) and where it is ignored.
    """
    ignored, safe = _class_targets(target, logp.shape[1], ignore_index)
    picked = jnp.take_along_axis(logp, jnp.expand_dims(safe, 1), axis=1, mode="fill")
    nll = -jnp.squeeze(picked, 1)
    keep = jnp.where(ignored, jnp.zeros((), logp.dtype), jnp.ones((), logp.dtype))
    if weight is not None:
        keep = keep * jnp.take(weight, safe, mode="fill")
    return nll * keep, keep, ignored


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """optax's cross-entropies on torch's (N, C, ...) layout, with torch's weights, ignore_index and smoothing.

    Class indices: ``optax.softmax_cross_entropy_with_integer_labels`` as
    ``jax.nn.log_softmax`` and ``jnp.take_along_axis``; probabilities:
    ``optax.softmax_cross_entropy`` (``-sum(p * log_softmax)``), smoothed as
    ``optax.smooth_labels``.  Label smoothing on class indices is torch's
    ``(1 - eps) nll + eps / C * sum_c(-w_c log p_c)``, the second term
    normalised, under "mean", by the same target-weight sum as the first;
    that includes a class ``weight`` with smoothing, which the derived body
    does not support.
    """
    num_classes = input.shape[1]
    logp = _log_softmax(input, axis=1)
    w = None if weight is None else _constant_like(weight, input)
    if jnp.issubdtype(jnp.result_type(target), jnp.floating):
        p = target
        if label_smoothing:
            p = p * (1.0 - label_smoothing) + label_smoothing / num_classes
        terms = logp * p if w is None else logp * p * jnp.reshape(w, _feature_shape(input))
        return _reduce_loss(-jnp.sum(terms, axis=1), reduction)  # "mean" over every element but the classes
    loss, keep, ignored = _nll(logp, target, w, ignore_index)
    denominator = jnp.sum(keep) if reduction == "mean" else None
    if not label_smoothing:
        return _reduce_loss(loss, reduction, denominator)
    smooth = -jnp.sum(logp if w is None else logp * jnp.reshape(w, _feature_shape(input)), axis=1)
    smooth = jnp.where(ignored, jnp.zeros((), smooth.dtype), smooth)
    return (_reduce_loss(loss, reduction, denominator) * (1.0 - label_smoothing)
            + _reduce_loss(smooth, reduction, denominator) * (label_smoothing / num_classes))


def nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean"):
    """torch's nll_loss on log-probabilities (N, C, ...), gathered as optax gathers (``jnp.take_along_axis``)."""
    w = None if weight is None else _constant_like(weight, input)
    loss, keep, _ = _nll(input, target, w, ignore_index)
    return _reduce_loss(loss, reduction, jnp.sum(keep) if reduction == "mean" else None)


def mse_loss(input, target, reduction="mean"):
    """optax.squared_error (``(predictions - targets) ** 2``), reduced as torch's."""
    errors = input - target
    return _reduce_loss(errors**2, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean", pos_weight=None):
    """optax.sigmoid_binary_cross_entropy (``jax.nn.log_sigmoid`` of the logits and of their negatives).

    ``-y log_sigmoid(x) - (1 - y) log_sigmoid(-x)``, torch's ``pos_weight``
    scaling the first term and ``weight`` the whole.
    """
    log_p = _log_sigmoid(input)
    log_not_p = _log_sigmoid(-input)
    positive = target * log_p
    if pos_weight is not None:
        positive = _constant_like(pos_weight, input) * positive
    loss = -positive - (1.0 - target) * log_not_p
    if weight is not None:
        loss = loss * _constant_like(weight, input)
    return _reduce_loss(loss, reduction)


# ---------------------------------------------------------------- ops for torch.export graphs
def hardsigmoid(x):
    """``jax.nn.hard_sigmoid``: ``relu6(x + 3) / 6``, as torch's."""
    return jax.nn.hard_sigmoid(x)


def hardswish(x):
    """``jax.nn.hard_swish``: ``x * relu6(x + 3) / 6``."""
    return jax.nn.hard_swish(x)


def upsample_bilinear2d(x, size, align_corners=False, scale_factor=None):
    """``jax.image.resize(method="linear", antialias=False)`` where it computes what torch does.

    jax samples at half-pixel centres with the ratio ``out/in``, which is
    torch's ``align_corners=False`` when no other scale factor was given;
    otherwise (corners aligned, or a scale factor that is not ``out/in``)
    the derived interpolation matrices run.
    """
    from gradcheck import ops

    n, c, h, w = _shape(x) if len(x.shape) == 4 else (None,) * 4
    oh, ow = (size, size) if isinstance(size, (int, np.integer)) else tuple(int(s) for s in size)
    scales = scale_factor if isinstance(scale_factor, (tuple, list)) else (scale_factor, scale_factor)
    plain = all(s is None or s <= 0 or float(s) == o / i for s, o, i in zip(scales, (oh, ow), (h, w)))
    if n is None or align_corners or not plain:
        return ops._upsample_bilinear2d_composed(x, size, align_corners, scale_factor)
    return jax.image.resize(x, (n, c, oh, ow), method="linear", antialias=False)

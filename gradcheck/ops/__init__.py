"""The one op namespace layers are written in.

Every function here dispatches on the array types it is given: a tape
``Tensor`` goes to the tape AD, a ``torch.Tensor`` to PyTorch, a jax array (or
tracer) to JAX, and plain numpy arrays to the numpy forward kernels (used by
the float64 finite-difference referee).  Semantics and layouts follow PyTorch
(NCHW activations, OIHW convolution weights, numpy broadcasting), so a layer
written once runs unchanged on every backend.

A backend implements an op by defining a function of the same name in its
ops module (``gradcheck/backends/<name>/ops.py``).  Before any backend runs
an op, its argument rule (``gradcheck/ops/rules.py``) checks the
arguments, so a mistake gets the same message on every backend; how a call
is dispatched, and how checks watch every call, is ``gradcheck/ops/dispatch.py``.  Ops whose body here is not
``...`` are *derived*: built from other ops, used by any backend that does not
define its own version.  An op a backend lacks and that has no derived
version raises ``BackendOpMissing`` naming the op and the backend.

Python operators on tape tensors (``+ - * / ** @``, unary ``-`` and ``[]``)
route through these ops too, and torch and jax arrays have their own, so
layers may use operators freely.
"""

from __future__ import annotations

import math

import numpy as np

from gradcheck.backends import backend_of_args, ops_module
from gradcheck.backends.numpy import kernels
from gradcheck.ops import rules as common
from gradcheck.ops.dispatch import NAMES, BackendOpMissing, op  # noqa: F401 (BackendOpMissing: raised here, caught by callers)

__all__: list[str] = NAMES  # the ops defined below, each appended by ``op`` (the helpers are not listed)


# ---------------------------------------------------------------- arrays
@op
def asarray(value, like=None, dtype=None):
    """Convert ``value`` (numpy or scalar) to the backend and dtype of ``like``.

    Layers use this for constants (masks, scales) so that they live on the
    same backend, and in the same float dtype, as the activations.
    """


@op
def astype(x, dtype):
    """Cast to a numpy dtype (``np.float32``, ``"float64"``); differentiable for floats."""


@op
def zeros_like(x):
    """Zeros with the shape, dtype and backend of ``x`` (carries no gradient)."""


@op
def stop_gradient(x):
    """The value of ``x`` with no gradient flowing through it."""


dtype_of, shape_of = common.dtype_of, common.shape_of


def to_numpy(x) -> np.ndarray:
    """Any backend's array as a numpy array (detached)."""
    backend = backend_of_args((x,))
    return ops_module(backend).to_numpy(x)


# ---------------------------------------------------------------- elementwise
@op
def add(a, b): ...
@op
def sub(a, b): ...
@op
def mul(a, b): ...
@op
def div(a, b): ...
@op
def neg(a): ...
@op
def pow(a, b):
    """``a ** b``; ``b`` may be a scalar or an array (differentiable in both)."""


@op
def maximum(a, b):
    """Elementwise max; at ties the gradient is split evenly (torch and jax agree)."""


@op
def minimum(a, b):
    """Elementwise min; at ties the gradient is split evenly."""


@op
def where(cond, a, b):
    """``cond ? a : b`` with broadcasting; ``cond`` is boolean and never differentiated."""


@op
def exp(x): ...
@op
def expm1(x): ...
@op
def log(x): ...
@op
def log1p(x): ...
@op
def sqrt(x): ...
@op
def rsqrt(x):
    """``1 / sqrt(x)``."""
    return div(1.0, sqrt(x))


@op
def abs(x):
    """``|x|``; gradient ``sign(x)``, 0 at 0 (torch and jax agree)."""


@op
def sin(x): ...
@op
def cos(x): ...
@op
def tanh(x): ...
@op
def sigmoid(x): ...
@op
def erf(x): ...
@op
def atan(x):
    """``arctan(x)``; gradient ``1 / (1 + x^2)``."""


@op
def relu(x):
    """``max(x, 0)``; gradient 0 at exactly 0 (the torch and jax convention)."""


@op
def leaky_relu(x, negative_slope=0.01):
    return where(greater(x, 0.0), x, mul(x, negative_slope))


@op
def elu(x, alpha=1.0):
    # The inner where keeps expm1 away from large positive x, whose overflow
    # would turn the unused branch's gradient into 0 * inf = nan.
    positive = greater(x, 0.0)
    return where(positive, x, mul(expm1(where(positive, 0.0, x)), alpha))


@op
def gelu(x, approximate="none"):
    """GELU, exact (``approximate="none"``, erf) or ``"tanh"``, as torch defines it."""
    if approximate == "tanh":
        inner = mul(add(x, mul(pow(x, 3), 0.044715)), math.sqrt(2.0 / math.pi))
        return mul(mul(x, 0.5), add(tanh(inner), 1.0))
    return mul(mul(x, 0.5), add(erf(mul(x, 1.0 / math.sqrt(2.0))), 1.0))


@op
def silu(x):
    return mul(x, sigmoid(x))


@op
def softplus(x):
    """``log(1 + exp(x))``, computed stably."""


# Comparisons return boolean arrays; they are never differentiated.
@op
def greater(a, b): ...
@op
def less(a, b): ...
@op
def equal(a, b): ...


# ---------------------------------------------------------------- linear algebra
@op
def matmul(a, b):
    """``a @ b`` with numpy semantics (batch dims broadcast; 1-d operands promoted)."""


@op
def einsum(subscripts, *operands):
    """``np.einsum``: ``"ij,jk->ik"``, an implicit output (``"ij,jk"``) or ``...``; each index has one size.

    An explicit output without ``...`` sums over the ``...`` dims, as torch's
    einsum does (numpy's own refuses that form).

    Size-1 dims broadcast only under ``...`` (numpy also stretches a named
    size-1 index; the rule refuses that, which not every framework does).
    """


# ---------------------------------------------------------------- reductions
@op
def sum(x, axis=None, keepdims=False): ...
@op
def mean(x, axis=None, keepdims=False):
    n = _count(x, axis)
    return div(sum(x, axis=axis, keepdims=keepdims), float(n))


@op
def var(x, axis=None, keepdims=False, ddof=0):
    """Variance (biased for ``ddof=0``, as BatchNorm normalises)."""
    centred = sub(x, mean(x, axis=axis, keepdims=True))
    n = _count(x, axis)
    return div(sum(mul(centred, centred), axis=axis, keepdims=keepdims), float(n - ddof))


@op
def normalize(x, axes, eps, weight=None, bias=None):
    """``(y, mean, var)``: ``y = (x - mean) / sqrt(var + eps) * weight + bias``, statistics over ``axes``.

    BatchNorm's, LayerNorm's and GroupNorm's normalisation as one op, so that
    a backend can run a fused version (the tape: one node; numpy: one
    forward); this body, the composition, is what torch and jax run.
    ``mean`` and ``var`` (biased, reduced axes kept) carry no gradient: they
    are for running statistics.  ``weight`` and ``bias`` (None leaves them
    out) broadcast into ``x``: BatchNorm's shaped ``(1, C, 1, ...)``,
    LayerNorm's as the normalised shape.
    """
    mu = mean(x, axis=axes, keepdims=True)
    centred = sub(x, mu)
    v = mean(mul(centred, centred), axis=axes, keepdims=True)
    scale = rsqrt(add(v, eps))
    # A per-channel weight joins the per-channel scale before the full-size multiply.
    fold = weight is not None and kernels.broadcasts_into(shape_of(weight), shape_of(v))
    if fold:
        scale = mul(scale, weight)
    y = mul(centred, scale)
    if weight is not None and not fold:
        y = mul(y, weight)
    if bias is not None:
        y = add(y, bias)
    return y, stop_gradient(mu), stop_gradient(v)


# ---------------------------------------------------------------- framework kernels
# The functions a model library calls.  Each has a derived body (the
# composition the tape and the numpy referee run); torch and jax implement
# them with their own kernels (F.batch_norm, F.linear, jax.nn.*), so a wrong
# backward in those kernels is what gets caught.  docs/ops.md has the table.
@op
def linear(x, weight, bias=None):
    """``x @ weight.T + bias``, as ``torch.nn.functional.linear`` (``weight`` is (out, in))."""
    y = matmul(x, transpose(weight))
    return y if bias is None else add(y, bias)


@op
def batch_norm(x, running_mean=None, running_var=None, weight=None, bias=None, training=True, momentum=0.1,
               eps=1e-5):
    """``torch.nn.functional.batch_norm`` on (N, C, ...), returning ``(y, running_mean, running_var)``.

    ``training``: normalise with the batch statistics and, when running
    statistics are given, return them updated as torch does
    (``r = (1 - momentum) r + momentum * stat``, the variance unbiased);
    otherwise normalise with the running statistics (returned unchanged).
    ``momentum`` is a float or a 0-d array (the cumulative factor
    ``1 / num_batches_tracked`` when the layer's momentum is None).
    ``weight`` and ``bias`` are per channel, shape (C,).
    """
    shape = shape_of(x)
    axes = (0,) + tuple(range(2, len(shape)))
    bshape = common.channel_shape(len(shape), shape[1])
    w = None if weight is None else reshape(weight, bshape)
    b = None if bias is None else reshape(bias, bshape)
    if not training:
        scale = rsqrt(add(reshape(running_var, bshape), eps))
        if w is not None:
            scale = mul(scale, w)
        y = mul(sub(x, reshape(running_mean, bshape)), scale)
        return (y if b is None else add(y, b)), running_mean, running_var
    y, mu, var_ = normalize(x, axes, eps, weight=w, bias=b)
    if running_mean is None or running_var is None:
        return y, running_mean, running_var
    n = int(np.prod([shape[a] for a in axes], dtype=np.int64))
    mu, var_ = reshape(mu, (-1,)), reshape(var_, (-1,))
    unbiased = n / (n - 1) if n > 1 else 1.0
    m = momentum
    # A Python momentum stays Python: an op on two Python numbers would give a float64 numpy scalar.
    keep, m_var = (1.0 - m, m * unbiased) if isinstance(m, (int, float)) else (sub(1.0, m), mul(m, unbiased))
    new_mean = add(mul(running_mean, keep), mul(mu, m))
    new_var = add(mul(running_var, keep), mul(var_, m_var))
    return y, new_mean, new_var


@op
def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """``torch.nn.functional.layer_norm``: statistics over the trailing ``normalized_shape`` dims."""
    axes = common.trailing_axes("layer_norm", shape_of(x), normalized_shape)
    return normalize(x, axes, eps, weight=weight, bias=bias)[0]


@op
def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """``torch.nn.functional.group_norm`` on (N, C, ...): statistics per sample over each group of channels."""
    shape = shape_of(x)
    grouped = reshape(x, (shape[0], num_groups, -1))
    y = reshape(normalize(grouped, (2,), eps)[0], shape)
    bshape = common.channel_shape(len(shape), shape[1])
    if weight is not None:
        y = mul(y, reshape(weight, bshape))
    if bias is not None:
        y = add(y, reshape(bias, bshape))
    return y


@op
def rms_norm(x, normalized_shape, weight=None, eps=None):
    """``torch.nn.functional.rms_norm``: ``x / sqrt(mean(x^2) + eps) * weight``; ``eps=None``: the dtype's epsilon."""
    axes = common.trailing_axes("rms_norm", shape_of(x), normalized_shape)
    eps = float(np.finfo(dtype_of(x)).eps) if eps is None else eps
    ms = mean(mul(x, x), axis=axes, keepdims=True)
    y = mul(x, rsqrt(add(ms, eps)))
    return y if weight is None else mul(y, weight)


@op
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_mask=None, is_causal=False,
                                 scale=None):
    """``torch.nn.functional.scaled_dot_product_attention`` on (..., L, E) queries, (..., S, E) keys and values.

    ``attn_mask``: boolean, True where a query may attend (torch's
    convention), or float, added to the scores; it broadcasts to (..., L, S).
    ``is_causal``: the top-left causal mask.  ``dropout_mask``: the case's
    dropout factors (0 or 1 / (1 - p)) of shape (..., L, S), multiplied into
    the attention weights; no framework's attention takes a given mask, so
    with one the frameworks run this composition in their own ops.

    A query that may attend to nothing (its mask row all False, or all
    -inf) gets zeros, and passes no gradient, as in torch; a softmax over
    only -inf would be NaN.
    """
    nk = len(shape_of(key))
    L, E = shape_of(query)[-2:]
    S = shape_of(key)[-2]
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    # The key's own rank: torch broadcasts a (3, S, E) key against (2, 3, L, E) queries.
    scores = mul(matmul(query, transpose(key, tuple(range(nk - 2)) + (nk - 1, nk - 2))), scale)
    if is_causal:
        attn_mask = np.tril(np.ones((L, S), dtype=bool))
    if attn_mask is not None:
        if dtype_of(attn_mask) == np.bool_:
            if isinstance(attn_mask, np.ndarray):
                scores = add(scores, asarray(np.where(attn_mask, 0.0, -np.inf), like=scores))
            else:
                scores = where(attn_mask, scores, -math.inf)
        else:
            scores = add(scores, asarray(attn_mask, like=scores) if isinstance(attn_mask, np.ndarray) else attn_mask)
    empty = None if attn_mask is None else attends_to_nothing(to_numpy(attn_mask))
    if empty is not None:
        scores = where(empty, 0.0, scores)  # zeroed first, so that no NaN reaches the backward pass either
    weights = softmax(scores, axis=-1)
    if empty is not None:
        weights = where(empty, 0.0, weights)
    if dropout_mask is not None:
        weights = mul(weights, asarray(dropout_mask, like=weights) if isinstance(dropout_mask, np.ndarray)
                      else dropout_mask)
    return matmul(weights, value)


def attends_to_nothing(mask: np.ndarray) -> np.ndarray | None:
    """Where a query's mask row admits no key: (..., L, 1), True there; None when every query attends somewhere."""
    mask = np.asarray(mask)
    rows = ~np.any(mask, axis=-1, keepdims=True) if mask.dtype == np.bool_ else np.all(
        np.isneginf(mask), axis=-1, keepdims=True)
    return rows if rows.any() else None


@op
def embedding(ids, weight, padding_idx=None):
    """``torch.nn.functional.embedding``: rows of ``weight`` (num, dim) at integer ``ids``.

    With ``padding_idx`` that row gets no gradient (torch's rule); here its
    positions of the output are the constant zero the row holds in torch, so
    the function does not depend on the row and zero is its true derivative
    (the float64 referee agrees).
    """
    out = take(weight, ids, axis=0)
    if padding_idx is None:
        return out
    padding_idx %= shape_of(weight)[0]  # a negative index counts from the end, as in torch
    pad = reshape(equal(ids, padding_idx), shape_of(ids) + (1,))
    return where(pad, 0.0, out)


# Losses, with torch.nn.functional's names, arguments and reductions.
def _reduce_loss(loss, reduction, denominator=None):
    if reduction == "none":
        return loss
    if reduction == "sum":
        return sum(loss)
    return mean(loss) if denominator is None else div(sum(loss), denominator)  # "mean"


def _one_hot(ids, num_classes: int, axis: int):
    ndim = len(shape_of(ids)) + 1
    axis %= ndim
    classes = np.arange(num_classes).reshape((1,) * axis + (num_classes,) + (1,) * (ndim - axis - 1))
    return equal(reshape(ids, shape_of(ids)[:axis] + (1,) + shape_of(ids)[axis:]), classes)


@op
def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """``torch.nn.functional.cross_entropy`` on logits (N, C) or (N, C, d1, ...).

    ``target``: class indices (N,) / (N, d1, ...), or class probabilities of
    the logits' shape (a float array).  ``weight``: a per-class weight (C,).
    """
    shape = shape_of(input)
    logp = log_softmax(input, axis=1)
    bshape = common.channel_shape(len(shape), shape[1])
    w = None if weight is None else reshape(asarray(weight, like=input) if isinstance(weight, np.ndarray)
                                            else weight, bshape)
    if np.dtype(dtype_of(target)).kind == "f":
        if label_smoothing:
            target = add(mul(target, 1.0 - label_smoothing), label_smoothing / shape[1])
        weighted = mul(logp, target) if w is None else mul(mul(logp, target), w)
        # torch's "mean" over probability targets divides by every output element but the class dim.
        return _reduce_loss(neg(sum(weighted, axis=1)), reduction)
    hot = _one_hot(target, shape[1], axis=1)
    nll = neg(sum(where(hot, logp, 0.0), axis=1))
    zeros = zeros_like(nll)
    # Per-sample weight: the target class's weight, 0 where the label is ignored.
    keep = where(equal(target, ignore_index), zeros, add(zeros, 1.0))
    if w is not None:
        keep = mul(keep, sum(where(hot, w, 0.0), axis=1))
    loss = mul(nll, keep)
    den = sum(keep) if reduction == "mean" else None
    if not label_smoothing:
        return _reduce_loss(loss, reduction, denominator=den)
    # torch's rule: (1 - e) * the weighted nll + e / C * the class-weighted sum of -log p, over kept samples.
    smooth = neg(sum(logp if w is None else mul(logp, w), axis=1))
    smooth = where(equal(target, ignore_index), zeros, smooth)
    return add(mul(_reduce_loss(loss, reduction, den), 1.0 - label_smoothing),
               mul(_reduce_loss(smooth, reduction, den), label_smoothing / shape[1]))


@op
def nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean"):
    """``torch.nn.functional.nll_loss``: negative log-likelihood of log-probabilities (N, C, ...) at integer targets."""
    shape = shape_of(input)
    hot = _one_hot(target, shape[1], axis=1)
    nll = neg(sum(where(hot, input, 0.0), axis=1))
    zeros = zeros_like(nll)
    keep = where(equal(target, ignore_index), zeros, add(zeros, 1.0))
    if weight is not None:
        w = reshape(asarray(weight, like=input) if isinstance(weight, np.ndarray) else weight,
                    common.channel_shape(len(shape), shape[1]))
        keep = mul(keep, sum(where(hot, w, 0.0), axis=1))
    return _reduce_loss(mul(nll, keep), reduction, denominator=sum(keep) if reduction == "mean" else None)


@op
def mse_loss(input, target, reduction="mean"):
    """``torch.nn.functional.mse_loss``."""
    d = sub(input, target)
    return _reduce_loss(mul(d, d), reduction)


@op
def binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean", pos_weight=None):
    """``torch.nn.functional.binary_cross_entropy_with_logits``, torch's stable form
    ``(1 - y) x + (1 + (pos_weight - 1) y) softplus(-x)``."""
    sp = softplus(neg(input))
    if pos_weight is not None:
        pw = asarray(pos_weight, like=input) if isinstance(pos_weight, np.ndarray) else pos_weight
        sp = mul(sp, add(mul(sub(pw, 1.0), target), 1.0))
    loss = add(mul(sub(1.0, target), input), sp)
    if weight is not None:
        loss = mul(loss, asarray(weight, like=input) if isinstance(weight, np.ndarray) else weight)
    return _reduce_loss(loss, reduction)


@op
def max(x, axis=None, keepdims=False):
    """Max reduction; at ties the gradient is split evenly (torch.amax, jax agree)."""


@op
def min(x, axis=None, keepdims=False): ...
@op
def prod(x, axis=None, keepdims=False):
    """Product reduction; the gradient is the product of the other elements, zeros included (torch's rule)."""


@op
def topk(x, k, axis=-1, largest=True):
    """``(values, indices)`` of the ``k`` largest (or smallest) elements along ``axis``, sorted, as ``torch.topk``.

    ``indices`` are int64 positions along ``axis`` and carry no gradient; the
    gradient of ``values`` goes to the elements picked.
    """


@op
def logsumexp(x, axis=None, keepdims=False): ...
@op
def softmax(x, axis=-1): ...
@op
def log_softmax(x, axis=-1): ...


def _count(x, axis) -> int:
    shape = shape_of(x)
    return int(np.prod([shape[a] for a in common.normal_axes("mean", axis, shape)], dtype=np.int64))


# ---------------------------------------------------------------- shapes
@op
def reshape(x, shape): ...
@op
def transpose(x, axes=None):
    """Permute axes (``axes=None`` reverses them, as numpy does)."""


@op
def broadcast_to(x, shape): ...
@op
def concatenate(xs, axis=0): ...
@op
def stack(xs, axis=0): ...
@op
def getitem(x, index):
    """``x[index]``: basic slicing and integer-array indexing (numpy semantics)."""


@op
def take(x, indices, axis=0):
    """Gather along ``axis`` with an integer array (embedding lookup)."""
    index = (slice(None),) * (axis % len(shape_of(x))) + (indices,)
    return getitem(x, index)


@op
def pad(x, pad_width, value=0.0):
    """Constant padding; ``pad_width`` as numpy: one ``(before, after)`` per axis (or a form that broadcasts)."""


def expand_dims(x, axis):
    shape = list(shape_of(x))
    axis = axis % (len(shape) + 1)
    return reshape(x, tuple(shape[:axis] + [1] + shape[axis:]))


def squeeze(x, axis):
    shape = list(shape_of(x))
    if shape[axis] != 1:
        raise ValueError(f"squeeze: axis {axis} of shape {tuple(shape)} has size {shape[axis]}, not 1")
    del shape[axis]
    return reshape(x, tuple(shape))


def flatten(x, start_axis=1):
    shape = shape_of(x)
    return reshape(x, shape[:start_axis] + (int(np.prod(shape[start_axis:], dtype=np.int64)),))


# ---------------------------------------------------------------- neural-network ops
@op
def conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """N-d convolution (cross-correlation, as torch): 1-d on NCL, 2-d on NCHW.

    ``w`` is ``(out, in/groups, *kernel)``; ``padding`` is an int, a tuple per
    spatial dim, or ``"same"``/``"valid"`` (``"same"`` needs stride 1).
    """


@op
def conv_transpose(x, w, bias=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    """Transposed convolution as torch's ``conv_transpose{1,2}d``; ``w`` is ``(in, out/groups, *kernel)``."""


@op
def max_pool2d(x, kernel_size, stride=None, padding=0):
    """2-d max pooling on NCHW (padding is -inf, as torch); at ties the tape, as torch, gives the gradient to the first maximum."""


@op
def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    """2-d average pooling on NCHW, as ``torch.nn.functional.avg_pool2d``.

    Derived as a depthwise convolution with a constant kernel, so it is
    differentiable to any order wherever ``conv`` is.
    """
    g = common.pool_geometry("avg_pool2d", shape_of(x), kernel_size, stride, padding)
    kernel = np.full((g.c, 1, g.kh, g.kw), 1.0 / (g.kh * g.kw))
    y = conv(x, asarray(kernel, like=x), stride=g.stride, padding=padding, groups=g.c)
    if not count_include_pad:
        y = mul(y, asarray(kernels.avg_pool_correction(g), like=x))
    return y


@op
def adaptive_avg_pool2d(x, output_size):
    """Adaptive average pooling with torch's bins: ``[floor(i*H/o), ceil((i+1)*H/o))``.

    Derived as two contractions with constant averaging matrices, so every
    backend that lacks a native version differentiates it to any order.
    """
    n, c, h, w = shape_of(x)
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    ph = asarray(adaptive_pool_matrix(h, oh), like=x)
    pw = asarray(adaptive_pool_matrix(w, ow), like=x)
    return einsum("ncij,pj->ncip", einsum("nchw,oh->ncow", x, ph), pw)


def adaptive_pool_matrix(size: int, out: int) -> np.ndarray:
    """The ``out x size`` averaging matrix of torch's adaptive pooling bins."""
    m = np.zeros((out, size))
    for i in range(out):
        start = (i * size) // out
        end = -((-(i + 1) * size) // out)
        m[i, start:end] = 1.0 / (end - start)
    return m


# ---- ops for torch.export graphs
# Functions a torch model calls that Core ATen keeps whole and that gradcheck had no op for.  Each body is
# the composition the tape and the numpy referee run; torch runs its own kernel and jax its own where jax
# has one that computes the same thing (backends/<name>/ops.py, at the end).
@op
def hardsigmoid(x):
    """``torch.nn.functional.hardsigmoid``: ``relu6(x + 3) / 6``; slope 1/6 inside (-3, 3), 0 outside.

    Written with ``where`` rather than ``maximum``/``minimum``, whose ties would split the slope at -3
    and 3: this way the gradient there is 0, as torch's and jax's are.
    """
    inside = add(div(x, 6.0), 0.5)
    return where(greater(x, -3.0), where(less(x, 3.0), inside, 1.0), 0.0)


@op
def hardswish(x):
    """``torch.nn.functional.hardswish``: ``x * hardsigmoid(x)``; slope 0 below -3 and at it, 1 from 3 up."""
    return mul(x, hardsigmoid(x))


def _upsample_scale(in_size: int, out_size: int, scale_factor) -> np.float32:
    """torch's ``compute_scales_value`` in float32, as its CPU kernels compute it: ``1/scale_factor`` or ``in/out``."""
    if scale_factor is not None and scale_factor > 0:
        return np.float32(1.0 / scale_factor)
    return np.float32(in_size) / np.float32(out_size)


def _upsample_args(name, x, size, scale_factor):
    shape = shape_of(x)
    oh, ow = common.spatial_size(name, "size", size)
    if scale_factor is None or isinstance(scale_factor, (int, float, np.number)):
        scales = (scale_factor, scale_factor)
    else:
        scales = tuple(scale_factor)
    return shape, oh, ow, scales


def nearest_indices(in_size: int, out_size: int, scale_factor=None) -> np.ndarray:
    """The input row each output row of torch's ``nearest`` reads: ``floor(i * scale)`` in float32, clamped."""
    if out_size == in_size:
        return np.arange(out_size)
    if out_size == 2 * in_size:
        return np.arange(out_size) >> 1
    scale = _upsample_scale(in_size, out_size, scale_factor)
    src = np.floor(np.arange(out_size, dtype=np.float32) * scale).astype(np.int64)
    return np.minimum(src, in_size - 1)


@op
def upsample_nearest2d(x, size, scale_factor=None):
    """``F.interpolate(x, size, mode="nearest")`` on NCHW: output pixel ``i`` reads input ``floor(i * in/out)``.

    ``scale_factor`` (one float, or one per spatial dim) is what torch maps
    coordinates with when the call gave one (``1/scale_factor`` instead of
    ``in/out``); ``size`` is the output size either way.  Derived as two
    gathers, so the gradient scatter-adds into the rows read.
    """
    (_, _, h, w), oh, ow, (sh, sw) = _upsample_args("upsample_nearest2d", x, size, scale_factor)
    rows = take(x, nearest_indices(h, oh, sh), axis=2)
    return take(rows, nearest_indices(w, ow, sw), axis=3)


def bilinear_matrix(in_size: int, out_size: int, align_corners: bool = False, scale_factor=None) -> np.ndarray:
    """The ``out x in`` interpolation matrix of torch's ``bilinear`` (``area_pixel_compute_source_index``)."""
    if align_corners:
        scale = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
        src = np.arange(out_size) * scale
    else:
        scale = 1.0 / scale_factor if scale_factor is not None and scale_factor > 0 else in_size / out_size
        src = np.maximum((np.arange(out_size) + 0.5) * scale - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    hi = np.where(lo < in_size - 1, lo + 1, lo)
    frac = src - lo
    m = np.zeros((out_size, in_size))
    np.add.at(m, (np.arange(out_size), lo), 1.0 - frac)
    np.add.at(m, (np.arange(out_size), hi), frac)
    return m


def _upsample_bilinear2d_composed(x, size, align_corners=False, scale_factor=None):
    (_, _, h, w), oh, ow, (sh, sw) = _upsample_args("upsample_bilinear2d", x, size, scale_factor)
    mh = asarray(bilinear_matrix(h, oh, align_corners, sh), like=x)
    mw = asarray(bilinear_matrix(w, ow, align_corners, sw), like=x)
    return einsum("ncoj,pj->ncop", einsum("nchw,oh->ncow", x, mh), mw)


@op
def upsample_bilinear2d(x, size, align_corners=False, scale_factor=None):
    """``F.interpolate(x, size, mode="bilinear", align_corners=...)`` on NCHW (no antialiasing, as torch's default).

    ``scale_factor`` as in ``upsample_nearest2d``.  Derived as two
    contractions with constant interpolation matrices, differentiable to any
    order wherever ``einsum`` is.
    """
    return _upsample_bilinear2d_composed(x, size, align_corners, scale_factor)

"""The tape's primitives: each numpy forward with its VJPs beside it, one row per primitive.

A VJP has the signature ``vjp(g, ans, *args, **kwargs)`` and is written in
``gradcheck.ops``, so it runs as numpy in a first-order backward pass and is
itself recorded (differentiable) under ``create_graph``.  Ops that are not
defined here fall back to their derived version in ``gradcheck.ops``.

Masks that only depend on values (relu's ``x > 0``, the arg-max of a max) are
computed from the raw numpy values: they are piecewise constant, so treating
them as constants is exact for every order of derivative.
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from gradcheck import ops as o
from gradcheck.backends.numpy import kernels
from gradcheck.backends.numpy import ops as npo
from gradcheck.backends.tape.tape import Primitive, Tensor, raw
from gradcheck.ops import rules as common


def _shape(x) -> tuple[int, ...]:
    return tuple(np.shape(raw(x)))


def _dtype(x):
    return np.result_type(raw(x))


def unbroadcast(g, shape):
    """Sum ``g`` over the axes that broadcasting added or stretched to reach its shape."""
    gshape = _shape(g)
    if gshape == tuple(shape):
        return g
    axes = kernels.summed_axes(gshape, tuple(shape))
    if axes:
        g = o.sum(g, axis=axes, keepdims=True)
    return o.reshape(g, tuple(shape))


def _keep_shape(shape, axis):
    """``shape`` with the reduced axes kept as size 1."""
    axes = common.normal_axes("sum", axis, shape)
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _const(mask, like):
    return np.asarray(mask, dtype=_dtype(like))


def to_numpy(x):
    return np.asarray(raw(x))


def asarray(value, like=None, dtype=None):
    if isinstance(value, Tensor):
        # A tensor stays on the tape, as torch.as_tensor and jnp.asarray keep theirs: a cast
        # (to ``dtype``, or a float to ``like``'s float dtype) is the differentiable astype.
        target = common.asarray_dtype(value.value, raw(like) if like is not None else None, dtype)
        return value if target is None or target == value.dtype else astype(value, target)
    return npo.asarray(raw(value), like=raw(like) if like is not None else None, dtype=dtype)


def zeros_like(x):
    return Tensor(np.zeros_like(raw(x)))


def stop_gradient(x):
    return Tensor(raw(x))


def greater(a, b):
    return np.greater(raw(a), raw(b))


def less(a, b):
    return np.less(raw(a), raw(b))


def equal(a, b):
    return np.equal(raw(a), raw(b))


def _p(name, forward):
    return Primitive(name, forward)


# ---------------------------------------------------------------- elementwise
# fmt: off
add = _p("add", npo.add).defvjp(
    lambda g, ans, a, b: unbroadcast(g, _shape(a)),
    lambda g, ans, a, b: unbroadcast(g, _shape(b)))
sub = _p("sub", npo.sub).defvjp(
    lambda g, ans, a, b: unbroadcast(g, _shape(a)),
    lambda g, ans, a, b: unbroadcast(o.neg(g), _shape(b)))
mul = _p("mul", npo.mul).defvjp(
    lambda g, ans, a, b: unbroadcast(o.mul(g, b), _shape(a)),
    lambda g, ans, a, b: unbroadcast(o.mul(g, a), _shape(b)))
div = _p("div", npo.div).defvjp(
    lambda g, ans, a, b: unbroadcast(o.div(g, b), _shape(a)),
    lambda g, ans, a, b: unbroadcast(o.neg(o.div(o.mul(g, ans), b)), _shape(b)))
neg = _p("neg", npo.neg).defvjp(lambda g, ans, a: o.neg(g))
pow = _p("pow", npo.pow).defvjp(
    lambda g, ans, a, b: unbroadcast(o.mul(g, _pow_slope(a, b)), _shape(a)),
    # d/db a**b = log(a) a**b; where a == 0 torch and jax define it as 0, where a < 0 (no real
    # logarithm) they give NaN.
    lambda g, ans, a, b: unbroadcast(o.mul(g, o.mul(_log_base(a), ans)), _shape(b)))


def _log_base(a):
    """log(a) for the exponent's gradient: 0 at a == 0, NaN below (torch's and jax's values)."""
    # A Python base stays a Python float: np.log of it would be a float64
    # array that promotes a float32 exponent's gradient to float64.
    if isinstance(a, (int, float)):
        return math.log(a) if a > 0 else (0.0 if a == 0 else math.nan)
    # log of the base where it is positive, of 1 (0) at 0 and of NaN below: no warning, the values torch gives.
    return o.log(o.where(o.greater(a, 0), a, _const(np.where(raw(a) == 0, 1.0, np.nan), a)))


def _pow_slope(a, b):
    """d/da a**b = b a**(b-1), and 0 where b == 0 (a**0 is constant; torch agrees).

    Computed without 0 * 0**-1 = nan at a = 0: where b == 0 the exponent is
    shifted to 1, whose power is finite, and the factor b zeroes it.
    """
    if isinstance(b, (int, float)):
        # A Python exponent stays a Python number: numpy would make it an int64
        # scalar, which promotes float32 arrays to float64.
        return o.mul(b, o.pow(a, b - 1)) if b != 0 else 0.0
    b_safe = o.add(b, _const(raw(b) == 0, b))
    return o.mul(b, o.pow(a, o.sub(b_safe, 1)))


def _tie_split(a, b, pick):
    """1 where ``pick(a, b)``, 1/2 at ties (the convention torch and jax share), else 0."""
    ra, rb = raw(a), raw(b)
    return _const(np.where(pick(ra, rb), 1.0, np.where(ra == rb, 0.5, 0.0)), a)


maximum = _p("maximum", npo.maximum).defvjp(
    lambda g, ans, a, b: unbroadcast(o.mul(g, _tie_split(a, b, np.greater)), _shape(a)),
    lambda g, ans, a, b: unbroadcast(o.mul(g, _tie_split(b, a, np.greater)), _shape(b)))
minimum = _p("minimum", npo.minimum).defvjp(
    lambda g, ans, a, b: unbroadcast(o.mul(g, _tie_split(a, b, np.less)), _shape(a)),
    lambda g, ans, a, b: unbroadcast(o.mul(g, _tie_split(b, a, np.less)), _shape(b)))
where = _p("where", npo.where).defvjp(
    None,
    lambda g, ans, c, a, b: unbroadcast(o.where(raw(c), g, 0.0), _shape(a)),
    lambda g, ans, c, a, b: unbroadcast(o.where(raw(c), 0.0, g), _shape(b)))

exp = _p("exp", npo.exp).defvjp(lambda g, ans, x: o.mul(g, ans))
expm1 = _p("expm1", npo.expm1).defvjp(lambda g, ans, x: o.mul(g, o.add(ans, 1.0)))
log = _p("log", npo.log).defvjp(lambda g, ans, x: o.div(g, x))
log1p = _p("log1p", npo.log1p).defvjp(lambda g, ans, x: o.div(g, o.add(x, 1.0)))
sqrt = _p("sqrt", npo.sqrt).defvjp(lambda g, ans, x: o.div(o.mul(g, 0.5), ans))
abs = _p("abs", npo.abs).defvjp(lambda g, ans, x: o.mul(g, _const(np.sign(raw(x)), x)))
sin = _p("sin", npo.sin).defvjp(lambda g, ans, x: o.mul(g, o.cos(x)))
cos = _p("cos", npo.cos).defvjp(lambda g, ans, x: o.neg(o.mul(g, o.sin(x))))
tanh = _p("tanh", npo.tanh).defvjp(lambda g, ans, x: o.mul(g, o.sub(1.0, o.mul(ans, ans))))
sigmoid = _p("sigmoid", npo.sigmoid).defvjp(lambda g, ans, x: o.mul(g, o.mul(ans, o.sub(1.0, ans))))
# A Python float, not np.float64: numpy scalars are not "weak" and would turn
# a float32 gradient into float64.
erf = _p("erf", npo.erf).defvjp(
    lambda g, ans, x: o.mul(g, o.mul(o.exp(o.neg(o.mul(x, x))), 2.0 / math.sqrt(math.pi))))
# where, not g * mask: one pass fewer, and a non-finite g stays where x <= 0
# (torch's threshold_backward selects the same way).
relu = _p("relu", npo.relu).defvjp(lambda g, ans, x: o.where(raw(x) > 0, g, 0.0))
atan = _p("atan", npo.atan).defvjp(lambda g, ans, x: o.div(g, o.add(o.mul(x, x), 1.0)))
softplus = _p("softplus", npo.softplus).defvjp(lambda g, ans, x: o.mul(g, o.sigmoid(x)))
# fmt: on


def _astype_fwd(x, dtype):
    return npo.astype(x, dtype)


astype = _p("astype", _astype_fwd).defvjp(lambda g, ans, x, dtype: o.astype(g, _dtype(x)))


# ---------------------------------------------------------------- linear algebra
def _swap(x):
    axes = list(range(len(_shape(x))))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return o.transpose(x, tuple(axes))


_matmul = _p("matmul", npo.matmul).defvjp(
    lambda g, ans, a, b: unbroadcast(o.matmul(g, _swap(b)), _shape(a)),
    lambda g, ans, a, b: unbroadcast(o.matmul(_swap(a), g), _shape(b)),
)


def matmul(a, b):
    """1-d operands are promoted as numpy does, so the primitive only sees matrices."""
    va, vb = len(_shape(a)) == 1, len(_shape(b)) == 1
    out = _matmul(o.expand_dims(a, 0) if va else a, o.expand_dims(b, -1) if vb else b)
    if vb:
        out = o.squeeze(out, -1)
    if va:
        out = o.squeeze(out, -2 if not vb else -1)
    return out


def _einsum_vjp(argnum, g, ans, *operands, subscripts):
    ins, out = common.einsum_terms(subscripts)
    mine = ins[argnum]
    if len(set(mine)) != len(mine):
        raise NotImplementedError(f"einsum {subscripts!r}: no tape gradient for an operand with a repeated index")
    others = [s for k, s in enumerate(ins) if k != argnum]
    elsewhere = set(out).union(*others)
    kept = "".join(c for c in mine if c in elsewhere)
    spec = ",".join([out] + others) + "->" + kept
    r = o.einsum(spec, g, *(x for k, x in enumerate(operands) if k != argnum))
    if kept != mine:  # indices summed inside this operand alone: broadcast back
        shape = _shape(operands[argnum])
        r = o.broadcast_to(o.reshape(r, tuple(s if c in elsewhere else 1 for c, s in zip(mine, shape))), shape)
    return r


_einsum = _p("einsum", lambda *ops_, subscripts: np.einsum(subscripts, *ops_)).defvjp_argnum(_einsum_vjp)


def einsum(subscripts, *operands):
    # numpy's forms (implicit output, '...') spelled out, the '...' dims broadcast first: the VJP reads an
    # explicit equation in which every index has one size.
    equation, targets = common.einsum_plan(subscripts, [_shape(x) for x in operands])
    operands = [x if t is None else o.broadcast_to(x, t) for x, t in zip(operands, targets, strict=True)]
    return _einsum(*operands, subscripts=equation)


# ---------------------------------------------------------------- reductions
def _expand(g, shape, axis, keepdims):
    return g if keepdims else o.reshape(g, _keep_shape(shape, axis))


def _sum_vjp(g, ans, x, axis=None, keepdims=False):
    shape = _shape(x)
    return o.broadcast_to(_expand(g, shape, axis, keepdims), shape)


def _chooser_vjp(g, ans, x, axis=None, keepdims=False):
    """Max/min: the gradient is split evenly among the elements equal to the result."""
    shape = _shape(x)
    hit = raw(x) == np.reshape(raw(ans), _keep_shape(shape, axis))
    share = _const(hit / hit.sum(axis=common.axis_arg(axis), keepdims=True), x)
    return o.mul(_expand(g, shape, axis, keepdims), share)


def _logsumexp_vjp(g, ans, x, axis=None, keepdims=False):
    shape = _shape(x)
    return o.mul(_expand(g, shape, axis, keepdims), o.exp(o.sub(x, _expand(ans, shape, axis, keepdims))))


def _prod_vjp(g, ans, x, axis=None, keepdims=False):
    """The product of the other elements of each group: ``prod / x`` without zeros, with one zero the others'
    product at the zero (0 elsewhere), with two or more 0 everywhere (torch's ``prod_backward``).

    The zeros are replaced by 1 before dividing, so no 0/0 is formed, and the
    slope is written so that it has the right derivative too (second order):
    a slope whose value is 0 because the group holds zeros keeps those zeros
    as live values, multiplied in.  With one zero, a non-zero element's slope
    is the others' product over it times the zero (the group's sum of its
    zeros); with two, each zero's slope is the non-zero product times the
    other zero (that sum minus this one).  Products of two or more zeros stay 0
    to first order, and are 0.
    """
    shape = _shape(x)
    zero = raw(x) == 0
    zeros = np.sum(zero, axis=common.axis_arg(axis), keepdims=True)
    safe = o.where(zero, 1.0, x)
    others = o.prod(safe, axis=axis, keepdims=True)
    without = o.div(others, safe)  # the product of the group's non-zero elements other than this one
    zero_sum = o.sum(o.where(zero, x, 0.0), axis=axis, keepdims=True)  # the group's zeros, live (value 0)
    slope = o.where(zeros == 0, without,
                    o.where(zeros == 1, o.where(zero, others, o.mul(without, zero_sum)),
                            o.where(zero & (zeros == 2), o.mul(others, o.sub(zero_sum, x)), 0.0)))
    return o.mul(_expand(g, shape, axis, keepdims), slope)


sum = _p("sum", npo.sum).defvjp(_sum_vjp)
prod = _p("prod", npo.prod).defvjp(_prod_vjp)
max = _p("max", npo.max).defvjp(_chooser_vjp)
min = _p("min", npo.min).defvjp(_chooser_vjp)
logsumexp = _p("logsumexp", npo.logsumexp).defvjp(_logsumexp_vjp)
softmax = _p("softmax", npo.softmax).defvjp(
    lambda g, ans, x, axis=-1: o.mul(ans, o.sub(g, o.sum(o.mul(g, ans), axis=axis, keepdims=True))))
log_softmax = _p("log_softmax", npo.log_softmax).defvjp(
    lambda g, ans, x, axis=-1: o.sub(g, o.mul(o.exp(ans), o.sum(g, axis=axis, keepdims=True))))


def topk(x, k, axis=-1, largest=True):
    """The positions from numpy's stable sort of the values (constants), the values gathered at them:
    getitem's VJP scatters the gradient back to the elements picked."""
    index = npo.topk_indices(raw(x), k, axis, largest)
    ax = axis % len(_shape(x))
    grid = list(np.ogrid[tuple(slice(n) for n in index.shape)])
    grid[ax] = index
    return o.getitem(x, tuple(grid)), index


# ---------------------------------------------------------------- shapes
reshape = _p("reshape", npo.reshape).defvjp(lambda g, ans, x, shape: o.reshape(g, _shape(x)))
transpose = _p("transpose", npo.transpose).defvjp(
    lambda g, ans, x, axes=None: o.transpose(g, None if axes is None else _inverse_permutation(axes, len(_shape(x)))))


def _inverse_permutation(axes, ndim):
    # Negative axes are normalised first: argsort of (0, -1, 1) is not the inverse of (0, 2, 1).
    return tuple(int(i) for i in np.argsort([a % ndim for a in axes]))

broadcast_to = _p("broadcast_to", npo.broadcast_to).defvjp(
    lambda g, ans, x, shape: unbroadcast(g, _shape(x)))


def _concat_vjp(argnum, g, ans, *xs, axis=0):
    start = builtins.sum(_shape(x)[axis] for x in xs[:argnum])
    index = [slice(None)] * len(_shape(g))
    index[axis] = slice(start, start + _shape(xs[argnum])[axis])
    return o.getitem(g, tuple(index))


def _stack_vjp(argnum, g, ans, *xs, axis=0):
    axis = axis % len(_shape(g))
    return o.getitem(g, (slice(None),) * axis + (argnum,))


_concatenate = _p("concatenate", lambda *xs, axis=0: np.concatenate(xs, axis=axis)).defvjp_argnum(_concat_vjp)
_stack = _p("stack", lambda *xs, axis=0: np.stack(xs, axis=axis)).defvjp_argnum(_stack_vjp)


def concatenate(xs, axis=0):
    return _concatenate(*xs, axis=axis)


def stack(xs, axis=0):
    return _stack(*xs, axis=axis)


def _index_add_fwd(g, index, shape):
    out = np.zeros(shape, dtype=g.dtype)
    items = index if isinstance(index, tuple) else (index,)
    if builtins.any(isinstance(i, (np.ndarray, list)) for i in items):
        np.add.at(out, index, g)  # integer-array indices may repeat (embeddings)
    else:
        out[index] = g
    return out


# getitem and its adjoint, index_add into zeros, are each other's VJP.
_index_add = _p("index_add", _index_add_fwd).defvjp(lambda g, ans, x, index, shape: o.getitem(g, index))
_getitem = _p("getitem", lambda x, index: x[index]).defvjp(
    lambda g, ans, x, index: _index_add(g, index=index, shape=_shape(x)))


def _plain_index(item):
    # Integer arrays handed to f (token ids, labels) arrive as constant tape
    # tensors; as indices they are plain numpy.
    return item.value if isinstance(item, Tensor) else item


def getitem(x, index):
    # The op's rule refused float indices, and only float tensors require grad: a tensor here is a constant.
    index = tuple(_plain_index(i) for i in index) if isinstance(index, tuple) else _plain_index(index)
    return _getitem(x, index=index)


_pad = _p("pad", npo.pad).defvjp(
    lambda g, ans, x, pad_width, value=0.0: o.getitem(
        g, tuple(slice(b, b + s) for (b, _), s in zip(pad_width, _shape(x)))))


def pad(x, pad_width, value=0.0):
    # One (before, after) pair per axis, which is what the VJP slices by.
    return _pad(x, common.pad_pairs(_shape(x), pad_width), value=value)


# ---------------------------------------------------------------- convolution
# conv, its input gradient (the transposed convolution) and its weight
# gradient are each other's VJPs: the three are closed under differentiation.
def _lifted(f):
    def run(a, b, geom, nd):
        if nd == 1:
            a, b = a[:, :, None, :], b[:, :, None, :]
        out = f(a, b, geom)
        return out[:, :, 0, :] if nd == 1 else out

    return run


_conv = _p("conv", _lifted(kernels.conv2d))
_conv_input_grad = _p("conv_input_grad", _lifted(kernels.conv2d_input_grad))
_conv_weight_grad = _p("conv_weight_grad", _lifted(kernels.conv2d_weight_grad))
_conv.defvjp(
    lambda g, ans, x, w, geom, nd: _conv_input_grad(g, w, geom=geom, nd=nd),
    lambda g, ans, x, w, geom, nd: _conv_weight_grad(x, g, geom=geom, nd=nd))
_conv_input_grad.defvjp(
    lambda g, ans, gy, w, geom, nd: _conv(g, w, geom=geom, nd=nd),
    lambda g, ans, gy, w, geom, nd: _conv_weight_grad(g, gy, geom=geom, nd=nd))
_conv_weight_grad.defvjp(
    lambda g, ans, x, gy, geom, nd: _conv_input_grad(gy, g, geom=geom, nd=nd),
    lambda g, ans, x, gy, geom, nd: _conv(x, g, geom=geom, nd=nd))


def _add_bias(y, bias):
    if bias is None:
        return y
    return o.add(y, o.reshape(bias, common.channel_shape(len(_shape(y)))))


def conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    geom, nd = common.conv_geometry(_shape(x), _shape(w), stride, padding, dilation, groups)
    return _add_bias(_conv(x, w, geom=geom, nd=nd), bias)


def conv_transpose(x, w, bias=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    geom, nd = common.transposed_geometry(_shape(x), _shape(w), stride, padding, output_padding, dilation, groups)
    return _add_bias(_conv_input_grad(x, w, geom=geom, nd=nd), bias)


# ---------------------------------------------------------------- normalisation
# One node for (x - mean) * rsqrt(var + eps) * weight + bias instead of the
# ~15 its composition records (BatchNorm was an eighth to a fifth of
# ResNet-18's tape time at batch 2 and 1).
# The forward's centred input and 1/std ride on the node as a constant
# keyword, so a first-order backward pass reuses them (kernels.normalize_grads);
# under create_graph they are recomputed from x with ops, and the gradient is
# the same formula in ops, itself differentiable (second order).
def _normalize_vjp(argnums, g, ans, x, weight, bias, axes, eps, stats):
    if not isinstance(g, Tensor):
        return kernels.normalize_grads(argnums, g, weight, bias, axes, *stats)
    centred = o.sub(x, o.mean(x, axis=axes, keepdims=True))
    rstd = o.rsqrt(o.add(o.mean(o.mul(centred, centred), axis=axes, keepdims=True), eps))
    xhat = o.mul(centred, rstd)
    fold = weight is not None and kernels.broadcasts_into(_shape(weight), _shape(rstd))
    gx = g if weight is None or fold else o.mul(g, weight)  # the gradient at xhat, up to a folded weight
    grads = []
    for i in argnums:
        if i == 0:  # dx = scale * (gx - mean(gx) - xhat * mean(gx * xhat))
            scale = o.mul(rstd, weight) if fold else rstd
            m1 = o.mean(gx, axis=axes, keepdims=True)
            m2 = o.mean(o.mul(gx, xhat), axis=axes, keepdims=True)
            grads.append(o.mul(o.sub(o.sub(gx, m1), o.mul(xhat, m2)), scale))
        elif i == 1:
            grads.append(unbroadcast(o.mul(g, xhat), _shape(weight)))
        else:
            grads.append(unbroadcast(g, _shape(bias)))
    return grads


_normalize = _p("normalize", lambda x, weight, bias, axes, eps, stats: kernels.normalize_apply(*stats, weight, bias))
_normalize.defvjp_joint(_normalize_vjp)


def normalize(x, axes, eps, weight=None, bias=None):
    """``gradcheck.ops.normalize`` as one node (see there); ``mean`` and ``var`` carry no gradient."""
    axes = common.normal_axes("normalize", axes, _shape(x))
    mean, var, centred, rstd = kernels.normalize_stats(raw(x), axes, eps)
    y = _normalize(x, weight, bias, axes=axes, eps=eps, stats=(centred, rstd))
    return y, Tensor(mean), Tensor(var)


# ---------------------------------------------------------------- pooling
# First order only: the max-pool gradient routes g to each window's first
# maximum; its own VJP is not defined (a second derivative raises clearly).
_max_pool_grad = _p("max_pool2d_grad", lambda x, g, geom, out: kernels.max_pool2d_grad(x, g, geom, out))
_max_pool = _p("max_pool2d", lambda x, geom: kernels.max_pool2d(x, geom)).defvjp(
    # The forward's result tells the gradient which taps hold the maxima.
    lambda g, ans, x, geom: _max_pool_grad(x, g, geom=geom, out=raw(ans)))


def max_pool2d(x, kernel_size, stride=None, padding=0):
    return _max_pool(x, geom=common.pool_geometry("max_pool2d", _shape(x), kernel_size, stride, padding))


# Links a tensor of an outer gradient computation into an inner one.
identity = _p("identity", lambda x: x).defvjp(lambda g, ans, x: g)

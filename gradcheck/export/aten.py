"""ATen -> ``gradcheck.ops``: one row per ATen op, the table the tape, jax and the numpy referee run graphs by.

Each lowering takes the op's arguments as the graph gives them (ATen's
schema names and defaults, values already on the backend that runs) and
computes the same thing with ``gradcheck.ops``, so every backend that runs
the graph runs its own kernels: the tape its VJPs, jax ``jax.nn``/``lax``,
numpy the referee's float64 forward.  None of them sees torch's
decompositions of the ops kept whole (``capture.PRESERVED``).

Conventions:

* ``ctx`` comes first: the case's float dtype (``ctx.floats``), the dropout
  mask of this node, the node itself for messages.
* A float dtype in the graph (``torch.float32`` where the module was
  exported) means the float dtype of the run: the same graph runs in
  float64 (decides) and float32 (measured).  Integer and bool dtypes stay.
* Outputs a forward never reads (batch norm's saved statistics, max
  pooling's indices, dropout's mask) are ``Unavailable``: a lowering that is
  handed one raises, naming the op that made it.
* Boolean logic on masks (``logical_and``, ``any``) has no gradient and no
  kink; it runs on numpy, or on jax when a mask is traced (``_logic``).
  Comparisons go through ``ops.greater``/``ops.less``/``ops.equal``, which
  the float64 reference records and float32 runs are pinned to.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable

import numpy as np

from gradcheck import ops as o
from gradcheck.backends import backend_of

LOWERINGS: dict[str, Callable] = {}


def lower(*names: str):
    """Register a lowering for the ATen overloads ``names`` (``"aten.convolution.default"``)."""

    def register(fn):
        for name in names:
            LOWERINGS[name] = fn
        return fn

    return register


class Unavailable:
    """An output of an op that the forward does not compute (saved statistics, indices, masks)."""

    def __init__(self, what: str):
        self.what = what

    def __repr__(self):
        return f"<{self.what}: not computed>"


class LoweringError(NotImplementedError):
    """An op, or a form of one, that the table cannot run; the interpreter adds where it comes from."""


def _unsupported(op: str, why: str):
    raise LoweringError(f"{op}: {why}")


def _f(ctx, dtype):
    """A dtype of the graph as the run's numpy dtype (float -> the run's float dtype)."""
    if dtype is None:
        return None
    dtype = np.dtype(dtype)
    return ctx.floats if dtype.kind == "f" else dtype


def _carries_gradient(x) -> bool:
    """A value on a differentiating backend (tape, jax), not a numpy constant or a Python number."""
    return backend_of(x) not in (None, "numpy")


def _logic(*xs):
    """numpy, or jax.numpy when a value is traced: boolean logic is never differentiated."""
    for x in xs:
        if backend_of(x) == "jax":
            import jax.numpy as jnp

            return jnp
        if backend_of(x) == "torch":
            raise LoweringError("boolean logic on torch tensors: the torch backend runs the module itself")
    return np


def _raw(x):
    """A tape tensor's value (an index or a mask computed from one carries no gradient)."""
    if backend_of(x) == "tape":
        from gradcheck import tape

        return tape.raw(x)
    return x


def _dims(x, dim) -> tuple[int, ...] | None:
    """ATen's reduction dims (None or [] for all) as a tuple of non-negative axes, or None."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    nd = len(o.shape_of(x))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(d % builtins.max(nd, 1) for d in dims)


def _scalar_or_const(ctx, v):
    """A Python number as itself; a numpy constant in the run's float dtype when it is a float."""
    if isinstance(v, np.ndarray) and v.dtype.kind == "f":
        return v.astype(ctx.floats)
    return v


# ---------------------------------------------------------------- elementwise
def _alpha(b, alpha):
    return b if alpha == 1 else o.mul(b, alpha)


@lower("aten.add.Tensor", "aten.add.Scalar")
def add(ctx, self, other, alpha=1):
    return o.add(self, _alpha(other, alpha))


@lower("aten.sub.Tensor", "aten.sub.Scalar")
def sub(ctx, self, other, alpha=1):
    return o.sub(self, _alpha(other, alpha))


@lower("aten.rsub.Scalar", "aten.rsub.Tensor")
def rsub(ctx, self, other, alpha=1):
    return o.sub(other, _alpha(self, alpha))


@lower("aten.mul.Tensor", "aten.mul.Scalar")
def mul(ctx, self, other):
    return o.mul(self, other)


@lower("aten.div.Tensor", "aten.div.Scalar")
def div(ctx, self, other):
    return o.div(self, other)


@lower("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def div_mode(ctx, self, other, rounding_mode=None):
    if rounding_mode is None:
        return o.div(self, other)
    if _carries_gradient(self) or _carries_gradient(other):
        _unsupported("aten.div", f"rounding_mode={rounding_mode!r} on values that carry gradients")
    q = np.true_divide(self, other)
    out = np.floor(q) if rounding_mode == "floor" else np.trunc(q)
    both_int = all(np.asarray(v).dtype.kind in "iub" for v in (self, other))
    return out.astype(np.int64) if both_int else out


@lower("aten.neg.default")
def neg(ctx, self):
    return o.neg(self)


def _unary(name: str, fn):
    lower(f"aten.{name}.default")(lambda ctx, self: fn(self))


for _name, _fn in (("exp", o.exp), ("log", o.log), ("sqrt", o.sqrt), ("rsqrt", o.rsqrt), ("abs", o.abs),
                   ("sin", o.sin), ("cos", o.cos), ("tanh", o.tanh), ("sigmoid", o.sigmoid), ("erf", o.erf),
                   ("relu", o.relu), ("silu", o.silu), ("hardswish", o.hardswish),
                   ("hardsigmoid", o.hardsigmoid), ("log1p", o.log1p), ("expm1", o.expm1)):
    _unary(_name, _fn)


@lower("aten.reciprocal.default")
def reciprocal(ctx, self):
    return o.div(1.0, self)


@lower("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor")
def pow_(ctx, self, exponent):
    return o.pow(self, exponent)


@lower("aten.pow.Scalar")
def pow_scalar(ctx, self, exponent):
    return o.pow(o.asarray(np.asarray(self, ctx.floats), like=exponent), exponent)


@lower("aten.gelu.default")
def gelu(ctx, self, approximate="none"):
    return o.gelu(self, approximate=approximate)


@lower("aten.leaky_relu.default")
def leaky_relu(ctx, self, negative_slope=0.01):
    return o.leaky_relu(self, negative_slope)


@lower("aten.elu.default")
def elu(ctx, self, alpha=1.0, scale=1.0, input_scale=1.0):
    """``scale * (x if x > 0 else alpha * (exp(input_scale * x) - 1))``: ELU, and SELU's and CELU's forms."""
    if input_scale == 1.0:
        y = o.elu(self, alpha)
    else:  # the negative branch alone sees input_scale: elu of a scaled x would scale the positive one too
        positive = o.greater(self, 0.0)
        y = o.where(positive, self, o.mul(o.expm1(o.mul(o.where(positive, 0.0, self), input_scale)), alpha))
    return y if scale == 1.0 else o.mul(y, scale)


@lower("aten.softplus.default")
def softplus(ctx, self, beta=1.0, threshold=20.0):
    if beta != 1.0:
        return o.div(o.softplus(o.mul(self, beta)), beta)
    return o.softplus(self)


@lower("aten.clamp.default", "aten.clamp.Tensor")
def clamp(ctx, self, min=None, max=None):  # noqa: A002 - ATen's argument names
    # maximum/minimum are kink ops: the float64 reference records which side each element took.
    y = self if min is None else o.maximum(self, _scalar_or_const(ctx, min))
    return y if max is None else o.minimum(y, _scalar_or_const(ctx, max))


@lower("aten.clamp_min.default")
def clamp_min(ctx, self, min):  # noqa: A002
    return o.maximum(self, min)


@lower("aten.clamp_max.default")
def clamp_max(ctx, self, max):  # noqa: A002
    return o.minimum(self, max)


@lower("aten.hardtanh.default")
def hardtanh(ctx, self, min_val=-1.0, max_val=1.0):
    return o.minimum(o.maximum(self, min_val), max_val)


@lower("aten.maximum.default")
def maximum(ctx, self, other):
    return o.maximum(self, other)


@lower("aten.minimum.default")
def minimum(ctx, self, other):
    return o.minimum(self, other)


@lower("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def where(ctx, condition, self, other):
    return o.where(condition, _scalar_or_const(ctx, self), _scalar_or_const(ctx, other))


@lower("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(ctx, self, mask, value):
    return o.where(mask, _scalar_or_const(ctx, value), self)


# Comparisons: through ops (recorded and pinned kinks); the negated forms add boolean logic on top.
@lower("aten.gt.Tensor", "aten.gt.Scalar")
def gt(ctx, self, other):
    return o.greater(self, other)


@lower("aten.lt.Tensor", "aten.lt.Scalar")
def lt(ctx, self, other):
    return o.less(self, other)


@lower("aten.eq.Tensor", "aten.eq.Scalar")
def eq(ctx, self, other):
    return o.equal(self, other)


@lower("aten.ge.Tensor", "aten.ge.Scalar")
def ge(ctx, self, other):
    lt_ = o.less(self, other)
    return _logic(lt_).logical_not(_raw(lt_))


@lower("aten.le.Tensor", "aten.le.Scalar")
def le(ctx, self, other):
    gt_ = o.greater(self, other)
    return _logic(gt_).logical_not(_raw(gt_))


@lower("aten.ne.Tensor", "aten.ne.Scalar")
def ne(ctx, self, other):
    eq_ = o.equal(self, other)
    return _logic(eq_).logical_not(_raw(eq_))


@lower("aten.logical_not.default", "aten.bitwise_not.default")
def logical_not(ctx, self):
    if np.dtype(o.dtype_of(self)) != np.bool_:
        _unsupported("aten.bitwise_not", f"on a {o.dtype_of(self)} tensor (only boolean masks are lowered)")
    return _logic(self).logical_not(_raw(self))


def _logic2(name):
    def fn(ctx, self, other):
        return getattr(_logic(self, other), name)(_raw(self), _raw(other))

    return fn


for _name, _np in (("logical_and", "logical_and"), ("logical_or", "logical_or"), ("logical_xor", "logical_xor"),
                   ("bitwise_and", "logical_and"), ("bitwise_or", "logical_or")):
    lower(f"aten.{_name}.default", f"aten.{_name}.Tensor")(_logic2(_np))


@lower("aten.any.dim", "aten.any.dims", "aten.any.default")
def any_(ctx, self, dim=None, keepdim=False):
    axes = _dims(self, dim)
    return _logic(self).any(_raw(self), axis=axes, keepdims=keepdim)


@lower("aten.all.dim", "aten.all.dims", "aten.all.default")
def all_(ctx, self, dim=None, keepdim=False):
    axes = _dims(self, dim)
    return _logic(self).all(_raw(self), axis=axes, keepdims=keepdim)


@lower("aten.isnan.default")
def isnan(ctx, self):
    return _logic(self).isnan(_raw(self))


# ---------------------------------------------------------------- creation (constants, on numpy)
def _default_dtype(ctx, value, dtype):
    if dtype is not None:
        return _f(ctx, dtype)
    if isinstance(value, bool):
        return np.dtype(bool)
    if isinstance(value, int):
        return np.dtype(np.int64)
    return ctx.floats


@lower("aten.full.default")
def full(ctx, size, fill_value, dtype=None, **_):
    return np.full(tuple(size), fill_value, dtype=_default_dtype(ctx, fill_value, dtype))


@lower("aten.zeros.default", "aten.empty.memory_format", "aten.empty.default")
def zeros(ctx, size, dtype=None, **_):
    return np.zeros(tuple(size), dtype=_f(ctx, dtype) or ctx.floats)


@lower("aten.copy.default")
def copy(ctx, self, src, non_blocking=False):
    """``self.copy_(src)`` made functional: ``src`` in ``self``'s shape and dtype; the gradient goes to ``src``."""
    dt = np.dtype(o.dtype_of(self))
    src = src if np.dtype(o.dtype_of(src)) == dt else o.astype(src, dt)
    shape = o.shape_of(self)
    return src if o.shape_of(src) == shape else o.broadcast_to(src, shape)


@lower("aten.empty_permuted.default")
def empty_permuted(ctx, size, physical_layout, dtype=None, **_):
    # torch.empty_like's: the layout in memory is torch's business, the values are nobody's.
    return zeros(ctx, size, dtype)


@lower("aten.ones.default")
def ones(ctx, size, dtype=None, **_):
    return np.ones(tuple(size), dtype=_f(ctx, dtype) or ctx.floats)


@lower("aten.scalar_tensor.default")
def scalar_tensor(ctx, s, dtype=None, **_):
    return np.asarray(s, dtype=_f(ctx, dtype) or ctx.floats)


def _like(ctx, self, value, dtype):
    dt = _f(ctx, dtype) if dtype is not None else np.dtype(o.dtype_of(self))
    return np.full(o.shape_of(self), value, dtype=dt)


@lower("aten.full_like.default")
def full_like(ctx, self, fill_value, dtype=None, **_):
    return _like(ctx, self, fill_value, dtype)


@lower("aten.zeros_like.default", "aten.empty_like.default")
def zeros_like(ctx, self, dtype=None, **_):
    return _like(ctx, self, 0, dtype)


@lower("aten.ones_like.default")
def ones_like(ctx, self, dtype=None, **_):
    return _like(ctx, self, 1, dtype)


@lower("aten.new_zeros.default", "aten.new_empty.default")
def new_zeros(ctx, self, size, dtype=None, **_):
    return np.zeros(tuple(size), dtype=_f(ctx, dtype) if dtype is not None else np.dtype(o.dtype_of(self)))


@lower("aten.new_ones.default")
def new_ones(ctx, self, size, dtype=None, **_):
    return np.ones(tuple(size), dtype=_f(ctx, dtype) if dtype is not None else np.dtype(o.dtype_of(self)))


@lower("aten.new_full.default")
def new_full(ctx, self, size, fill_value, dtype=None, **_):
    return np.full(tuple(size), fill_value, dtype=_f(ctx, dtype) if dtype is not None else np.dtype(o.dtype_of(self)))


@lower("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def arange(ctx, *args, dtype=None, **_):
    values = args if len(args) != 1 else (0, args[0])
    ints = all(isinstance(v, int) for v in values)
    return np.arange(*values, dtype=_f(ctx, dtype) if dtype is not None else (np.int64 if ints else ctx.floats))


def _triangle(lower_: bool):
    def fn(ctx, self, diagonal=0):
        shape = o.shape_of(self)
        rows, cols = shape[-2:]
        keep = (np.tril if lower_ else np.triu)(np.ones((rows, cols), bool), diagonal)
        if backend_of(self) == "numpy":
            return np.where(keep, self, np.zeros((), np.asarray(self).dtype))
        return o.where(keep, self, o.zeros_like(self))

    return fn


LOWERINGS["aten.tril.default"] = _triangle(True)
LOWERINGS["aten.triu.default"] = _triangle(False)


# ---------------------------------------------------------------- dtype, copies, views
@lower("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout")
def to_copy(ctx, self, dtype=None, **_):
    if dtype is None:
        return self
    dt = _f(ctx, dtype)
    return self if np.dtype(o.dtype_of(self)) == dt else o.astype(self, dt)


def _identity(ctx, self, *args, **kwargs):
    return self


for _name in ("aten.clone.default", "aten.alias.default", "aten.lift_fresh_copy.default",
              "aten.contiguous.default"):
    LOWERINGS[_name] = _identity


@lower("aten.detach.default")
def detach(ctx, self):
    return o.stop_gradient(self) if _carries_gradient(self) else self


@lower("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.view_copy.default")
def view(ctx, self, size):
    return o.reshape(self, tuple(size))


@lower("aten.permute.default", "aten.permute_copy.default")
def permute(ctx, self, dims):
    return o.transpose(self, tuple(dims))


@lower("aten.transpose.int")
def transpose(ctx, self, dim0, dim1):
    nd = len(o.shape_of(self))
    axes = list(range(nd))
    axes[dim0 % nd], axes[dim1 % nd] = axes[dim1 % nd], axes[dim0 % nd]
    return o.transpose(self, tuple(axes))


@lower("aten.t.default")
def t(ctx, self):
    return self if len(o.shape_of(self)) < 2 else o.transpose(self, (1, 0))


@lower("aten.expand.default", "aten.expand_copy.default")
def expand(ctx, self, size, implicit=False):
    shape = o.shape_of(self)
    lead = len(size) - len(shape)
    target = tuple(shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return o.broadcast_to(self, target)


@lower("aten.unsqueeze.default")
def unsqueeze(ctx, self, dim):
    return o.expand_dims(self, dim)


@lower("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default")
def squeeze(ctx, self, dim=None):
    shape = o.shape_of(self)
    dims = range(len(shape)) if dim is None else [dim] if isinstance(dim, int) else dim
    drop = {d % builtins.max(len(shape), 1) for d in dims if shape and shape[d] == 1}
    return o.reshape(self, tuple(s for i, s in enumerate(shape) if i not in drop))


@lower("aten.flatten.using_ints")
def flatten(ctx, self, start_dim=0, end_dim=-1):
    shape = o.shape_of(self)
    if not shape:
        return o.reshape(self, (1,))
    s, e = start_dim % len(shape), end_dim % len(shape)
    return o.reshape(self, shape[:s] + (int(np.prod(shape[s : e + 1], dtype=np.int64)),) + shape[e + 1 :])


@lower("aten.unflatten.int")
def unflatten(ctx, self, dim, sizes):
    shape = o.shape_of(self)
    d = dim % len(shape)
    return o.reshape(self, shape[:d] + tuple(sizes) + shape[d + 1 :])


def _index(nd, dim, part):
    return (slice(None),) * (dim % nd) + (part,)


@lower("aten.slice.Tensor", "aten.slice_copy.Tensor")
def slice_(ctx, self, dim=0, start=None, end=None, step=1):
    nd = len(o.shape_of(self))
    size = o.shape_of(self)[dim % nd]
    # ATen's "to the end" is the largest int64; Python slices clamp any stop, but keep the number small.
    end = None if end is not None and end >= size else end
    return o.getitem(self, _index(nd, dim, slice(start, end, step)))


@lower("aten.select.int", "aten.select_copy.int")
def select(ctx, self, dim, index):
    nd = len(o.shape_of(self))
    return o.getitem(self, _index(nd, dim, int(index)))


@lower("aten.narrow.default")
def narrow(ctx, self, dim, start, length):
    return slice_(ctx, self, dim, start, start + length)


@lower("aten.cat.default")
def cat(ctx, tensors, dim=0):
    # torch accepts the legacy empty 1-d tensor in a cat of other ranks; it contributes nothing.
    parts = [t for t in tensors if not (o.shape_of(t) == (0,) and any(len(o.shape_of(u)) > 1 for u in tensors))]
    nd = len(o.shape_of(parts[0]))
    return o.concatenate([_scalar_or_const(ctx, p) for p in parts], axis=dim % nd)


@lower("aten.stack.default")
def stack(ctx, tensors, dim=0):
    nd = len(o.shape_of(tensors[0])) + 1
    return o.stack(list(tensors), axis=dim % nd)


@lower("aten.split_with_sizes.default", "aten.split_with_sizes_copy.default")
def split_with_sizes(ctx, self, split_sizes, dim=0):
    nd = len(o.shape_of(self))
    out, start = [], 0
    for s in split_sizes:
        out.append(o.getitem(self, _index(nd, dim, slice(start, start + s))))
        start += s
    return tuple(out)


@lower("aten.split.Tensor", "aten.split_copy.Tensor")
def split(ctx, self, split_size, dim=0):
    size = o.shape_of(self)[dim % len(o.shape_of(self))]
    sizes = [builtins.min(split_size, size - s) for s in range(0, size, split_size)]
    return split_with_sizes(ctx, self, sizes, dim)


@lower("aten.chunk.default")
def chunk(ctx, self, chunks, dim=0):
    size = o.shape_of(self)[dim % len(o.shape_of(self))]
    return split(ctx, self, -(-size // chunks), dim)


@lower("aten.unbind.int", "aten.unbind_copy.int")
def unbind(ctx, self, dim=0):
    nd = len(o.shape_of(self))
    return tuple(o.getitem(self, _index(nd, dim, i)) for i in range(o.shape_of(self)[dim % nd]))


@lower("aten.index.Tensor")
def index(ctx, self, indices):
    # ATen's None in an index list is "all of this dim", not numpy's new axis.
    return o.getitem(self, tuple(slice(None) if i is None else i for i in indices))


@lower("aten.index_select.default")
def index_select(ctx, self, dim, index):
    return o.take(self, index, axis=dim)


@lower("aten.as_strided.default", "aten.as_strided_copy.default")
def as_strided(ctx, self, size, stride, storage_offset=None):
    """Element ``i`` of the view is ``self``'s element ``offset + sum_k i_k stride_k`` in row-major order.

    That is ``as_strided`` of a contiguous tensor, which is what a graph's
    value is; the lowering check holds it to torch's result on the tensor
    torch actually had.  A gather, so overlapping windows add up their
    gradients, as torch's backward does.
    """
    nd = len(size)
    index = np.full(tuple(size), int(storage_offset or 0), dtype=np.int64)
    for k, (n, s) in enumerate(zip(size, stride)):
        index = index + np.arange(n).reshape((1,) * k + (n,) + (1,) * (nd - k - 1)) * int(s)
    return o.take(o.reshape(self, (-1,)), index, axis=0)


@lower("aten.gather.default")
def gather(ctx, self, dim, index, sparse_grad=False):
    """``out[..., i, ...] = self[..., index[..., i, ...], ...]`` along ``dim``: one advanced index per axis."""
    shape = o.shape_of(index)
    nd = len(shape)
    dim %= nd
    parts = tuple(index if d == dim else np.arange(shape[d]).reshape((1,) * d + (shape[d],) + (1,) * (nd - d - 1))
                  for d in range(nd))
    return o.getitem(self, parts)


@lower("aten.scatter_add.default")
def scatter_add(ctx, self, dim, index, src):
    """``self`` plus ``src[p]`` added at ``p`` with its ``dim`` coordinate replaced by ``index[p]``.

    The index is a constant (a graph's scatter positions come from data, not
    from a parameter), so the scatter is a sum against its one-hot: linear in
    ``self`` and ``src``, and a repeated position adds up, as torch's does.
    """
    if _carries_gradient(index):
        _unsupported("aten.scatter_add", "with an index that is not a constant")
    index = np.asarray(index)
    shape, ishape = o.shape_of(self), index.shape
    nd = len(shape)
    dim %= nd
    if any(i > s for i, s in zip(ishape, shape)) or any(i > s for i, s in zip(ishape, o.shape_of(src))):
        _unsupported("aten.scatter_add", f"an index of shape {ishape} larger than self {shape} or src")
    src = o.getitem(src, tuple(slice(0, i) for i in ishape))
    hot = np.expand_dims(index, -1) == np.arange(shape[dim])  # (ishape..., n): where each entry lands
    added = o.sum(o.mul(o.expand_dims(src, nd), o.asarray(hot, like=src)), axis=dim)  # ishape without dim, + (n,)
    added = o.transpose(added, tuple(range(dim)) + (nd - 1,) + tuple(range(dim, nd - 1)))
    short = [(0, s - i) if k != dim else (0, 0) for k, (i, s) in enumerate(zip(ishape, shape))]
    if any(after for _, after in short):
        added = o.pad(added, tuple(short))
    return o.add(self, added)


@lower("aten.cumsum.default")
def cumsum(ctx, self, dim, dtype=None):
    """A product with the upper-triangular ones matrix along ``dim`` (differentiable wherever matmul is)."""
    nd = len(o.shape_of(self))
    dim %= nd
    n = o.shape_of(self)[dim]
    x = self if dtype is None else o.astype(self, _f(ctx, dtype))
    perm = tuple(d for d in range(nd) if d != dim) + (dim,)
    y = o.matmul(o.transpose(x, perm), o.asarray(np.triu(np.ones((n, n))), like=x))
    return o.transpose(y, tuple(int(i) for i in np.argsort(perm)))


@lower("aten.flip.default")
def flip(ctx, self, dims):
    nd = len(o.shape_of(self))
    idx = [slice(None)] * nd
    for d in dims:
        idx[d % nd] = slice(None, None, -1)
    return o.getitem(self, tuple(idx))


@lower("aten.repeat.default")
def repeat(ctx, self, repeats):
    shape = (1,) * (len(repeats) - len(o.shape_of(self))) + o.shape_of(self)
    x = o.reshape(self, tuple(d for s in shape for d in (1, s)))
    x = o.broadcast_to(x, tuple(d for r, s in zip(repeats, shape) for d in (r, s)))
    return o.reshape(x, tuple(r * s for r, s in zip(repeats, shape)))


@lower("aten.constant_pad_nd.default")
def constant_pad_nd(ctx, self, pad, value=0):
    nd = len(o.shape_of(self))
    # torch lists (before, after) pairs from the last dim backwards; negative pads crop.
    pairs = [(0, 0)] * nd
    for i in range(len(pad) // 2):
        pairs[nd - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    if any(a < 0 or b < 0 for a, b in pairs):
        _unsupported("aten.constant_pad_nd", f"negative padding {list(pad)} (cropping)")
    return o.pad(self, tuple(pairs), value=float(value))


# ---------------------------------------------------------------- reductions
@lower("aten.sum.dim_IntList", "aten.sum.default")
def sum_(ctx, self, dim=None, keepdim=False, dtype=None):
    if np.dtype(o.dtype_of(self)).kind in "biu" and backend_of(self) == "numpy":
        return np.sum(self, axis=_dims(self, dim), keepdims=keepdim)
    return o.sum(self, axis=_dims(self, dim), keepdims=keepdim)


@lower("aten.mean.dim", "aten.mean.default")
def mean(ctx, self, dim=None, keepdim=False, dtype=None):
    return o.mean(self, axis=_dims(self, dim), keepdims=keepdim)


@lower("aten.var.correction", "aten.var.dim", "aten.var.default")
def var(ctx, self, dim=None, unbiased=None, keepdim=False, correction=None):
    ddof = correction if correction is not None else (1 if unbiased is None or unbiased else 0)
    return o.var(self, axis=_dims(self, dim), keepdims=keepdim, ddof=ddof)


@lower("aten.std.correction", "aten.std.dim", "aten.std.default")
def std(ctx, self, dim=None, unbiased=None, keepdim=False, correction=None):
    return o.sqrt(var(ctx, self, dim, unbiased, keepdim, correction))


@lower("aten.linalg_vector_norm.default")
def linalg_vector_norm(ctx, self, ord=2, dim=None, keepdim=False, dtype=None):  # noqa: A002
    """``||x||_ord`` over ``dim`` (all dims when None): 2, 1, inf, -inf, or any p > 0 as ``(sum |x|^p)^(1/p)``."""
    x = self if dtype is None else o.astype(self, _f(ctx, dtype))
    axis = _dims(x, dim)
    if ord == 2:
        return o.sqrt(o.sum(o.mul(x, x), axis=axis, keepdims=keepdim))
    if ord in (math.inf, -math.inf):
        return (o.max if ord > 0 else o.min)(o.abs(x), axis=axis, keepdims=keepdim)
    if ord == 1:
        return o.sum(o.abs(x), axis=axis, keepdims=keepdim)
    if ord > 0:
        return o.pow(o.sum(o.pow(o.abs(x), float(ord)), axis=axis, keepdims=keepdim), 1.0 / ord)
    _unsupported("aten.linalg_vector_norm", f"ord={ord}; the lowered norms are p > 0 and inf (p = 0 counts, "
                                            "it has no derivative)")


@lower("aten.sign.default")
def sign(ctx, self):
    """-1, 0 or 1; piecewise constant, so no gradient flows (torch's too)."""
    dt = o.dtype_of(self)
    return o.sub(o.astype(o.greater(self, 0.0), dt), o.astype(o.less(self, 0.0), dt))


@lower("aten.fmod.Scalar", "aten.fmod.Tensor", "aten.remainder.Scalar", "aten.remainder.Tensor")
def fmod(ctx, self, other):
    # torch.roll's decomposition computes its gather indices with fmod of an arange: constants only.
    if _carries_gradient(self) or _carries_gradient(other):
        _unsupported(ctx.op, "of a value that carries a gradient (only constant index arithmetic is lowered)")
    a, b = np.asarray(self), np.asarray(other)
    return np.fmod(a, b) if "fmod" in ctx.op else np.remainder(a, b)


@lower("aten.amax.default")
def amax(ctx, self, dim=(), keepdim=False):
    return o.max(self, axis=_dims(self, dim), keepdims=keepdim)


@lower("aten.amin.default")
def amin(ctx, self, dim=(), keepdim=False):
    return o.min(self, axis=_dims(self, dim), keepdims=keepdim)


@lower("aten.max.dim")
def max_dim(ctx, self, dim, keepdim=False):
    return o.max(self, axis=dim, keepdims=keepdim), Unavailable("the indices of aten.max.dim")


@lower("aten.min.dim")
def min_dim(ctx, self, dim, keepdim=False):
    return o.min(self, axis=dim, keepdims=keepdim), Unavailable("the indices of aten.min.dim")


def _arg(name):
    def fn(ctx, self, dim=None, keepdim=False):
        return getattr(_logic(self), name)(_raw(self), axis=dim, keepdims=keepdim)

    return fn


LOWERINGS["aten.argmax.default"] = _arg("argmax")
LOWERINGS["aten.argmin.default"] = _arg("argmin")


@lower("aten._softmax.default", "aten.softmax.int")
def softmax(ctx, self, dim, half_to_float=False, dtype=None):
    return o.softmax(self, axis=dim)


@lower("aten._log_softmax.default", "aten.log_softmax.int")
def log_softmax(ctx, self, dim, half_to_float=False, dtype=None):
    return o.log_softmax(self, axis=dim)


@lower("aten.logsumexp.default")
def logsumexp(ctx, self, dim, keepdim=False):
    return o.logsumexp(self, axis=_dims(self, dim), keepdims=keepdim)


# ---------------------------------------------------------------- linear algebra
@lower("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def matmul(ctx, self, other):
    return o.matmul(self, other)


@lower("aten.addmm.default", "aten.baddbmm.default")
def addmm(ctx, self, mat1, mat2, beta=1, alpha=1):
    prod = o.matmul(mat1, mat2)
    prod = prod if alpha == 1 else o.mul(prod, alpha)
    if beta == 0:
        return prod
    return o.add(self if beta == 1 else o.mul(self, beta), prod)


@lower("aten.linear.default")
def linear(ctx, input, weight, bias=None):  # noqa: A002
    return o.linear(input, weight, bias)


@lower("aten.einsum.default")
def einsum(ctx, equation, tensors, path=None):
    return o.einsum(equation.replace(" ", ""), *tensors)


# ---------------------------------------------------------------- neural-network ops
def _pair(v, n=2):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(v * n if len(v) == 1 else v)


@lower("aten.convolution.default")
def convolution(ctx, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):  # noqa: A002
    nd = len(o.shape_of(weight)) - 2
    stride, padding, dilation = _pair(stride, nd), _pair(padding, nd), _pair(dilation, nd)
    if transposed:
        return o.conv_transpose(input, weight, bias, stride=stride, padding=padding,
                                output_padding=_pair(output_padding, nd), dilation=dilation, groups=groups)
    return o.conv(input, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)


@lower("aten.conv1d.default", "aten.conv2d.default", "aten.conv1d.padding", "aten.conv2d.padding")
def conv(ctx, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    nd = len(o.shape_of(weight)) - 2
    pad = padding if isinstance(padding, str) else _pair(padding, nd)
    return o.conv(input, weight, bias, stride=_pair(stride, nd), padding=pad, dilation=_pair(dilation, nd),
                  groups=groups)


@lower("aten.conv_transpose1d.default", "aten.conv_transpose2d.input")
def conv_transpose(ctx, input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,  # noqa: A002
                   dilation=1):
    nd = len(o.shape_of(weight)) - 2
    return o.conv_transpose(input, weight, bias, stride=_pair(stride, nd), padding=_pair(padding, nd),
                            output_padding=_pair(output_padding, nd), dilation=_pair(dilation, nd), groups=groups)


def _stats(op):
    return Unavailable(f"the saved statistics of {op}")


@lower("aten._native_batch_norm_legit_functional.default")
def batch_norm_functional(ctx, input, weight, bias, running_mean, running_var, training, momentum, eps):  # noqa: A002
    y, new_mean, new_var = o.batch_norm(input, running_mean, running_var, weight, bias, training=training,
                                        momentum=momentum, eps=eps)
    op = "aten._native_batch_norm_legit_functional"
    return y, _stats(op), _stats(op), new_mean, new_var


@lower("aten._native_batch_norm_legit_no_training.default")
def batch_norm_eval(ctx, input, weight, bias, running_mean, running_var, momentum, eps):  # noqa: A002
    y = o.batch_norm(input, running_mean, running_var, weight, bias, training=False, eps=eps)[0]
    op = "aten._native_batch_norm_legit_no_training"
    return y, _stats(op), _stats(op)


@lower("aten._native_batch_norm_legit.no_stats")
def batch_norm_no_stats(ctx, input, weight, bias, training, momentum, eps):  # noqa: A002
    y = o.batch_norm(input, None, None, weight, bias, training=True, eps=eps)[0]
    op = "aten._native_batch_norm_legit.no_stats"
    return y, _stats(op), _stats(op)


@lower("aten.native_layer_norm.default")
def native_layer_norm(ctx, input, normalized_shape, weight, bias, eps):  # noqa: A002
    op = "aten.native_layer_norm"
    return o.layer_norm(input, tuple(normalized_shape), weight, bias, eps=eps), _stats(op), _stats(op)


@lower("aten.layer_norm.default")
def layer_norm(ctx, input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):  # noqa: A002
    return o.layer_norm(input, tuple(normalized_shape), weight, bias, eps=eps)


@lower("aten.native_group_norm.default")
def native_group_norm(ctx, input, weight, bias, N, C, HxW, group, eps):  # noqa: A002, N803
    op = "aten.native_group_norm"
    return o.group_norm(input, group, weight, bias, eps=eps), _stats(op), _stats(op)


@lower("aten.group_norm.default")
def group_norm(ctx, input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):  # noqa: A002
    return o.group_norm(input, num_groups, weight, bias, eps=eps)


@lower("aten.rms_norm.default")
def rms_norm(ctx, input, normalized_shape, weight=None, eps=None):  # noqa: A002
    return o.rms_norm(input, tuple(normalized_shape), weight, eps=eps)


@lower("aten.embedding.default")
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if scale_grad_by_freq:
        _unsupported("aten.embedding", "scale_grad_by_freq=True rescales gradients by token counts, which is "
                                       "not the derivative of the forward; no independent AD can agree with it")
    return o.embedding(indices, weight, padding_idx=None if padding_idx is None or padding_idx < 0 else padding_idx)


@lower("aten.native_dropout.default")
def native_dropout(ctx, input, p, train):  # noqa: A002
    if not train or p == 0:
        return input, Unavailable("the mask of aten.native_dropout")
    return o.mul(input, o.asarray(ctx.dropout_mask(o.shape_of(input), p), like=input)), \
        Unavailable("the mask of aten.native_dropout")


@lower("aten.bernoulli.p")
def bernoulli(ctx, self, p=0.5, generator=None):
    """1 with probability ``p``, else 0, shaped like ``self``: the case's mask (DropPath draws its keep mask so).

    The mask is the one a dropout of probability ``1 - p`` would keep, drawn
    for this node from the case seed; torch's run gets the same one.  A
    constant: a random draw has no derivative.
    """
    shape = o.shape_of(self)
    dt = np.dtype(o.dtype_of(self))
    dt = dt if dt.kind == "f" else ctx.floats
    if not 0.0 < p < 1.0:
        return np.full(shape, float(p >= 1.0), dtype=dt)
    return (np.asarray(ctx.dropout_mask(shape, 1.0 - p)) != 0).astype(dt)


@lower("aten.dropout.default")
def dropout(ctx, input, p, train):  # noqa: A002
    return native_dropout(ctx, input, p, train)[0]


@lower("aten.max_pool2d_with_indices.default", "aten.max_pool2d.default")
def max_pool2d(ctx, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    if _pair(dilation) != (1, 1):
        _unsupported("aten.max_pool2d_with_indices", f"dilation={list(_pair(dilation))}; gradcheck's max_pool2d "
                                                    "has dilation 1")
    stride = _pair(stride) if stride else _pair(kernel_size)
    y = max_pool2d_ceil(self, _pair(kernel_size), stride, _pair(padding), ceil_mode)
    return (y, Unavailable("the indices of aten.max_pool2d_with_indices")) if ctx.op.endswith("with_indices.default") \
        else y


def max_pool2d_ceil(x, kernel_size, stride, padding, ceil_mode: bool):
    """``F.max_pool2d`` with torch's ``ceil_mode``: the input padded with -inf on the far side where ceil adds a window.

    torch's rule: ``ceil((H + 2p - k) / s) + 1`` windows, less one if the
    last would start past the input and its left padding.  The extra rows are
    -inf, so a window that reaches them takes its maximum among real ones.
    """
    kernel_size, stride, padding = _pair(kernel_size), _pair(stride), _pair(padding)
    if not ceil_mode:
        return o.max_pool2d(x, kernel_size, stride, padding)
    extra = []
    for size, k, s, p in zip(o.shape_of(x)[2:], kernel_size, stride, padding):
        out = -(-(size + 2 * p - k) // s) + 1
        if (out - 1) * s >= size + p:
            out -= 1
        extra.append(max((out - 1) * s + k - size - 2 * p, 0))
    if not any(extra):
        return o.max_pool2d(x, kernel_size, stride, padding)
    (ph, pw), (eh, ew) = padding, extra
    padded = o.pad(x, ((0, 0), (0, 0), (ph, ph + eh), (pw, pw + ew)), value=-math.inf)
    return o.max_pool2d(padded, kernel_size, stride, 0)


@lower("aten.adaptive_max_pool2d.default")
def adaptive_max_pool2d(ctx, self, output_size):
    h, w = o.shape_of(self)[-2:]
    oh, ow = (s if s is not None else d for s, d in zip(_pair(output_size), (h, w)))
    if h % oh or w % ow or len(o.shape_of(self)) != 4:
        _unsupported("aten.adaptive_max_pool2d", f"output {(oh, ow)} of an input {o.shape_of(self)}; lowered where "
                                                 "the output divides the NCHW input (as a max pool with that window)")
    y = o.max_pool2d(self, (h // oh, w // ow), (h // oh, w // ow), 0)
    return y, Unavailable("the indices of aten.adaptive_max_pool2d")


@lower("aten.avg_pool2d.default")
def avg_pool2d(ctx, self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    if ceil_mode or divisor_override is not None:
        _unsupported("aten.avg_pool2d", f"ceil_mode={ceil_mode}, divisor_override={divisor_override}")
    stride = _pair(stride) if stride else _pair(kernel_size)
    return o.avg_pool2d(self, _pair(kernel_size), stride, _pair(padding), count_include_pad=count_include_pad)


@lower("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def adaptive_avg_pool2d(ctx, self, output_size):
    h, w = o.shape_of(self)[-2:]
    size = tuple(s if s is not None else d for s, d in zip(_pair(output_size), (h, w)))
    if len(o.shape_of(self)) == 3:  # (C, H, W): a batch of one
        return o.reshape(o.adaptive_avg_pool2d(o.expand_dims(self, 0), size), o.shape_of(self)[:1] + size)
    return o.adaptive_avg_pool2d(self, size)


def _upsample_size(x, output_size, scale_factors):
    if output_size is not None:
        return tuple(output_size), None
    h, w = o.shape_of(x)[-2:]
    sh, sw = _pair(scale_factors)
    return (int(math.floor(h * sh)), int(math.floor(w * sw))), (sh, sw)


@lower("aten.upsample_nearest2d.vec")
def upsample_nearest2d_vec(ctx, input, output_size, scale_factors):  # noqa: A002
    size, scales = _upsample_size(input, output_size, scale_factors)
    return o.upsample_nearest2d(input, size, scales)


@lower("aten.upsample_nearest2d.default")
def upsample_nearest2d(ctx, self, output_size, scales_h=None, scales_w=None):
    scales = None if scales_h is None and scales_w is None else (scales_h, scales_w)
    return o.upsample_nearest2d(self, tuple(output_size), scales)


@lower("aten.upsample_bilinear2d.vec")
def upsample_bilinear2d_vec(ctx, input, output_size, align_corners, scale_factors):  # noqa: A002
    size, scales = _upsample_size(input, output_size, scale_factors)
    return o.upsample_bilinear2d(input, size, align_corners, scales)


@lower("aten.upsample_bilinear2d.default")
def upsample_bilinear2d(ctx, self, output_size, align_corners, scales_h=None, scales_w=None):
    scales = None if scales_h is None and scales_w is None else (scales_h, scales_w)
    return o.upsample_bilinear2d(self, tuple(output_size), align_corners, scales)


@lower("aten.scaled_dot_product_attention.default")
def scaled_dot_product_attention(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    if enable_gqa:
        _unsupported("aten.scaled_dot_product_attention", "enable_gqa=True (grouped-query attention)")
    mask = None
    if dropout_p > 0:
        mask = ctx.dropout_mask(attention_shape(query, key), dropout_p)
    if isinstance(attn_mask, np.ndarray) and attn_mask.dtype.kind == "f":
        attn_mask = attn_mask.astype(ctx.floats)
    return o.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_mask=mask,
                                          is_causal=is_causal, scale=scale)


def attention_shape(query, key) -> tuple[int, ...]:
    """The shape of the attention weights, (..., L, S): the dropout mask's shape."""
    batch = np.broadcast_shapes(o.shape_of(query)[:-2], o.shape_of(key)[:-2])
    return tuple(batch) + (o.shape_of(query)[-2], o.shape_of(key)[-2])


@lower("aten._scaled_dot_product_flash_attention_for_cpu.default")
def sdpa_flash_cpu(ctx, query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    out = scaled_dot_product_attention(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale)
    return out, Unavailable("the logsumexp of aten._scaled_dot_product_flash_attention_for_cpu")


# Graph bookkeeping that computes nothing.
for _name in ("aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
              "aten.sym_constrain_range_for_size.default", "aten._assert_async.msg",
              "aten._functional_assert_async.msg"):
    LOWERINGS[_name] = lambda ctx, *args, **kwargs: None

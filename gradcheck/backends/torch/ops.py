"""PyTorch implementations of ``gradcheck.ops``.

Every op of ``gradcheck.ops`` is defined here with torch / torch.nn.functional,
with numpy's conventions for axes (``axis`` an int, a tuple or None;
``keepdims``), broadcasting and indexing, and PyTorch's layouts (NCHW, OIHW,
transposed-convolution weights ``(in, out/groups, *kernel)``).

Constants may be numpy arrays or Python scalars.  A float numpy constant takes
the dtype of the torch tensor it meets (a float64 scale must not turn a
float32 activation into float64, which is what numpy-style promotion of two
tensors would do); integer and bool constants keep their dtype.  Everything
lands on the device of the tensor it meets.

Every op runs torch's own function, the one a torch model calls: ``F.linear``,
``F.batch_norm``, ``F.layer_norm``, ``F.group_norm``, ``F.rms_norm``,
``F.scaled_dot_product_attention``, ``F.embedding``, the ``F`` losses,
``F.conv*d``, the ``F`` activations and pools, ``torch.softmax`` ...  (tests
check that none of them runs a composition of other ops).  The exceptions:
``normalize`` (statistics over arbitrary axes, which torch has no kernel for;
the layers call ``batch_norm``/``layer_norm``/``group_norm``) runs the derived
composition in ``gradcheck.ops``; ``softmax``/``log_softmax`` over several axes
at once are composed from ``torch.logsumexp`` (torch's take one dim).

Arguments arrive checked by the rules in ``gradcheck/ops/rules.py``, so
a wrong shape gets the message every backend gives, not torch's own.
"""

from __future__ import annotations

import builtins
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from gradcheck.ops import rules as common

# torch warns that an even kernel with padding="same" copies the input; that
# is the semantics gradcheck asks for, so the warning only clutters reports.
warnings.filterwarnings("ignore", message="Using padding='same' with even kernel lengths", category=UserWarning)

# ---------------------------------------------------------------- conversion
_SCALARS = (bool, int, float)


def _torch_dtype(dtype) -> torch.dtype:
    """A numpy dtype (or its name, or a torch dtype) as a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = np.dtype(dtype).name
    found = getattr(torch, name, None)
    if not isinstance(found, torch.dtype):
        raise TypeError(f"dtype {name!r} has no torch equivalent; use a float, int or bool dtype")
    return found


def _numpy_to_torch(value, device, dtype=None) -> torch.Tensor:
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise TypeError(
            f"cannot pass a numpy array of dtype {arr.dtype} to torch; use a float, int or bool array"
        )
    # torch shares numpy's memory and refuses negative strides; read-only
    # views (np.broadcast_to) would make it warn.  Copy those.
    if not (arr.flags.writeable and arr.flags.c_contiguous):
        arr = np.array(arr, order="C")
    return torch.as_tensor(arr, device=device, dtype=dtype)


def _const(value, ref: torch.Tensor | None):
    """``value`` as something torch can combine with ``ref``; Python scalars stay scalars."""
    if isinstance(value, torch.Tensor) or isinstance(value, _SCALARS):
        return value
    device = ref.device if ref is not None else None
    dtype = None
    if np.asarray(value).dtype.kind == "f" and ref is not None and ref.is_floating_point():
        dtype = ref.dtype
    return _numpy_to_torch(value, device, dtype)


def _tensor(value, ref: torch.Tensor | None) -> torch.Tensor:
    """Like ``_const``, but Python scalars become 0-d tensors (for ops that need tensors)."""
    value = _const(value, ref)
    if isinstance(value, torch.Tensor):
        return value
    if ref is None:
        return torch.as_tensor(value)
    return torch.as_tensor(value, dtype=torch.result_type(ref, value), device=ref.device)


def _ref(*args) -> torch.Tensor | None:
    """The first torch tensor among ``args``: its dtype and device are what constants adopt."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
    return None


def _operands(a, b):
    """Two operands for a torch function: ``a`` a tensor, ``b`` a tensor or a Python scalar.

    torch.add(2.0, x) is an error, so a scalar first operand becomes a 0-d
    tensor (which, like the scalar, does not change the result dtype).
    """
    ref = _ref(a, b)
    return _tensor(a, ref), _const(b, ref)


def _tensors(a, b):
    """Two operands that must both be tensors (torch.maximum, torch.matmul)."""
    ref = _ref(a, b)
    return _tensor(a, ref), _tensor(b, ref)


def to_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided:  # nn.Embedding(sparse=True)'s gradient: the same numbers, stored sparsely
            x = x.to_dense()
        # A ZeroTensor (torch's gradient through sgn, zero by declaration) holds no memory, which numpy needs made;
        # a conjugate or negative view has a lazy bit numpy cannot read.
        return x.detach().cpu().resolve_conj().resolve_neg().numpy(force=x._is_zerotensor())
    return np.asarray(x)


def asarray(value, like=None, dtype=None):
    like = like if isinstance(like, torch.Tensor) else None
    if isinstance(value, torch.Tensor):
        out = value if like is None else value.to(like.device)
    else:
        out = _numpy_to_torch(value, like.device if like is not None else None)
    # A float constant lives in the activations' precision.
    target = common.asarray_dtype(out, like, dtype)
    return out if target is None else out.to(_torch_dtype(target))


def astype(x, dtype):
    return x.to(_torch_dtype(dtype))


def zeros_like(x):
    return torch.zeros_like(x)


def stop_gradient(x):
    return x.detach()


# ---------------------------------------------------------------- elementwise
def add(a, b):
    return torch.add(*_operands(a, b))


def sub(a, b):
    return torch.sub(*_operands(a, b))


def mul(a, b):
    return torch.mul(*_operands(a, b))


def div(a, b):
    return torch.true_divide(*_operands(a, b))


def neg(a):
    return torch.neg(a)


def pow(a, b):
    return torch.pow(*_operands(a, b))


def maximum(a, b):
    # Ties split the gradient evenly, as on the tape and in jax.
    return torch.maximum(*_tensors(a, b))


def minimum(a, b):
    return torch.minimum(*_tensors(a, b))


def greater(a, b):
    return torch.gt(*_operands(a, b))


def less(a, b):
    return torch.lt(*_operands(a, b))


def equal(a, b):
    return torch.eq(*_operands(a, b))


def _on_device(value, device) -> torch.Tensor:
    """A constant with no tensor to take a dtype from: numpy keeps its dtype, a scalar gets torch's default."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, _SCALARS):
        return torch.as_tensor(value, device=device)
    return _numpy_to_torch(value, device)


def where(cond, a, b):
    ref = _ref(a, b)
    device = _ref(cond, a, b).device
    cond = cond if isinstance(cond, torch.Tensor) else _numpy_to_torch(cond, device)
    if cond.dtype != torch.bool:
        raise TypeError(
            f"where: the condition must be boolean, got {cond.dtype}; compare first (ops.greater)"
        )
    if ref is None:  # only the condition is a tensor: the branches follow its device
        return torch.where(cond, _on_device(a, device), _on_device(b, device))
    return torch.where(cond, _const(a, ref), _const(b, ref))


def exp(x):
    return torch.exp(x)


def expm1(x):
    return torch.expm1(x)


def log(x):
    return torch.log(x)


def log1p(x):
    return torch.log1p(x)


def sqrt(x):
    return torch.sqrt(x)


def rsqrt(x):
    return torch.rsqrt(x)


def abs(x):
    return torch.abs(x)


def sin(x):
    return torch.sin(x)


def cos(x):
    return torch.cos(x)


def tanh(x):
    return torch.tanh(x)


def sigmoid(x):
    return torch.sigmoid(x)


def erf(x):
    return torch.special.erf(x)


def atan(x):
    return torch.atan(x)


def relu(x):
    return torch.relu(x)


def leaky_relu(x, negative_slope=0.01):
    return F.leaky_relu(x, negative_slope)


def elu(x, alpha=1.0):
    return F.elu(x, alpha)


def gelu(x, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate={approximate!r}; expected 'none' or 'tanh'")
    return F.gelu(x, approximate=approximate)


def silu(x):
    return F.silu(x)


def softplus(x):
    # torch returns x itself above x = 20 (its default threshold); the exact
    # value differs from that by under 2.1e-9, below float32 resolution there.
    return F.softplus(x)


# ---------------------------------------------------------------- linear algebra
def matmul(a, b):
    return torch.matmul(*_tensors(a, b))


def einsum(subscripts, *operands):
    ref = _ref(*operands)
    return torch.einsum(subscripts, *(_tensor(x, ref) for x in operands))


# ---------------------------------------------------------------- reductions
def _reduce(fn, x, axis, keepdims, **kwargs):
    dims = common.normal_axes(fn.__name__, axis, tuple(x.shape))
    if not dims:
        # A 0-d input, or axis=(): numpy reduces nothing, torch would reduce everything.
        return fn(x.unsqueeze(0), dim=0, **kwargs)
    return fn(x, dim=dims, keepdim=keepdims, **kwargs)


def sum(x, axis=None, keepdims=False):
    return _reduce(torch.sum, x, axis, keepdims)


def _float_input(name, x):
    if not x.is_floating_point():
        raise TypeError(
            f"{name}: input of dtype {x.dtype} is not a float; torch computes {name} only for "
            f"floats (cast first: ops.astype(x, 'float64'))"
        )


def mean(x, axis=None, keepdims=False):
    _float_input("mean", x)
    return _reduce(torch.mean, x, axis, keepdims)


def var(x, axis=None, keepdims=False, ddof=0):
    _float_input("var", x)
    return _reduce(torch.var, x, axis, keepdims, correction=ddof)


def max(x, axis=None, keepdims=False):
    # amax, not max: its gradient is split evenly at ties, as the tape's and jax's are.
    return _reduce(torch.amax, x, axis, keepdims)


def min(x, axis=None, keepdims=False):
    return _reduce(torch.amin, x, axis, keepdims)


def prod(x, axis=None, keepdims=False):
    dims = common.normal_axes("prod", axis, tuple(x.shape))
    if not dims:
        return torch.prod(x.unsqueeze(0), dim=0)
    # torch.prod takes one dim: the last first, so that the others keep their numbers.
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, dim=d, keepdim=keepdims)
    return x


def topk(x, k, axis=-1, largest=True):
    values, indices = torch.topk(x, int(k), dim=int(axis), largest=bool(largest), sorted=True)
    return values, indices


def logsumexp(x, axis=None, keepdims=False):
    _float_input("logsumexp", x)
    return _reduce(torch.logsumexp, x, axis, keepdims)


def softmax(x, axis=-1):
    if isinstance(axis, (int, np.integer)):
        return torch.softmax(x, dim=int(axis))
    # numpy_ops accepts a tuple or None too: normalise over all those axes at once.  torch.softmax
    # takes one dim, so this (deliberately) is a composition; layers use one axis.
    return torch.exp(x - logsumexp(x, axis=axis, keepdims=True))


def log_softmax(x, axis=-1):
    if isinstance(axis, (int, np.integer)):
        return torch.log_softmax(x, dim=int(axis))
    return x - logsumexp(x, axis=axis, keepdims=True)


# ---------------------------------------------------------------- shapes
def reshape(x, shape):
    shape = (shape,) if isinstance(shape, (int, np.integer)) else shape
    return torch.reshape(x, tuple(int(s) for s in shape))


def transpose(x, axes=None):
    if axes is None:
        axes = tuple(reversed(range(x.ndim)))
    return x.permute(tuple(int(a) for a in axes))


def broadcast_to(x, shape):
    return torch.broadcast_to(x, tuple(int(s) for s in shape))


def _join(fn, xs, axis):
    xs = list(xs)
    ref = _ref(*xs)
    # A float constant joins in the float dtype of the first float tensor.
    float_ref = next((x for x in xs if isinstance(x, torch.Tensor) and x.is_floating_point()), ref)
    return fn([_tensor(x, float_ref) for x in xs], dim=int(axis))


def concatenate(xs, axis=0):
    return _join(torch.cat, xs, axis)


def stack(xs, axis=0):
    return _join(torch.stack, xs, axis)


def _index_part(i, device):
    """One component of a numpy index, as torch understands it."""
    if i is None or i is Ellipsis or isinstance(i, (slice, bool, int, torch.Tensor)):
        return i
    if isinstance(i, np.integer):
        return int(i)
    if isinstance(i, (np.ndarray, list, tuple)):
        arr = np.asarray(i)
        if arr.dtype == np.bool_:
            return _numpy_to_torch(arr, device)
        if arr.dtype.kind in "iu" or arr.size == 0:
            return _numpy_to_torch(arr.astype(np.int64), device)  # torch indexes with long tensors
    raise TypeError(f"getitem: index component {i!r} of type {type(i).__name__}")  # refused by the op's rule


def _axes_used(part) -> int:
    """How many input axes one (converted) index component consumes."""
    if part is None or isinstance(part, bool):
        return 0  # a new axis
    if isinstance(part, torch.Tensor) and part.dtype == torch.bool:
        return part.ndim
    return 1


def _flip_negative_steps(x, parts):
    """torch slices with positive steps only: ``x[::-1]`` becomes ``x.flip(0)[::1]``."""
    if not builtins.any(isinstance(p, slice) and p.step is not None and p.step < 0 for p in parts):
        return x, parts
    explicit = builtins.sum(_axes_used(p) for p in parts if p is not Ellipsis)
    dim, flips, out = 0, [], []
    for p in parts:
        if p is Ellipsis:
            dim += x.ndim - explicit
        elif isinstance(p, slice) and p.step is not None and p.step < 0:
            size = x.shape[dim]
            picked = range(size)[p]
            flips.append(dim)
            # Position i of x is position size-1-i of the flipped x.
            p = (
                slice(size - 1 - picked[0], size - picked[-1], -p.step)
                if len(picked)
                else slice(0, 0)
            )
        out.append(p)
        dim += _axes_used(p) if p is not Ellipsis else 0
    return x.flip(flips), out


def _ints_as_arrays(parts):
    """Next to an index array numpy treats an int as an index array too; torch does not.

    It matters for where the indexed axes go: numpy's ``x[1, :, [0, 2]]`` is
    (2, n) (the separated advanced indices move to the front), torch's (n, 2).
    An int broadcast to the arrays' shape makes torch do what numpy does.
    """
    arrays = [p for p in parts if isinstance(p, torch.Tensor) and p.ndim > 0]
    if not arrays or not builtins.any(type(p) is int for p in parts):
        return parts
    shapes = [(int(p.sum()),) if p.dtype == torch.bool else tuple(p.shape) for p in arrays]
    shape = np.broadcast_shapes(*shapes)
    device = arrays[0].device
    return [
        torch.full(shape, p, dtype=torch.long, device=device) if type(p) is int else p
        for p in parts
    ]


def getitem(x, index):
    parts = index if isinstance(index, tuple) else (index,)
    parts = [_index_part(i, x.device) for i in parts]
    x, parts = _flip_negative_steps(x, parts)
    parts = _ints_as_arrays(parts)
    return x[tuple(parts)]


def take(x, indices, axis=0):
    x = _tensor(x, _ref(x, indices))  # the table may be a numpy constant indexed by a tensor
    axis = int(axis) % x.ndim
    idx = _index_part(indices if isinstance(indices, torch.Tensor) else np.asarray(indices), x.device)
    size = x.shape[axis]
    idx = torch.where(idx < 0, idx + size, idx)  # numpy's negative indices; index_select has none
    flat = torch.index_select(x, axis, idx.reshape(-1))
    return flat.reshape(tuple(x.shape[:axis]) + tuple(idx.shape) + tuple(x.shape[axis + 1 :]))


def pad(x, pad_width, value=0.0):
    widths = common.pad_pairs(tuple(x.shape), pad_width)
    # F.pad lists (before, after) from the last axis backwards.
    flat = [w for before_after in widths[::-1] for w in before_after]
    return F.pad(x, flat, mode="constant", value=float(value))


# ---------------------------------------------------------------- neural-network ops
def _conv_args(x, w, bias):
    """Input, weight and bias as tensors (any of them may be a numpy constant), in torch's contiguous layout.

    A program lowered from jax hands a convolution views of its NHWC input and HWIO kernel: for torch, a
    channels-last tensor.  torch 2.13's oneDNN kernel for a channels-last float32 input computes a wrong weight
    gradient with more than one thread and corrupts the heap with one (a 1x1, stride-2 kernel: a flax ResNet's
    projection).  The layout is the lowering's choice, not the user's, so torch gets the contiguous one its
    mainstream kernels take (docs/decisions.md, "A convolution lowered to torch takes contiguous operands");
    ``contiguous`` returns an already contiguous tensor itself, and its backward is the identity.
    """
    ref = _ref(x, w, bias)
    return (_tensor(x, ref).contiguous(), _tensor(w, ref).contiguous(),
            (None if bias is None else _tensor(bias, ref)))


def _int_or_tuple(v):
    """A size argument as torch takes it: an int, a string ("same"), or a tuple of ints."""
    if isinstance(v, (int, np.integer)):
        return int(v)
    return v if isinstance(v, str) else tuple(int(i) for i in v)


def conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    x, w, bias = _conv_args(x, w, bias)
    fn = F.conv1d if x.ndim == 3 else F.conv2d
    return fn(
        x,
        w,
        bias,
        stride=_int_or_tuple(stride),
        padding=_int_or_tuple(padding),
        dilation=_int_or_tuple(dilation),
        groups=int(groups),
    )


def conv_transpose(x, w, bias=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    x, w, bias = _conv_args(x, w, bias)
    fn = F.conv_transpose1d if x.ndim == 3 else F.conv_transpose2d
    return fn(
        x,
        w,
        bias,
        stride=_int_or_tuple(stride),
        padding=_int_or_tuple(padding),
        output_padding=_int_or_tuple(output_padding),
        groups=int(groups),
        dilation=_int_or_tuple(dilation),
    )


def max_pool2d(x, kernel_size, stride=None, padding=0):
    return F.max_pool2d(
        x,
        _int_or_tuple(kernel_size),
        None if stride is None else _int_or_tuple(stride),
        _int_or_tuple(padding),
    )


def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    return F.avg_pool2d(
        x,
        _int_or_tuple(kernel_size),
        None if stride is None else _int_or_tuple(stride),
        _int_or_tuple(padding),
        count_include_pad=count_include_pad,
    )


def adaptive_avg_pool2d(x, output_size):
    return F.adaptive_avg_pool2d(x, _int_or_tuple(output_size))


# ---------------------------------------------------------------- framework kernels
# The functions a torch model calls, run with torch's own kernels (never the
# derived compositions in gradcheck.ops): a wrong backward in F.batch_norm or
# F.linear is what gradcheck exists to catch.  Constants (integer targets,
# class weights, masks) may be numpy arrays; they land on the input's device,
# float ones in the input's dtype.
def _optional(x, ref):
    return None if x is None else _tensor(x, ref)


def _index_tensor(ids, ref) -> torch.Tensor:
    """Integer ids or labels as the long tensor torch's kernels index with."""
    ids = ids if isinstance(ids, torch.Tensor) else _numpy_to_torch(ids, ref.device)
    return ids.to(device=ref.device, dtype=torch.long)


def _no_gradient(name, what, t):
    """torch's kernels treat some arguments as constants; a gradient asked of them would be an autograd error."""
    if isinstance(t, torch.Tensor) and t.requires_grad:
        raise ValueError(
            f"{name}: torch gives no gradient for {what}; pass it as a constant (a numpy array, a buffer or "
            "a frozen parameter)"
        )


def linear(x, weight, bias=None):
    ref = _ref(x, weight, bias)
    x, weight, bias = _tensor(x, ref), _tensor(weight, ref), _optional(bias, ref)
    return F.linear(x, weight, bias)


def batch_norm(x, running_mean=None, running_var=None, weight=None, bias=None, training=True, momentum=0.1,
               eps=1e-5):
    x = _tensor(x, _ref(x))
    weight, bias = _optional(weight, x), _optional(bias, x)
    for name, a in (("running_mean", running_mean), ("running_var", running_var), ("momentum", momentum)):
        _no_gradient("batch_norm", name, a)
    if not training:
        rm, rv = _tensor(running_mean, x), _tensor(running_var, x)
        y = F.batch_norm(x, rm, rv, weight, bias, training=False, eps=float(eps))
        return y, running_mean, running_var
    if running_mean is None:
        return F.batch_norm(x, None, None, weight, bias, training=True, eps=float(eps)), None, None
    # F.batch_norm updates the running statistics in place: it gets copies, which are returned.
    rm = _tensor(running_mean, x).detach().clone()
    rv = _tensor(running_var, x).detach().clone()
    # A 0-d array (the cumulative factor of momentum=None) becomes the Python float torch takes.
    y = F.batch_norm(x, rm, rv, weight, bias, training=True, momentum=float(momentum), eps=float(eps))
    return y, rm, rv


def _trailing_shape(name, x, normalized_shape):
    return tuple(x.shape[a] for a in common.trailing_axes(name, tuple(x.shape), normalized_shape))


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    x = _tensor(x, _ref(x))
    shape = _trailing_shape("layer_norm", x, normalized_shape)
    return F.layer_norm(x, shape, _optional(weight, x), _optional(bias, x), eps=float(eps))


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    x = _tensor(x, _ref(x))
    weight, bias = _optional(weight, x), _optional(bias, x)
    if weight is None and bias is not None and bias.requires_grad:
        # torch 2.13: F.group_norm's backward fails ("tensor does not have a device") for a bias that
        # requires grad without a weight; the kernel normalises, the bias is added outside it.
        return F.group_norm(x, int(num_groups), None, None, eps=float(eps)) + bias.reshape(
            (-1,) + (1,) * (x.ndim - 2))
    return F.group_norm(x, int(num_groups), weight, bias, eps=float(eps))


def rms_norm(x, normalized_shape, weight=None, eps=None):
    x = _tensor(x, _ref(x))
    shape = _trailing_shape("rms_norm", x, normalized_shape)
    # eps=None: torch, like the derived op, uses the input dtype's machine epsilon.
    return F.rms_norm(x, shape, _optional(weight, x), eps=None if eps is None else float(eps))


def _sdpa_dropout(dropout_mask, ref):
    """The case's dropout factors (0 or 1/(1-p)) as aten's (keep mask, p)."""
    factors = _const(dropout_mask, ref)
    factors = factors if isinstance(factors, torch.Tensor) else torch.as_tensor(factors, device=ref.device)
    kept = factors[factors != 0]
    if kept.numel() == 0:
        # Everything dropped: with no element kept any finite scale gives the zeros it must.
        return torch.zeros(factors.shape, dtype=torch.bool, device=ref.device), 0.5
    f = float(kept.reshape(-1)[0])
    if not bool((kept == f).all()) or f < 1.0 or (f == 1.0 and kept.numel() < factors.numel()):
        raise ValueError(
            "scaled_dot_product_attention: dropout_mask must hold 0 and one keep factor 1/(1-p) >= 1 "
            f"(dropout's), got values {torch.unique(factors).tolist()[:6]}"
        )
    return factors != 0, 1.0 - 1.0 / f


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_mask=None, is_causal=False,
                                 scale=None):
    ref = _ref(query, key, value)
    q, k, v = _tensor(query, ref), _tensor(key, ref), _tensor(value, ref)
    if attn_mask is not None:
        attn_mask = _const(attn_mask, q)
        if attn_mask.dtype != torch.bool:
            attn_mask = attn_mask.to(q.dtype)  # torch takes a float mask in the query's dtype only
    scale = None if scale is None else float(scale)
    if dropout_mask is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=bool(is_causal), scale=scale)
    # F.scaled_dot_product_attention draws its own dropout; its math kernel, which F.sdpa falls back
    # to, takes a given one: a boolean keep mask (True = keep), the kept weights scaled by 1/(1-p),
    # applied only when dropout_p > 0.  Unlike F.sdpa it adds a boolean attn_mask as 0/1 instead of
    # masking, so a boolean mask goes in as the additive 0/-inf that F.sdpa makes of it.
    keep, p = _sdpa_dropout(dropout_mask, q)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~attn_mask, -np.inf)
    out, _ = torch.ops.aten._scaled_dot_product_attention_math(
        q, k, v, attn_mask, p, bool(is_causal), dropout_mask=keep, scale=scale
    )
    return out


def embedding(ids, weight, padding_idx=None):
    weight = _tensor(weight, _ref(weight))
    ids = _index_tensor(ids, weight)
    num = weight.shape[0]
    if padding_idx is None:
        return F.embedding(ids, weight)
    pad = int(padding_idx) % num
    out = F.embedding(ids, weight, padding_idx=pad)
    # F.embedding returns the padding row's values and gives that row no gradient.  The op's
    # contract is zeros at padding positions (the row torch keeps at zero); with a zero row the
    # two agree, forward and backward, and zeroing the positions keeps them equal for any row.
    return out.masked_fill((ids == pad).unsqueeze(-1), 0.0)


def _class_weight(name, weight, x):
    if weight is None:
        return None
    weight = _tensor(weight, x)
    _no_gradient(name, "the class weight", weight)
    return weight


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    x = _tensor(input, _ref(input, target))
    w = _class_weight("cross_entropy", weight, x)
    target = _tensor(target, x) if common.dtype_of(target).kind == "f" else _index_tensor(target, x)
    return F.cross_entropy(x, target, weight=w, ignore_index=int(ignore_index), reduction=reduction,
                           label_smoothing=float(label_smoothing))


def nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean"):
    x = _tensor(input, _ref(input, target))
    target = _index_tensor(target, x)
    return F.nll_loss(x, target, weight=_class_weight("nll_loss", weight, x), ignore_index=int(ignore_index),
                      reduction=reduction)


def mse_loss(input, target, reduction="mean"):
    ref = _ref(input, target)
    x, t = _tensor(input, ref), _tensor(target, ref)
    if x.shape != t.shape:
        # The derived op broadcasts; F.mse_loss does too, with a warning that it does.
        x, t = torch.broadcast_tensors(x, t)
    return F.mse_loss(x, t, reduction=reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean", pos_weight=None):
    ref = _ref(input, target, weight, pos_weight)
    x, t = _tensor(input, ref), _tensor(target, ref)
    w, pw = _optional(weight, x), _optional(pos_weight, x)
    _no_gradient("binary_cross_entropy_with_logits", "weight", w)
    _no_gradient("binary_cross_entropy_with_logits", "pos_weight", pw)
    return F.binary_cross_entropy_with_logits(x, t, weight=w, reduction=reduction, pos_weight=pw)


# ---------------------------------------------------------------- ops for torch.export graphs
def hardsigmoid(x):
    return F.hardsigmoid(x)


def hardswish(x):
    return F.hardswish(x)


def _scale_pair(scale_factor):
    if scale_factor is None or isinstance(scale_factor, (int, float, np.number)):
        return scale_factor, scale_factor
    return tuple(scale_factor)


def upsample_nearest2d(x, size, scale_factor=None):
    # The aten kernel F.interpolate calls, given the output size and torch's scale factor both (F.interpolate
    # itself takes one or the other).
    oh, ow = (size, size) if isinstance(size, (int, np.integer)) else tuple(size)
    sh, sw = _scale_pair(scale_factor)
    return torch.ops.aten.upsample_nearest2d.default(x, [int(oh), int(ow)], sh, sw)


def upsample_bilinear2d(x, size, align_corners=False, scale_factor=None):
    oh, ow = (size, size) if isinstance(size, (int, np.integer)) else tuple(size)
    sh, sw = _scale_pair(scale_factor)
    return torch.ops.aten.upsample_bilinear2d.default(x, [int(oh), int(ow)], bool(align_corners), sh, sw)

"""The one op namespace layers are written in.

Every function here dispatches on the array types it is given: a tape
``Tensor`` goes to the tape AD, a ``torch.Tensor`` to PyTorch, a jax array (or
tracer) to JAX, and plain numpy arrays to the numpy forward kernels (used by
the float64 finite-difference referee).  Semantics and layouts follow PyTorch
(NCHW activations, OIHW convolution weights, numpy broadcasting), so a layer
written once runs unchanged on every backend.

A backend implements an op by defining a function of the same name in its
ops module (see ``gradcheck/backends/*_ops.py``).  Ops whose body here is not
``...`` are *derived*: built from other ops, used by any backend that does not
define its own version.  An op a backend lacks and that has no derived
version raises ``BackendOpMissing`` naming the op and the backend.

Python operators on tape tensors (``+ - * / ** @``, unary ``-`` and ``[]``)
route through these ops too, and torch and jax arrays have their own, so
layers may use operators freely.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from gradcheck import cost, kernels
from gradcheck.backends import backend_of_args, ops_module

__all__: list[str] = []


class BackendOpMissing(NotImplementedError):
    """An op that a backend does not implement (and that has no derived version)."""


def op(fn):
    """Make ``fn`` a dispatching op; its body (if any) is the derived fallback."""
    name = fn.__name__
    derived = not _is_stub(fn)

    @functools.wraps(fn)
    def dispatch(*args, **kwargs):
        backend = backend_of_args(args + tuple(kwargs.values()) if kwargs else args)
        impl = getattr(ops_module(backend), name, None)
        if impl is not None:
            out = impl(*args, **kwargs)
            if cost._current is not None and backend == "numpy":  # counting a float64 forward's work
                cost.note(name, args, out)
            return out
        if derived:
            return fn(*args, **kwargs)
        raise BackendOpMissing(
            f"op '{name}' is not implemented by the {backend} backend; "
            f"add `def {name}(...)` to gradcheck/backends/{backend}_ops.py "
            f"or run this case without the {backend} backend"
        )

    dispatch.derived = derived
    __all__.append(name)
    return dispatch


def _is_stub(fn) -> bool:
    code = fn.__code__
    # A body of just a docstring and `...` compiles to "return None" with only
    # the docstring (and Ellipsis) as constants.
    consts = [c for c in code.co_consts if c is not None and c is not Ellipsis and c != fn.__doc__]
    return not consts and not code.co_names


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


def dtype_of(x) -> np.dtype:
    """The numpy dtype of any backend's array (torch dtypes are mapped)."""
    dt = x.dtype
    if isinstance(dt, np.dtype):
        return dt
    return np.dtype(str(dt).replace("torch.", ""))


def shape_of(x) -> tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


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
    if approximate != "none":
        raise ValueError(f"gelu: approximate={approximate!r}; expected 'none' or 'tanh'")
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
    """``np.einsum`` with explicit output (``"ij,jk->ik"``); at most two operands on the tape."""


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
    check_normalize_affine(shape_of(x), weight, bias)
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


def check_normalize_affine(shape, weight, bias) -> None:
    """``normalize``'s weight and bias must broadcast into the input (every backend's version checks)."""
    for name, a in (("weight", weight), ("bias", bias)):
        if a is not None and not kernels.broadcasts_into(shape_of(a), shape):
            raise ValueError(
                f"normalize: {name} of shape {shape_of(a)} does not broadcast into the input's shape {shape}; "
                "it must (one value per channel or per normalised element)"
            )


@op
def max(x, axis=None, keepdims=False):
    """Max reduction; at ties the gradient is split evenly (torch.amax, jax agree)."""


@op
def min(x, axis=None, keepdims=False): ...
@op
def logsumexp(x, axis=None, keepdims=False): ...
@op
def softmax(x, axis=-1): ...
@op
def log_softmax(x, axis=-1): ...


def _count(x, axis) -> int:
    shape = shape_of(x)
    if axis is None:
        return int(np.prod(shape, dtype=np.int64))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return int(np.prod([shape[a] for a in axes], dtype=np.int64))


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
    g = kernels.pool_geometry(shape_of(x), kernel_size, stride, padding)
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
    if len(shape_of(x)) != 4:
        raise ValueError(f"adaptive_avg_pool2d: input of shape {shape_of(x)}; expected 4 dims, NCHW")
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

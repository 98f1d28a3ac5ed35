"""The argument rules of ``gradcheck.ops``, shared by every backend.

``gradcheck.ops.op`` runs the rule registered here under an op's name
before any backend (or the op's derived body) sees the arguments.  A mistake
then gets one message whichever backend meets it: a convolution with the
wrong channels says the same on the tape, in torch and in jax, where it used
to be three frameworks' wordings of it, and an out-of-range index raises in
jax too instead of being clamped.  The geometry the backends compute with
(convolution and pooling windows, pad widths, axes, the per-channel shape a
bias broadcasts in, the dtype a constant takes) lives here as well, so what
is validated is what is computed.

A rule checks the op's contract: shapes, dtypes, argument values, and the
values of indices wherever they are concrete (a traced jax index is not).
What one framework cannot do although the contract allows it (torch has no
mean of an integer tensor) stays that backend's own error.

Rules take the op's name and then the op's own arguments, so one rule can
serve a family (the elementwise ops, the reductions).
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Callable

import numpy as np

from gradcheck.backends import backend_of, concrete
from gradcheck.backends.numpy import kernels
from gradcheck.backends.numpy.kernels import (
    broadcasts_into,  # the numpy kernels' own rule, for folding a weight
)

RULES: dict[str, Callable] = {}


def rule(*names: str):
    """Register ``fn(op, *args, **kwargs)`` as the argument rule of the ops ``names``."""

    def register(fn):
        for name in names:
            RULES[name] = fn
        return fn

    return register


# ---------------------------------------------------------------- reading arguments
def shape_of(x) -> tuple[int, ...]:
    """The shape of any backend's array (a Python scalar is 0-d)."""
    s = getattr(x, "shape", None)
    return tuple(int(d) for d in s) if s is not None else tuple(np.shape(x))


def dtype_of(x) -> np.dtype:
    """The numpy dtype of any backend's array (torch dtypes are mapped; a Python scalar's is numpy's)."""
    dt = getattr(x, "dtype", None)
    if dt is None:
        return np.result_type(x)
    if isinstance(dt, np.dtype):
        return dt
    return np.dtype(str(dt).replace("torch.", ""))


def _float(op: str, name: str, x) -> None:
    if x is not None and dtype_of(x).kind != "f":
        raise TypeError(
            f"{op}: {name} of dtype {dtype_of(x)}; expected a float array (cast with ops.astype(x, 'float32'))"
        )


def _integer(op: str, name: str, x) -> None:
    if dtype_of(x).kind not in "iu":
        raise TypeError(f"{op}: {name} of dtype {dtype_of(x)}; expected an integer array")


def _size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


# ---------------------------------------------------------------- broadcasting
def broadcast_shape(op: str, *shapes) -> tuple[int, ...]:
    """numpy's broadcast of ``shapes``, or an error naming the op and every shape."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        given = ", ".join(str(tuple(int(d) for d in s)) for s in shapes)
        raise ValueError(
            f"{op}: shapes {given} do not broadcast: counted from the last axis, each axis must be equal "
            "or 1 (reshape or expand_dims an operand)"
        ) from None


def channel_shape(ndim: int, channels: int = -1) -> tuple[int, ...]:
    """``(1, C, 1, ...)``: a per-channel vector (a bias, BatchNorm's statistics) along axis 1 of ``ndim`` dims."""
    return (1, channels) + (1,) * (ndim - 2)


@rule("add", "sub", "mul", "div", "pow", "maximum", "minimum", "greater", "less", "equal")
def _elementwise(op, a, b):
    # The same shape twice is the common case: no broadcast to work out.
    sa, sb = getattr(a, "shape", ()), getattr(b, "shape", ())
    if sa != sb:
        broadcast_shape(op, sa, sb)


@rule("where")
def _where(op, cond, a, b):
    if dtype_of(cond) != np.bool_:
        raise TypeError(
            f"where: the condition has dtype {dtype_of(cond)}; expected a bool array (compare first, e.g. "
            "ops.greater(x, 0.0))"
        )
    shapes = [getattr(v, "shape", ()) for v in (cond, a, b)]
    if not shapes[0] == shapes[1] == shapes[2]:
        broadcast_shape(op, *shapes)


# ---------------------------------------------------------------- axes
def normal_axes(op: str, axis, shape) -> tuple[int, ...]:
    """numpy's ``axis`` (None, an int, a tuple or a list) as sorted non-negative axes of ``shape``."""
    ndim = len(shape)
    if axis is None:
        return tuple(range(ndim))
    given = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    found = []
    for a in given:
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise TypeError(f"{op}: axis={axis!r}; expected an int or a tuple of ints")
        if not -ndim <= a < ndim:
            raise ValueError(f"{op}: axis {int(a)} is out of bounds for an array of shape {tuple(shape)}")
        found.append(int(a) % ndim)
    if len(set(found)) != len(found):
        raise ValueError(f"{op}: axis={axis!r} names an axis twice")
    return tuple(sorted(found))


def axis_arg(axis):
    """``axis`` as numpy and jax take it: a list becomes a tuple."""
    return tuple(axis) if isinstance(axis, list) else axis


@rule("sum", "mean", "var", "max", "min", "logsumexp", "prod")
def _reduction(op, x, axis=None, keepdims=False, ddof=0):
    shape = shape_of(x)
    reduced = normal_axes(op, axis, shape)
    if op in ("max", "min") and any(shape[a] == 0 for a in reduced):
        raise ValueError(f"{op}: reducing an axis of size 0 (shape {shape}, axis={axis!r}); it has no {op}imum")


@rule("softmax", "log_softmax")
def _softmax(op, x, axis=-1):
    normal_axes(op, axis, shape_of(x))


@rule("topk")
def _topk(op, x, k, axis=-1, largest=True):
    shape = shape_of(x)
    if not shape:
        raise ValueError("topk: a 0-d input has no axis to select along; reshape it to (1,) first")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"topk: axis={axis!r}; expected one int")
    (ax,) = normal_axes(op, axis, shape)
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 0 <= k <= shape[ax]:
        raise ValueError(f"topk: k={k!r} for axis {ax} of size {shape[ax]} (shape {shape}); "
                         f"expected an int in [0, {shape[ax]}]")


# ---------------------------------------------------------------- linear algebra
@rule("matmul")
def check_matmul(op, a, b):
    """Refuse operands ``a @ b`` cannot take, naming both shapes and the rule they break."""
    a_shape, b_shape = shape_of(a), shape_of(b)
    if not a_shape or not b_shape:
        raise ValueError(f"{op}: shapes {a_shape} and {b_shape}: a 0-d operand cannot be matrix-multiplied; use mul")
    k_a = a_shape[-1]
    k_b = b_shape[0] if len(b_shape) == 1 else b_shape[-2]
    if k_a != k_b:
        which = "only" if len(b_shape) == 1 else "second-to-last"
        raise ValueError(
            f"{op}: shapes {a_shape} and {b_shape} do not match: the first's last axis ({k_a}) "
            f"must equal the second's {which} axis ({k_b})"
        )
    try:
        np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    except ValueError:
        raise ValueError(
            f"{op}: shapes {a_shape} and {b_shape}: batch dimensions {a_shape[:-2]} and {b_shape[:-2]} "
            "do not broadcast"
        ) from None


def einsum_terms(subscripts) -> tuple[list[str], str]:
    """An explicit equation ``"ij,jk->ik"`` as ``(["ij", "jk"], "ik")``."""
    ins, out = subscripts.split("->")
    return ins.split(","), out


def einsum_plan(subscripts, shapes) -> tuple[str, list[tuple[int, ...] | None]]:
    """numpy's einsum forms (implicit output, ``...``) as an explicit equation, and what to broadcast first.

    Returns the equation with the ellipsis spelled out in letters the
    subscripts do not use (its dims right-aligned across operands, as numpy
    broadcasts them) and the output written out (numpy's and torch's implicit
    rule: the ellipsis, then the labels used once, in ASCII order); and per
    operand the shape it must be broadcast to so that every index has one
    size, or None.  The tape and numpy run that; torch and jax take the
    subscripts as given, which mean the same.
    """
    if not isinstance(subscripts, str):
        raise TypeError(f"einsum: subscripts {subscripts!r}; expected a string such as 'bij,bjk->bik'")
    eq = subscripts.replace(" ", "")
    ins, arrow, out = eq.partition("->")
    terms = ins.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"einsum {subscripts!r}: {len(terms)} input terms for {len(shapes)} operands")
    for term in terms + ([out] if arrow else []):
        bad = set(term.replace("...", "", 1)) - set(string.ascii_letters)
        if bad:
            raise ValueError(f"einsum {subscripts!r}: {term!r} has {''.join(sorted(bad))!r}; indices are letters, "
                             "with at most one '...' per term")
    spare = [c for c in string.ascii_letters if c not in eq]
    ranks = []  # the ellipsis's rank in each operand
    for k, (term, shape) in enumerate(zip(terms, shapes)):
        named = len(term) - (3 if "..." in term else 0)
        rank = len(shape) - named
        if rank < 0 or (rank > 0 and "..." not in term):
            raise ValueError(f"einsum {subscripts!r}: operand {k} has shape {tuple(shape)} ({len(shape)} axes) but "
                             f"its term {term!r} names {named}")
        ranks.append(rank)
    dots = "".join(spare[: max(ranks, default=0)])
    dot_shape = broadcast_shape(f"einsum {subscripts!r} (the '...' dims)",
                                *[tuple(shape)[term.index("..."):][:r] if r else () for term, shape, r in
                                  zip(terms, shapes, ranks) if "..." in term])
    explicit, targets, sizes = [], [], {}
    for k, (term, shape, rank) in enumerate(zip(terms, shapes, ranks)):
        at = term.find("...")
        letters = term if at < 0 else term[:at] + dots[len(dots) - rank:] + term[at + 3:]
        target = tuple(shape) if at < 0 else tuple(shape[:at]) + dot_shape[len(dot_shape) - rank:] + tuple(
            shape[at + rank:])
        targets.append(target if target != tuple(shape) else None)
        explicit.append(letters)
        for label, n in zip(letters, target):
            first = sizes.setdefault(label, (n, k))
            if first[0] != n:
                raise ValueError(
                    f"einsum {subscripts!r}: index {label!r} has size {first[0]} in operand {first[1]} and {n} "
                    f"in operand {k}; an index has one size (broadcast explicitly first)"
                )
    if arrow:
        # An output without '...' sums over the '...' dims, as torch's einsum does (numpy's refuses the form).
        result = out.replace("...", dots)
    else:
        counts = {c: "".join(explicit).count(c) for c in set("".join(explicit)) - set(dots)}
        result = dots + "".join(sorted(c for c, n in counts.items() if n == 1))
    if len(set(result)) != len(result) or any(c not in sizes for c in result):
        raise ValueError(f"einsum {subscripts!r}: every output index must appear once, and in an input")
    return ",".join(explicit) + "->" + result, targets


@rule("einsum")
def _einsum(op, subscripts, *operands):
    einsum_plan(subscripts, [shape_of(x) for x in operands])


# ---------------------------------------------------------------- shapes
@rule("reshape")
def _reshape(op, x, shape):
    target = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    given = shape_of(x)
    size = _size(given)
    unknown = sum(1 for d in target if d == -1)
    if unknown > 1 or any(d < -1 for d in target):
        raise ValueError(f"{op}: shape {target}: sizes must be non-negative, with at most one -1")
    known = _size([d for d in target if d != -1])
    fits = (known > 0 and size % known == 0) if unknown else known == size
    if not fits:
        raise ValueError(f"{op}: cannot reshape an array of shape {given} (size {size}) into shape {target}")


@rule("transpose")
def _transpose(op, x, axes=None):
    if axes is None:
        return
    shape = shape_of(x)
    n = len(shape)
    perm = tuple(int(a) for a in axes)
    if sorted(a + n if a < 0 else a for a in perm) != list(range(n)):
        raise ValueError(f"{op}: axes {perm} are not a permutation of the {n} axes of shape {shape}")


@rule("broadcast_to")
def _broadcast_to(op, x, shape):
    target = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    given = shape_of(x)
    if not broadcasts_into(given, target):
        raise ValueError(
            f"{op}: an array of shape {given} does not broadcast to {target}: counted from the last axis, "
            "each of its axes must equal the target's or be 1"
        )


@rule("concatenate", "stack")
def _join(op, xs, axis=0):
    shapes = [shape_of(x) for x in xs]
    if not shapes:
        raise ValueError(f"{op}: no arrays to join")
    first = shapes[0]
    if op == "stack":
        normal_axes(op, axis, first + (1,))
        for k, s in enumerate(shapes):
            if s != first:
                raise ValueError(f"stack: array {k} has shape {s} and array 0 {first}; stacked arrays need one shape")
        return
    if not first:
        raise ValueError("concatenate: 0-d arrays have no axis to join along; use stack")
    (ax,) = normal_axes(op, axis, first)
    for k, s in enumerate(shapes):
        if len(s) != len(first) or any(a != b for i, (a, b) in enumerate(zip(s, first)) if i != ax):
            raise ValueError(
                f"concatenate: array {k} has shape {s} and array 0 {first}; along axis {ax} they join, "
                "every other axis must match"
            )


# ---------------------------------------------------------------- indexing
def _index_items(index) -> tuple:
    return index if isinstance(index, tuple) else (index,)


def check_index(index, op="getitem"):
    """``index`` unchanged if it is ints, slices, None, Ellipsis or integer/bool arrays; otherwise a TypeError."""
    for item in _index_items(index):
        if item is None or item is Ellipsis or isinstance(item, (slice, int, np.integer)):
            continue
        if isinstance(item, list):
            item = np.asarray(item)
        dtype = getattr(item, "dtype", None)
        if dtype is None:
            raise TypeError(
                f"{op}: index component {item!r} of type {type(item).__name__}; expected ints, slices, None, "
                "Ellipsis, or integer or bool arrays"
            )
        if dtype_of(item).kind not in "biu":
            raise TypeError(
                f"{op}: an index array of dtype {dtype_of(item)} (shape {shape_of(item)}); expected an integer "
                "or bool array, ints or slices (cast float indices with .astype(np.int64))"
            )
    return index


def _describe_index(items) -> str:
    parts = [f"{dtype_of(i)} array{shape_of(i)}" if hasattr(i, "dtype") and shape_of(i) else repr(i) for i in items]
    return "[" + ", ".join(parts) + "]"


def check_bounds(op, shape, index) -> None:
    """Index a zero-stride stand-in of ``shape`` with the concrete ``index``: numpy's rules, numpy's message.

    The stand-in costs no memory for slices and a byte per selected element
    for index arrays; a traced jax index (token ids inside jit) is skipped.
    """
    items = []
    for item in _index_items(index):
        if getattr(item, "dtype", None) is not None and backend_of(item) != "numpy":
            item = concrete(item)
            if item is None:
                return
        items.append(item)
    probe = np.broadcast_to(np.zeros((), dtype=bool), shape)
    try:
        probe[tuple(items) if isinstance(index, tuple) else items[0]]
    except IndexError as exc:
        raise IndexError(f"{op}: index {_describe_index(items)} is invalid for shape {shape}: {exc}") from None


@rule("getitem")
def _getitem(op, x, index):
    check_bounds(op, shape_of(x), check_index(index, op))


@rule("take")
def _take(op, x, indices, axis=0):
    shape = shape_of(x)
    if not isinstance(axis, (int, np.integer)):
        raise TypeError(f"take: axis={axis!r}; expected an int")
    (ax,) = normal_axes(op, axis, shape)
    if isinstance(indices, list):
        indices = np.asarray(indices)
    _integer(op, "indices", indices)
    values = concrete(indices)
    if values is not None and values.size:
        bad = values[(values < -shape[ax]) | (values >= shape[ax])]
        if bad.size:
            raise IndexError(f"take: index {int(bad[0])} is out of bounds for axis {ax} with size {shape[ax]}")


def pad_pairs(shape, pad_width) -> tuple[tuple[int, int], ...]:
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


@rule("pad")
def _pad(op, x, pad_width, value=0.0):
    pad_pairs(shape_of(x), pad_width)


# ---------------------------------------------------------------- convolution and pooling
def _spatial_rank(op: str, x_shape, w_shape, weight_layout: str) -> int:
    """1 or 2 spatial dims, the input's and the weight's alike (``weight_layout``: its two leading axes)."""
    nd = len(x_shape) - 2
    if nd not in (1, 2) or len(w_shape) != nd + 2:
        raise ValueError(
            f"{op}: input {x_shape} and weight {w_shape}: expected NCL with ({weight_layout}, k) or NCHW with "
            f"({weight_layout}, kh, kw)"
        )
    return nd


def conv_geometry(x_shape, w_shape, stride, padding, dilation, groups):
    """Geometry of a 1-d or 2-d convolution, with 1-d lifted to 2-d (unit height): ``(geometry, nd)``."""
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    nd = _spatial_rank("conv", x_shape, w_shape, "out, in/groups")
    if x_shape[1] != w_shape[1] * groups:
        raise ValueError(
            f"conv: input {x_shape} has {x_shape[1]} channels but weight {w_shape} with "
            f"groups={groups} expects {w_shape[1] * groups}; the weight is (out, in/groups, *kernel)"
        )
    if nd == 2:
        return kernels.geometry(x_shape, w_shape, stride, padding, dilation, groups), nd
    stride, dilation = (1, kernels.pair(stride, 1, "stride")[0]), (1, kernels.pair(dilation, 1, "dilation")[0])
    if not isinstance(padding, str):
        padding = (0, kernels.pair(padding, 1, "padding")[0])
    try:
        return kernels.geometry(lift(x_shape), lift(w_shape), stride, padding, dilation, groups), nd
    except ValueError as exc:  # the kernels speak 2-d: say which 1-d shapes were meant
        raise ValueError(f"{exc} [1-d input {x_shape} and weight {w_shape}, lifted to unit height]") from None


def lift(shape) -> tuple[int, ...]:
    """An NCL shape as NCHW with unit height (the kernels are 2-d)."""
    return tuple(shape[:2]) + (1,) + tuple(shape[2:])


def transposed_geometry(x_shape, w_shape, stride, padding, output_padding, dilation, groups):
    """The geometry of the convolution that a transposed convolution is the adjoint of: ``(geometry, nd)``."""
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    nd = _spatial_rank("conv_transpose", x_shape, w_shape, "in, out/groups")
    if isinstance(padding, str):
        raise ValueError(
            f"conv_transpose: padding={padding!r}; a transposed convolution takes an int or a tuple of ints "
            "(as torch's), not 'same' or 'valid'"
        )
    if x_shape[1] != w_shape[0]:
        raise ValueError(
            f"conv_transpose: input {x_shape} has {x_shape[1]} channels but weight {w_shape} "
            f"expects {w_shape[0]}; a transposed convolution's weight is (in, out/groups, *kernel)"
        )
    ks = w_shape[2:]
    s, p, d, op = (kernels.pair(v, nd, name) for v, name in (
        (stride, "stride"), (padding, "padding"), (dilation, "dilation"), (output_padding, "output_padding")))
    if any(o >= max(si, di) for o, si, di in zip(op, s, d)):
        raise ValueError(f"conv_transpose: output_padding={op} must be smaller than stride {s} or dilation {d}")
    out_spatial = tuple((i - 1) * si - 2 * pi + di * (k - 1) + oi + 1
                        for i, si, pi, di, k, oi in zip(x_shape[2:], s, p, d, ks, op))
    if min(out_spatial) < 1:
        raise ValueError(
            f"conv_transpose: input {x_shape} with weight {w_shape}, stride {s}, padding {p}, "
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


def _bias(op, bias, channels: int) -> None:
    if bias is not None and shape_of(bias) != (channels,):
        raise ValueError(f"{op}: bias of shape {shape_of(bias)}; expected ({channels},), one per output channel")


@rule("conv")
def _conv(op, x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    conv_geometry(shape_of(x), shape_of(w), stride, padding, dilation, groups)
    _bias(op, bias, shape_of(w)[0])


@rule("conv_transpose")
def _conv_transpose(op, x, w, bias=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    transposed_geometry(shape_of(x), shape_of(w), stride, padding, output_padding, dilation, groups)
    _bias(op, bias, shape_of(w)[1] * groups)


def _nchw(op: str, shape) -> None:
    if len(shape) != 4:
        raise ValueError(f"{op}: input of shape {tuple(shape)}; expected 4 dims, NCHW")


def pool_geometry(op: str, x_shape, kernel_size, stride=None, padding=0) -> kernels.ConvGeometry:
    """The window geometry of a 2-d pool on NCHW, validated with torch's rules and ``op``'s name.

    The windows are those of a depthwise convolution (one 1-channel kernel per
    channel), so the geometry is a ``kernels.ConvGeometry``; every backend and
    the kink pinning take it from here.
    """
    x_shape = tuple(x_shape)
    _nchw(op, x_shape)
    k = kernels.pair(kernel_size, 2, "kernel_size")
    s = kernels.pair(stride if stride is not None else k, 2, "stride")
    p = kernels.pair(padding, 2, "padding")
    if min(k) < 1 or min(s) < 1 or min(p) < 0:
        raise ValueError(f"{op}: kernel_size {k} and stride {s} must be positive and padding {p} non-negative")
    if any(pi > ki // 2 for pi, ki in zip(p, k)):
        raise ValueError(f"{op}: padding {p} must be at most half the kernel {k} (torch's rule)")
    if any(hi + 2 * pi < ki for hi, pi, ki in zip(x_shape[2:], p, k)):
        raise ValueError(
            f"{op}: input {x_shape} is smaller than the kernel {k} (padding {p}); the output would be empty"
        )
    c = x_shape[1]
    return kernels.geometry(x_shape, (c, 1, *k), s, p, 1, c)


@rule("max_pool2d", "avg_pool2d")
def _pool(op, x, kernel_size, stride=None, padding=0, count_include_pad=True):
    pool_geometry(op, shape_of(x), kernel_size, stride, padding)


def spatial_size(op: str, name: str, size) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, (int, np.integer)) else tuple(size)
    if len(pair) != 2 or any(not isinstance(v, (int, np.integer)) or v < 1 for v in pair):
        raise ValueError(f"{op}: {name}={size!r}; expected a positive int or two (height, width)")
    return int(pair[0]), int(pair[1])


@rule("adaptive_avg_pool2d")
def _adaptive_pool(op, x, output_size):
    _nchw(op, shape_of(x))
    spatial_size(op, "output_size", output_size)


@rule("upsample_nearest2d", "upsample_bilinear2d")
def _upsample(op, x, size, *rest, **options):
    _nchw(op, shape_of(x))
    spatial_size(op, "size", size)


# ---------------------------------------------------------------- framework kernels
@rule("gelu")
def _gelu(op, x, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate={approximate!r}; expected 'none' or 'tanh'")


@rule("linear")
def _linear(op, x, weight, bias=None):
    xs, ws = shape_of(x), shape_of(weight)
    if len(ws) not in (1, 2):
        raise ValueError(f"linear: weight of shape {ws}; expected (out_features, in_features) or (in_features,)")
    if not xs or xs[-1] != ws[-1]:
        raise ValueError(
            f"linear: input of shape {xs} and weight {ws}: the weight is (out_features, in_features), so the "
            f"input's last dim must be in_features={ws[-1]}"
        )
    if bias is not None and shape_of(bias) not in ({(), ws[:1]} if len(ws) == 2 else {()}):
        raise ValueError(f"linear: bias of shape {shape_of(bias)}; expected {ws[:1] if len(ws) == 2 else ()}, "
                         "one per output feature")


def check_normalize_affine(op: str, shape, weight, bias) -> None:
    """``normalize``'s weight and bias must broadcast into the input without changing its shape."""
    for name, a in (("weight", weight), ("bias", bias)):
        if a is not None and not broadcasts_into(shape_of(a), shape):
            raise ValueError(
                f"{op}: {name} of shape {shape_of(a)} does not broadcast into the input's shape {tuple(shape)}; "
                "it must (one value per channel or per normalised element)"
            )


@rule("normalize")
def _normalize(op, x, axes, eps, weight=None, bias=None):
    shape = shape_of(x)
    normal_axes(op, axes, shape)
    check_normalize_affine(op, shape, weight, bias)


def _per_channel(op: str, channels: int, **arrays) -> None:
    for name, a in arrays.items():
        if a is not None and shape_of(a) != (channels,):
            raise ValueError(f"{op}: {name} of shape {shape_of(a)}; expected ({channels},), one per channel")


@rule("batch_norm")
def _batch_norm(op, x, running_mean=None, running_var=None, weight=None, bias=None, training=True, momentum=0.1,
                eps=1e-5):
    _float(op, "input", x)
    shape = shape_of(x)
    if len(shape) < 2:
        raise ValueError(f"batch_norm: input of shape {shape}; expected (N, C, ...)")
    if (running_mean is None) != (running_var is None):
        raise ValueError("batch_norm: give both running_mean and running_var, or neither")
    if not training and running_mean is None:
        raise ValueError("batch_norm: training=False needs running_mean and running_var")
    if momentum is None:
        raise ValueError(
            "batch_norm: momentum=None; pass the cumulative factor 1 / num_batches_tracked "
            "(as torch.nn.BatchNorm does for momentum=None)"
        )
    _per_channel(op, shape[1], running_mean=running_mean, running_var=running_var, weight=weight, bias=bias)


def trailing_axes(op: str, shape, normalized_shape) -> tuple[int, ...]:
    """The axes of ``shape`` that ``normalized_shape`` (an int or a sequence) names: its trailing ones."""
    dims = (int(normalized_shape),) if isinstance(normalized_shape, (int, np.integer)) else tuple(
        int(d) for d in normalized_shape)
    n, k = len(shape), len(dims)
    if k == 0 or k > n or tuple(shape[n - k:]) != dims:
        raise ValueError(f"{op}: normalized_shape {dims} is not the trailing shape of the input {tuple(shape)}")
    return tuple(range(n - k, n))


def _normalized_affine(op, x, normalized_shape, **arrays) -> None:
    _float(op, "input", x)
    shape = shape_of(x)
    dims = tuple(shape[a] for a in trailing_axes(op, shape, normalized_shape))
    for name, a in arrays.items():
        if a is not None and shape_of(a) != dims:
            raise ValueError(f"{op}: {name} of shape {shape_of(a)}; expected {dims}, the normalized_shape")


@rule("layer_norm")
def _layer_norm(op, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    _normalized_affine(op, x, normalized_shape, weight=weight, bias=bias)


@rule("rms_norm")
def _rms_norm(op, x, normalized_shape, weight=None, eps=None):
    _normalized_affine(op, x, normalized_shape, weight=weight)


@rule("group_norm")
def _group_norm(op, x, num_groups, weight=None, bias=None, eps=1e-5):
    _float(op, "input", x)
    shape = shape_of(x)
    if (len(shape) < 2 or not isinstance(num_groups, (int, np.integer)) or num_groups < 1
            or shape[1] % num_groups):
        raise ValueError(f"group_norm: num_groups={num_groups!r} must be a positive int dividing the channels "
                         f"(axis 1) of the input {shape}")
    _per_channel(op, shape[1], weight=weight, bias=bias)


@rule("scaled_dot_product_attention")
def _attention(op, query, key, value, attn_mask=None, dropout_mask=None, is_causal=False, scale=None):
    for name, t in (("query", query), ("key", key), ("value", value)):
        _float(op, name, t)
    q, k, v = shape_of(query), shape_of(key), shape_of(value)
    if len(q) < 2 or len(k) < 2 or len(v) < 2 or q[-1] != k[-1] or k[-2] != v[-2]:
        raise ValueError(f"{op}: query {q}, key {k}, value {v}; expected (..., L, E), (..., S, E) and (..., S, Ev)")
    if is_causal and attn_mask is not None:
        raise ValueError(f"{op}: give attn_mask or is_causal=True, not both (as torch)")
    batch = broadcast_shape(op, q[:-2], k[:-2], v[:-2])
    scores = batch + (q[-2], k[-2])
    for name, m in (("attn_mask", attn_mask), ("dropout_mask", dropout_mask)):
        if m is not None and not broadcasts_into(shape_of(m), scores):
            raise ValueError(f"{op}: {name} of shape {shape_of(m)} does not broadcast to the scores' shape {scores}")


@rule("embedding")
def _embedding(op, ids, weight, padding_idx=None):
    _float(op, "weight", weight)
    ws = shape_of(weight)
    if len(ws) != 2:
        raise ValueError(f"embedding: weight of shape {ws}; expected (num_embeddings, dim)")
    if isinstance(ids, (list, tuple)):
        ids = np.asarray(ids)
    _integer(op, "ids", ids)
    num = ws[0]
    values = concrete(ids)
    if values is not None and values.size:
        bad = values[(values < 0) | (values >= num)]
        if bad.size:
            raise IndexError(f"embedding: id {int(bad[0])} is out of range for a table of {num} rows "
                             f"(weight {ws}); ids must be in [0, {num})")
    if padding_idx is not None and not -num <= padding_idx < num:
        raise ValueError(f"embedding: padding_idx={padding_idx} is out of range for a table of {num} rows")


def _reduction_arg(op: str, reduction) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{op}: reduction={reduction!r}; expected 'mean', 'sum' or 'none'")


def _class_inputs(op, input, target, weight, ignore_index, reduction, probabilities_allowed):
    _float(op, "input", input)
    shape = shape_of(input)
    if len(shape) < 2:
        raise ValueError(f"{op}: input of shape {shape}; expected (N, C) or (N, C, d1, ...)")
    _reduction_arg(op, reduction)
    _float(op, "weight", weight)
    _per_channel(op, shape[1], weight=weight)
    if probabilities_allowed and dtype_of(target).kind == "f":
        if shape_of(target) != shape:
            raise ValueError(f"{op}: probability targets of shape {shape_of(target)} must match the input {shape}")
        return
    _integer(op, "target", target)
    expected = shape[:1] + shape[2:]
    if shape_of(target) != expected:
        raise ValueError(f"{op}: class-index targets of shape {shape_of(target)}; an input {shape} needs {expected}")
    values = concrete(target)
    if values is not None:
        bad = values[(values != ignore_index) & ((values < 0) | (values >= shape[1]))]
        if bad.size:
            raise IndexError(f"{op}: target {int(bad[0])} is out of bounds for {shape[1]} classes "
                             f"(ignore_index={ignore_index}); targets must be in [0, {shape[1]})")


@rule("cross_entropy")
def _cross_entropy(op, input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    _class_inputs(op, input, target, weight, ignore_index, reduction, probabilities_allowed=True)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing={label_smoothing!r}; expected a number in [0, 1]")


@rule("nll_loss")
def _nll_loss(op, input, target, weight=None, ignore_index=-100, reduction="mean"):
    _class_inputs(op, input, target, weight, ignore_index, reduction, probabilities_allowed=False)


@rule("mse_loss")
def _mse_loss(op, input, target, reduction="mean"):
    _float(op, "input", input)
    _float(op, "target", target)
    _reduction_arg(op, reduction)
    broadcast_shape(op, shape_of(input), shape_of(target))


@rule("binary_cross_entropy_with_logits")
def _bce_with_logits(op, input, target, weight=None, reduction="mean", pos_weight=None):
    _float(op, "input", input)
    _float(op, "target", target)
    _reduction_arg(op, reduction)
    shape = shape_of(input)
    if shape_of(target) != shape:
        raise ValueError(f"{op}: target of shape {shape_of(target)} must match the input {shape}")
    for name, a in (("weight", weight), ("pos_weight", pos_weight)):
        if a is not None and not broadcasts_into(shape_of(a), shape):
            raise ValueError(f"{op}: {name} of shape {shape_of(a)} does not broadcast into the input {shape}")


def asarray_dtype(value, like=None, dtype=None) -> np.dtype | None:
    """The dtype ``asarray`` casts ``value`` to, or None to keep its own (every backend's rule).

    ``dtype`` if given; else a float value takes ``like``'s float dtype (a
    float constant next to an int array keeps its own), so that a float64
    constant does not promote float32 activations.
    """
    if dtype is not None:
        return np.dtype(dtype)
    if like is None or dtype_of(value).kind != "f":
        return None
    like_dtype = dtype_of(like)
    return like_dtype if like_dtype.kind == "f" else None


"""Every op in ``gradcheck.ops``: the tape's VJP against float64 central differences.

One table row per case (op, configuration); each row draws shapes, values
and options with hypothesis and hands ``(f, args)`` to ``check_vjp``.  The
table must name every op in ``gradcheck.ops.__all__``: an op added without a
row fails ``test_every_op_has_a_row``.  Inputs are kept away from kinks
(relu/abs at 0, ties of max) so that finite differences can referee.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from draws import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from vjp_check import VjpMismatch, check_vjp

from gradcheck import ops
from gradcheck.backends.tape import ops as tape_ops
from gradcheck.backends.tape import tape
from gradcheck.backends.tape.tape import Tensor

SETTINGS = settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Draw:
    """What a row may draw: shapes and options through hypothesis, values from a drawn seed."""

    def __init__(self, data):
        self.data = data
        self.seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
        self.rng = np.random.default_rng(self.seed)

    def __call__(self, strategy, label=None):
        return self.data.draw(strategy, label=label)

    def pick(self, options, label=None):
        return self.data.draw(st.sampled_from(list(options)), label=label)

    def int(self, lo, hi, label=None):
        return self.data.draw(st.integers(lo, hi), label=label)

    def shape(self, min_dims=1, max_dims=3, min_side=1, max_side=4):
        return self.data.draw(
            hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side),
            label="shape",
        )

    # -- values -----------------------------------------------------------
    # Values are always float64 ndarrays, 0-d included (numpy hands back
    # scalars for shape (), which would dodge the float32 cast of a check).
    def normal(self, shape):
        return np.asarray(self.rng.standard_normal(shape), np.float64)

    def positive(self, shape, lo=0.3, hi=2.0):
        return np.asarray(self.rng.uniform(lo, hi, shape), np.float64)

    def away(self, shape, gap=0.1):
        """Values at least ``gap`` from zero (the kink of relu, abs, leaky_relu, elu).

        The first is positive, so relu of a one-element draw is not flat.
        """
        x = self.rng.choice([-1.0, 1.0], size=shape) * self.rng.uniform(gap, 2.0, shape)
        x = np.asarray(x, np.float64)
        x.reshape(-1)[:1] = np.abs(x.reshape(-1)[:1])
        return x

    def distinct(self, shape, spacing=0.05):
        """All values different by at least ``spacing`` (no ties for max, min, max-pool)."""
        n = int(np.prod(shape, dtype=np.int64))
        values = (self.rng.permutation(n) - n / 2) * spacing + self.rng.uniform(0, spacing / 4)
        return values.reshape(shape)

    def axis(self, ndim, allow_none=True, allow_tuple=True):
        """None, an int (maybe negative) or a tuple of distinct axes."""
        kinds = ["int", "neg"] + (["none"] if allow_none else []) + (["tuple"] if allow_tuple and ndim > 1 else [])
        kind = self.pick(kinds, "axis kind")
        if kind == "none":
            return None
        if kind in ("int", "neg"):
            a = self.int(0, ndim - 1, "axis")
            return a - ndim if kind == "neg" else a
        axes = self(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True), "axes")
        return tuple(a - ndim if self(st.booleans(), "negative") else a for a in axes)


@dataclass
class Row:
    op: str  # the gradcheck.ops name this row covers
    label: str
    build: Callable[[Draw], tuple]  # -> (f, args) with float64 numpy args
    kind: str = "vjp"  # "vjp", or "constant" for ops that never carry a gradient
    float32: bool = True  # also check float32 in -> float32 out and gradients

    def __repr__(self):
        return self.label


ROWS: list[Row] = []


def row(op, label=None, kind="vjp", float32=True):
    def register(build):
        ROWS.append(Row(op, label or op, build, kind, float32))
        return build

    return register


# ---------------------------------------------------------------- elementwise, one input
def _unary(op, domain="normal", **kw):
    fn = getattr(ops, op)

    def build(d: Draw):
        x = getattr(d, domain)(d.shape(min_dims=0))
        return (lambda x: fn(x, **kw)), (x,)

    return build


for _op in ["neg", "exp", "expm1", "sin", "cos", "tanh", "sigmoid", "erf", "softplus", "silu", "atan"]:
    ROWS.append(Row(_op, _op, _unary(_op)))
for _op in ["log", "log1p", "sqrt", "rsqrt"]:
    ROWS.append(Row(_op, _op, _unary(_op, "positive")))
for _op in ["abs", "relu"]:
    ROWS.append(Row(_op, f"{_op} (away from 0)", _unary(_op, "away")))
ROWS.append(Row("gelu", "gelu exact", _unary("gelu")))
ROWS.append(Row("gelu", "gelu tanh", _unary("gelu", approximate="tanh")))


@row("leaky_relu", "leaky_relu (away from 0, drawn slope)")
def _(d):
    slope = d.pick([0.01, 0.2, 1.5])
    return (lambda x: ops.leaky_relu(x, slope)), (d.away(d.shape(min_dims=0)),)


@row("elu", "elu (away from 0, drawn alpha)")
def _(d):
    alpha = d.pick([1.0, 0.5, 2.0])
    return (lambda x: ops.elu(x, alpha)), (d.away(d.shape(min_dims=0)),)


@row("astype", "astype float64 -> float64", float32=False)
def _(d):
    return (lambda x: ops.astype(x, np.float64)), (d.normal(d.shape()),)


# ---------------------------------------------------------------- elementwise, two inputs
def _broadcast_pair(d: Draw):
    """Two mutually broadcastable shapes: drawn, (3,1)x(1,4), or one side a 0-d scalar."""
    kind = d.pick(["drawn", "3x1 by 1x4", "scalar left", "scalar right"], "broadcast")
    if kind == "3x1 by 1x4":
        return (3, 1), (1, 4)
    if kind == "scalar left":
        return (), d.shape()
    if kind == "scalar right":
        return d.shape(), ()
    shapes = d(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=4), "shapes")
    return shapes.input_shapes


def _binary(op, a_domain="normal", b_domain="normal"):
    fn = getattr(ops, op)

    def build(d: Draw):
        sa, sb = _broadcast_pair(d)
        return fn, (getattr(d, a_domain)(sa), getattr(d, b_domain)(sb))

    return build


ROWS += [
    Row("add", "add (broadcast)", _binary("add")),
    Row("sub", "sub (broadcast)", _binary("sub")),
    Row("mul", "mul (broadcast)", _binary("mul")),
    Row("div", "div (broadcast, divisor away from 0)", _binary("div", "normal", "away")),
    Row("pow", "pow (broadcast, positive base)", _binary("pow", "positive", "normal")),
]


@row("mul", "mul by a Python scalar")
def _(d):
    c = d.pick([-2.5, 0.5, 3.0])
    side = d.pick(["left", "right"])
    return ((lambda x: ops.mul(c, x)) if side == "left" else (lambda x: ops.mul(x, c))), (d.normal(d.shape()),)


@row("pow", "pow with a Python exponent")
def _(d):
    p = d.pick([2, 3, 0.5, -1.5])
    return (lambda x: ops.pow(x, p)), (d.positive(d.shape(min_dims=0)),)


@row("pow", "pow with a Python base")
def _(d):
    base = d.pick([2.0, 0.5, 3.0])
    return (lambda x: ops.pow(base, x)), (d.normal(d.shape(min_dims=0)),)


# ---------------------------------------------------------------- integer constants
# numpy computes float32 with an int64 array (or an np.int64 scalar) in float64; torch and jax
# stay in float32.  The float32 half of these rows (_check_float32) is what they are for.
def _integer_constant(op, lo=-3, hi=4, nonzero=False, domain="normal"):
    fn = getattr(ops, op)

    def build(d: Draw):
        sx, sk = _broadcast_pair(d)
        k = d.rng.integers(lo, hi, size=sk)
        if nonzero:
            k = np.where(k == 0, 1, k)
        if d(st.booleans(), "np.int64 scalar"):
            k = np.int64(k.flat[0]) if np.ndim(k) else np.int64(k)
        left = d(st.booleans(), "constant on the left")
        return ((lambda x: fn(k, x)) if left else (lambda x: fn(x, k))), (getattr(d, domain)(sx),)

    return build


ROWS += [
    Row("add", "add an integer numpy constant", _integer_constant("add")),
    Row("sub", "sub an integer numpy constant", _integer_constant("sub")),
    Row("mul", "mul by an integer numpy constant", _integer_constant("mul", nonzero=True)),
    Row("div", "div by / of an integer numpy constant", _integer_constant("div", nonzero=True, domain="away")),
    # Non-positive integers against positive values: x wins everywhere, no tie, not flat.
    Row("maximum", "maximum with an integer numpy constant (no ties)",
        _integer_constant("maximum", lo=-3, hi=1, domain="positive")),
]


@row("pow", "pow with an integer numpy exponent")
def _(d):
    shape = d.shape(min_dims=0)
    k = d.rng.integers(1, 4, size=shape)
    return (lambda x: ops.pow(x, k)), (d.positive(shape),)


@row("where", "where with an integer numpy branch")
def _(d):
    shape = d.shape()
    mask, k = d.rng.random(shape) < 0.5, d.rng.integers(-3, 4, size=shape)
    mask.reshape(-1)[0] = True  # x reaches the output somewhere
    return (lambda x: ops.where(mask, x, k)), (d.normal(shape),)


@row("matmul", "matmul by an integer numpy matrix")
def _(d):
    n, k, m = (d.int(1, 4, name) for name in "nkm")
    w = d.rng.choice([-3, -2, -1, 1, 2, 3], size=(k, m))
    return (lambda x: ops.matmul(x, w)), (d.normal((n, k)),)


@row("asarray", "asarray of a tensor keeps its gradient (like=)")
def _(d):
    return (lambda x: ops.mul(ops.asarray(x, like=x), x)), (d.normal(d.shape()),)


@row("asarray", "asarray of a tensor to another dtype keeps its gradient (dtype=)", float32=False)
def _(d):
    return (lambda x: ops.asarray(x, dtype=np.float64)), (d.normal(d.shape()),)


def _minmax(op):
    fn = getattr(ops, op)

    def build(d: Draw):
        sa, sb = _broadcast_pair(d)
        # a and b cut from one set of distinct values: no ties between them.
        both = d.distinct((2,) + np.broadcast_shapes(sa, sb))
        return fn, (_shrink(both[0], sa), _shrink(both[1], sb))

    return build


def _shrink(full, shape):
    """``full`` cut down to ``shape`` (first element along broadcast axes, leading axes dropped)."""
    lead = full.ndim - len(shape)
    out = full[(0,) * lead] if lead else full
    return np.asarray(out[tuple(slice(0, 1) if s == 1 else slice(None) for s in shape)], np.float64)


ROWS += [Row("maximum", "maximum (broadcast, no ties)", _minmax("maximum")),
         Row("minimum", "minimum (broadcast, no ties)", _minmax("minimum"))]


@row("where", "where (broadcast cond, a, b)")
def _(d):
    shapes = d(hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=4), "shapes")
    sc, sa, sb = shapes.input_shapes
    cond = d.rng.random(sc) > 0.5
    return (lambda a, b: ops.where(cond, a, b)), (d.normal(sa), d.normal(sb))


@row("where", "where (3x1 cond, 1x4 a, scalar b)")
def _(d):
    cond = d.rng.random((3, 1)) > 0.5
    return (lambda a, b: ops.where(cond, a, b)), (d.normal((1, 4)), d.normal(()))


# ---------------------------------------------------------------- comparisons and constants
@row("greater", kind="constant")
def _(d):
    s = d.shape()
    return ops.greater, (d.distinct(s), d.distinct(s))


@row("less", kind="constant")
def _(d):
    s = d.shape()
    return ops.less, (d.distinct(s), d.normal(()))


@row("equal", kind="constant")
def _(d):
    x = d.normal(d.shape())
    return (lambda x: ops.equal(x, x)), (x,)


@row("asarray", kind="constant")
def _(d):
    c = d.normal(d.shape())
    return (lambda x: ops.asarray(c, like=x)), (d.normal(d.shape()),)


@row("zeros_like", kind="constant")
def _(d):
    return ops.zeros_like, (d.normal(d.shape()),)


@row("stop_gradient", kind="constant")
def _(d):
    return ops.stop_gradient, (d.normal(d.shape()),)


# ---------------------------------------------------------------- linear algebra
@row("matmul", "matmul (1-d, 2-d, batched broadcast)")
def _(d):
    n, k, m, b = (d.int(1, 4, name) for name in "nkmb")
    case = d.pick(["vec.vec", "vec.mat", "mat.vec", "mat.mat", "batched.mat", "batch broadcast", "vec.batched"])
    shapes = {
        "vec.vec": ((k,), (k,)),
        "vec.mat": ((k,), (k, m)),
        "mat.vec": ((n, k), (k,)),
        "mat.mat": ((n, k), (k, m)),
        "batched.mat": ((b, n, k), (k, m)),
        "batch broadcast": ((b, 1, n, k), (3, k, m)),
        "vec.batched": ((k,), (b, k, m)),
    }[case]
    return ops.matmul, tuple(d.normal(s) for s in shapes)


@row("einsum", "einsum (two operands, contractions, summed index)")
def _(d):
    i, j, k, b = (d.int(1, 4, name) for name in "ijkb")
    spec, shapes = d.pick([
        ("ij,jk->ik", ((i, j), (j, k))),
        ("bij,bjk->bik", ((b, i, j), (b, j, k))),
        ("ij,ij->i", ((i, j), (i, j))),
        ("ij,k->k", ((i, j), (k,))),  # i and j are summed inside the first operand alone
        ("i,j->ij", ((i,), (j,))),
        ("ij,jk->", ((i, j), (j, k))),
        ("ij->ji", ((i, j),)),
        ("bij->bj", ((b, i, j),)),
        ("...ik,...j->ij", ((b, i, k), (b, j))),  # the '...' dims summed: an output without '...', as torch's
    ], "spec")
    return (lambda *xs: ops.einsum(spec, *xs)), tuple(d.normal(s) for s in shapes)


# ---------------------------------------------------------------- reductions
def _reduction(op, domain="normal", **extra):
    fn = getattr(ops, op)

    def build(d: Draw):
        shape = d.shape(min_dims=1)
        axis = d.axis(len(shape))
        keepdims = d(st.booleans(), "keepdims")
        kw = {k: d.pick(v, k) for k, v in extra.items()}
        return (lambda x: fn(x, axis=axis, keepdims=keepdims, **kw)), (getattr(d, domain)(shape),)

    return build


ROWS += [
    Row("sum", "sum (axis None/int/tuple/negative, keepdims)", _reduction("sum")),
    Row("mean", "mean (axis, keepdims)", _reduction("mean")),
    Row("max", "max (axis, keepdims, no ties)", _reduction("max", "distinct")),
    Row("min", "min (axis, keepdims, no ties)", _reduction("min", "distinct")),
    Row("logsumexp", "logsumexp (axis, keepdims)", _reduction("logsumexp")),
]


@row("var", "var (axis, keepdims, ddof)")
def _(d):
    shape = d.shape(min_dims=1, min_side=2)
    axis = d.axis(len(shape))
    keepdims, ddof = d(st.booleans(), "keepdims"), d.pick([0, 1], "ddof")
    return (lambda x: ops.var(x, axis=axis, keepdims=keepdims, ddof=ddof)), (d.normal(shape),)


@row("normalize", "normalize (batchnorm, layernorm, groupnorm axes; weight and bias or not)")
def _(d):
    kind = d.pick(["batchnorm", "layernorm", "groups"], "kind")
    if kind == "batchnorm":  # statistics over every dim but 1, a per-channel affine (folded into the scale)
        shape = d.shape(min_dims=2, max_dims=4, min_side=2)
        axes = (0,) + tuple(range(2, len(shape)))
        affine = (1, shape[1]) + (1,) * (len(shape) - 2)
    elif kind == "layernorm":  # over trailing dims, an affine of their shape
        shape = d.shape(min_dims=1, max_dims=3, min_side=2)
        k = d.int(1, len(shape), "normalised dims")
        axes = tuple(range(len(shape) - k, len(shape)))
        affine = tuple(shape[len(shape) - k:])
    else:  # GroupNorm's statistics: (N, groups, rest), no affine
        shape, axes, affine = d.shape(min_dims=3, max_dims=3, min_side=2), (2,), None
    with_weight = affine is not None and d(st.booleans(), "weight")
    with_bias = affine is not None and d(st.booleans(), "bias")
    # Distinct values: a near-constant group would make 1/std, and its finite differences, explode.
    args = (d.distinct(shape, spacing=0.3),) + ((d.positive(affine),) if with_weight else ()) + (
        (d.normal(affine),) if with_bias else ())

    def f(x, *wb):
        wb = list(wb)
        weight = wb.pop(0) if with_weight else None
        bias = wb.pop(0) if with_bias else None
        return ops.normalize(x, axes, 1e-5, weight=weight, bias=bias)[0]

    return f, args


def _softmax(op):
    fn = getattr(ops, op)

    def build(d: Draw):
        shape = d.shape(min_dims=1, min_side=2)  # softmax over one element is constant
        axis = d.axis(len(shape), allow_none=False, allow_tuple=False)
        return (lambda x: fn(x, axis=axis)), (d.normal(shape),)

    return build


ROWS += [Row("softmax", "softmax (axis)", _softmax("softmax")),
         Row("log_softmax", "log_softmax (axis)", _softmax("log_softmax"))]


@row("prod", "prod (axis, keepdims; exact zeros: the product of the others)")
def _(d):
    shape = d.shape(min_dims=1)
    x = d.normal(shape)
    axis, keepdims = d.axis(len(shape)), d(st.booleans(), "keepdims")
    # Zeros are where prod's gradient is not prod / x: one in a group gets the others' product, the rest 0.
    # Two zeros make a group flat, so they are drawn only where another group keeps the function from being so.
    reduced = range(len(shape)) if axis is None else [a % len(shape) for a in np.atleast_1d(axis)]
    size = int(np.prod([shape[a] for a in reduced], dtype=np.int64))
    groups = x.size // size
    # A group of one element is the element itself: a zero there leaves sin(prod) without curvature at all.
    zeros = d.int(0, 2 if groups > 1 else 1, "zeros") if size > 1 else 0
    x.reshape(-1)[d.rng.choice(x.size, size=builtins.min(zeros, x.size), replace=False)] = 0.0
    return (lambda x: ops.prod(x, axis=axis, keepdims=keepdims)), (x,)


@row("topk", "topk values (axis, k, largest or smallest; no ties)")
def _(d):
    shape = d.shape(min_dims=1)
    axis = d.axis(len(shape), allow_none=False, allow_tuple=False)
    k, largest = d.int(1, shape[axis], "k"), d(st.booleans(), "largest")
    return (lambda x: ops.topk(x, k, axis=axis, largest=largest)[0]), (d.distinct(shape),)


# ---------------------------------------------------------------- shapes
@row("reshape")
def _(d):
    shape = d.shape(min_dims=1)
    size = int(np.prod(shape))
    target = d.pick([(size,), (1, size), tuple(reversed(shape)), (-1,) + tuple(shape[1:]), (size, 1, 1)], "target")
    return (lambda x: ops.reshape(x, target)), (d.normal(shape),)


@row("transpose", "transpose (permutations, negative axes, None)")
def _(d):
    shape = d.shape(min_dims=1, max_dims=4, max_side=3)
    n = len(shape)
    perm = d(st.permutations(range(n)), "perm")
    axes = d.pick(["none", "perm", "some negative"], "axes kind")
    if axes == "none":
        axes = None
    elif axes == "perm":
        axes = tuple(perm)
    else:  # a mix of signs: all-negative axes sort like positive ones and hide bugs
        axes = tuple(a - n if d(st.booleans(), f"negative {a}") else a for a in perm)
    return (lambda x: ops.transpose(x, axes)), (d.normal(shape),)


@row("broadcast_to", "broadcast_to (stretched and new leading axes)")
def _(d):
    target = d.shape(min_dims=1)
    ndim = d.int(0, len(target), "source ndim")
    source = tuple(1 if d(st.booleans(), f"stretch {i}") else s for i, s in enumerate(target[len(target) - ndim:]))
    return (lambda x: ops.broadcast_to(x, target)), (d.normal(source),)


@row("concatenate", "concatenate (1-3 arrays, axis incl. negative)")
def _(d):
    shape = list(d.shape(min_dims=1))
    axis = d.int(-len(shape), len(shape) - 1, "axis")
    k = d.int(1, 3, "count")
    arrays = []
    for i in range(k):
        s = list(shape)
        s[axis] = d.int(1, 3, f"length {i}")
        arrays.append(d.normal(tuple(s)))
    return (lambda *xs: ops.concatenate(list(xs), axis=axis)), tuple(arrays)


@row("stack", "stack (1-3 arrays, axis incl. negative)")
def _(d):
    shape = d.shape(min_dims=0)
    axis = d.int(-len(shape) - 1, len(shape), "axis")
    k = d.int(1, 3, "count")
    return (lambda *xs: ops.stack(list(xs), axis=axis)), tuple(d.normal(shape) for _ in range(k))


def _index(d: Draw, shape):
    """A numpy index into ``shape`` (ndim >= 2, sides >= 3): slices, steps, ints, arrays with repeats."""
    n0, n1 = shape[0], shape[1]
    kind = d.pick(["slice", "step", "negative step", "int", "int array repeats", "2-d int array",
                   "mixed", "ellipsis and None", "bool mask"], "index kind")
    if kind == "slice":
        return (slice(1, None), slice(0, n1 - 1))
    if kind == "step":
        return (slice(None, None, 2), slice(1, None, d.int(1, 3, "step")))
    if kind == "negative step":
        return (slice(None, None, -1), slice(None, None, -2))
    if kind == "int":
        return (d.int(-n0, n0 - 1, "int"),)
    if kind == "int array repeats":
        return d.rng.integers(0, n0, size=d.int(1, 6, "count"))
    if kind == "2-d int array":
        return (d.rng.integers(0, n0, size=(2, 3)),)
    if kind == "mixed":
        return (slice(None), np.array([0, n1 - 1, 0, 1]))
    if kind == "ellipsis and None":
        return (Ellipsis, None, slice(0, 2))
    mask = d.rng.random(shape[:1]) > 0.4
    mask[0] = True  # an empty selection would make the check vacuous
    return mask


@row("getitem", "getitem (slices, steps, ints, integer arrays with repeats, masks)")
def _(d):
    shape = d.shape(min_dims=2, max_dims=3, min_side=3, max_side=4)
    index = _index(d, shape)
    return (lambda x: ops.getitem(x, index)), (d.normal(shape),)


@row("getitem", "Tensor[...] operator")
def _(d):
    shape = d.shape(min_dims=2, max_dims=3, min_side=3, max_side=4)
    index = _index(d, shape)
    return (lambda x: x[index]), (d.normal(shape),)


@row("take", "take (embedding gather with repeats, axis)")
def _(d):
    shape = d.shape(min_dims=1, max_dims=3, min_side=2)
    axis = d.int(-len(shape), len(shape) - 1, "axis")
    idx_shape = d.pick([(5,), (2, 3), ()], "indices shape")
    indices = d.rng.integers(0, shape[axis], size=idx_shape)
    return (lambda x: ops.take(x, indices, axis=axis)), (d.normal(shape),)


@row("pad", "pad (per-axis widths, value)")
def _(d):
    shape = d.shape(min_dims=1)
    widths = tuple((d.int(0, 2, f"before {i}"), d.int(0, 2, f"after {i}")) for i in range(len(shape)))
    value = d.pick([0.0, -1.5])
    return (lambda x: ops.pad(x, widths, value=value)), (d.normal(shape),)


@row("pad", "pad (numpy's broadcast forms: int, one pair)")
def _(d):
    shape = d.shape(min_dims=1)
    widths = d.pick([1, 2, ((0, 2),), ((1, 0),), (1,)], "widths")
    return (lambda x: ops.pad(x, widths)), (d.normal(shape),)


# ---------------------------------------------------------------- convolution and pooling
def _conv_config(d: Draw, nd: int, transposed: bool):
    groups = d.int(1, 2, "groups")
    cin, cout = groups * d.int(1, 2, "in per group"), groups * d.int(1, 2, "out per group")
    k = tuple(d.int(1, 3, "kernel") for _ in range(nd))
    stride = d.int(1, 2, "stride")
    dilation = d.int(1, 2, "dilation")
    n = d.int(1, 2, "batch")
    bias = d(st.booleans(), "bias")
    if transposed:
        # Padding at most half the dilated kernel, so the output is never empty.
        padding = d.int(0, builtins.min(1, dilation * (builtins.min(k) - 1) // 2), "padding")
        output_padding = d.int(0, max(stride, dilation) - 1, "output_padding")
        spatial = tuple(d.int(2, 4, "size") for _ in range(nd))  # size 1 with padding can crop to holes only
        w_shape = (cin, cout // groups) + k
        kw = dict(stride=stride, padding=padding, output_padding=output_padding, dilation=dilation, groups=groups)
    else:
        # An int padding up to the dilated kernel's reach, so no output sees padding only.
        pad = builtins.min(1, dilation * (builtins.min(k) - 1))
        padding = d.pick([0, pad, "same", "valid"] if stride == 1 else [0, pad, "valid"], "padding")
        spatial = tuple(dilation * (ki - 1) + 1 + d.int(0, 3, "extra") for ki in k)
        w_shape = (cout, cin // groups) + k
        kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    x = d.normal((n, cin) + spatial)
    w = d.normal(w_shape)
    b = d.normal((w_shape[1] * groups if transposed else cout,))
    return x, w, (b if bias else None), kw


def _conv_row(nd, transposed):
    fn = ops.conv_transpose if transposed else ops.conv

    def build(d: Draw):
        x, w, b, kw = _conv_config(d, nd, transposed)
        if b is None:
            return (lambda x, w: fn(x, w, **kw)), (x, w)
        return (lambda x, w, b: fn(x, w, b, **kw)), (x, w, b)

    return build


ROWS += [
    Row("conv", "conv 1-d (stride, padding, 'same', dilation, groups, bias)", _conv_row(1, False)),
    Row("conv", "conv 2-d (stride, padding, 'same', dilation, groups, bias)", _conv_row(2, False)),
    Row("conv_transpose", "conv_transpose 1-d (output_padding, groups)", _conv_row(1, True)),
    Row("conv_transpose", "conv_transpose 2-d (output_padding, groups)", _conv_row(2, True)),
]


def _pool_config(d: Draw):
    k = (d.int(1, 3, "kh"), d.int(1, 3, "kw"))
    stride = d.pick([None, 1, 2, (1, 2)], "stride")
    padding = (d.int(0, k[0] // 2, "ph"), d.int(0, k[1] // 2, "pw"))
    shape = (d.int(1, 2, "n"), d.int(1, 2, "c"), k[0] + d.int(0, 3, "h"), k[1] + d.int(0, 3, "w"))
    return shape, k, stride, padding


@row("max_pool2d", "max_pool2d (kernel, stride, padding; no ties)")
def _(d):
    shape, k, stride, padding = _pool_config(d)
    return (lambda x: ops.max_pool2d(x, k, stride, padding)), (d.distinct(shape),)


@row("avg_pool2d", "avg_pool2d (count_include_pad both ways)")
def _(d):
    shape, k, stride, padding = _pool_config(d)
    include = d(st.booleans(), "count_include_pad")
    return (lambda x: ops.avg_pool2d(x, k, stride, padding, count_include_pad=include)), (d.normal(shape),)


@row("adaptive_avg_pool2d", "adaptive_avg_pool2d (non-divisible and upsampling sizes)")
def _(d):
    h, w = d.int(1, 7, "h"), d.int(1, 7, "w")
    out = (d.int(1, h + 1, "oh"), d.int(1, w + 1, "ow"))
    out = out[0] if out[0] == out[1] and d(st.booleans(), "int size") else out
    return (lambda x: ops.adaptive_avg_pool2d(x, out)), (d.normal((d.int(1, 2, "n"), d.int(1, 2, "c"), h, w)),)


# ---------------------------------------------------------------- framework kernels (derived on the tape)
@row("linear", "linear (bias or not)")
def _(d):
    # n * out >= 2: with one output element, sin(x w) in the second-order check can sit at a zero of its
    # second derivative, where the finite difference has nothing to measure but rounding.
    n, i, o = d.int(1, 4, "n"), d.int(1, 4, "in"), d.int(2, 4, "out")
    args = (d.normal((n, i)), d.normal((o, i))) + ((d.normal((o,)),) if d(st.booleans(), "bias") else ())
    return ops.linear, args


@row("batch_norm", "batch_norm (train with batch statistics; eval with running ones)")
def _(d):
    shape = (d.int(2, 3, "n"), d.int(1, 3, "c"), d.int(1, 3, "l"))
    training = d(st.booleans(), "training")
    c = shape[1]

    # y only: the updated running statistics are buffers, which carry no gradient (as in torch).
    def f(x, running_mean, running_var, weight, bias):
        return ops.batch_norm(x, running_mean, running_var, weight, bias, training=training, momentum=0.1)[0]

    return f, (d.distinct(shape, spacing=0.3), d.normal((c,)), d.positive((c,)), d.positive((c,)), d.normal((c,)))


@row("layer_norm", "layer_norm (trailing dims, affine or not)")
def _(d):
    # Three values at least per normalised group: two normalise to +-1 whatever they are, a function so flat
    # that its second-order finite differences are rounding alone.
    shape = d.shape(min_dims=2, max_dims=3, min_side=3)
    k = d.int(1, len(shape) - 1, "normalised dims")
    normalized = shape[len(shape) - k:]
    affine = d(st.booleans(), "affine")
    args = (d.distinct(shape, spacing=0.3),) + ((d.positive(normalized), d.normal(normalized)) if affine else ())
    return (lambda x, *wb: ops.layer_norm(x, normalized, *wb)), args


@row("group_norm", "group_norm (2 groups, affine)")
def _(d):
    shape = (d.int(1, 2, "n"), 4, d.int(2, 3, "l"))
    return (lambda x, w, b: ops.group_norm(x, 2, w, b)), (d.distinct(shape, spacing=0.3), d.positive((4,)),
                                                          d.normal((4,)))


@row("rms_norm", "rms_norm (weight or not)")
def _(d):
    shape = d.shape(min_dims=1, max_dims=3, min_side=2)
    args = (d.normal(shape),) + ((d.positive(shape[-1:]),) if d(st.booleans(), "weight") else ())
    return (lambda x, *w: ops.rms_norm(x, shape[-1:], *w, eps=1e-5)), args


@row("scaled_dot_product_attention", "scaled_dot_product_attention (causal, float mask, plain)")
def _(d):
    b, n, e = d.int(1, 2, "batch"), d.int(1, 3, "length"), d.int(1, 3, "embedding")
    kind = d.pick(["plain", "causal", "float mask"], "mask")
    mask = d.normal((n, n)) if kind == "float mask" else None
    return ((lambda q, k, v: ops.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=kind == "causal")),
            (d.normal((b, n, e)), d.normal((b, n, e)), d.normal((b, n, e))))


@row("embedding", "embedding (repeated ids, padding_idx or not)")
def _(d):
    num, dim = d.int(2, 5, "num"), d.int(1, 3, "dim")
    ids = d.rng.integers(0, num, size=(d.int(1, 3, "n"), d.int(1, 3, "l")))
    ids.reshape(-1)[0] = num - 1  # one id that is not the padding row, so the output is not flat
    padding = d.pick([None, 0], "padding_idx")
    return (lambda w: ops.embedding(ids, w, padding_idx=padding)), (d.normal((num, dim)),)


def _class_targets(d, n, c):
    return d.rng.integers(0, c, size=(n,))


@row("cross_entropy", "cross_entropy (class ids or probabilities, class weight, reduction)")
def _(d):
    n, c = d.int(1, 4, "n"), d.int(2, 4, "classes")
    reduction = d.pick(["mean", "sum", "none"], "reduction")
    if d(st.booleans(), "probability targets"):
        p = d.positive((n, c))
        return (lambda x, t: ops.cross_entropy(x, t, reduction=reduction)), (d.normal((n, c)), p / p.sum(1, keepdims=True))
    weight = d.positive((c,)) if d(st.booleans(), "class weight") else None
    target = _class_targets(d, n, c)
    return (lambda x: ops.cross_entropy(x, target, weight=weight, reduction=reduction)), (d.normal((n, c)),)


@row("nll_loss", "nll_loss (class weight, reduction)")
def _(d):
    n, c = d.int(1, 4, "n"), d.int(2, 4, "classes")
    reduction = d.pick(["mean", "sum", "none"], "reduction")
    weight = d.positive((c,)) if d(st.booleans(), "class weight") else None
    target = _class_targets(d, n, c)
    return (lambda x: ops.nll_loss(x, target, weight=weight, reduction=reduction)), (d.normal((n, c)),)


@row("mse_loss", "mse_loss (reduction)")
def _(d):
    shape = d.shape()
    reduction = d.pick(["mean", "sum", "none"], "reduction")
    return (lambda x, t: ops.mse_loss(x, t, reduction=reduction)), (d.normal(shape), d.normal(shape))


@row("binary_cross_entropy_with_logits", "binary_cross_entropy_with_logits (weight, pos_weight, reduction)")
def _(d):
    shape = d.shape()
    reduction = d.pick(["mean", "sum", "none"], "reduction")
    weight = d.positive(shape) if d(st.booleans(), "weight") else None
    pos_weight = d.positive(shape[-1:]) if d(st.booleans(), "pos_weight") else None
    f = (lambda x, t: ops.binary_cross_entropy_with_logits(x, t, weight=weight, reduction=reduction,
                                                           pos_weight=pos_weight))
    return f, (d.normal(shape), d.rng.uniform(0.0, 1.0, shape))


# ---------------------------------------------------------------- ops for torch.export graphs (derived)
def _off_hard_kinks(x):
    """Values across (-5, 5), the flat parts included, none within 0.1 of the kinks at -3 and 3, and the
    first on the slope (an input all on the flat parts would make a check that cannot fail)."""
    near = np.abs(np.abs(x) - 3.0) < 0.1
    x = np.array(np.where(near, x + 0.25 * np.sign(x), x))
    x.reshape(-1)[0] = 1.5
    return x


@row("hardswish", "hardswish (both flat parts and the curve)")
def _(d):
    return ops.hardswish, (_off_hard_kinks(d.rng.uniform(-5.0, 5.0, d.shape())),)


@row("hardsigmoid", "hardsigmoid (both flat parts and the slope)")
def _(d):
    return ops.hardsigmoid, (_off_hard_kinks(d.rng.uniform(-5.0, 5.0, d.shape())),)


@row("upsample_nearest2d", "upsample_nearest2d (up, down, a given scale factor)")
def _(d):
    h, w = d.int(1, 4, "h"), d.int(1, 4, "w")
    size = (d.int(1, 8, "oh"), d.int(1, 8, "ow"))
    factor = 2.0 if d(st.booleans(), "scale factor 2") else None
    size = (2 * h, 2 * w) if factor else size
    return (lambda x: ops.upsample_nearest2d(x, size, factor)), (d.normal((d.int(1, 2, "n"), 2, h, w)),)


@row("upsample_bilinear2d", "upsample_bilinear2d (corners aligned or not, up and down)")
def _(d):
    h, w = d.int(1, 4, "h"), d.int(1, 4, "w")
    size = (d.int(1, 8, "oh"), d.int(1, 8, "ow"))
    corners = d(st.booleans(), "align_corners")
    return (lambda x: ops.upsample_bilinear2d(x, size, corners)), (d.normal((d.int(1, 2, "n"), 2, h, w)),)


# ---------------------------------------------------------------- the tests
def test_every_op_has_a_row():
    covered = {r.op for r in ROWS}
    missing = sorted(set(ops.__all__) - covered)
    assert not missing, (
        f"ops without a VJP test row: {missing}; add a row to tests/test_tape_vjp.py "
        "(a `@row(\"name\")` builder returning (f, args))"
    )
    unknown = sorted(covered - set(ops.__all__))
    assert not unknown, f"rows name ops that gradcheck.ops does not export: {unknown}"


def _check_float32(row: Row, f, args):
    """float32 in -> float32 out and float32 gradients (no silent float64 promotion)."""
    args32 = [a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == np.float64 else a for a in args]
    tensors = [Tensor(a, requires_grad=True) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args32]
    out = f(*tensors)
    assert out.dtype == np.float32, f"{row.label}: float32 inputs gave a {out.dtype} output"
    float_inputs = [t for t in tensors if isinstance(t, Tensor)]
    grads = tape.grad(out, float_inputs, cotangent=np.ones(out.shape, np.float32))
    for i, g in enumerate(grads):
        assert g.dtype == np.float32, f"{row.label}: float32 input {i} got a {g.dtype} gradient"


VJP_ROWS = [r for r in ROWS if r.kind == "vjp"]
CONSTANT_ROWS = [r for r in ROWS if r.kind == "constant"]


@pytest.mark.parametrize("row", VJP_ROWS, ids=[r.label for r in VJP_ROWS])
@SETTINGS
@given(data=st.data())
def test_vjp(row: Row, data):
    d = Draw(data)
    f, args = row.build(d)
    check_vjp(f, args, name=row.label, seed=d.seed)
    if row.float32:
        _check_float32(row, f, args)


@pytest.mark.parametrize("row", CONSTANT_ROWS, ids=[r.label for r in CONSTANT_ROWS])
@settings(max_examples=examples(5), deadline=None)
@given(data=st.data())
def test_constant_ops_carry_no_gradient(row: Row, data):
    f, args = row.build(Draw(data))
    expected = np.asarray(f(*args))
    out = f(*(Tensor(a, requires_grad=True) for a in args))
    assert not (isinstance(out, Tensor) and out.requires_grad), f"{row.label} returned a tensor that requires grad"
    np.testing.assert_array_equal(np.asarray(tape.raw(out)), expected, err_msg=f"{row.label}: tape vs numpy value")


def test_stop_gradient_cuts_one_path_only():
    # d/dx [stop(x) * x] = stop(x): the gradient flows through the second factor only.
    x = np.array([0.5, -2.0, 3.0])
    t = Tensor(x, requires_grad=True)
    (g,) = tape.grad(ops.sum(ops.mul(ops.stop_gradient(t), t)), [t])
    np.testing.assert_allclose(g, x)


@pytest.mark.parametrize("src,dst", [(np.float32, np.float64), (np.float64, np.float32)])
def test_astype_gradient_returns_to_the_source_dtype(src, dst):
    x = Tensor(np.array([0.5, -1.25], src), requires_grad=True)
    y = ops.astype(x, dst)
    assert y.dtype == dst
    (g,) = tape.grad(ops.sum(ops.mul(y, 3.0)), [x])
    assert g.dtype == src
    np.testing.assert_array_equal(g, [3.0, 3.0])


# The documented conventions at kinks and ties, which finite differences
# cannot referee (torch and jax agree on each).
def _grad(f, *xs):
    ts = [Tensor(np.asarray(x, np.float64), requires_grad=True) for x in xs]
    return tape.grad(ops.sum(f(*ts)), ts)


def test_tie_and_kink_conventions():
    np.testing.assert_array_equal(_grad(ops.relu, [0.0, 1.0, -1.0])[0], [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(_grad(ops.abs, [0.0, 2.0, -2.0])[0], [0.0, 1.0, -1.0])
    ga, gb = _grad(ops.maximum, [1.0, 2.0, 3.0], [1.0, 5.0, 0.0])
    np.testing.assert_array_equal(ga, [0.5, 0.0, 1.0])
    np.testing.assert_array_equal(gb, [0.5, 1.0, 0.0])
    ga, gb = _grad(ops.minimum, [1.0, 2.0], [1.0, 5.0])
    np.testing.assert_array_equal(ga, [0.5, 1.0])
    np.testing.assert_array_equal(gb, [0.5, 0.0])
    np.testing.assert_array_equal(_grad(lambda x: ops.max(x, axis=1), [[3.0, 3.0, 1.0, 3.0]])[0],
                                  [[1 / 3, 1 / 3, 0.0, 1 / 3]])
    # d/da a**0 = 0, also at a = 0 (not 0 * 0**-1 = nan), as torch.
    ga, gb = _grad(ops.pow, [0.0, 1.0, 2.0], [0.0, 0.0, 3.0])
    np.testing.assert_array_equal(ga, [0.0, 0.0, 12.0])
    np.testing.assert_allclose(gb, [0.0, 0.0, 8 * np.log(2.0)])
    np.testing.assert_array_equal(_grad(lambda a: ops.pow(a, 0), [0.0, 3.0])[0], [0.0, 0.0])
    # max-pool: the first maximum of each window, as torch.
    x = np.array([[[[2.0, 2.0], [1.0, 2.0]]]])
    np.testing.assert_array_equal(_grad(lambda x: ops.max_pool2d(x, 2), x)[0], [[[[1.0, 0.0], [0.0, 0.0]]]])


# ---------------------------------------------------------------- empty axes
# torch and jax: a softmax over an empty axis is empty, a logsumexp over one is -inf (the log of
# an empty sum), and the gradients are empty too.
@pytest.mark.parametrize("shape, axis", [((3, 0), -1), ((0, 3), 0), ((2, 0, 3), 1), ((3, 0), None)])
def test_softmax_family_over_an_empty_axis_gives_what_torch_and_jax_give(shape, axis):
    for value in (np.zeros(shape, np.float32), Tensor(np.zeros(shape, np.float32), requires_grad=True)):
        lse = ops.logsumexp(value, axis=axis)
        kept = () if axis is None else tuple(s for i, s in enumerate(shape) if i != axis % len(shape))
        np.testing.assert_array_equal(tape.raw(lse), np.full(kept, -np.inf, np.float32))
        assert ops.dtype_of(lse) == np.float32
        for op in (ops.softmax, ops.log_softmax):
            y = op(value, axis=-1 if axis is None else axis)
            assert ops.shape_of(y) == shape and ops.dtype_of(y) == np.float32
    x = Tensor(np.zeros(shape, np.float32), requires_grad=True)
    (g,) = tape.grad(ops.sum(ops.log_softmax(x, axis=-1 if axis is None else axis)), [x])
    assert g.shape == shape and g.dtype == np.float32


# ---------------------------------------------------------------- integer constants and inputs
def test_integer_constants_keep_float32_tensors_in_float32():
    x = Tensor(np.array([[0.5, -1.25, 2.0]], np.float32), requires_grad=True)
    w = Tensor(np.ones((3, 2), np.float32), requires_grad=True)
    ints, scalar = np.array([1, 2, 3]), np.int64(3)
    for y in (ops.mul(x, ints), ops.add(scalar, x), ops.div(x, ints), ops.pow(x, np.array([0, 1, 2])),
              ops.sub(ints, x), ops.maximum(x, np.int64(0)), ops.where(ints > 1, x, ints),
              ops.matmul(np.array([[1, 2, 3]]), w)):
        assert y.dtype == np.float32
        grads = tape.grad(ops.sum(ops.mul(y, y)), [x, w])
        assert [g.dtype for g in grads] == [np.float32, np.float32]


def test_an_integer_input_to_a_float32_model_stays_float32_on_the_tape():
    import gradcheck
    import gradcheck.layers as L

    model = L.Dense(3, 2, rng=0)
    x, k = np.ones((2, 3), np.float32), np.array([[1, 2], [3, 4]])
    value, (_, gx, gk) = gradcheck.withgradient(lambda m, x, k: ops.sum(m(x) * k), model, x, k)
    assert value.dtype == np.float32 and gx.dtype == np.float32 and gk is None


def test_an_integer_input_does_not_blame_the_tape_for_numpys_promotion():
    pytest.importorskip("torch")
    import gradcheck.layers as L
    from gradcheck.case import Case
    from gradcheck.check.runner import RunOptions, run_case

    case = Case("int input", lambda rng: L.Dense(3, 2, rng=rng),
                lambda rng: (rng.standard_normal((2, 3)), rng.integers(1, 4, size=(2, 2))),
                forward=lambda m, x, k: m(x) * k)
    result = run_case(case, RunOptions(backends=("tape", "torch"), repeat=False))
    assert result.verdict == "agree", [(leaf.path, leaf.verdict, leaf.message) for leaf in result.leaves]


# ---------------------------------------------------------------- integer and bool arrays
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_integer_and_bool_tensors_cannot_require_grad(dtype):
    with pytest.raises(TypeError, match=f"dtype {np.dtype(dtype)}.*only float arrays are differentiated"):
        Tensor(np.zeros(3, dtype), requires_grad=True)


def test_integer_results_are_never_differentiated():
    x = Tensor(np.array([0.2, -1.0, 3.0]), requires_grad=True)
    mask = ops.greater(x, 0.0)
    assert mask.dtype == np.bool_ and not isinstance(mask, Tensor)
    # A float op on an int tensor is fine, but nothing integer joins the graph.
    idx = Tensor(np.array([2, 0]))
    assert not ops.add(idx, 1).requires_grad
    (g,) = tape.grad(ops.sum(ops.where(mask, x, 0.0)), [x])
    np.testing.assert_array_equal(g, [1.0, 0.0, 1.0])


# ---------------------------------------------------------------- negative controls
# A checker that cannot fail proves nothing: each deliberately wrong VJP below
# must be caught.  Inputs are fixed so the controls are deterministic.
R = np.random.default_rng(1234)
X34, Y34 = R.standard_normal((3, 4)), R.standard_normal((3, 4))
X14 = R.standard_normal((1, 4))
CONV_X, CONV_W = R.standard_normal((2, 2, 5, 5)), R.standard_normal((3, 2, 3, 3))


def _scaled(vjp, factor=1.01):
    return lambda g, ans, *a, **k: ops.mul(vjp(g, ans, *a, **k), factor)


def _flip_kernel(g, ans, x, w, geom, nd):
    return tape_ops._conv_input_grad(g, w[..., ::-1, ::-1], geom=geom, nd=nd)


NEGATIVE = [
    # (label, primitive, argnum or "any", wrong vjp builder, f, args)
    ("mul scaled by 1.01", tape_ops.mul, 0, lambda old: _scaled(old), ops.mul, (X34, Y34)),
    ("add broadcast not undone in b", tape_ops.add, 1, lambda old: (lambda g, ans, a, b: g), ops.add, (X34, X14)),
    ("tanh drops the ans^2 term", tape_ops.tanh, 0, lambda old: (lambda g, ans, x: g), ops.tanh, (X34,)),
    ("softmax drops the sum term", tape_ops.softmax, 0,
     lambda old: (lambda g, ans, x, axis=-1: ops.mul(ans, g)), ops.softmax, (X34,)),
    ("sum scaled by 1.01", tape_ops.sum, 0, lambda old: _scaled(old), lambda x: ops.sum(x, axis=1), (X34,)),
    ("matmul wrt b without transposing a", tape_ops._matmul, 1,
     lambda old: (lambda g, ans, a, b: ops.matmul(a, g)),
     ops.matmul, (R.standard_normal((3, 3)), R.standard_normal((3, 3)))),
    ("conv input grad with a flipped kernel", tape_ops._conv, 0, lambda old: _flip_kernel,
     lambda x, w: ops.conv(x, w, padding=1), (CONV_X, CONV_W)),
    ("conv weight grad scaled by 1.01", tape_ops._conv, 1, lambda old: _scaled(old),
     lambda x, w: ops.conv(x, w, stride=2), (CONV_X, CONV_W)),
    ("transpose VJP uses the permutation, not its inverse", tape_ops.transpose, 0,
     lambda old: (lambda g, ans, x, axes=None: ops.transpose(g, axes)),
     lambda x: ops.transpose(x, (1, 2, 0)), (R.standard_normal((2, 3, 4)),)),
    ("max_pool2d scaled by 1.01", tape_ops._max_pool, 0, lambda old: _scaled(old),
     lambda x: ops.max_pool2d(x, 2), (R.permutation(50).reshape(1, 2, 5, 5) / 10.0,)),
    ("log VJP 1/x^2", tape_ops.log, 0, lambda old: (lambda g, ans, x: ops.div(g, ops.mul(x, x))),
     ops.log, (R.uniform(0.5, 2.0, (3, 4)),)),
    ("atan VJP 1/(1 + x), the square forgotten", tape_ops.atan, 0,
     lambda old: (lambda g, ans, x: ops.div(g, ops.add(x, 1.0))), ops.atan, (R.uniform(0.5, 2.0, (3, 4)),)),
    ("prod VJP prod/x, wrong at a zero", tape_ops.prod, 0,
     lambda old: (lambda g, ans, x, axis=None, keepdims=False: ops.mul(ops.reshape(g, (-1, 1)), ops.div(
         ops.reshape(ans, (-1, 1)), ops.where(tape.raw(x) == 0, 1.0, x)))),
     lambda x: ops.prod(x, axis=1), (np.where(np.eye(3, 4, dtype=bool), 0.0, R.standard_normal((3, 4))),)),
]


@pytest.mark.parametrize("case", NEGATIVE, ids=[c[0] for c in NEGATIVE])
def test_checker_catches_a_wrong_vjp(case, monkeypatch):
    label, prim, argnum, wrong, f, args = case
    check_vjp(f, args, name=label)  # the control is only meaningful if the right VJP passes
    monkeypatch.setitem(prim.vjps, argnum, wrong(prim.vjps[argnum]))
    with pytest.raises(VjpMismatch, match=rf"wrt arg {argnum}: tape .* vs numeric|gradient shape"):
        check_vjp(f, args, name=label)


def test_checker_catches_a_wrong_variadic_vjp(monkeypatch):
    # einsum and concatenate share one VJP for all operands (vjp_any).
    a, b = R.standard_normal((3, 4)), R.standard_normal((4, 2))
    f = lambda a, b: ops.einsum("ij,jk->ik", a, b)
    check_vjp(f, (a, b), name="einsum")
    old = tape_ops._einsum.vjp_any
    monkeypatch.setattr(tape_ops._einsum, "vjp_any",
                        lambda n, g, ans, *xs, **k: ops.mul(old(n, g, ans, *xs, **k), 1.0 if n == 0 else 1.01))
    with pytest.raises(VjpMismatch, match=r"wrt arg 1: tape"):
        check_vjp(f, (a, b), name="einsum")


def test_checker_catches_a_scatter_that_drops_repeats(monkeypatch):
    # Embedding gradients must add up repeated indices: assignment would keep only one.
    x, idx = R.standard_normal((4, 3)), np.array([1, 1, 2, 1])
    f = lambda x: ops.take(x, idx)
    check_vjp(f, (x,), name="take")

    def assign(g, index, shape):
        out = np.zeros(shape, g.dtype)
        out[index] = g
        return out

    monkeypatch.setattr(tape_ops._index_add, "forward", assign)
    with pytest.raises(VjpMismatch, match="wrt arg 0: tape"):
        check_vjp(f, (x,), name="take")


def test_checker_refuses_a_kink_within_the_step():
    # Inputs 1.5 steps from relu's kink: for many directions the kink falls
    # between the step h and 2h, and the two central differences disagree.
    with pytest.raises(VjpMismatch, match="unstable"):
        check_vjp(ops.relu, (np.full(50, 1.5e-5),), name="relu near 0")


def test_checker_fails_at_a_kink():
    # Exactly at 0 the central difference sees slope 1/2, the tape (as torch) 0.
    with pytest.raises(VjpMismatch, match="wrt arg 0: tape"):
        check_vjp(ops.relu, (np.array([0.0, 1.0, -1.0]),), name="relu at 0")


def test_checker_refuses_a_vacuous_check():
    with pytest.raises(VjpMismatch, match="depends on none"):
        check_vjp(lambda x: ops.mul(x, 0.0), (np.ones(3),), name="times zero")


@pytest.mark.parametrize("error", [1e-3, 1e-5])
def test_checker_sensitivity(error, monkeypatch):
    # The tolerance is about 3e-8 relative for these inputs, so even a 1e-5
    # relative error in a VJP is caught, not only the 1% of the controls above.
    monkeypatch.setitem(tape_ops.tanh.vjps, 0, _scaled(tape_ops.tanh.vjps[0], 1 + error))
    with pytest.raises(VjpMismatch, match="wrt arg 0: tape"):
        check_vjp(ops.tanh, (X34,), name="tanh")


def test_checker_sensitivity_survives_the_measured_jitter(monkeypatch):
    # The rounding allowance takes the larger of a value bound and the jitter seen a hair around x; for ops
    # whose value is not a small difference of large terms the jitter is the smaller, so a 1e-5 relative error
    # in a normalisation's VJP is still caught.
    x = R.standard_normal((2, 3, 4, 4))
    f = lambda x: ops.normalize(x, (0, 2, 3), 1e-5)[0]  # noqa: E731
    check_vjp(f, (x,), name="normalize")
    old = tape_ops._normalize.vjp_joint
    monkeypatch.setattr(tape_ops._normalize, "vjp_joint",
                        lambda argnums, *a, **k: [ops.mul(g, 1 + 1e-5) for g in old(argnums, *a, **k)])
    with pytest.raises(VjpMismatch, match="wrt arg 0: tape"):
        check_vjp(f, (x,), name="normalize")


def test_checker_messages_label_both_sides(monkeypatch):
    monkeypatch.setitem(tape_ops.exp.vjps, 0, _scaled(tape_ops.exp.vjps[0]))
    with pytest.raises(VjpMismatch) as info:
        check_vjp(ops.exp, (X34,), name="exp")
    msg = str(info.value)
    assert msg.startswith("vjp of exp wrt arg 0: tape ") and " vs numeric " in msg and "tol" in msg

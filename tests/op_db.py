"""The op database of the tests: one entry per op of ``gradcheck.ops``, read by every backend suite.

In the spirit of PyTorch's OpInfo: each op has one :class:`OpInfo` in ``OPS``,
and the suites read their cases from it instead of keeping tables of their own.

* ``OpInfo.drawn``: hypothesis-drawn samples (:class:`Drawn`, a builder
  ``build(draw) -> (f, args)``), away from kinks and ties so that float64
  central differences can referee.  ``tests/test_tape_vjp.py`` checks the
  tape's VJP of each against finite differences.
* ``OpInfo.samples``: fixed samples (:class:`Sample`), ties, kinks, extremes
  and constants included.  ``tests/test_backend_torch.py`` runs every one on
  torch (forward against numpy, gradients against the tape) and
  ``tests/test_backend_jax.py`` on jax (likewise, compiled and eager).
* ``OpInfo.differentiable``: False for an op whose output is boolean, which
  needs no gradient sample; ``OpInfo.bugs``: a known defect of one backend's
  kernel, with its reason (that backend's gradient checks of the op are strict
  xfails until it is fixed).

A sample's inputs are exactly its differentiable arguments: every input is a
float array the suites differentiate, drawn from the sample's domain when it
is given as a shape, used as given when it is an array.  Everything else (class
labels, masks, constant weights, running statistics held fixed, keyword
arguments) is closed over by the sample's function, or given as the op's
keyword arguments: ``U("sum", dict(axis=1), (2, 3, 4))`` is ``ops.sum(x,
axis=1)`` of one input of shape (2, 3, 4), uniform in [-2, 2).  A sample that
one backend cannot differentiate names it in ``no_gradient_on`` with the reason.

A sample's id is ``<op>-<label>``, or ``<op>-<n>`` for the op's n-th sample
without a label; the torch suite seeds a sample's inputs from its test id, so
an unlabelled sample keeps its id only while the ones before it stay.  An op
added to ``gradcheck.ops`` gets an empty entry here, and the coverage test of
each suite fails until it has drawn and fixed samples.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gradcheck import ops


# ---------------------------------------------------------------- the entries
@dataclass(frozen=True)
class Domain:
    """Where a sample's drawn inputs come from: ``uniform`` in [lo, hi), the standard ``normal``, or ``ties``
    (the integers -2..2, for ties, zeros and kinks on purpose)."""

    kind: str
    lo: float = -2.0
    hi: float = 2.0

    def draw(self, rng, shape) -> np.ndarray:
        if self.kind == "ties":
            return rng.integers(-2, 3, size=shape).astype(np.float64)
        if self.kind == "normal":
            return np.asarray(rng.standard_normal(shape))
        return np.asarray(rng.uniform(self.lo, self.hi, size=shape))


@dataclass(eq=False)
class Sample:
    """One fixed sample of an op: its differentiable inputs and the function of them that calls the op."""

    op: str
    call: Callable | dict  # a function of the inputs written with gradcheck.ops, or the op's keyword arguments
    inputs: tuple  # one per differentiable input: a shape (drawn from the domain) or an array (used as given)
    domain: Domain
    label: str = ""  # the id is "<op>-<label>"; "<op>-<n>" without one
    grad: bool = True  # False: the output carries no gradient (booleans, indices, statistics read as values)
    const64: bool = False  # closes over a float64 numpy constant: numpy promotes float32 there, a framework must not
    no_gradient_on: dict[str, str] = field(default_factory=dict)  # backend -> why its gradient is not checked there
    id: str = ""  # set when the database is assembled

    @property
    def kwargs(self) -> dict:
        """The op's keyword arguments, when the sample calls the op itself."""
        return self.call if isinstance(self.call, dict) else {}

    def fn(self, *xs):
        """The sample's function of its inputs.

        The op itself is looked up when called, so a test that wraps the ops
        of ``gradcheck.ops`` (or replaces one) sees the sample call it.
        """
        if isinstance(self.call, dict):
            return getattr(ops, self.op)(*xs, **self.call)
        return self.call(*xs)

    def arrays(self, seed: int, dtype=np.float64) -> list[np.ndarray]:
        """The inputs: each shape drawn from the domain (one generator seeded with ``seed``), cast to ``dtype``."""
        rng = np.random.default_rng(seed)
        out = []
        for spec in self.inputs:
            value = spec if isinstance(spec, np.ndarray) else self.domain.draw(rng, spec)
            out.append(value.astype(np.float64).astype(dtype))
        return out

    def __repr__(self):
        return self.id or f"{self.op} sample"


@dataclass(eq=False)
class Drawn:
    """A hypothesis-drawn sample of an op: ``build(draw) -> (f, args)``, args float64 numpy arrays."""

    op: str
    label: str
    build: Callable  # build(Draw) -> (f, args)
    constant: bool = False  # an op that never carries a gradient: the check is that none comes out
    float32: bool = True  # also float32 in -> float32 out and float32 gradients

    def __repr__(self):
        return self.label


@dataclass(eq=False)
class OpInfo:
    """Everything the tests know about one op of ``gradcheck.ops``."""

    name: str
    differentiable: bool = True  # False: a boolean output, no gradient sample asked for
    # backend -> a known defect of its kernel: its gradient checks of this op are strict xfails until it is fixed.
    # "tape" is every backend's: the torch and jax gradients are compared with the tape's.
    bugs: dict[str, str] = field(default_factory=dict)
    drawn: list[Drawn] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)

    def bug(self, backend: str) -> str:
        """The known defect behind ``backend``'s gradient checks of this op, its own or the tape's ("" when none)."""
        for whose in dict.fromkeys((backend, "tape")):
            if whose in self.bugs:
                return f"{whose}: {self.bugs[whose]}"
        return ""


def U(op, call, *inputs, lo=-2.0, hi=2.0, **kw) -> Sample:
    """A sample whose drawn inputs are uniform in [lo, hi)."""
    return Sample(op, call, inputs, Domain("uniform", lo, hi), **kw)


def N(op, call, *inputs, **kw) -> Sample:
    """A sample whose drawn inputs are standard normal."""
    return Sample(op, call, inputs, Domain("normal"), **kw)


def K(op, call, *inputs, **kw) -> Sample:
    """A sample whose drawn inputs are the small integers -2..2: ties, zeros and kinks on purpose."""
    return Sample(op, call, inputs, Domain("ties"), **kw)


_DRAWN: list[Drawn] = []


def drawn(op, label=None, constant=False, float32=True):
    """Register the decorated ``build(draw) -> (f, args)`` as a drawn sample of ``op`` (labelled ``op`` by default)."""

    def register(build):
        _DRAWN.append(Drawn(op, label or op, build, constant, float32))
        return build

    return register


# ================================================================ drawn samples (hypothesis), for the tape's VJP
# Each draws shapes, values and options with hypothesis; inputs are kept away
# from kinks (relu/abs at 0, ties of max) so that finite differences can referee.
class Draw:
    """What a drawn sample's builder may draw: shapes and options through hypothesis, values from a drawn seed."""

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


# ---------------------------------------------------------------- elementwise, one input
def _unary(op, domain="normal", **kw):
    fn = getattr(ops, op)

    def build(d: Draw):
        x = getattr(d, domain)(d.shape(min_dims=0))
        return (lambda x: fn(x, **kw)), (x,)

    return build


for _op in ["neg", "exp", "expm1", "sin", "cos", "tanh", "sigmoid", "erf", "softplus", "silu", "atan"]:
    _DRAWN.append(Drawn(_op, _op, _unary(_op)))
for _op in ["log", "log1p", "sqrt", "rsqrt"]:
    _DRAWN.append(Drawn(_op, _op, _unary(_op, "positive")))
for _op in ["abs", "relu"]:
    _DRAWN.append(Drawn(_op, f"{_op} (away from 0)", _unary(_op, "away")))
_DRAWN.append(Drawn("gelu", "gelu exact", _unary("gelu")))
_DRAWN.append(Drawn("gelu", "gelu tanh", _unary("gelu", approximate="tanh")))


@drawn("leaky_relu", "leaky_relu (away from 0, drawn slope)")
def _(d):
    slope = d.pick([0.01, 0.2, 1.5])
    return (lambda x: ops.leaky_relu(x, slope)), (d.away(d.shape(min_dims=0)),)


@drawn("elu", "elu (away from 0, drawn alpha)")
def _(d):
    alpha = d.pick([1.0, 0.5, 2.0])
    return (lambda x: ops.elu(x, alpha)), (d.away(d.shape(min_dims=0)),)


@drawn("astype", "astype float64 -> float64", float32=False)
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


_DRAWN += [
    Drawn("add", "add (broadcast)", _binary("add")),
    Drawn("sub", "sub (broadcast)", _binary("sub")),
    Drawn("mul", "mul (broadcast)", _binary("mul")),
    Drawn("div", "div (broadcast, divisor away from 0)", _binary("div", "normal", "away")),
    Drawn("pow", "pow (broadcast, positive base)", _binary("pow", "positive", "normal")),
]


@drawn("mul", "mul by a Python scalar")
def _(d):
    c = d.pick([-2.5, 0.5, 3.0])
    side = d.pick(["left", "right"])
    return ((lambda x: ops.mul(c, x)) if side == "left" else (lambda x: ops.mul(x, c))), (d.normal(d.shape()),)


@drawn("pow", "pow with a Python exponent")
def _(d):
    p = d.pick([2, 3, 0.5, -1.5])
    return (lambda x: ops.pow(x, p)), (d.positive(d.shape(min_dims=0)),)


@drawn("pow", "pow with a Python base")
def _(d):
    base = d.pick([2.0, 0.5, 3.0])
    return (lambda x: ops.pow(base, x)), (d.normal(d.shape(min_dims=0)),)


# ---------------------------------------------------------------- integer constants
# numpy computes float32 with an int64 array (or an np.int64 scalar) in float64; torch and jax
# stay in float32.  The float32 half of these samples' check (test_tape_vjp's _check_float32) is what they are for.
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


_DRAWN += [
    Drawn("add", "add an integer numpy constant", _integer_constant("add")),
    Drawn("sub", "sub an integer numpy constant", _integer_constant("sub")),
    Drawn("mul", "mul by an integer numpy constant", _integer_constant("mul", nonzero=True)),
    Drawn("div", "div by / of an integer numpy constant", _integer_constant("div", nonzero=True, domain="away")),
    # Non-positive integers against positive values: x wins everywhere, no tie, not flat.
    Drawn("maximum", "maximum with an integer numpy constant (no ties)",
        _integer_constant("maximum", lo=-3, hi=1, domain="positive")),
]


@drawn("pow", "pow with an integer numpy exponent")
def _(d):
    shape = d.shape(min_dims=0)
    k = d.rng.integers(1, 4, size=shape)
    return (lambda x: ops.pow(x, k)), (d.positive(shape),)


@drawn("where", "where with an integer numpy branch")
def _(d):
    shape = d.shape()
    mask, k = d.rng.random(shape) < 0.5, d.rng.integers(-3, 4, size=shape)
    mask.reshape(-1)[0] = True  # x reaches the output somewhere
    return (lambda x: ops.where(mask, x, k)), (d.normal(shape),)


@drawn("matmul", "matmul by an integer numpy matrix")
def _(d):
    n, k, m = (d.int(1, 4, name) for name in "nkm")
    w = d.rng.choice([-3, -2, -1, 1, 2, 3], size=(k, m))
    return (lambda x: ops.matmul(x, w)), (d.normal((n, k)),)


@drawn("asarray", "asarray of a tensor keeps its gradient (like=)")
def _(d):
    return (lambda x: ops.mul(ops.asarray(x, like=x), x)), (d.normal(d.shape()),)


@drawn("asarray", "asarray of a tensor to another dtype keeps its gradient (dtype=)", float32=False)
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


_DRAWN += [Drawn("maximum", "maximum (broadcast, no ties)", _minmax("maximum")),
         Drawn("minimum", "minimum (broadcast, no ties)", _minmax("minimum"))]


@drawn("where", "where (broadcast cond, a, b)")
def _(d):
    shapes = d(hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=4), "shapes")
    sc, sa, sb = shapes.input_shapes
    cond = d.rng.random(sc) > 0.5
    return (lambda a, b: ops.where(cond, a, b)), (d.normal(sa), d.normal(sb))


@drawn("where", "where (3x1 cond, 1x4 a, scalar b)")
def _(d):
    cond = d.rng.random((3, 1)) > 0.5
    return (lambda a, b: ops.where(cond, a, b)), (d.normal((1, 4)), d.normal(()))


# ---------------------------------------------------------------- comparisons and constants
@drawn("greater", constant=True)
def _(d):
    s = d.shape()
    return ops.greater, (d.distinct(s), d.distinct(s))


@drawn("less", constant=True)
def _(d):
    s = d.shape()
    return ops.less, (d.distinct(s), d.normal(()))


@drawn("equal", constant=True)
def _(d):
    x = d.normal(d.shape())
    return (lambda x: ops.equal(x, x)), (x,)


@drawn("asarray", constant=True)
def _(d):
    c = d.normal(d.shape())
    return (lambda x: ops.asarray(c, like=x)), (d.normal(d.shape()),)


@drawn("zeros_like", constant=True)
def _(d):
    return ops.zeros_like, (d.normal(d.shape()),)


@drawn("stop_gradient", constant=True)
def _(d):
    return ops.stop_gradient, (d.normal(d.shape()),)


# ---------------------------------------------------------------- linear algebra
@drawn("matmul", "matmul (1-d, 2-d, batched broadcast)")
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


@drawn("einsum", "einsum (two operands, contractions, summed index)")
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


_DRAWN += [
    Drawn("sum", "sum (axis None/int/tuple/negative, keepdims)", _reduction("sum")),
    Drawn("mean", "mean (axis, keepdims)", _reduction("mean")),
    Drawn("max", "max (axis, keepdims, no ties)", _reduction("max", "distinct")),
    Drawn("min", "min (axis, keepdims, no ties)", _reduction("min", "distinct")),
    Drawn("logsumexp", "logsumexp (axis, keepdims)", _reduction("logsumexp")),
]


@drawn("var", "var (axis, keepdims, ddof)")
def _(d):
    shape = d.shape(min_dims=1, min_side=2)
    axis = d.axis(len(shape))
    keepdims, ddof = d(st.booleans(), "keepdims"), d.pick([0, 1], "ddof")
    return (lambda x: ops.var(x, axis=axis, keepdims=keepdims, ddof=ddof)), (d.normal(shape),)


@drawn("normalize", "normalize (batchnorm, layernorm, groupnorm axes; weight and bias or not)")
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


_DRAWN += [Drawn("softmax", "softmax (axis)", _softmax("softmax")),
         Drawn("log_softmax", "log_softmax (axis)", _softmax("log_softmax"))]


@drawn("prod", "prod (axis, keepdims; exact zeros: the product of the others)")
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


@drawn("topk", "topk values (axis, k, largest or smallest; no ties)")
def _(d):
    shape = d.shape(min_dims=1)
    axis = d.axis(len(shape), allow_none=False, allow_tuple=False)
    k, largest = d.int(1, shape[axis], "k"), d(st.booleans(), "largest")
    return (lambda x: ops.topk(x, k, axis=axis, largest=largest)[0]), (d.distinct(shape),)


# ---------------------------------------------------------------- shapes
@drawn("reshape")
def _(d):
    shape = d.shape(min_dims=1)
    size = int(np.prod(shape))
    target = d.pick([(size,), (1, size), tuple(reversed(shape)), (-1,) + tuple(shape[1:]), (size, 1, 1)], "target")
    return (lambda x: ops.reshape(x, target)), (d.normal(shape),)


@drawn("transpose", "transpose (permutations, negative axes, None)")
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


@drawn("broadcast_to", "broadcast_to (stretched and new leading axes)")
def _(d):
    target = d.shape(min_dims=1)
    ndim = d.int(0, len(target), "source ndim")
    source = tuple(1 if d(st.booleans(), f"stretch {i}") else s for i, s in enumerate(target[len(target) - ndim:]))
    return (lambda x: ops.broadcast_to(x, target)), (d.normal(source),)


@drawn("concatenate", "concatenate (1-3 arrays, axis incl. negative)")
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


@drawn("stack", "stack (1-3 arrays, axis incl. negative)")
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


@drawn("getitem", "getitem (slices, steps, ints, integer arrays with repeats, masks)")
def _(d):
    shape = d.shape(min_dims=2, max_dims=3, min_side=3, max_side=4)
    index = _index(d, shape)
    return (lambda x: ops.getitem(x, index)), (d.normal(shape),)


@drawn("getitem", "Tensor[...] operator")
def _(d):
    shape = d.shape(min_dims=2, max_dims=3, min_side=3, max_side=4)
    index = _index(d, shape)
    return (lambda x: x[index]), (d.normal(shape),)


@drawn("take", "take (embedding gather with repeats, axis)")
def _(d):
    shape = d.shape(min_dims=1, max_dims=3, min_side=2)
    axis = d.int(-len(shape), len(shape) - 1, "axis")
    idx_shape = d.pick([(5,), (2, 3), ()], "indices shape")
    indices = d.rng.integers(0, shape[axis], size=idx_shape)
    return (lambda x: ops.take(x, indices, axis=axis)), (d.normal(shape),)


@drawn("pad", "pad (per-axis widths, value)")
def _(d):
    shape = d.shape(min_dims=1)
    widths = tuple((d.int(0, 2, f"before {i}"), d.int(0, 2, f"after {i}")) for i in range(len(shape)))
    value = d.pick([0.0, -1.5])
    return (lambda x: ops.pad(x, widths, value=value)), (d.normal(shape),)


@drawn("pad", "pad (numpy's broadcast forms: int, one pair)")
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


def _conv_builder(nd, transposed):
    fn = ops.conv_transpose if transposed else ops.conv

    def build(d: Draw):
        x, w, b, kw = _conv_config(d, nd, transposed)
        if b is None:
            return (lambda x, w: fn(x, w, **kw)), (x, w)
        return (lambda x, w, b: fn(x, w, b, **kw)), (x, w, b)

    return build


_DRAWN += [
    Drawn("conv", "conv 1-d (stride, padding, 'same', dilation, groups, bias)", _conv_builder(1, False)),
    Drawn("conv", "conv 2-d (stride, padding, 'same', dilation, groups, bias)", _conv_builder(2, False)),
    Drawn("conv_transpose", "conv_transpose 1-d (output_padding, groups)", _conv_builder(1, True)),
    Drawn("conv_transpose", "conv_transpose 2-d (output_padding, groups)", _conv_builder(2, True)),
]


def _pool_config(d: Draw):
    k = (d.int(1, 3, "kh"), d.int(1, 3, "kw"))
    stride = d.pick([None, 1, 2, (1, 2)], "stride")
    padding = (d.int(0, k[0] // 2, "ph"), d.int(0, k[1] // 2, "pw"))
    shape = (d.int(1, 2, "n"), d.int(1, 2, "c"), k[0] + d.int(0, 3, "h"), k[1] + d.int(0, 3, "w"))
    return shape, k, stride, padding


@drawn("max_pool2d", "max_pool2d (kernel, stride, padding; no ties)")
def _(d):
    shape, k, stride, padding = _pool_config(d)
    return (lambda x: ops.max_pool2d(x, k, stride, padding)), (d.distinct(shape),)


@drawn("avg_pool2d", "avg_pool2d (count_include_pad both ways)")
def _(d):
    shape, k, stride, padding = _pool_config(d)
    include = d(st.booleans(), "count_include_pad")
    return (lambda x: ops.avg_pool2d(x, k, stride, padding, count_include_pad=include)), (d.normal(shape),)


@drawn("adaptive_avg_pool2d", "adaptive_avg_pool2d (non-divisible and upsampling sizes)")
def _(d):
    h, w = d.int(1, 7, "h"), d.int(1, 7, "w")
    out = (d.int(1, h + 1, "oh"), d.int(1, w + 1, "ow"))
    out = out[0] if out[0] == out[1] and d(st.booleans(), "int size") else out
    return (lambda x: ops.adaptive_avg_pool2d(x, out)), (d.normal((d.int(1, 2, "n"), d.int(1, 2, "c"), h, w)),)


# ---------------------------------------------------------------- framework kernels (derived on the tape)
@drawn("linear", "linear (bias or not)")
def _(d):
    # n * out >= 2: with one output element, sin(x w) in the second-order check can sit at a zero of its
    # second derivative, where the finite difference has nothing to measure but rounding.
    n, i, o = d.int(1, 4, "n"), d.int(1, 4, "in"), d.int(2, 4, "out")
    args = (d.normal((n, i)), d.normal((o, i))) + ((d.normal((o,)),) if d(st.booleans(), "bias") else ())
    return ops.linear, args


@drawn("batch_norm", "batch_norm (train with batch statistics; eval with running ones)")
def _(d):
    shape = (d.int(2, 3, "n"), d.int(1, 3, "c"), d.int(1, 3, "l"))
    training = d(st.booleans(), "training")
    c = shape[1]

    # y only: the updated running statistics are buffers, which carry no gradient (as in torch).
    def f(x, running_mean, running_var, weight, bias):
        return ops.batch_norm(x, running_mean, running_var, weight, bias, training=training, momentum=0.1)[0]

    return f, (d.distinct(shape, spacing=0.3), d.normal((c,)), d.positive((c,)), d.positive((c,)), d.normal((c,)))


@drawn("layer_norm", "layer_norm (trailing dims, affine or not)")
def _(d):
    # Three values at least per normalised group: two normalise to +-1 whatever they are, a function so flat
    # that its second-order finite differences are rounding alone.
    shape = d.shape(min_dims=2, max_dims=3, min_side=3)
    k = d.int(1, len(shape) - 1, "normalised dims")
    normalized = shape[len(shape) - k:]
    affine = d(st.booleans(), "affine")
    args = (d.distinct(shape, spacing=0.3),) + ((d.positive(normalized), d.normal(normalized)) if affine else ())
    return (lambda x, *wb: ops.layer_norm(x, normalized, *wb)), args


@drawn("group_norm", "group_norm (2 groups, affine)")
def _(d):
    shape = (d.int(1, 2, "n"), 4, d.int(2, 3, "l"))
    return (lambda x, w, b: ops.group_norm(x, 2, w, b)), (d.distinct(shape, spacing=0.3), d.positive((4,)),
                                                          d.normal((4,)))


@drawn("rms_norm", "rms_norm (weight or not)")
def _(d):
    shape = d.shape(min_dims=1, max_dims=3, min_side=2)
    args = (d.normal(shape),) + ((d.positive(shape[-1:]),) if d(st.booleans(), "weight") else ())
    return (lambda x, *w: ops.rms_norm(x, shape[-1:], *w, eps=1e-5)), args


@drawn("scaled_dot_product_attention", "scaled_dot_product_attention (causal, float mask, plain)")
def _(d):
    b, n, e = d.int(1, 2, "batch"), d.int(1, 3, "length"), d.int(1, 3, "embedding")
    kind = d.pick(["plain", "causal", "float mask"], "mask")
    mask = d.normal((n, n)) if kind == "float mask" else None
    return ((lambda q, k, v: ops.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=kind == "causal")),
            (d.normal((b, n, e)), d.normal((b, n, e)), d.normal((b, n, e))))


@drawn("embedding", "embedding (repeated ids, padding_idx or not)")
def _(d):
    num, dim = d.int(2, 5, "num"), d.int(1, 3, "dim")
    ids = d.rng.integers(0, num, size=(d.int(1, 3, "n"), d.int(1, 3, "l")))
    ids.reshape(-1)[0] = num - 1  # one id that is not the padding row, so the output is not flat
    padding = d.pick([None, 0], "padding_idx")
    return (lambda w: ops.embedding(ids, w, padding_idx=padding)), (d.normal((num, dim)),)


def _class_targets(d, n, c):
    return d.rng.integers(0, c, size=(n,))


@drawn("cross_entropy", "cross_entropy (class ids or probabilities, class weight, reduction)")
def _(d):
    n, c = d.int(1, 4, "n"), d.int(2, 4, "classes")
    reduction = d.pick(["mean", "sum", "none"], "reduction")
    if d(st.booleans(), "probability targets"):
        p = d.positive((n, c))
        return (lambda x, t: ops.cross_entropy(x, t, reduction=reduction)), (d.normal((n, c)), p / p.sum(1, keepdims=True))
    weight = d.positive((c,)) if d(st.booleans(), "class weight") else None
    target = _class_targets(d, n, c)
    return (lambda x: ops.cross_entropy(x, target, weight=weight, reduction=reduction)), (d.normal((n, c)),)


@drawn("nll_loss", "nll_loss (class weight, reduction)")
def _(d):
    n, c = d.int(1, 4, "n"), d.int(2, 4, "classes")
    reduction = d.pick(["mean", "sum", "none"], "reduction")
    weight = d.positive((c,)) if d(st.booleans(), "class weight") else None
    target = _class_targets(d, n, c)
    return (lambda x: ops.nll_loss(x, target, weight=weight, reduction=reduction)), (d.normal((n, c)),)


@drawn("mse_loss", "mse_loss (reduction)")
def _(d):
    shape = d.shape()
    reduction = d.pick(["mean", "sum", "none"], "reduction")
    return (lambda x, t: ops.mse_loss(x, t, reduction=reduction)), (d.normal(shape), d.normal(shape))


@drawn("binary_cross_entropy_with_logits", "binary_cross_entropy_with_logits (weight, pos_weight, reduction)")
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


@drawn("hardswish", "hardswish (both flat parts and the curve)")
def _(d):
    return ops.hardswish, (_off_hard_kinks(d.rng.uniform(-5.0, 5.0, d.shape())),)


@drawn("hardsigmoid", "hardsigmoid (both flat parts and the slope)")
def _(d):
    return ops.hardsigmoid, (_off_hard_kinks(d.rng.uniform(-5.0, 5.0, d.shape())),)


@drawn("upsample_nearest2d", "upsample_nearest2d (up, down, a given scale factor)")
def _(d):
    h, w = d.int(1, 4, "h"), d.int(1, 4, "w")
    size = (d.int(1, 8, "oh"), d.int(1, 8, "ow"))
    factor = 2.0 if d(st.booleans(), "scale factor 2") else None
    size = (2 * h, 2 * w) if factor else size
    return (lambda x: ops.upsample_nearest2d(x, size, factor)), (d.normal((d.int(1, 2, "n"), 2, h, w)),)


@drawn("upsample_bilinear2d", "upsample_bilinear2d (corners aligned or not, up and down)")
def _(d):
    h, w = d.int(1, 4, "h"), d.int(1, 4, "w")
    size = (d.int(1, 8, "oh"), d.int(1, 8, "ow"))
    corners = d(st.booleans(), "align_corners")
    return (lambda x: ops.upsample_bilinear2d(x, size, corners)), (d.normal((d.int(1, 2, "n"), 2, h, w)),)


# ================================================================ fixed samples, for every backend
# ---------------------------------------------------------------- their constants
# Closed over by the samples' functions; the suites' own tests use some of them too.  Each block draws
# from its own generator, in this order: a constant added to a block goes at its end.
REDUCTIONS = ("mean", "sum", "none")
rng0 = np.random.default_rng(7)
C34 = rng0.standard_normal((3, 4))  # a float64 numpy constant
MASK34 = rng0.standard_normal((3, 4)) > 0
W_CONV = rng0.standard_normal((6, 2, 3, 3))  # used as a constant weight in some samples
IX = np.array  # index arrays read better short
# Constants of the framework kernels' samples: running statistics, masks, labels, class weights.
RM4, RV4 = rng0.standard_normal(4), rng0.uniform(0.5, 2.0, 4)
KEEP46 = (rng0.random((4, 6)) > 0.4) | np.eye(4, 6, dtype=bool)  # True = attend; never a whole row masked
EMPTY46 = KEEP46 & (np.arange(4) != 2)[:, None]  # query 2 may attend to nothing: torch gives it zeros
BIAS46, BIAS246 = rng0.standard_normal((4, 6)), rng0.standard_normal((2, 1, 4, 6))
DROP = (rng0.random((2, 3, 4, 6)) >= 0.25) / 0.75  # dropout's factors: 0 or 1/(1-p)
IDS7 = np.array([[0, 2, 6, 2], [5, 0, 1, 6]])  # ids into a 7-row table
T5, T23 = np.array([0, 3, 1, 2, 3]), np.array([[1, 0, 3], [2, 2, 0]])
W4, PW4 = np.array([0.2, 1.0, 3.0, 0.5]), np.array([1.0, 2.0, 0.5, 3.0])
P54 = rng0.dirichlet(np.ones(4), size=5)  # probability targets
Y34 = rng0.random((3, 4))
# Masks, ties and zeros written out; then the framework kernels' constants, from a generator of their own.
MASK = np.array([[True, False, True, True], [False, False, True, False], [True, True, False, True]])
IDX = np.array([2, 0, 2, 1])
TIES = np.array([[1.0, 3.0, 3.0, -2.0], [0.5, 0.5, 0.5, 0.5], [0.0, -1.0, 2.0, 2.0]])
# Rows with one zero (its gradient: the others' product), two (all 0) and none.
PROD_ZEROS = np.array([[1.5, 0.0, -2.0, 0.5], [0.0, 1.5, 0.0, 2.0], [0.5, -1.5, 1.2, 0.8]])
POOL_TIES = np.tile(np.array([[1.0, 1.0, 0.0], [1.0, 0.5, 0.0], [0.0, 0.0, 0.0]]), (1, 2, 2, 2))
_K = np.random.default_rng(7)
BN_RM, BN_RV = np.linspace(-0.5, 0.5, 4), np.linspace(0.5, 1.5, 4)
ATT_MASK = np.array([[True, False, True, True, False, True], [False, True, True, False, True, True],
                     [True, True, False, False, False, True], [False, False, False, True, True, False]])  # (L, S)
ATT_MASK_B = _K.random((2, 1, 4, 6)) < 0.5
ATT_MASK_B[..., 2] = True  # every query attends to something (ATT_MASK_EMPTY covers one that cannot)
ATT_MASK_EMPTY = ATT_MASK_B.copy()
ATT_MASK_EMPTY[1, 0, 3] = False  # query 3 of batch 1 may attend to nothing: zeros, as torch gives
ATT_BIAS = _K.standard_normal((4, 6))
ATT_BIAS_FULL = np.where(_K.random((2, 3, 4, 6)) < 0.2, -np.inf, _K.standard_normal((2, 3, 4, 6)))
ATT_BIAS_FULL[..., 0] = 0.5
DROP4 = np.where(_K.random((2, 3, 4, 6)) < 0.25, 0.0, 1 / 0.75)
DROP3 = np.where(_K.random((2, 4, 6)) < 0.25, 0.0, 1 / 0.75)
IDS5 = np.array([[3, 0, 1], [1, 1, 4]])  # ids into a 5-row table
CE_T = np.array([2, 0, 4, 1, 4, 3])
CE_T_IGN = np.array([2, -100, 4, 1, -100, 3])
CE_T_IGN1 = np.array([2, 1, 4, 1, 0, 3])  # ignore_index=1
CE_W = np.linspace(0.5, 2.0, 5)
CE_P = np.exp(_K.standard_normal((6, 5)))
CE_P /= CE_P.sum(axis=1, keepdims=True)
CE_T_MAP = _K.integers(0, 3, (2, 4, 5))
CE_T_MAP[0, 1, :2] = -100
CE_W3 = np.array([0.3, 1.0, 2.5])
BCE_Y = _K.random((3, 4))
BCE_HARD = (_K.random((3, 4)) < 0.5).astype(np.float64)
BCE_POS = np.array([0.5, 1.0, 2.0, 3.0])
BCE_W = _K.uniform(0.5, 1.5, (3, 4))


def running_stats(out):
    """batch_norm's updated running statistics as one array."""
    return ops.concatenate([out[1], out[2]])


TORCH_NO_STATS_GRADIENT = {"torch": "F.batch_norm gives no gradient for running_mean and running_var, so the torch "
                           "backend refuses them as differentiated inputs (test_precise_errors)"}


# ---------------------------------------------------------------- the samples, op by op
# fmt: off
SAMPLES = [
    # -- arrays
    U("asarray", lambda x: ops.mul(x, ops.asarray(C34, like=x)), (3, 4)),
    U("asarray", lambda x: ops.add(x, ops.asarray(2.5, like=x)), (3, 4)),
    N("asarray", lambda x: ops.mul(x, ops.asarray(np.linspace(0.5, 1.5, 4), like=x)), (3, 4)),
    U("astype", lambda x: ops.astype(ops.astype(x, "float32"), np.float64), (3, 4)),
    N("astype", lambda x: ops.astype(x, np.float32), (3, 4), grad=False),  # a float32 loss: see round-trip
    # Back to the input's dtype, so that the loss is summed in float64.
    N("astype", lambda x: ops.astype(ops.astype(x, np.float32), ops.dtype_of(x)), (3, 4), label="round-trip"),
    U("zeros_like", lambda x: ops.add(x, ops.zeros_like(x)), (3, 4)),
    N("zeros_like", lambda x: ops.add(x, ops.zeros_like(x)), (3, 4)),
    U("stop_gradient", lambda x: ops.mul(x, ops.stop_gradient(ops.sin(x))), (3, 4)),
    N("stop_gradient", lambda x, y: ops.mul(x, ops.stop_gradient(y)), (3, 4), (3, 4)),
    # -- elementwise, with broadcasting and constants
    U("add", dict(), (3, 4), (3, 4)),
    U("add", dict(), (2, 1, 3), (4, 1)),
    U("add", lambda a: ops.add(a, C34), (3, 4), const64=True),
    N("add", dict(), (2, 1, 4), (3, 4), label="broadcast"),
    N("add", lambda x: ops.add(x, 2.5), (3, 4), label="scalar"),
    U("sub", dict(), (3, 4), (4,)),
    U("sub", lambda a: ops.sub(1.0, a), (3, 4)),
    N("sub", dict(), (3, 4), (4,), label="broadcast"),
    N("sub", lambda x: ops.sub(1.0, x), (3, 4), label="rscalar"),
    U("mul", dict(), (2, 3, 4), (3, 1)),
    U("mul", lambda a: ops.mul(0.5, a), (5,)),
    N("mul", dict(), (2, 3, 1), (1, 4), label="broadcast"),
    U("div", dict(), (3, 4), (4,), lo=0.5),
    U("div", lambda a: ops.div(2.0, a), (3, 4), lo=0.5),
    U("div", dict(), (3, 4), (3, 1), label="broadcast", lo=0.5),
    U("div", lambda x: ops.div(2.0, x), (3, 4), label="rscalar", lo=0.5),
    U("neg", dict(), (3, 4)),
    N("neg", dict(), (3, 4)),
    U("pow", lambda a: ops.pow(a, 3), (3, 4)),
    U("pow", lambda a: ops.pow(a, 0.5), (3, 4), lo=0.5),
    U("pow", dict(), (3, 4), (4,), lo=0.5),
    U("pow", lambda b: ops.pow(2.0, b), (3, 4)),
    N("pow", lambda x: ops.pow(x, 3), (3, 4), label="int"),
    U("pow", lambda x: ops.pow(x, 2.5), (3, 4), label="float", lo=0.5),
    U("pow", dict(), (3, 4), (4,), label="array", lo=0.5),
    U("maximum", dict(), (3, 4), (4,)),
    K("maximum", dict(), (3, 4), (3, 4)),
    K("maximum", lambda a: ops.maximum(a, 0.0), (3, 4)),
    N("maximum", dict(), (3, 4), (3, 1), label="broadcast"),
    N("maximum", dict(), TIES, TIES[::-1].copy(), label="ties"),
    U("minimum", dict(), (3, 4), (3, 1)),
    K("minimum", dict(), (3, 4), (3, 4)),
    N("minimum", dict(), (3, 4), (4,), label="broadcast"),
    N("minimum", lambda x: ops.minimum(x, 0.0), TIES, label="ties"),
    U("where", lambda a, b: ops.where(ops.greater(a, b), a, b), (3, 4), (4,)),
    U("where", lambda a: ops.where(ops.greater(a, 0.0), a, 0.0), (3, 4)),
    U("where", lambda a: ops.where(MASK34, 1.5, a), (3, 4)),
    U("where", lambda a, b: ops.where(MASK34, a, b), (3, 4), (1, 4)),
    N("where", lambda a, b: ops.where(MASK, a, b), (3, 4), (4,), label="numpy-mask"),
    N("where", lambda a: ops.where(ops.greater(a, 0.0), a, 0.5), (3, 4), label="scalar-branch"),
    U("exp", dict(), (3, 4)),
    N("exp", dict(), (3, 4)),
    U("expm1", dict(), (3, 4)),
    N("expm1", dict(), (3, 4)),
    U("log", dict(), (3, 4), lo=0.1),
    U("log", dict(), (3, 4), lo=0.5),
    U("log1p", dict(), (3, 4), lo=-0.5),
    U("log1p", dict(), (3, 4), lo=0.5),
    U("sqrt", dict(), (3, 4), lo=0.1),
    U("sqrt", dict(), (3, 4), lo=0.5),
    U("rsqrt", dict(), (3, 4), lo=0.1),
    U("rsqrt", dict(), (3, 4), lo=0.5),
    U("abs", dict(), (3, 4)),
    K("abs", dict(), (3, 4)),
    N("abs", dict(), (3, 4)),
    N("abs", dict(), TIES - 0.5, label="zeros"),
    U("sin", dict(), (3, 4)),
    N("sin", dict(), (3, 4)),
    U("cos", dict(), (3, 4)),
    N("cos", dict(), (3, 4)),
    U("tanh", dict(), (3, 4)),
    N("tanh", dict(), (3, 4)),
    U("sigmoid", dict(), (3, 4), lo=-8, hi=8),
    N("sigmoid", dict(), np.array([-40.0, -3.0, -0.5, 0.0, 0.7, 4.0, 40.0])),
    U("erf", dict(), (3, 4)),
    N("erf", dict(), (3, 4)),
    U("atan", dict(), (3, 4), lo=-5, hi=5),
    N("atan", lambda x: ops.atan(ops.mul(x, 3.0)), (3, 4)),
    U("relu", dict(), (3, 4)),
    K("relu", dict(), (3, 4)),
    N("relu", dict(), TIES - 1.0),
    U("leaky_relu", dict(), (3, 4)),
    K("leaky_relu", lambda x: ops.leaky_relu(x, 0.2), (3, 4)),
    N("leaky_relu", lambda x: ops.leaky_relu(x, 0.2), TIES - 1.0),
    U("elu", dict(), (3, 4), lo=-4, hi=4),
    K("elu", lambda x: ops.elu(x, 0.5), (3, 4)),
    N("elu", dict(alpha=1.5), TIES - 1.0),
    N("elu", dict(), np.array([-30.0, -1.0, 0.5, 80.0]), label="extremes"),
    U("gelu", dict(), (3, 4), lo=-4, hi=4),
    U("gelu", dict(approximate="tanh"), (3, 4), lo=-4, hi=4),
    N("gelu", dict(), (3, 4), label="erf"),
    N("gelu", dict(approximate="tanh"), (3, 4), label="tanh"),
    U("silu", dict(), (3, 4), lo=-4, hi=4),
    N("silu", dict(), (3, 4)),
    U("softplus", dict(), (3, 4), lo=-10, hi=10),
    N("softplus", dict(), np.array([-40.0, -3.0, -0.5, 0.0, 0.7, 4.0, 40.0])),
    K("greater", dict(), (3, 4), (4,), grad=False),
    U("greater", lambda a: ops.greater(a, 0.5), (3, 4), grad=False),
    N("greater", dict(), (3, 4), (4,), grad=False),
    K("less", dict(), (3, 4), (3, 1), grad=False),
    U("less", lambda a: ops.less(a, C34), (3, 4), grad=False, const64=True),
    N("less", dict(), (3, 4), (3, 1), grad=False),
    K("equal", dict(), (3, 4), (3, 4), grad=False),
    N("equal", lambda x: ops.equal(x, ops.maximum(x, 0.0)), (3, 4), grad=False),
    # -- linear algebra
    U("matmul", dict(), (3, 4), (4, 5)),
    U("matmul", dict(), (2, 1, 3, 4), (5, 4, 2)),
    U("matmul", dict(), (2, 3, 4), (4,)),
    U("matmul", dict(), (4,), (4, 5)),
    U("matmul", dict(), (4,), (4,)),
    U("matmul", lambda a: ops.matmul(a, C34), (2, 3), const64=True),
    N("matmul", dict(), (2, 3, 4), (4, 5), label="batch"),
    N("matmul", dict(), (2, 1, 3, 4), (5, 4, 2), label="broadcast-batch"),
    N("matmul", dict(), (4,), (2, 4, 3), label="vector-left"),
    N("matmul", dict(), (3, 4), (4,), label="vector-right"),
    N("matmul", dict(), (4,), (4,), label="dot"),
    U("einsum", lambda a, b: ops.einsum("ij,jk->ik", a, b), (3, 4), (4, 5)),
    U("einsum", lambda a, b: ops.einsum("bij,bkj->bki", a, b), (2, 3, 4), (2, 5, 4)),
    U("einsum", lambda a: ops.einsum("ijk->ki", a), (2, 3, 4)),
    U("einsum", lambda a, b: ops.einsum("...ik, ...j -> ij", a, b), (2, 3, 4), (1, 5)),  # the '...' dims summed
    U("einsum", lambda a, b: ops.einsum("i,i->", a, b), (4,), (4,)),
    U("einsum", lambda a: ops.einsum("ij,jk->ik", a, C34), (2, 3), const64=True),
    # numpy's other forms: the tape spells them out (einsum_plan), the frameworks take them as written.
    U("einsum", lambda a, b: ops.einsum("...ij,...jk->...ik", a, b), (5, 1, 2, 3), (4, 3, 2)),
    U("einsum", lambda a, b: ops.einsum("ij,jk", a, b), (3, 4), (4, 5)),
    U("einsum", lambda a, b: ops.einsum("ij...,jk", a, b), (2, 3, 5), (3, 4)),
    U("einsum", lambda a, b: ops.einsum("Ba,aC", a, b), (2, 3), (3, 4)),
    N("einsum", lambda a, b: ops.einsum("ij,jk->ik", a, b), (3, 4), (4, 2), label="matrix"),
    N("einsum", lambda a, b: ops.einsum("bij,bkj->bik", a, b), (2, 3, 4), (2, 5, 4), label="batch"),
    N("einsum", lambda a, b: ops.einsum("nchw,oh->ncow", a, b), (2, 2, 3, 4), (5, 3), label="contract"),
    N("einsum", lambda a: ops.einsum("ijk->ki", a), (2, 3, 4), label="unary"),
    N("einsum", lambda a, b: ops.einsum("...ij,...jk->...ik", a, b), (5, 1, 2, 3), (4, 3, 2), label="ellipsis"),
    N("einsum", lambda a, b: ops.einsum("ij...,jk", a, b), (2, 3, 5), (3, 4), label="implicit"),
    # An output that leaves '...' out sums over those dims, as torch's einsum does (numpy's refuses the form).
    N("einsum", lambda a, b: ops.einsum("...ik, ...j -> ij", a, b), (2, 3, 4), (1, 5), label="ellipsis-summed"),
    # -- reductions: axis None / int / negative / tuple, keepdims
    U("sum", dict(), (3, 4)),
    U("sum", dict(axis=1), (2, 3, 4)),
    U("sum", dict(axis=(0, 2), keepdims=True), (2, 3, 4)),
    U("sum", dict(axis=-1), (2, 3, 4)),
    U("sum", dict(axis=()), (2, 3)),
    U("sum", dict(keepdims=True), (2, 3)),
    N("sum", dict(), (2, 3, 4), label="all"),
    N("sum", dict(axis=1), (2, 3, 4), label="int"),
    N("sum", dict(axis=(0, 2), keepdims=True), (2, 3, 4), label="tuple-keepdims"),
    N("sum", dict(axis=[-1, 0]), (2, 3, 4), label="list"),
    U("mean", dict(), (3, 4)),
    U("mean", dict(axis=(0, 2)), (2, 3, 4)),
    U("mean", dict(axis=-2, keepdims=True), (2, 3, 4)),
    N("mean", dict(), (2, 3, 4), label="all"),
    N("mean", dict(axis=(0, 2), keepdims=True), (2, 3, 4), label="tuple-keepdims"),
    U("var", dict(), (3, 4)),
    U("var", dict(axis=(0, 2, 3)), (2, 3, 4, 2)),
    U("var", dict(axis=1, keepdims=True, ddof=1), (2, 5, 3)),
    N("var", dict(axis=(0, 2)), (2, 3, 4), label="tuple"),
    N("var", dict(axis=-1, keepdims=True, ddof=1), (2, 3, 4), label="ddof"),
    N("var", dict(), (2, 3, 4), label="all"),
    # normalize: BatchNorm, BatchNorm1d, LayerNorm and other shapes; the statistics
    U("normalize", lambda x, w, b: ops.normalize(x, (0, 2, 3), 1e-5, weight=w, bias=b)[0], (3, 4, 5, 2), (1, 4, 1, 1),
      (1, 4, 1, 1)),
    U("normalize", lambda x: ops.normalize(x, 0, 1e-5)[0], (5, 3)),
    U("normalize", lambda x, w, b: ops.normalize(x, (-2, -1), 1e-5, weight=w, bias=b)[0], (2, 3, 4, 5), (4, 5),
      (4, 5)),
    U("normalize", lambda x, w: ops.normalize(x, (1,), 1e-3, weight=w)[0], (3, 4, 2), (4, 1)),
    U("normalize", lambda x: ops.normalize(x, (0, 2), 1e-5)[1], (3, 4, 2), grad=False),
    U("normalize", lambda x: ops.normalize(x, (-1,), 1e-5)[2], (3, 4, 2), grad=False),
    N("normalize", lambda x, w, b: ops.normalize(x, (0, 2, 3), 1e-5, weight=w, bias=b)[0], (3, 4, 5, 2),
        (1, 4, 1, 1), (1, 4, 1, 1), label="batchnorm"),
    N("normalize", lambda x, w, b: ops.normalize(x, (-2, -1), 1e-5, weight=w, bias=b)[0], (2, 3, 4, 5), (4, 5),
        (4, 5), label="layernorm"),
    N("normalize", lambda x: ops.normalize(x, (2,), 1e-5)[0], (2, 3, 4), label="groups"),
    N("normalize", lambda x: ops.normalize(x, (0, 2), 1e-5)[1], (3, 4, 2), label="mean", grad=False),
    N("normalize", lambda x: ops.normalize(x, -1, 1e-5)[2], (3, 4, 2), label="var", grad=False),
    U("max", dict(), (3, 4)),
    U("max", dict(axis=1), (2, 3, 4)),
    K("max", dict(axis=(0, 2), keepdims=True), (2, 3, 4)),
    K("max", dict(axis=-1), (3, 6)),
    N("max", dict(), (2, 3, 4), label="all"),
    N("max", dict(axis=1, keepdims=True), (2, 3, 4), label="int-keepdims"),
    N("max", dict(axis=1), TIES, label="ties"),
    K("min", dict(), (3, 4)),
    U("min", dict(axis=0, keepdims=True), (3, 4)),
    K("min", dict(axis=(1, 2)), (2, 3, 4)),
    N("min", dict(axis=(0, 2)), (2, 3, 4), label="tuple"),
    N("min", dict(axis=-1), TIES, label="ties"),
    U("prod", dict(), (3, 4), lo=0.5, hi=1.5),
    U("prod", dict(axis=1, keepdims=True), (2, 3, 4)),
    U("prod", dict(axis=(0, 2)), (2, 3, 4)),
    K("prod", dict(axis=-1), (3, 4)),  # small integers: zeros, one or several a row
    U("prod", dict(), (3, 4), label="all", lo=0.5),
    N("prod", dict(axis=(0, 2), keepdims=True), (2, 3, 4), label="tuple-keepdims"),
    N("prod", dict(axis=1), PROD_ZEROS, label="zeros"),
    U("topk", lambda x: ops.topk(x, 2, axis=1)[0], (3, 5)),
    U("topk", lambda x: ops.topk(x, 3, axis=0, largest=False)[0], (4, 2, 3)),
    U("topk", lambda x: ops.topk(x, 2)[1], (3, 5), grad=False),
    N("topk", lambda x: ops.topk(x, 2, axis=1)[0], (3, 5), label="values"),
    N("topk", lambda x: ops.topk(x, 3, axis=0, largest=False)[0], (4, 2, 3), label="smallest-axis0"),
    N("topk", lambda x: ops.topk(x, 2)[1], (3, 5), label="indices", grad=False),
    U("logsumexp", dict(), (3, 4)),
    U("logsumexp", dict(axis=1, keepdims=True), (2, 3, 4), lo=-30, hi=30),
    U("logsumexp", dict(axis=(0, 2)), (2, 3, 4)),
    N("logsumexp", dict(), (2, 3, 4), label="all"),
    N("logsumexp", dict(axis=1, keepdims=True), (2, 3, 4), label="keepdims"),
    N("logsumexp", lambda x: ops.logsumexp(x * 100.0, axis=(0, 2)), (2, 3, 4), label="large"),
    U("softmax", dict(), (3, 4), lo=-5, hi=5),
    U("softmax", dict(axis=0), (3, 4)),
    U("softmax", dict(axis=(1, 2)), (2, 3, 4)),
    N("softmax", dict(), (2, 3, 4), label="last"),
    N("softmax", dict(axis=1), (2, 3, 4), label="axis1"),
    U("log_softmax", dict(), (3, 4), lo=-5, hi=5),
    U("log_softmax", dict(axis=1), (2, 3, 4)),
    U("log_softmax", dict(axis=(0, 1)), (2, 3)),
    N("log_softmax", dict(), (2, 3, 4), label="last"),
    N("log_softmax", lambda x: ops.log_softmax(x * 50.0, axis=0), (2, 3, 4), label="axis0-large"),
    # -- shapes
    U("reshape", lambda x: ops.reshape(x, (6, -1)), (2, 3, 4)),
    U("reshape", lambda x: ops.flatten(ops.squeeze(ops.expand_dims(x, 1), 1)), (2, 3, 4)),
    N("reshape", lambda x: ops.reshape(x, (4, -1)), (2, 3, 4)),
    U("transpose", dict(), (2, 3, 4)),
    U("transpose", lambda x: ops.transpose(x, (1, 0, 2)), (2, 3, 4)),
    U("transpose", lambda x: ops.transpose(x, (-1, 0, 1)), (2, 3, 4)),
    N("transpose", dict(), (2, 3, 4), label="reverse"),
    N("transpose", lambda x: ops.transpose(x, (1, 2, 0)), (2, 3, 4), label="axes"),
    U("broadcast_to", lambda x: ops.broadcast_to(x, (2, 3, 4)), (3, 1)),
    U("broadcast_to", lambda x: ops.broadcast_to(x, (3, 4)), ()),
    N("broadcast_to", lambda x: ops.broadcast_to(x, (2, 3, 4)), (3, 1)),
    U("concatenate", lambda a, b, c: ops.concatenate([a, b, c]), (1, 3), (2, 3), (3, 3)),
    U("concatenate", lambda a, b: ops.concatenate((a, b), axis=-1), (2, 3), (2, 1)),
    U("concatenate", lambda a: ops.concatenate([a, C34], axis=0), (2, 4), const64=True),
    N("concatenate", lambda a, b: ops.concatenate([a, b], axis=1), (2, 3), (2, 2)),
    N("concatenate", lambda a, b: ops.concatenate((a, b)), (2, 3), (1, 3), label="axis0"),
    U("stack", lambda a, b: ops.stack([a, b]), (2, 3), (2, 3)),
    U("stack", lambda a, b, c: ops.stack([a, b, c], axis=-1), (2, 3), (2, 3), (2, 3)),
    N("stack", lambda a, b: ops.stack([a, b], axis=-1), (2, 3), (2, 3)),
    U("getitem", lambda x: ops.getitem(x, (slice(1, None), slice(None, None, 2))), (4, 5)),
    U("getitem", lambda x: ops.getitem(x, (Ellipsis, slice(None, None, -1))), (2, 3, 4)),
    U("getitem", lambda x: ops.getitem(x, (None, 1, slice(3, 0, -2))), (2, 5)),
    U("getitem", lambda x: ops.getitem(x, IX([0, 2, 2, -1])), (4, 3)),
    U("getitem", lambda x: ops.getitem(x, (slice(None), IX([[0, 1], [1, 0]]))), (2, 3, 4)),
    U("getitem", lambda x: ops.getitem(x, (IX([0, 1, 1]), slice(None), IX([1, 2, 1]))), (2, 3, 4)),
    U("getitem", lambda x: ops.getitem(x, (1, slice(None), IX([0, 3, 3]))), (2, 3, 4)),
    U("getitem", lambda x: ops.getitem(x, MASK34), (3, 4)),
    U("getitem", lambda x: ops.getitem(x, 2), (3, 4)),
    N("getitem", lambda x: ops.getitem(x, (slice(1, None), slice(None, None, 2))), (3, 5), label="slices"),
    N("getitem", lambda x: ops.getitem(x, (Ellipsis, None, -1)), (2, 3, 4), label="ellipsis-newaxis"),
    N("getitem", lambda x: ops.getitem(x, 1), (3, 4), label="int"),
    N("getitem", lambda x: ops.getitem(x, IDX), (3, 4), label="int-array-repeats"),
    N("getitem", lambda x: ops.getitem(x, (slice(None), np.array([-1, 1, 1]))), (3, 4), label="negative-array"),
    N("getitem", lambda x: ops.getitem(x, (np.array([0, 2]), np.array([3, 3]))), (3, 4), label="paired-arrays"),
    N("getitem", lambda x: ops.getitem(x, [2, 2, 0]), (3, 4), label="list"),
    N("getitem", lambda x: ops.getitem(x, MASK), (3, 4), label="bool-mask"),
    U("take", lambda x: ops.take(x, IX([2, 0, 2])), (3, 4)),
    U("take", lambda x: ops.take(x, IX([[1, -1], [0, 1]]), axis=1), (2, 3, 4)),
    U("take", lambda x: ops.take(x, IX([3, 3, 0]), axis=-1), (2, 4)),
    N("take", lambda x: ops.take(x, IDX), (3, 4), label="embedding"),
    N("take", lambda x: ops.take(x, np.array([[3, 0], [0, 1]]), axis=-1), (3, 4), label="last-2d"),
    U("pad", lambda x: ops.pad(x, ((1, 2), (0, 1))), (3, 4)),
    U("pad", lambda x: ops.pad(x, 1, value=0.5), (2, 3)),
    U("pad", lambda x: ops.pad(x, ((0, 0), (0, 0), (2, 1), (1, 0))), (1, 2, 3, 3)),
    N("pad", lambda x: ops.pad(x, ((0, 0), (1, 2))), (3, 4)),
    N("pad", lambda x: ops.pad(x, ((1, 0), (0, 0), (2, 1)), value=0.5), (2, 3, 4), label="value"),
    N("pad", lambda x: ops.pad(x, 1), (2, 3), label="int"),
    N("pad", lambda x: ops.pad(x, ((2, 1),)), (2, 3), label="broadcast-pair"),
    # -- convolution: stride, padding (int, tuple, "same", "valid"), dilation, groups, 1-d
    U("conv", dict(), (2, 3, 5, 6), (4, 3, 3, 3)),
    U("conv", dict(stride=2, padding=1), (2, 3, 7, 6), (4, 3, 3, 3), (4,)),
    U("conv", dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2)), (1, 2, 6, 7), (3, 2, 3, 2)),
    U("conv", dict(padding=2, dilation=2, groups=2), (2, 4, 6, 5), (6, 2, 3, 3), (6,)),
    U("conv", dict(padding="same"), (1, 2, 5, 6), (3, 2, 3, 3)),
    U("conv", dict(padding="same", dilation=(1, 2)), (1, 2, 5, 6), (3, 2, 2, 4)),
    U("conv", dict(padding="valid", groups=2), (1, 4, 5, 4), (2, 2, 2, 3)),
    U("conv", lambda x: ops.conv(x, W_CONV, groups=2), (1, 4, 4, 4), const64=True),
    U("conv", dict(), (2, 3, 9), (4, 3, 3), (4,)),
    U("conv", dict(stride=2, padding=1, dilation=2), (2, 2, 10), (3, 2, 3)),
    U("conv", dict(padding="same", groups=3), (1, 3, 7), (6, 1, 4)),
    N("conv", dict(), (2, 3, 6, 5), (4, 3, 3, 3), label="basic"),
    N("conv", dict(stride=2, padding=1), (2, 3, 7, 6), (4, 3, 3, 3), (4,), label="stride-pad-bias"),
    N("conv", dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2)), (1, 2, 7, 8), (3, 2, 3, 2), label="tuples"),
    N("conv", dict(dilation=2, groups=2), (2, 4, 7, 7), (6, 2, 3, 3), label="dilation-groups"),
    N("conv", dict(groups=3), (1, 3, 5, 5), (3, 1, 3, 3), label="depthwise"),
    N("conv", dict(padding="same"), (1, 2, 5, 6), (3, 2, 4, 3), label="same-even"),
    N("conv", dict(padding="same", dilation=(2, 1)), (1, 2, 7, 6), (2, 2, 2, 2), label="same-dilated"),
    N("conv", dict(padding="valid"), (1, 2, 5, 6), (3, 2, 2, 3), label="valid"),
    N("conv", dict(stride=2, padding=1, dilation=2, groups=2), (2, 4, 11), (6, 2, 3), (6,), label="1d"),
    N("conv", dict(padding="same"), (2, 3, 8), (2, 3, 4), label="1d-same"),
    U("conv_transpose", dict(), (2, 3, 4, 5), (3, 2, 3, 3)),
    U("conv_transpose", dict(stride=2, padding=1, output_padding=1), (2, 3, 4, 3), (3, 4, 3, 3), (4,)),
    U("conv_transpose", dict(stride=(2, 3), output_padding=(1, 2), groups=2), (1, 4, 3, 3), (4, 1, 2, 3)),
    U("conv_transpose", dict(padding=1, dilation=2, groups=2), (1, 4, 4, 4), (4, 3, 3, 3)),
    U("conv_transpose", dict(stride=2, output_padding=1), (2, 3, 5), (3, 2, 3), (2,)),
    U("conv_transpose", dict(stride=3, padding=1, dilation=2, groups=3), (1, 3, 4), (3, 2, 2)),
    N("conv_transpose", dict(), (2, 3, 4, 5), (3, 2, 3, 3), label="basic"),
    N("conv_transpose", dict(stride=2, padding=1, output_padding=1), (2, 3, 4, 3), (3, 2, 3, 3), (2,), label="stride-outpad-bias"),
    N("conv_transpose", dict(stride=(2, 3), padding=(0, 1), output_padding=(1, 2), groups=2), (1, 4, 3, 3), (4, 3, 2, 3), label="groups-tuples"),
    N("conv_transpose", dict(dilation=2, padding=1, groups=2), (1, 4, 4, 4), (4, 1, 3, 2), label="dilation"),
    N("conv_transpose", dict(stride=3, padding=2), (1, 2, 4, 4), (2, 2, 2, 2), label="crop"),
    N("conv_transpose", dict(stride=3, padding=1, output_padding=2, dilation=2, groups=3), (2, 3, 5), (3, 2, 3), (6,), label="1d"),
    # -- pooling
    U("max_pool2d", lambda x: ops.max_pool2d(x, 2), (2, 3, 4, 6)),
    U("max_pool2d", lambda x: ops.max_pool2d(x, 3, stride=2, padding=1), (2, 2, 7, 6)),
    U("max_pool2d", lambda x: ops.max_pool2d(x, (2, 3), stride=(1, 2), padding=(1, 1)), (1, 2, 5, 7)),
    K("max_pool2d", lambda x: ops.max_pool2d(x, 2, stride=1), (1, 2, 4, 4)),
    N("max_pool2d", lambda x: ops.max_pool2d(x, 2), (2, 3, 6, 5), label="basic"),
    N("max_pool2d", lambda x: ops.max_pool2d(x, 3, stride=2, padding=1), (2, 2, 7, 6), label="pad"),
    N("max_pool2d", lambda x: ops.max_pool2d(x, (3, 2), stride=(1, 2), padding=(1, 1)), (1, 2, 5, 6), label="tuples"),
    N("max_pool2d", lambda x: ops.max_pool2d(x, 2, stride=1), POOL_TIES, label="ties"),
    U("avg_pool2d", lambda x: ops.avg_pool2d(x, 2), (2, 3, 4, 6)),
    U("avg_pool2d", lambda x: ops.avg_pool2d(x, 3, stride=2, padding=1), (2, 2, 7, 6)),
    U("avg_pool2d", lambda x: ops.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False), (2, 2, 7, 6)),
    U("avg_pool2d", lambda x: ops.avg_pool2d(x, (2, 3), stride=(1, 2), padding=(1, 0), count_include_pad=False), (1, 2, 5, 7)),
    N("avg_pool2d", lambda x: ops.avg_pool2d(x, 2), (2, 3, 6, 5), label="basic"),
    N("avg_pool2d", lambda x: ops.avg_pool2d(x, 3, stride=2, padding=1), (2, 2, 7, 6), label="pad-include"),
    N("avg_pool2d", lambda x: ops.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False), (2, 2, 7, 6), label="pad-exclude"),
    N("avg_pool2d", lambda x: ops.avg_pool2d(x, (2, 3), stride=(1, 2), padding=(1, 1), count_include_pad=False), (1, 2, 5, 6), label="tuples-exclude"),
    U("adaptive_avg_pool2d", lambda x: ops.adaptive_avg_pool2d(x, (3, 2)), (2, 3, 5, 7)),
    U("adaptive_avg_pool2d", lambda x: ops.adaptive_avg_pool2d(x, 1), (2, 3, 4, 4)),
    U("adaptive_avg_pool2d", lambda x: ops.adaptive_avg_pool2d(x, 4), (1, 2, 6, 5)),
    N("adaptive_avg_pool2d", lambda x: ops.adaptive_avg_pool2d(x, 3), (2, 2, 5, 7), label="uneven"),
    N("adaptive_avg_pool2d", lambda x: ops.adaptive_avg_pool2d(x, (2, 3)), (1, 2, 4, 6), label="even"),
    N("adaptive_avg_pool2d", lambda x: ops.adaptive_avg_pool2d(x, 1), (2, 3, 3, 4), label="global"),
    # -- ops for torch.export graphs: F.hardswish, F.hardsigmoid, F.interpolate's kernels
    U("hardswish", dict(), (3, 8), lo=-5, hi=5),
    # ops for torch.export graphs: jax.nn's hard activations, jax.image.resize where it matches torch
    N("hardswish", lambda x: ops.hardswish(ops.mul(x, 2.5)), (3, 8), label="hardswish"),
    U("hardsigmoid", dict(), (3, 8), lo=-5, hi=5),
    U("hardsigmoid", dict(), (3, 8), lo=-5, hi=5, grad=False),
    N("hardsigmoid", lambda x: ops.hardsigmoid(ops.mul(x, 2.5)), (3, 8), label="hardsigmoid"),
    U("upsample_nearest2d", lambda x: ops.upsample_nearest2d(x, (6, 9)), (2, 2, 3, 4)),
    U("upsample_nearest2d", lambda x: ops.upsample_nearest2d(x, (2, 3)), (1, 2, 5, 7)),
    U("upsample_nearest2d", lambda x: ops.upsample_nearest2d(x, (7, 7), 1.5), (1, 2, 5, 5)),
    N("upsample_nearest2d", lambda x: ops.upsample_nearest2d(x, (6, 9)), (2, 2, 3, 4), label="nearest-up"),
    N("upsample_nearest2d", lambda x: ops.upsample_nearest2d(x, (2, 3)), (1, 2, 5, 7), label="nearest-down"),
    U("upsample_bilinear2d", lambda x: ops.upsample_bilinear2d(x, (6, 9)), (2, 2, 3, 4)),
    U("upsample_bilinear2d", lambda x: ops.upsample_bilinear2d(x, (5, 7), align_corners=True), (1, 2, 3, 4)),
    U("upsample_bilinear2d", lambda x: ops.upsample_bilinear2d(x, (3, 4)), (1, 2, 5, 7)),
    U("upsample_bilinear2d", lambda x: ops.upsample_bilinear2d(x, (7, 7), scale_factor=1.5), (1, 2, 5, 5)),
    N("upsample_bilinear2d", lambda x: ops.upsample_bilinear2d(x, (6, 9)), (2, 2, 3, 4), label="bilinear-resize"),
    N("upsample_bilinear2d", lambda x: ops.upsample_bilinear2d(x, (3, 4)), (1, 2, 5, 7), label="bilinear-down"),
    N("upsample_bilinear2d", lambda x: ops.upsample_bilinear2d(x, (5, 7), align_corners=True), (1, 2, 3, 4),
        label="bilinear-corners"),
    N("upsample_bilinear2d", lambda x: ops.upsample_bilinear2d(x, (7, 7), scale_factor=1.5), (1, 2, 5, 5),
        label="bilinear-factor"),
    # -- framework kernels: torch runs F.linear, F.batch_norm, F.scaled_dot_product_attention, F.cross_entropy ...
    U("linear", dict(), (4, 5), (3, 5), (3,)),
    U("linear", dict(), (2, 3, 5), (4, 5)),
    U("linear", lambda x, b: ops.linear(x, C34, b), (2, 4), (3,), const64=True),
    U("linear", dict(), (5,), (2, 5), (2,)),
    N("linear", dict(), (2, 3, 4), (5, 4), (5,), label="batch-bias"),
    N("linear", dict(), (3, 4), (2, 4), label="no-bias"),
    N("linear", dict(), (4,), (3, 4), (3,), label="vector"),
    # batch_norm: train (batch statistics, running statistics updated) and eval, 1d and 2d, affine or not
    U("batch_norm", lambda x, w, b: ops.batch_norm(x, RM4, RV4, w, b)[0], (3, 4, 5, 2), (4,), (4,), const64=True),
    U("batch_norm", lambda x, w, b: ops.batch_norm(x, None, None, w, b, eps=1e-3)[0], (3, 4, 2, 3), (4,), (4,)),
    U("batch_norm", lambda x: ops.batch_norm(x, RM4, RV4, momentum=0.3)[0], (6, 4), const64=True),
    U("batch_norm", lambda x, w: ops.batch_norm(x, weight=w, training=True)[0], (3, 4, 5), (4,)),
    U("batch_norm", lambda x, w, b: ops.batch_norm(x, RM4, RV4, w, b, training=False)[0], (2, 4, 3, 3), (4,), (4,),
      const64=True),
    U("batch_norm", lambda x: ops.batch_norm(x, RM4, RV4, training=False, eps=1e-2)[0], (5, 4), const64=True),
    U("batch_norm", lambda x, b: ops.batch_norm(x, RM4, RV4, bias=b, training=False)[0], (2, 4, 6), (4,), const64=True),
    U("batch_norm", lambda x: ops.batch_norm(x, RM4, RV4, momentum=0.2)[1], (3, 4, 5, 2), grad=False, const64=True),
    U("batch_norm", lambda x: ops.batch_norm(x, RM4, RV4, momentum=0.2)[2], (3, 4, 5, 2), grad=False, const64=True),
    # momentum as a 0-d array: BatchNorm's cumulative factor 1/num_batches_tracked for momentum=None
    U("batch_norm", lambda x, w: ops.batch_norm(x, RM4, RV4, w, momentum=np.array(1 / 3))[0], (3, 4, 2, 2), (4,),
      const64=True),
    U("batch_norm", lambda x: ops.batch_norm(x, RM4, RV4, momentum=np.array(1 / 3))[1], (7, 4), grad=False, const64=True),
    U("batch_norm", lambda x: ops.batch_norm(x, RM4, RV4, momentum=np.array(1 / 3))[2], (3, 4, 3), grad=False,
      const64=True),
    # batch_norm: train / eval, (N, C), (N, C, L), (N, C, H, W), with and without affine and running stats.
    N("batch_norm", lambda x, w, b: ops.batch_norm(x, weight=w, bias=b)[0], (3, 4, 5, 2), (4,), (4,),
        label="train-2d-affine"),
    N("batch_norm", lambda x: ops.batch_norm(x)[0], (6, 4), label="train-1d"),
    N("batch_norm", lambda x, w, b: ops.batch_norm(x, weight=w, bias=b, eps=1e-3)[0], (3, 4, 5), (4,), (4,),
        label="train-1d-NCL-eps"),
    N("batch_norm", lambda x, rm, rv, w: ops.batch_norm(x, rm, rv, weight=w)[0], (3, 4, 2, 3), BN_RM, BN_RV, (4,),
        label="train-2d-stats-weight-only", no_gradient_on=TORCH_NO_STATS_GRADIENT),
    N("batch_norm", lambda x, rm, rv: running_stats(ops.batch_norm(x, rm, rv)), (3, 4, 2, 3), BN_RM, BN_RV,
        label="train-2d-running-stats", no_gradient_on=TORCH_NO_STATS_GRADIENT),
    N("batch_norm", lambda x, rm, rv: running_stats(ops.batch_norm(x, rm, rv, momentum=0.3)), (5, 4), BN_RM, BN_RV,
        label="train-1d-running-stats", no_gradient_on=TORCH_NO_STATS_GRADIENT),
    # momentum a 0-d array: in x's backend (as 1/num_batches_tracked is), and an input (a tracer under jit).
    N("batch_norm", lambda x, rm, rv: running_stats(ops.batch_norm(x, rm, rv, momentum=ops.asarray(np.array(0.25), like=x))),
        (3, 4, 2, 2), BN_RM, BN_RV, label="train-momentum-0d", no_gradient_on=TORCH_NO_STATS_GRADIENT),
    N("batch_norm", lambda x, rm, rv, m: running_stats(ops.batch_norm(x, rm, rv, momentum=m)), (3, 4, 5), BN_RM, BN_RV,
        np.array(0.2), label="train-momentum-0d-input", no_gradient_on=TORCH_NO_STATS_GRADIENT),
    N("batch_norm", lambda x, rm, rv, m: ops.batch_norm(x, rm, rv, momentum=m)[0], (3, 4, 5), BN_RM, BN_RV,
        np.array(0.2), label="train-momentum-0d-output", no_gradient_on=TORCH_NO_STATS_GRADIENT),
    N("batch_norm", lambda x, w, b: ops.batch_norm(x, ops.asarray(BN_RM, like=x), ops.asarray(BN_RV, like=x), w, b,
                                                     training=False)[0], (3, 4, 2, 3), (4,), (4,), label="eval-2d-affine"),
    N("batch_norm", lambda x, rm, rv: ops.batch_norm(x, rm, rv, training=False)[0], (5, 4), BN_RM, BN_RV,
        label="eval-1d-stats-inputs", no_gradient_on=TORCH_NO_STATS_GRADIENT),
    N("batch_norm", lambda x, rm, rv: running_stats(ops.batch_norm(x, rm, rv, training=False)), (5, 4), BN_RM, BN_RV,
        label="eval-stats-unchanged", no_gradient_on=TORCH_NO_STATS_GRADIENT),
    U("layer_norm", lambda x, w, b: ops.layer_norm(x, (4, 5), w, b), (2, 3, 4, 5), (4, 5), (4, 5)),
    U("layer_norm", lambda x: ops.layer_norm(x, (6,)), (3, 6)),
    U("layer_norm", lambda x, w: ops.layer_norm(x, (3, 4), w, eps=1e-3), (2, 3, 4), (3, 4)),
    U("layer_norm", lambda x, w, b: ops.layer_norm(x, (2, 3, 4), w, b), (2, 3, 4), (2, 3, 4), (2, 3, 4)),
    N("layer_norm", lambda x, w, b: ops.layer_norm(x, (5,), w, b), (2, 3, 5), (5,), (5,), label="last"),
    N("layer_norm", lambda x, w, b: ops.layer_norm(x, (4, 5), w, b), (2, 3, 4, 5), (4, 5), (4, 5), label="multi-dim"),
    N("layer_norm", lambda x: ops.layer_norm(x, (3, 6), eps=1e-3), (2, 3, 6), label="no-affine-all-dims"),
    N("layer_norm", lambda x, w: ops.layer_norm(x, [6], w), (4, 6), (6,), label="weight-only"),
    U("group_norm", lambda x, w, b: ops.group_norm(x, 2, w, b), (2, 6, 3, 3), (6,), (6,)),
    U("group_norm", lambda x: ops.group_norm(x, 6), (2, 6, 4)),
    U("group_norm", lambda x, w: ops.group_norm(x, 1, w, eps=1e-3), (3, 4, 5), (4,)),
    U("group_norm", lambda x, b: ops.group_norm(x, 3, bias=b), (2, 6, 2, 3), (6,)),
    N("group_norm", lambda x, w, b: ops.group_norm(x, 3, w, b), (2, 6, 4, 3), (6,), (6,), label="2d-affine"),
    N("group_norm", lambda x: ops.group_norm(x, 2), (2, 4, 5), label="1d"),
    N("group_norm", lambda x, w, b: ops.group_norm(x, 4, w, b, eps=1e-3), (2, 4, 3, 3), (4,), (4,),
        label="instance"),
    N("group_norm", lambda x, b: ops.group_norm(x, 1, bias=b), (3, 4, 2, 2), (4,), label="layer-bias-only"),
    U("rms_norm", lambda x, w: ops.rms_norm(x, (8,), w), (2, 3, 8), (8,)),
    U("rms_norm", lambda x, w: ops.rms_norm(x, (3, 4), w, eps=1e-5), (2, 3, 4), (3, 4)),
    U("rms_norm", lambda x: ops.rms_norm(x, (5,), eps=1e-6), (3, 5)),
    U("rms_norm", lambda x: ops.rms_norm(x, (2, 5)), (3, 2, 5), lo=-0.01, hi=0.01),  # eps=None matters here
    N("rms_norm", lambda x, w: ops.rms_norm(x, (5,), w), (2, 3, 5), (5,), label="last-dtype-eps"),
    N("rms_norm", lambda x, w: ops.rms_norm(x, (3, 4), w, eps=1e-6), (2, 3, 4), (3, 4), label="multi-dim"),
    N("rms_norm", lambda x: ops.rms_norm(x, (6,), eps=1e-5), (4, 6), label="no-weight"),
    # attention: batched heads (N, H, L, E), masks bool (True = attend) / float, causal, dropout, scale
    U("scaled_dot_product_attention", dict(), (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2)),
    U("scaled_dot_product_attention", dict(attn_mask=KEEP46), (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2)),
    U("scaled_dot_product_attention", dict(attn_mask=BIAS46), (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2), const64=True),
    U("scaled_dot_product_attention", dict(attn_mask=BIAS246), (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 4), const64=True),
    U("scaled_dot_product_attention", dict(is_causal=True), (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2)),
    U("scaled_dot_product_attention", dict(scale=0.3), (3, 4, 5), (3, 6, 5), (3, 6, 3)),
    U("scaled_dot_product_attention", lambda q, k, v, m: ops.scaled_dot_product_attention(q, k, v, attn_mask=m),
      (2, 4, 5), (2, 6, 5), (2, 6, 2), (4, 6)),
    U("scaled_dot_product_attention", dict(dropout_mask=DROP), (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2), const64=True),
    U("scaled_dot_product_attention",
      dict(dropout_mask=DROP, is_causal=True, scale=0.7),
      (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2), const64=True),
    U("scaled_dot_product_attention",
      dict(attn_mask=KEEP46, dropout_mask=DROP[0]),
      (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2), const64=True),
    U("scaled_dot_product_attention",
      dict(attn_mask=BIAS46, dropout_mask=DROP),
      (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2), const64=True),
    U("scaled_dot_product_attention",
      dict(dropout_mask=np.zeros((4, 6))),
      (2, 4, 5), (2, 6, 5), (2, 6, 2), const64=True),
    U("scaled_dot_product_attention", dict(attn_mask=EMPTY46), (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2)),
    U("scaled_dot_product_attention",
      dict(attn_mask=np.where(EMPTY46, BIAS46, -np.inf)),
      (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2), const64=True),
    U("scaled_dot_product_attention",
      dict(attn_mask=EMPTY46, dropout_mask=DROP[0]),
      (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2), const64=True),
    # attention, on (..., L, E): L=4 queries, S=6 keys.
    N("scaled_dot_product_attention", dict(), (2, 4, 3), (2, 6, 3), (2, 6, 3), label="rank3"),
    N("scaled_dot_product_attention", dict(), (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 5), label="rank4"),
    N("scaled_dot_product_attention", dict(), (4, 3), (6, 3), (6, 3), label="rank2"),
    N("scaled_dot_product_attention", dict(), (2, 2, 3, 4, 3), (2, 2, 3, 6, 3), (2, 2, 3, 6, 3), label="rank5"),
    N("scaled_dot_product_attention", dict(), (2, 3, 4, 5), (1, 3, 6, 5), (1, 3, 6, 5), label="broadcast-kv"),
    N("scaled_dot_product_attention", dict(), (2, 4, 3), (2, 6, 3), (2, 6, 2), label="value-dim"),
    N("scaled_dot_product_attention", dict(attn_mask=ATT_MASK),
        (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 5), label="rank4-bool-mask-LS"),
    N("scaled_dot_product_attention", dict(attn_mask=ATT_MASK_B),
        (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 5), label="rank4-bool-mask-B1LS"),
    N("scaled_dot_product_attention", dict(attn_mask=ATT_MASK),
        (2, 4, 3), (2, 6, 3), (2, 6, 3), label="rank3-bool-mask"),
    N("scaled_dot_product_attention", dict(attn_mask=ATT_BIAS),
        (2, 4, 3), (2, 6, 3), (2, 6, 3), label="rank3-float-mask"),
    N("scaled_dot_product_attention",
        dict(attn_mask=ATT_BIAS_FULL),
        (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 5), label="rank4-float-mask-inf"),
    N("scaled_dot_product_attention",
        dict(attn_mask=ATT_MASK_EMPTY),
        (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 5), label="rank4-bool-mask-a-query-attends-nothing"),
    N("scaled_dot_product_attention",
        dict(attn_mask=np.where(ATT_MASK_EMPTY, 0.0, -np.inf)),
        (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 5), label="rank4-float-mask-a-query-attends-nothing"),
    N("scaled_dot_product_attention",
        dict(attn_mask=ATT_MASK_EMPTY, dropout_mask=DROP4),
        (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 5), label="rank4-bool-mask-dropout-a-query-attends-nothing"),
    N("scaled_dot_product_attention", dict(is_causal=True),
        (2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 4), label="rank4-causal"),
    N("scaled_dot_product_attention", dict(is_causal=True), (2, 4, 3), (2, 6, 3), (2, 6, 3), label="rank3-causal-L<S"),
    N("scaled_dot_product_attention", dict(is_causal=True), (2, 6, 3), (2, 4, 3), (2, 4, 3), label="rank3-causal-L>S"),
    N("scaled_dot_product_attention", dict(scale=0.3), (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 5), label="rank4-scale"),
    N("scaled_dot_product_attention",
        dict(dropout_mask=DROP4),
        (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 5), label="rank4-dropout"),
    N("scaled_dot_product_attention",
        dict(attn_mask=ATT_MASK, dropout_mask=DROP3, scale=0.7),
        (2, 4, 3), (2, 6, 3), (2, 6, 3), label="rank3-dropout-mask-scale"),
    N("scaled_dot_product_attention",
        dict(dropout_mask=DROP3[:, :, :4], is_causal=True),
        (2, 4, 3), (2, 4, 3), (2, 4, 3), label="rank3-dropout-causal"),
    U("embedding", lambda w: ops.embedding(IDS7, w), (7, 3)),
    U("embedding", lambda w: ops.embedding(IDS7[0], w, padding_idx=0), (7, 3)),  # a non-zero padding row: still zeros
    U("embedding", lambda w: ops.embedding(IDS7, w, padding_idx=6), (7, 4)),
    N("embedding", lambda w: ops.embedding(IDS5, w), (5, 3), label="2d-ids"),
    N("embedding", lambda w: ops.embedding(IDS5[0], w, padding_idx=1), (5, 3), label="padding-idx"),
    N("embedding", lambda w: ops.embedding(IDS5, w, padding_idx=0), (5, 3), label="padding-idx-2d"),
    # losses: every reduction; class weights, ignore_index, label smoothing, probability targets, pos_weight
    *[U("cross_entropy", lambda x, red=red: ops.cross_entropy(x, T5, reduction=red), (5, 4)) for red in REDUCTIONS],
    *[U("cross_entropy", lambda x, red=red: ops.cross_entropy(x, T5, weight=W4, reduction=red), (5, 4), const64=True)
      for red in REDUCTIONS],
    *[U("cross_entropy", lambda x, red=red: ops.cross_entropy(x, T5, ignore_index=3, weight=W4, reduction=red), (5, 4),
        const64=True) for red in REDUCTIONS],
    *[U("cross_entropy", lambda x, red=red: ops.cross_entropy(x, T5, ignore_index=1, label_smoothing=0.1,
                                                              reduction=red), (5, 4)) for red in REDUCTIONS],
    *[U("cross_entropy", lambda x, red=red: ops.cross_entropy(x, P54, reduction=red), (5, 4), const64=True)
      for red in REDUCTIONS],
    *[U("cross_entropy", lambda x, red=red: ops.cross_entropy(x, P54, weight=W4, label_smoothing=0.2, reduction=red),
        (5, 4), const64=True) for red in REDUCTIONS],
    U("cross_entropy", lambda x: ops.cross_entropy(x, T23, label_smoothing=0.3), (2, 4, 3)),
    U("cross_entropy", lambda x: ops.cross_entropy(x, T23, reduction="sum", weight=W4), (2, 4, 3), const64=True),
    U("cross_entropy", dict(), (2, 4, 3), (2, 4, 3), lo=0.0, hi=1.0),
    *[N("cross_entropy", lambda x, r=r: ops.cross_entropy(x, CE_T, reduction=r), (6, 5), label=r) for r in REDUCTIONS],
    *[N("cross_entropy", lambda x, r=r: ops.cross_entropy(x, CE_T_IGN, CE_W, reduction=r), (6, 5),
          label=f"weight-ignore-{r}") for r in REDUCTIONS],
    *[N("cross_entropy", lambda x, r=r: ops.cross_entropy(x, CE_T_IGN1, ignore_index=1, reduction=r), (6, 5),
          label=f"ignore-index-1-{r}") for r in REDUCTIONS],
    *[N("cross_entropy", lambda x, r=r: ops.cross_entropy(x, CE_T_IGN, reduction=r, label_smoothing=0.2), (6, 5),
          label=f"smoothing-ignore-{r}") for r in REDUCTIONS],
    *[N("cross_entropy", lambda x, p, r=r: ops.cross_entropy(x, p, CE_W, reduction=r), (6, 5), CE_P,
          label=f"probabilities-weight-{r}") for r in REDUCTIONS],
    *[N("cross_entropy", lambda x, p, r=r: ops.cross_entropy(x, p, reduction=r, label_smoothing=0.1), (6, 5), CE_P,
          label=f"probabilities-smoothing-{r}") for r in REDUCTIONS],
    *[N("cross_entropy", lambda x, r=r: ops.cross_entropy(x, CE_T_MAP, CE_W3, reduction=r), (2, 3, 4, 5),
          label=f"spatial-weight-ignore-{r}") for r in REDUCTIONS],
    *[U("nll_loss", lambda x, red=red: ops.nll_loss(x, T5, reduction=red), (5, 4), hi=0.0) for red in REDUCTIONS],
    *[U("nll_loss", lambda x, red=red: ops.nll_loss(x, T5, weight=W4, ignore_index=2, reduction=red), (5, 4),
        const64=True) for red in REDUCTIONS],
    U("nll_loss", lambda x: ops.nll_loss(x, T23, ignore_index=0), (2, 4, 3)),
    *[N("nll_loss", lambda x, r=r: ops.nll_loss(x, CE_T, reduction=r), (6, 5), label=r) for r in REDUCTIONS],
    *[N("nll_loss", lambda x, r=r: ops.nll_loss(x, CE_T_IGN, CE_W, reduction=r), (6, 5), label=f"weight-ignore-{r}")
      for r in REDUCTIONS],
    N("nll_loss", lambda x: ops.nll_loss(ops.log_softmax(x, axis=1), CE_T_MAP, CE_W3), (2, 3, 4, 5),
        label="spatial-log-softmax"),
    N("nll_loss", lambda x: ops.nll_loss(x, CE_T_IGN1, ignore_index=1, reduction="sum"), (6, 5), label="ignore-index-1"),
    *[U("mse_loss", lambda x, t, red=red: ops.mse_loss(x, t, reduction=red), (3, 4), (3, 4)) for red in REDUCTIONS],
    U("mse_loss", lambda x: ops.mse_loss(x, C34), (3, 4), const64=True),
    U("mse_loss", dict(reduction="sum"), (2, 3, 4), (2, 3, 4)),
    *[N("mse_loss", lambda x, y, r=r: ops.mse_loss(x, y, reduction=r), (3, 4), (3, 4), label=r) for r in REDUCTIONS],
    N("mse_loss", dict(reduction="none"), (2, 3, 4), (4,), label="broadcast"),
    *[U("binary_cross_entropy_with_logits", lambda x, t, red=red: ops.binary_cross_entropy_with_logits(x, t, reduction=red),
        (3, 4), (3, 4), lo=-5, hi=5) for red in REDUCTIONS],
    *[U("binary_cross_entropy_with_logits",
        lambda x, red=red: ops.binary_cross_entropy_with_logits(x, Y34, weight=W4, pos_weight=PW4, reduction=red),
        (3, 4), lo=-5, hi=5, const64=True) for red in REDUCTIONS],
    # torch gives no gradient for weight and pos_weight (test_precise_errors): forward only
    U("binary_cross_entropy_with_logits", lambda x, w: ops.binary_cross_entropy_with_logits(x, Y34, weight=w),
      (3, 4), (3, 4), const64=True, grad=False),
    U("binary_cross_entropy_with_logits", lambda x, pw: ops.binary_cross_entropy_with_logits(x, Y34, pos_weight=pw),
      (3, 4), (4,), lo=0.5, const64=True, grad=False),
    U("binary_cross_entropy_with_logits", lambda x: ops.binary_cross_entropy_with_logits(x, Y34, weight=Y34[0]),
      (3, 4), lo=-5, hi=5, const64=True),
    *[N("binary_cross_entropy_with_logits", lambda x, y, r=r: ops.binary_cross_entropy_with_logits(x, y, reduction=r),
          (3, 4), BCE_Y, label=r) for r in REDUCTIONS],
    *[N("binary_cross_entropy_with_logits",
          lambda x, y, r=r: ops.binary_cross_entropy_with_logits(x, y, BCE_W, reduction=r, pos_weight=BCE_POS),
          (3, 4), BCE_HARD, label=f"weight-pos-weight-{r}") for r in REDUCTIONS],
    N("binary_cross_entropy_with_logits", dict(pos_weight=BCE_POS), (3, 4), BCE_Y, label="soft-pos-weight"),
    N("binary_cross_entropy_with_logits", dict(reduction="none"),
        np.array([[-40.0, -3.0, 0.0, 40.0]]), np.array([[1.0, 0.0, 0.5, 0.0]]), label="extremes"),
]
# fmt: on


# ================================================================ the database
NOT_DIFFERENTIABLE = ("greater", "less", "equal")  # boolean outputs
BUGS = {
    "hardsigmoid": {"torch": "torch 2.13's CPU hardsigmoid backward multiplies by 1/6 rounded to float32, in "
                             "float64 too (0.16666667163, 3e-8 off)"},
}


def _assemble() -> dict[str, OpInfo]:
    """One OpInfo per op of ``gradcheck.ops.__all__``, holding its drawn and fixed samples in table order."""
    db = {name: OpInfo(name, differentiable=name not in NOT_DIFFERENTIABLE, bugs=dict(BUGS.get(name, {})))
          for name in ops.__all__}
    named = {d.op for d in _DRAWN} | {s.op for s in SAMPLES} | set(NOT_DIFFERENTIABLE) | set(BUGS)
    unknown = sorted(named - set(db))
    if unknown:
        raise ValueError(f"tests/op_db.py names ops that gradcheck.ops does not export: {unknown}; "
                         "fix the name, or export the op from gradcheck/ops/__init__.py")
    for d in _DRAWN:
        db[d.op].drawn.append(d)
    unlabelled: dict[str, int] = {}
    seen: set[str] = set()
    for s in SAMPLES:
        if s.label:
            s.id = f"{s.op}-{s.label}"
        else:
            s.id = f"{s.op}-{unlabelled.setdefault(s.op, 0)}"
            unlabelled[s.op] += 1
        if s.id in seen:
            raise ValueError(f"tests/op_db.py: two samples have the id {s.id!r}; give one another label")
        seen.add(s.id)
        db[s.op].samples.append(s)
    return db


OPS = _assemble()


def all_drawn() -> list[Drawn]:
    """Every drawn sample, op by op."""
    return [d for info in OPS.values() for d in info.drawn]


def all_samples() -> list[Sample]:
    """Every fixed sample, op by op."""
    return [s for info in OPS.values() for s in info.samples]


def sample(sample_id: str) -> Sample:
    """The fixed sample with this id."""
    for s in all_samples():
        if s.id == sample_id:
            return s
    raise KeyError(f"no sample {sample_id!r} in tests/op_db.py")

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
* Every output keeps torch's dtype: ``lower`` casts a lowering's result
  to the dtype the graph records for the node (``node.meta["val"]``, a float
  dtype meaning the run's), so integer and bool results (position ids from
  ``cumsum``, masks) stay integer and bool, as torch computes them.
* Outputs a forward never reads (batch norm's saved statistics, dropout's
  mask, a max pool's indices that no node uses) are ``Unavailable``: a
  lowering that is handed one raises, naming the op that made it.
* A form of an op the table does not lower raises ``LoweringError`` naming
  the form (``_unsupported``); any other exception is a bug of the table.
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
    """Register a lowering for the ATen overloads ``names`` (``"aten.convolution.default"``).

    The table holds it wrapped so that its outputs keep the dtypes torch gives
    them (``_graph_dtypes``); the function itself is returned unwrapped.
    """

    def register(fn):
        wrapped = _keeps_graph_dtypes(fn)
        for name in names:
            LOWERINGS[name] = wrapped
        return fn

    return register


def _keeps_graph_dtypes(fn):
    def lowering(ctx, *args, **kwargs):
        out = fn(ctx, *args, **kwargs)
        val = _traced_value(getattr(ctx, "node", None))
        return out if val is None else _graph_dtypes(ctx, out, val)

    lowering.__name__ = lowering.__qualname__ = fn.__name__
    lowering.__wrapped__ = fn
    return lowering


def _traced_value(node):
    """The value torch recorded for a graph node when it was traced (``meta["val"]``: its shape, dtype, strides),
    or None (no node, or a node without one)."""
    return getattr(node, "meta", {}).get("val") if node is not None else None


def _graph_dtype(ctx, val) -> np.dtype | None:
    """The numpy dtype of a graph value (a float one is the run's float dtype), or None for a non-tensor."""
    dt = getattr(val, "dtype", None)
    if dt is None or not hasattr(val, "shape") or getattr(dt, "is_complex", False):
        return None
    return ctx.floats if dt.is_floating_point else np.dtype(str(dt).replace("torch.", ""))


def _graph_dtypes(ctx, out, val):
    """``out`` with each tensor in the dtype torch's node gives it (integer and bool stay so, floats the run's).

    numpy and the lowerings' compositions would promote on their own (an
    integer cumsum through a float matmul, a float32 run's result in
    float64); torch's dtype is what the next node, and torch's own run, see.
    """
    if isinstance(out, (tuple, list)):
        if not isinstance(val, (tuple, list)) or len(val) != len(out):
            return out
        return type(out)(_graph_dtypes(ctx, v, t) for v, t in zip(out, val))
    want = _graph_dtype(ctx, val)
    if isinstance(out, np.generic):  # numpy's arithmetic on 0-d values gives a scalar (a float64 is a float)
        out = np.asarray(out)
    if want is None or out is None or isinstance(out, (Unavailable, bool, int, float)):
        return out
    return out if np.dtype(o.dtype_of(out)) == want else o.astype(out, want)


class Unavailable:
    """An output of an op that the forward does not compute (saved statistics, indices, masks)."""

    def __init__(self, what: str):
        self.what = what

    def __repr__(self):
        return f"<{self.what}: not computed>"


class LoweringError(NotImplementedError):
    """An op, or a form of one, that the table cannot run; the interpreter adds where it comes from."""


def _unsupported(op: str, form: str, why: str = ""):
    """Refuse a form of an op, naming it: ``aten.max_unpool2d with indices computed from traced values is not
    lowered: ...``."""
    raise LoweringError(f"{op} with {form} is not lowered" + (f": {why}" if why else ""))


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
        from gradcheck.backends.tape import tape

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


def _quotient(self, other, rounding_mode: str):
    """``self / other`` rounded down (``floor``, Python's and torch's floor division) or towards 0 (``trunc``).

    A step: computed on the values (numpy, or jax when traced), a constant to
    the tape; torch's gradient of a rounded division is 0 too.
    """
    xp = _logic(self, other)
    a, b = _raw(self), _raw(other)
    if rounding_mode == "floor":
        return xp.floor_divide(a, b)
    if xp.result_type(a, b).kind in "iu":  # exactly, in integers: a float quotient rounds a large one
        return xp.sign(a) * xp.sign(b) * xp.floor_divide(xp.abs(a), xp.abs(b))
    return xp.trunc(xp.true_divide(a, b))


@lower("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def div_mode(ctx, self, other, rounding_mode=None):
    if rounding_mode is None:
        return o.div(self, other)
    return _quotient(self, other, rounding_mode)


@lower("aten.neg.default")
def neg(ctx, self):
    return o.neg(self)


def _unary(name: str, fn):
    lower(f"aten.{name}.default")(lambda ctx, self: fn(self))


for _name, _fn in (("exp", o.exp), ("log", o.log), ("sqrt", o.sqrt), ("rsqrt", o.rsqrt), ("abs", o.abs),
                   ("sin", o.sin), ("cos", o.cos), ("tanh", o.tanh), ("sigmoid", o.sigmoid), ("erf", o.erf),
                   ("relu", o.relu), ("silu", o.silu), ("hardswish", o.hardswish),
                   ("hardsigmoid", o.hardsigmoid), ("log1p", o.log1p), ("expm1", o.expm1), ("atan", o.atan)):
    _unary(_name, _fn)


def _step(name: str):
    """floor, ceil, round, trunc: steps, whose derivative is 0 wherever it exists (torch's gradient is 0 too).

    Computed on the values (numpy, or jax when they are traced), a constant
    to the tape; an integer tensor is its own floor, as in torch.
    """

    def lowering(ctx, self, decimals=0):
        if np.dtype(o.dtype_of(self)).kind in "biu":
            return self
        xp = _logic(self)
        return xp.round(_raw(self), decimals) if name == "round" else getattr(xp, name)(_raw(self))

    lowering.__name__ = name
    return lowering


for _name in ("floor", "ceil", "round", "trunc"):
    lower(f"aten.{_name}.default")(_step(_name))
lower("aten.round.decimals")(_step("round"))


# ---------------------------------------------------------------- elementwise math composed from ops
# Each is a composition whose float64 value is within a few ulps of torch's over the op's whole domain (the forms
# that lose digits somewhere, 1 - x^2 near 1, exp(x) - exp(-x) near 0, atan(y / x) at x = 0, are avoided) and
# whose derivative, taken by each backend's AD, is the op's own, at the domain's edges (torch's infinities) too.
# erfc is not among them: 1 - erf(x) loses every relative digit for large x and no op gives erfc's tail.
LN2, LN10 = math.log(2.0), math.log(10.0)
BIG = 2.0 ** 28  # from here on sqrt(x^2 +- 1) is x in float64: asinh(x) and acosh(x) are log(2x)


def _float(ctx, x):
    """Integer and bool tensors as the run's floats: torch's math ops promote them (``torch.asin(ints)``)."""
    return o.astype(x, ctx.floats) if np.dtype(o.dtype_of(x)).kind in "biu" else x


def _select(cond, x, if_true, if_false, safe=1.0):
    """``where(cond, if_true(x), if_false(x))``, each branch computed only on its own elements (``safe`` elsewhere).

    A branch's value where it is not taken may be inf or NaN (x^2 overflows
    past 1e154); the gradient would carry it back as 0 * inf = NaN.
    """
    return o.where(cond, if_true(o.where(cond, x, safe)), if_false(o.where(cond, safe, x)))


def _odd(x, f):
    """``f(|x|)`` with x's sign, for an odd ``f`` whose form wants x >= 0; the gradient at 0 is ``f'(0)`` (|x| has 0)."""
    negative = o.less(x, 0.0)
    y = f(o.where(negative, o.neg(x), x))
    return o.where(negative, o.neg(y), y)


def _sign_bit(x):
    """Where x's sign bit is set: x < 0, -0.0 and a negative NaN (0 / 0 gives one), which torch's copysign and
    atan2 read.  The comparisons go through ops (recorded and pinned); only a zero's or NaN's bit is read raw."""
    lt, gt = o.less(x, 0.0), o.greater(x, 0.0)
    xp = _logic(lt, gt, x)
    return xp.logical_or(_raw(lt), xp.logical_and(xp.logical_not(_raw(gt)), xp.signbit(_raw(x))))


@lower("aten.asin.default")
def asin(ctx, self):
    """``2 atan(x / (1 + sqrt(1 - x) sqrt(1 + x)))``.

    The atan's argument stays in [-1, 1], so at x = +-1 the value is +-pi/2
    and the gradient torch's inf (``atan(x / sqrt(1 - x^2))`` gives 0 * inf
    there, and so does ``sqrt((1 - x)(1 + x))``, whose product rule meets
    sqrt's inf times 0); ``1 - x`` keeps the digits ``1 - x^2`` loses near 1.
    Beyond +-1 a square root is NaN, as torch's asin.
    """
    x = _float(ctx, self)
    root = o.mul(o.sqrt(o.sub(1.0, x)), o.sqrt(o.add(1.0, x)))
    return o.mul(o.atan(o.div(x, o.add(1.0, root))), 2.0)


def _acos_positive(a):
    """acos(a) for a >= 0: ``2 atan(sqrt(1 - a) / sqrt(1 + a))``, accurate where acos is small (a near 1); the
    roots taken apart keep the gradient at a = 1 torch's inf (a quotient's rule would meet sqrt's inf times 0)."""
    return o.mul(o.atan(o.div(o.sqrt(o.sub(1.0, a)), o.sqrt(o.add(1.0, a)))), 2.0)


@lower("aten.acos.default")
def acos(ctx, self):
    """``pi - acos(-x)`` for x < 0, ``2 atan(sqrt((1 - x) / (1 + x)))`` otherwise.

    ``pi/2 - asin(x)`` would cancel near x = 1, where acos is small; the
    reflection keeps 1 + x away from 0, so the gradient at x = -1 is torch's
    -inf, not 0 * inf.  Beyond +-1 the square root is NaN, as torch's acos.
    """
    x = _float(ctx, self)
    negative = o.less(x, 0.0)
    y = _acos_positive(o.where(negative, o.neg(x), x))
    return o.where(negative, o.sub(math.pi, y), y)


def _asinh_positive(a):
    """asinh(a) for a >= 0: ``log1p(a + a^2 / (1 + sqrt(1 + a^2)))`` (no cancellation near 0), log(2a) from BIG."""
    def moderate(v):
        vv = o.mul(v, v)
        return o.log1p(o.add(v, o.div(vv, o.add(1.0, o.sqrt(o.add(1.0, vv))))))

    return _select(o.greater(a, BIG), a, lambda v: o.add(o.log(v), LN2), moderate)


@lower("aten.asinh.default")
def asinh(ctx, self):
    """asinh, odd: computed on |x| in a form without cancellation, and log(2|x|) where x^2 would overflow."""
    return _odd(_float(ctx, self), _asinh_positive)


@lower("aten.acosh.default")
def acosh(ctx, self):
    """``log1p(t + sqrt(t) sqrt(t + 2))``, t = x - 1 (exact near 1, where acosh is small), log(2x) from BIG.

    ``sqrt(t)`` is NaN for every x < 1 (torch's acosh is NaN there; sqrt(t (t + 2))
    would not be for x < -1) and its gradient at x = 1 is torch's inf.
    """
    def moderate(v):
        t = o.sub(v, 1.0)
        return o.log1p(o.add(t, o.mul(o.sqrt(t), o.sqrt(o.add(t, 2.0)))))

    x = _float(ctx, self)
    return _select(o.greater(x, BIG), x, lambda v: o.add(o.log(v), LN2), moderate, safe=2.0)


@lower("aten.atanh.default")
def atanh(ctx, self):
    """``(log1p(x) - log1p(-x)) / 2``: the two terms have opposite signs, so nothing cancels; +-inf at +-1 and NaN
    beyond, as torch's atanh."""
    x = _float(ctx, self)
    return o.mul(o.sub(o.log1p(x), o.log1p(o.neg(x))), 0.5)


def _sinh_half(x):
    """sinh(x/2) as ``(expm1(x/2) - expm1(-x/2)) / 2``: no cancellation near 0 (exp(x) - exp(-x) has one).

    Each use of x/2 is its own node, so the backward halves each cotangent
    before they meet at x: met at one x/2 node, they add up to 2 cosh(x),
    which overflows for |x| in (709.8, 710.5] where torch's gradient does not.
    """
    return o.mul(o.sub(o.expm1(o.mul(x, 0.5)), o.expm1(o.mul(x, -0.5))), 0.5)


@lower("aten.sinh.default")
def sinh(ctx, self):
    """``2 sinh(x/2) cosh(x/2)``: accurate near 0, and finite up to |x| = 710.47 where torch's is (exp(x)
    overflows from 709.78); its derivative is cosh(x) without cancellation."""
    x = _float(ctx, self)
    return o.mul(_sinh_half(x), o.add(o.exp(o.mul(x, 0.5)), o.exp(o.mul(x, -0.5))))


@lower("aten.cosh.default")
def cosh(ctx, self):
    """``1 + 2 sinh(x/2)^2``: finite as far as torch's, and its derivative ``2 sinh(x/2) cosh(x/2)`` is sinh(x)
    without the cancellation of ``(exp(x) - exp(-x)) / 2`` near 0.  The two factors are separate copies, for
    the reason ``_sinh_half`` gives (a square's cotangent, 4 sinh(x/2), would overflow on its way to x)."""
    x = _float(ctx, self)
    return o.add(o.mul(o.mul(_sinh_half(x), _sinh_half(x)), 2.0), 1.0)


@lower("aten.tan.default")
def tan(ctx, self):
    """``sin(x) / cos(x)``: each is accurate relative to itself, near cos's zeros too, so their ratio is."""
    x = _float(ctx, self)
    return o.div(o.sin(x), o.cos(x))


def _log_base(ctx, self, base: float):
    """``log(x) / log(base)``, within an ulp, and exactly k at x = base^k as torch's log2 and log10 are (a floor
    or a cast of log2(8) must give 3).  The snap adds ``k - r`` as a constant: the gradient stays 1 / (x log base).
    Subnormal x are left alone: 10^k rounded to one is far from 10^k, and so is its log10."""
    x = _float(ctx, self)
    r = o.div(o.log(x), math.log(base))
    xp = _logic(r, x)
    k = xp.round(_raw(r))
    with np.errstate(over="ignore"):  # base^k past the largest float is inf, and no x
        exact = xp.logical_and(xp.isfinite(k), xp.equal(xp.power(xp.asarray(base, dtype=k.dtype), k), _raw(x)))
    exact = xp.logical_and(exact, _raw(x) >= np.finfo(k.dtype).tiny)
    return o.where(exact, o.add(o.sub(r, o.stop_gradient(r)), k), r)


@lower("aten.log2.default")
def log2(ctx, self):
    return _log_base(ctx, self, 2.0)


@lower("aten.log10.default")
def log10(ctx, self):
    return _log_base(ctx, self, 10.0)


def _exp2(ctx, x):
    """``2 ** x`` through pow, exact at integers (``exp(x log 2)`` is off by |x| ulps); gradient ``2^x log 2``."""
    x = _float(ctx, x)
    return o.pow(o.asarray(np.asarray(2.0, ctx.floats), like=x), x)


@lower("aten.exp2.default")
def exp2(ctx, self):
    return _exp2(ctx, self)


@lower("aten.ldexp.Tensor")
def ldexp(ctx, self, other):
    """``self * 2 ** other``, as torch computes it (so it overflows where torch's does); an integer ``other`` is a
    constant."""
    return o.mul(_float(ctx, self), _exp2(ctx, other))


@lower("aten.atan2.default")
def atan2(ctx, self, other):
    """atan2(y, x): ``atan`` of the smaller over the larger of |y| and |x|, then the quadrant.

    With |y| > |x| it is ``+-pi/2 - atan(x / y)``, so the ratio never
    overflows and the gradient at x = 0 is torch's (``atan(y / x)`` gives
    0 * inf there).  Signed zeros and infinities follow torch (atan2(-0., -1.)
    = -pi, atan2(inf, inf) = pi/4); at y = x = 0 the gradient is 0, as torch's.
    """
    y, x = _float(ctx, self), _float(ctx, other)
    y_neg, x_neg = _sign_bit(y), _sign_bit(x)
    ay, ax = o.abs(y), o.abs(x)
    both_inf = _logic(ay, ax).logical_and(_raw(o.equal(ay, math.inf)), _raw(o.equal(ax, math.inf)))
    y, x = o.where(both_inf, o.where(y_neg, -1.0, 1.0), y), o.where(both_inf, o.where(x_neg, -1.0, 1.0), x)
    both_zero = _logic(ay, ax).logical_and(_raw(o.equal(ay, 0.0)), _raw(o.equal(ax, 0.0)))
    swap = o.greater(ay, ax)
    t = o.atan(o.div(o.where(swap, x, y), o.where(both_zero, 1.0, o.where(swap, y, x))))  # no 0 / 0
    quadrant = o.where(x_neg, o.add(t, o.where(y_neg, -math.pi, math.pi)), t)
    angle = o.where(swap, o.sub(o.where(y_neg, -math.pi / 2, math.pi / 2), t), quadrant)
    zero = o.where(x_neg, o.where(y_neg, -math.pi, math.pi), o.where(y_neg, -0.0, 0.0))  # a constant: gradient 0
    return o.where(both_zero, zero, angle)


@lower("aten.copysign.Tensor", "aten.copysign.Scalar")
def copysign(ctx, self, other):
    """|self| with other's sign bit (-0.0 and a negative NaN count as negative, as torch's).

    The gradient is torch's: sign(self) times other's sign, 0 at self = 0
    (|x|'s derivative there), and none to ``other``.
    """
    x = o.abs(_float(ctx, self))
    if not hasattr(other, "shape"):
        other = np.asarray(other, ctx.floats)
    return o.where(_sign_bit(other), o.neg(x), x)


def _fmax_fmin(name: str, wins):
    """fmax/fmin: ``self`` where it ``wins``, ties it, or ``other`` is NaN; ``other`` elsewhere (a NaN loses to a
    number).  At a tie the whole gradient goes to ``self``, as torch's (maximum splits it)."""

    def lowering(ctx, self, other):
        nan = _logic(other).isnan(_raw(other))
        xp = _logic(self, other)
        first = xp.logical_or(xp.logical_or(_raw(wins(self, other)), _raw(o.equal(self, other))), nan)
        return o.where(first, self, other)

    lowering.__name__ = name
    return lowering


lower("aten.fmax.default")(_fmax_fmin("fmax", o.greater))
lower("aten.fmin.default")(_fmax_fmin("fmin", o.less))


@lower("aten.nextafter.default")
def nextafter(ctx, self, other):
    """The next float after ``self`` towards ``other``: ``self`` plus the step to it, the step held fixed, so the
    gradient is 1 in ``self`` and 0 in ``other``, torch's (the function is ``self`` moved by one ulp).  The step is
    computed on values no gradient reaches (jax has no rule for nextafter); ``x + (next - x)`` is ``next`` exactly,
    adjacent floats' difference being exact."""
    still, towards = o.stop_gradient(self), o.stop_gradient(other)
    after = _logic(still, towards).nextafter(_raw(still), _raw(towards))
    return o.add(self, o.stop_gradient(o.sub(after, still)))


@lower("aten.isinf.default")
def isinf(ctx, self):
    return _logic(self).isinf(_raw(self))


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


@lower("aten.rrelu_with_noise_functional.default")
def rrelu(ctx, self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    """``nn.RReLU`` in evaluation: a leaky relu of slope ``(lower + upper) / 2`` (``noise`` is left as it is)."""
    if training:
        _unsupported("aten.rrelu_with_noise", "training=True", "its negative slopes are random draws, one per "
                     "element, which the case does not give every backend; check it with mode='eval'")
    return o.leaky_relu(self, (lower + upper) / 2), noise


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
        _unsupported("aten.bitwise_not", f"a {o.dtype_of(self)} tensor", "only boolean masks are lowered")
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


@lower("aten.copy.default", "aten.copy_.default")
def copy(ctx, self, src, non_blocking=False):
    """``self.copy_(src)`` made functional: ``src`` in ``self``'s shape and dtype; the gradient goes to ``src``."""
    dt = np.dtype(o.dtype_of(self))
    src = src if np.dtype(o.dtype_of(src)) == dt else o.astype(src, dt)
    shape = o.shape_of(self)
    return src if o.shape_of(src) == shape else o.broadcast_to(src, shape)


# Ops whose value torch leaves partly uninitialised (a tensor grown by resize_, ctc_loss's log_alpha past a sample's
# lengths): ``fn(node, torch_args, value)`` is torch's value with those elements as the lowering makes them, so the
# node-by-node check (``interpreter._verify``) holds a lowering to what torch defines, and the nodes after it read
# the same values on both sides.
PARTLY_UNINITIALISED: dict[str, Callable] = {}


def _partly_uninitialised(*names: str):
    def register(fn):
        for name in names:
            PARTLY_UNINITIALISED[name] = fn
        return fn

    return register


@lower("aten.resize.default", "aten.resize_.default")
def resize(ctx, self, size, memory_format=None):
    """``self.resize_(size)`` made functional: ``self``'s leading elements, row-major, in the new shape.

    torch keeps the storage: the first min(old, new) elements of the result
    are ``self``'s in row-major order (its storage order, for the contiguous
    tensor the check requires).  Where the tensor grows, torch leaves memory
    uninitialised: its values there are undefined (whatever the allocator
    held), so a model that reads them before writing them has a bug of its
    own, and the lowering gives zeros, as ``aten.empty`` does.  A legacy
    ``autograd.Function`` traced as written makes its outputs so
    (``input.new().resize_as_(input)``, filled through ``out=``).
    """
    size = tuple(int(s) for s in size)
    _resizable(ctx, self)
    n, have = math.prod(size), math.prod(o.shape_of(self))
    keep = builtins.min(n, have)
    if keep == 0:
        return np.zeros(size, dtype=np.dtype(o.dtype_of(self)))
    flat = o.getitem(o.reshape(self, (have,)), slice(0, keep))
    if keep < n:  # the grown part: zeros, no gradient (torch's values there are undefined)
        flat = o.concatenate([flat, o.asarray(np.zeros(n - keep, dtype=np.dtype(o.dtype_of(self))), like=flat)])
    return o.reshape(flat, size)


@lower("aten.resize_as.default", "aten.resize_as_.default")
def resize_as(ctx, self, the_template, memory_format=None):
    """``self.resize_as_(the_template)``: ``self`` resized to the template's shape (``resize``); the template's
    values are not read."""
    return resize(ctx, self, o.shape_of(the_template), memory_format)


def _resizable(ctx, self):
    """Refuse a resize of a non-contiguous tensor, whose kept elements are torch's storage order, not row-major
    (the graph records the strides torch traced the node's input with)."""
    node = getattr(ctx, "node", None)
    src = node.args[0] if node is not None and node.args else None
    val = _traced_value(src) if hasattr(src, "meta") else None
    if val is not None and hasattr(val, "is_contiguous") and val.numel() > 0 and not val.is_contiguous():
        _unsupported(ctx.op, "a non-contiguous tensor to resize",
                     "torch keeps its storage order, not the row-major order the lowering keeps (a contiguous "
                     "tensor's resize is lowered)")


@_partly_uninitialised("aten.resize.default", "aten.resize_.default", "aten.resize_as.default",
                       "aten.resize_as_.default")
def _grown_as_lowered(node, args, value):
    """torch's resized value with the grown elements zeros, as the lowering gives them: only the kept ones are
    torch's to define.  The input's size is the one traced (``resize_`` has already resized ``args[0]``)."""
    src = _traced_value(node.args[0]) if node.args else None
    keep = src.numel() if hasattr(src, "numel") else value.numel()
    if keep >= value.numel():
        return value
    out = value.detach().clone()
    out.view(-1)[keep:] = 0  # a resize's result is contiguous: view(-1) is its row-major order
    return out


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


lower("aten.tril.default")(_triangle(True))
lower("aten.triu.default")(_triangle(False))


# ---------------------------------------------------------------- dtype, copies, views
@lower("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout")
def to_copy(ctx, self, dtype=None, **_):
    if dtype is None:
        return self
    dt = _f(ctx, dtype)
    return self if np.dtype(o.dtype_of(self)) == dt else o.astype(self, dt)


def _identity(ctx, self, *args, **kwargs):
    return self


lower("aten.clone.default", "aten.alias.default", "aten.lift_fresh_copy.default", "aten.contiguous.default")(
    _identity)


@lower("aten.detach.default")
def detach(ctx, self):
    # On numpy too: the referee holds every stop_gradient's value fixed at the case point (gradcheck.check.kinks).
    return o.stop_gradient(self) if _carries_gradient(self) or isinstance(self, np.ndarray) else self


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


@lower("aten.unfold.default")
def unfold(ctx, self, dimension, size, step):
    """``Tensor.unfold``: windows of ``size`` every ``step`` along ``dimension``, as a new last dimension
    (PatchTST's patches).  A gather, so overlapping windows add up their gradients, as torch's backward does."""
    shape = o.shape_of(self)
    if not shape:
        _unsupported("aten.unfold", "a 0-d tensor")
    nd, d = len(shape), dimension % len(shape)
    starts = np.arange((shape[d] - size) // step + 1) * step  # every window lies inside: no -1 among them
    windows = o.take(self, _windows(starts, size, shape[d]), axis=d)  # shape[:d] + (n, size) + shape[d + 1:]
    return o.transpose(windows, tuple(range(d + 1)) + tuple(range(d + 2, nd + 1)) + (d + 1,))


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


@lower("aten.diagonal.default", "aten.diagonal_copy.default")
def diagonal(ctx, self, offset=0, dim1=0, dim2=1):
    """The diagonal of dims ``dim1`` and ``dim2`` (above it for ``offset`` > 0, below for < 0), as the last dim and
    the others in order, as torch's view: those two dims moved last, then indexed at (i, i + offset)."""
    shape = o.shape_of(self)
    nd = len(shape)
    d1, d2 = dim1 % nd, dim2 % nd
    rest = [d for d in range(nd) if d not in (d1, d2)]
    x = o.transpose(self, tuple(rest + [d1, d2]))
    n1, n2 = shape[d1], shape[d2]
    length = max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))
    i = np.arange(length)
    rows, cols = (i, i + offset) if offset >= 0 else (i - offset, i)
    return o.getitem(x, (Ellipsis, rows, cols))


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
    # A 0-d index selects one entry and keeps the dim (torch reads it as a 1-d index of length one).
    if len(o.shape_of(index)) == 0:
        index = _logic(index).reshape(_raw(index), (1,))
    return o.take(self, index, axis=dim)


@lower("aten.as_strided.default", "aten.as_strided_copy.default")
def as_strided(ctx, self, size, stride, storage_offset=None):
    """Element ``i`` of the view is the element at storage position ``offset + sum_k i_k stride_k``.

    The positions are in ``self``'s storage as torch laid it out when the
    graph was traced (``_layout``: a transposed tensor is not stored
    row-major, and Longformer's chunking views one so); a graph's value is
    the logical array, read back in that order.  A gather, so overlapping
    windows add up their gradients, as torch's backward does.
    """
    shape = o.shape_of(self)
    layout = _layout(ctx, shape)
    if storage_offset is None:  # torch takes self's own
        storage_offset = layout[1] if layout is not None else 0
    index = _positions(size, stride, storage_offset)
    if layout is not None and not (layout[1] == 0 and all(
            s == r for n, s, r in zip(shape, layout[0], _row_major(shape)) if n > 1)):
        stored = _positions(shape, *layout).reshape(-1)
        element = np.full(int(stored.max(initial=-1)) + 1, -1, dtype=np.int64)  # storage position -> element
        element[stored] = np.arange(stored.size)
        if index.size and (int(index.max()) >= element.size or (element[index] < 0).any()):
            raise LoweringError("aten.as_strided reads storage that is not the tensor's own elements "
                                "(a view of part of a larger tensor)")
        index = element[index]
    return o.take(o.reshape(self, (-1,)), index, axis=0)


def _layout(ctx, shape) -> tuple | None:
    """``(strides, storage offset)`` torch gave the first argument of ``ctx``'s node when it was traced, or
    None where the graph does not record them."""
    node = getattr(ctx, "node", None)
    val = _traced_value(node.args[0] if node is not None and node.args else None)
    if val is None or not hasattr(val, "stride") or tuple(val.shape) != tuple(shape):
        return None
    return tuple(int(s) for s in val.stride()), int(val.storage_offset())


def _positions(shape, strides, offset) -> np.ndarray:
    """The storage position of each element of a strided view, in row-major order of the view."""
    nd = len(shape)
    out = np.full(tuple(shape), int(offset), dtype=np.int64)
    for k, (n, s) in enumerate(zip(shape, strides)):
        out = out + np.arange(n).reshape((1,) * k + (n,) + (1,) * (nd - k - 1)) * int(s)
    return out


def _row_major(shape) -> tuple:
    strides, step = [], 1
    for n in reversed(tuple(shape)):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


@lower("aten.gather.default")
def gather(ctx, self, dim, index, sparse_grad=False):
    """``out[..., i, ...] = self[..., index[..., i, ...], ...]`` along ``dim``: one advanced index per axis."""
    shape = o.shape_of(index)
    nd = len(shape)
    dim %= nd
    parts = tuple(index if d == dim else np.arange(shape[d]).reshape((1,) * d + (shape[d],) + (1,) * (nd - d - 1))
                  for d in range(nd))
    return o.getitem(self, parts)


# ---------------------------------------------------------------- scatters (writes at positions, made functional)
def _scatter(ctx, self, index: tuple, values, accumulate: bool):
    """``self`` with ``values`` written at ``self[index]`` (added there, with ``accumulate``), as a new array.

    ``index`` is numpy's (ints, slices, integer or bool arrays; ATen's None
    already a full slice).  Where the positions are known (constants, or the
    values of a tape or numpy run) the write is a gather from ``self`` and
    ``values`` side by side, linear in both; repeated positions add up
    (``_segment_sum``).  Positions traced by jax (computed from its inputs)
    go to jax's own scatter, ``.at[index].add`` / ``.set``.
    """
    from gradcheck.ops import rules as common

    items, traced = [], False
    for i in index:
        if i is None or isinstance(i, (slice, int, np.integer)):
            items.append(i)
            continue
        known = common.concrete(_raw(i))
        traced = traced or known is None
        items.append(i if known is None else known)
    if traced:
        return _scatter_traced(ctx.op, self, items, values, accumulate)
    shape = o.shape_of(self)
    size = int(np.prod(shape, dtype=np.int64))
    written = np.arange(size).reshape(shape)[tuple(items)]  # the flat position of each element written
    positions = written.reshape(-1)
    if positions.size == 0:
        return self
    if isinstance(values, (bool, int, float)):
        values = np.asarray(values, dtype=o.dtype_of(self))
    flat = o.reshape(o.broadcast_to(_scalar_or_const(ctx, values), written.shape), (-1,))
    if accumulate:
        return o.add(self, o.reshape(_segment_sum(flat, positions, size), shape))
    if np.unique(positions).size != positions.size and not _same_at_repeats(flat, positions):
        _unsupported(ctx.op, "different values written at one position",
                     "torch keeps one of them, and which one is not defined")
    gather = np.arange(size)
    gather[positions] = size + np.arange(positions.size)  # the last write at a repeated position, all equal
    return o.reshape(o.take(o.concatenate([o.reshape(self, (-1,)), flat]), gather, axis=0), shape)


def _scatter_traced(op, self, items, values, accumulate):
    """``_scatter`` at positions jax traces: jax's own scatter; a boolean mask (``x[x > 0] = v``) as a ``where``,
    which needs the value to broadcast over the masked elements (their number is not known while traced)."""
    import jax.numpy as jnp

    masks = [i for i in items if hasattr(i, "dtype") and np.dtype(o.dtype_of(i)) == np.bool_]
    if not masks:
        at = jnp.asarray(self).at[tuple(items)]
        return at.add(values) if accumulate else at.set(values)
    (mask,) = masks
    rest = len(o.shape_of(self)) - len(o.shape_of(mask))
    if len(items) != 1 or len(o.shape_of(values)) > rest + (1 if o.shape_of(values)[:1] == (1,) else 0):
        _unsupported(op, "a traced boolean mask and one value per masked element",
                     "their number is not known while jax traces")
    where = jnp.reshape(mask, tuple(o.shape_of(mask)) + (1,) * rest)
    value = jnp.reshape(jnp.asarray(values), tuple(o.shape_of(values))[-rest:] if rest else ())
    return jnp.where(where, (self + value) if accumulate else value, self)


def _same_at_repeats(flat, positions) -> bool:
    """Whether every position written more than once gets one value (constants only: a traced value may not)."""
    if _carries_gradient(flat):
        return False
    values = np.asarray(flat)
    order = np.argsort(positions, kind="stable")
    p, v = positions[order], values[order]
    repeat = p[1:] == p[:-1]
    return bool(np.all(v[1:][repeat] == v[:-1][repeat]))


def _segment_sum(values, positions: np.ndarray, size: int):
    """For every p < ``size``, the sum of ``values[k]`` over the k with ``positions[k] == p`` (0 where none).

    A gather of each position's values into a row, padded with a zero, then
    a sum along the row: linear in ``values``, so its gradient is the gather
    back, and a repeated position adds up, as torch's ``index_put(...,
    accumulate=True)``, ``scatter_add`` and ``index_add`` do.
    """
    n = positions.size
    counts = np.bincount(positions, minlength=size)
    width = int(counts.max(initial=0))
    order = np.argsort(positions, kind="stable")
    slot = (np.cumsum(counts) - counts)[:, None] + np.arange(width)[None, :]
    rows = np.where(np.arange(width)[None, :] < counts[:, None], order[np.minimum(slot, n - 1)], n)
    padded = o.concatenate([values, o.zeros_like(o.getitem(values, slice(0, 1)))])
    return o.sum(o.take(padded, rows, axis=0), axis=1)


def _along(shape, dim: int, index) -> tuple:
    """The numpy index of ``scatter``/``gather`` along ``dim``: ``index`` there, each other axis's own positions."""
    nd = len(shape)
    return tuple(index if d == dim else np.arange(shape[d]).reshape((1,) * d + (shape[d],) + (1,) * (nd - d - 1))
                 for d in range(nd))


@lower("aten.scatter_add.default")
def scatter_add(ctx, self, dim, index, src):
    """``self`` plus ``src[p]`` added at ``p`` with its ``dim`` coordinate replaced by ``index[p]``.

    Repeated positions add up, as torch's do; ``src`` is read where ``index``
    reaches (it may be larger).
    """
    ishape = o.shape_of(index)
    dim %= builtins.max(len(o.shape_of(self)), 1)
    src = o.getitem(src, tuple(slice(0, i) for i in ishape))
    return _scatter(ctx, self, _along(ishape, dim, index), src, accumulate=True)


@lower("aten.scatter.src", "aten.scatter.value")
def scatter(ctx, self, dim, index, src=None, value=None):
    """``self`` with ``src[p]`` (or ``value``) written at ``p`` with its ``dim`` coordinate replaced by ``index[p]``."""
    if ctx.op.endswith(".value") and value is None:  # scatter.value's fourth argument given by position
        src, value = None, src
    ishape = o.shape_of(index)
    dim %= builtins.max(len(o.shape_of(self)), 1)
    values = value if src is None else o.getitem(src, tuple(slice(0, i) for i in ishape))
    return _scatter(ctx, self, _along(ishape, dim, index), values, accumulate=False)


@lower("aten.index_put.default", "aten.index_put_.default")
def index_put(ctx, self, indices, values, accumulate=False):
    """``self[indices] = values`` (``+=`` with ``accumulate``) made functional: item assignment, ``index_add_``."""
    return _scatter(ctx, self, tuple(slice(None) if i is None else i for i in indices), values, accumulate)


@lower("aten.slice_scatter.default")
def slice_scatter(ctx, self, src, dim=0, start=None, end=None, step=1):
    """``self`` with ``src`` written at ``self[..., start:end:step, ...]`` along ``dim`` (slice assignment, circular
    padding)."""
    nd = len(o.shape_of(self))
    return _scatter(ctx, self, _index(nd, dim, slice(start, end, step)), src, accumulate=False)


@lower("aten.select_scatter.default")
def select_scatter(ctx, self, src, dim, index):
    """``self`` with ``src`` written at ``self.select(dim, index)`` (an item assignment made functional where the
    graph is functionalised without decompositions: a module traced as written, ``capture._as_written``)."""
    nd = len(o.shape_of(self))
    return _scatter(ctx, self, _index(nd, dim, int(index)), src, accumulate=False)


@lower("aten.cumsum.default")
def cumsum(ctx, self, dim, dtype=None):
    """A product with the upper-triangular ones matrix along ``dim`` (differentiable wherever matmul is).

    Integer and bool tensors (position ids from an attention mask) are summed
    as integers, exactly, in torch's dtype: int64 unless ``dtype`` says
    otherwise.  They carry no gradient.
    """
    nd = len(o.shape_of(self))
    target = _f(ctx, dtype) if dtype is not None else None
    if np.dtype(o.dtype_of(self)).kind in "biu" and (target is None or target.kind != "f"):
        values = _raw(self)
        return _logic(values).cumsum(values, axis=dim if nd else None, dtype=target or np.int64)
    x = self if target is None else o.astype(self, target)
    if nd == 0:
        return x
    dim %= nd
    n = o.shape_of(self)[dim]
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
    return _pad_or_crop(self, pairs, float(value))


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


@lower("aten.var_mean.correction", "aten.var_mean.dim", "aten.var_mean.default")
def var_mean(ctx, self, dim=None, unbiased=None, keepdim=False, correction=None):
    return var(ctx, self, dim, unbiased, keepdim, correction), o.mean(self, axis=_dims(self, dim), keepdims=keepdim)


@lower("aten.std.correction", "aten.std.dim", "aten.std.default")
def std(ctx, self, dim=None, unbiased=None, keepdim=False, correction=None):
    return o.sqrt(var(ctx, self, dim, unbiased, keepdim, correction))


@lower("aten.linalg_vector_norm.default")
def linalg_vector_norm(ctx, self, ord=2, dim=None, keepdim=False, dtype=None):  # noqa: A002
    """``||x||_ord`` over ``dim`` (all dims when None): 2, 1, inf, -inf, 0 (a count), any other p as ``(sum |x|^p)^(1/p)``."""
    x = self if dtype is None else o.astype(self, _f(ctx, dtype))
    axis = _dims(x, dim)
    if ord == 2:
        return _root_at_zero(o.sum(o.mul(x, x), axis=axis, keepdims=keepdim), o.sqrt)
    if ord in (math.inf, -math.inf):
        return (o.max if ord > 0 else o.min)(o.abs(x), axis=axis, keepdims=keepdim)
    if ord == 1:
        return o.sum(o.abs(x), axis=axis, keepdims=keepdim)
    if ord != 0:
        return _root_at_zero(o.sum(o.pow(o.abs(x), float(ord)), axis=axis, keepdims=keepdim),
                             lambda s: o.pow(s, 1.0 / ord))
    # ord 0 counts the non-zero elements: piecewise constant, so no gradient flows (torch's is 0 too).
    xp = _logic(x)
    return xp.sum(_raw(x) != 0, axis=axis, keepdims=keepdim).astype(ctx.floats)


def _root_at_zero(total, root):
    """``root(total)``, and 0 with a gradient of 0 where ``total`` is 0: torch's subgradient of a norm at a zero
    vector (a padding row's embedding), where the root's own derivative is infinite and sends NaN back."""
    xp = _logic(total)
    zero = xp.equal(_raw(total), 0.0)
    return o.where(zero, 0.0, root(o.where(zero, 1.0, total)))


@lower("aten.sign.default")
def sign(ctx, self):
    """-1, 0 or 1; piecewise constant, so no gradient flows (torch's too)."""
    dt = o.dtype_of(self)
    return o.sub(o.astype(o.greater(self, 0.0), dt), o.astype(o.less(self, 0.0), dt))


@lower("aten.fmod.Scalar", "aten.fmod.Tensor", "aten.remainder.Scalar", "aten.remainder.Tensor")
def fmod(ctx, self, other):
    """``self - other * q``, ``q`` the quotient rounded towards 0 (fmod) or down (remainder), as a step.

    Constants (torch.roll's gather indices, an fmod of an arange) are
    computed exactly by numpy; a value that carries a gradient gets torch's:
    1 for ``self``, ``-q`` for ``other``.
    """
    rounding = "trunc" if "fmod" in ctx.op else "floor"
    if not (_carries_gradient(self) or _carries_gradient(other)):
        xp = _logic(self, other)
        return (xp.fmod if rounding == "trunc" else xp.remainder)(_raw(self), _raw(other))
    return o.sub(self, o.mul(other, _quotient(self, other, rounding)))


@lower("aten.amax.default")
def amax(ctx, self, dim=(), keepdim=False):
    return o.max(self, axis=_dims(self, dim), keepdims=keepdim)


@lower("aten.amin.default")
def amin(ctx, self, dim=(), keepdim=False):
    return o.min(self, axis=_dims(self, dim), keepdims=keepdim)


@lower("aten.max.default")
def max_all(ctx, self):
    """The largest element (Nystromformer's scaling): torch shares the gradient among ties, as amax does."""
    return o.max(self, axis=None)


@lower("aten.min.default")
def min_all(ctx, self):
    return o.min(self, axis=None)


@lower("aten.max.dim")
def max_dim(ctx, self, dim, keepdim=False):
    return o.max(self, axis=dim, keepdims=keepdim), _arg("argmax")(ctx, self, dim, keepdim)


@lower("aten.min.dim")
def min_dim(ctx, self, dim, keepdim=False):
    return o.min(self, axis=dim, keepdims=keepdim), _arg("argmin")(ctx, self, dim, keepdim)


def _arg(name):
    """argmax/argmin: the first position of the extreme value (NaN counts as the largest), as torch's indices."""

    def fn(ctx, self, dim=None, keepdim=False):
        return getattr(_logic(self), name)(_raw(self), axis=dim, keepdims=keepdim)

    return fn


lower("aten.argmax.default")(_arg("argmax"))
lower("aten.argmin.default")(_arg("argmin"))


def _over_a_0d(fn, x, dim):
    """``fn(x, axis=dim)``, and for a 0-d tensor (torch takes dim 0 or -1 of it) over the one element it has."""
    if o.shape_of(x):
        return fn(x, axis=dim)
    return o.reshape(fn(o.reshape(x, (1,)), axis=0), ())


@lower("aten._softmax.default", "aten.softmax.int")
def softmax(ctx, self, dim, half_to_float=False, dtype=None):
    return _over_a_0d(o.softmax, self, dim)


@lower("aten._safe_softmax.default")
def safe_softmax(ctx, self, dim, dtype=None):
    """softmax over ``dim``, and 0 over a slice that is -inf throughout (an attention row with every key masked),
    as torch's kernel computes it, with its gradient there 0.  The slice is made 0 before the softmax as well as
    after it: through a ``where`` after it alone, the softmax of a -inf slice (NaN) times the cotangent's 0 sends
    NaN back, where torch's gradient is 0 (why the capture keeps this op whole, ``capture.decomposition_table``)."""
    x = self if dtype is None else o.astype(self, _f(ctx, dtype))
    xp = _logic(x)
    raw = _raw(x)
    dead = xp.all(xp.isneginf(raw), axis=dim, keepdims=True) if o.shape_of(x) else xp.isneginf(raw)
    y = _over_a_0d(o.softmax, o.where(dead, 0.0, x), dim)
    return o.where(dead, 0.0, y)


@lower("aten._log_softmax.default", "aten.log_softmax.int")
def log_softmax(ctx, self, dim, half_to_float=False, dtype=None):
    return _over_a_0d(o.log_softmax, self, dim)


@lower("aten.prod.dim_int", "aten.prod.default")
def prod(ctx, self, dim=None, keepdim=False, dtype=None):
    """``torch.prod``; an integer or bool tensor's product is int64, as torch's."""
    x = self if dtype is None else o.astype(self, _f(ctx, dtype))
    if np.dtype(o.dtype_of(x)).kind in "biu" and np.dtype(o.dtype_of(x)) != np.int64:
        x = o.astype(x, np.int64)  # before the product, which int32 would overflow
    return o.prod(x, axis=None if dim is None else dim % builtins.max(len(o.shape_of(x)), 1), keepdims=keepdim)


def _sorted(ctx, self, k, dim, largest):
    """``ops.topk`` along ``dim``; a 0-d tensor as the one element along its dim 0, as torch treats it."""
    if o.shape_of(self):
        return o.topk(self, k, dim, largest)
    values, indices = o.topk(o.reshape(self, (1,)), k, 0, largest)
    return o.reshape(values, ()), indices.reshape(()) if k else indices


@lower("aten.topk.default")
def topk(ctx, self, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    # sorted=False leaves the order to the kernel; torch's CPU kernel returns it sorted as well, and the
    # lowering check holds the order to torch's.
    return _sorted(ctx, self, k, dim, largest)


@lower("aten.sort.default", "aten.sort.stable")
def sort(ctx, self, dim=-1, descending=False, stable=None):
    n = o.shape_of(self)[dim] if o.shape_of(self) else 1
    return _sorted(ctx, self, n, dim, descending)


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


@lower("aten.addmv.default")
def addmv(ctx, self, mat, vec, beta=1, alpha=1):
    """``beta * self + alpha * (mat @ vec)``; with beta 0, ``self`` is not read (torch's rule: NaN there is dropped)."""
    return addmm(ctx, self, mat, vec, beta, alpha)


@lower("aten.addbmm.default")
def addbmm(ctx, self, batch1, batch2, beta=1, alpha=1):
    """``beta * self + alpha * sum_b batch1[b] @ batch2[b]``: the batched products summed over the batch."""
    prod = o.sum(o.matmul(batch1, batch2), axis=0)
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


@lower("aten._trilinear.default")
def trilinear(ctx, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """``sum over sumdim of i1 * i2 * i3``, each unsqueezed at its ``expand`` dims first (``nn.Bilinear``): one einsum.

    Every dim of the product gets a letter; an input names the dims it was
    not unsqueezed at, and one that is size 1 where another is not is
    broadcast first (an einsum index has one size).
    """
    import string

    inputs, expands = (i1, i2, i3), (expand1, expand2, expand3)
    nd = len(o.shape_of(i1)) + len(expand1)
    kept = [[d for d in range(nd) if d not in set(e)] for e in expands]
    sizes = [1] * nd
    for x, dims in zip(inputs, kept):
        for d, n in zip(dims, o.shape_of(x)):
            sizes[d] = builtins.max(sizes[d], n)
    operands = [o.broadcast_to(x, tuple(sizes[d] for d in dims)) for x, dims in zip(inputs, kept)]
    letters = string.ascii_letters
    terms = ["".join(letters[d] for d in dims) for dims in kept]
    out = "".join(letters[d] for d in range(nd) if d not in set(sumdim))
    return o.einsum(",".join(terms) + "->" + out, *operands)


# ---------------------------------------------------------------- neural-network ops
def _pair(v, n=2):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(v * n if len(v) == 1 else v)


def _convolve(x, w, bias, stride, padding, dilation, groups, transposed=False, output_padding=0):
    """torch's convolution, plain or transposed, 1-d to 3-d, batched or not: ``ops.conv``/``ops.conv_transpose``.

    An unbatched input (C, L...) is a batch of one, as torch takes it; a 3-d
    one is a sum of 2-d ones over the depth taps (``_conv3d``).
    """
    nd = len(o.shape_of(w)) - 2
    if len(o.shape_of(x)) == nd + 1:
        y = _convolve(o.expand_dims(x, 0), w, bias, stride, padding, dilation, groups, transposed, output_padding)
        return o.squeeze(y, 0)
    pad = padding if isinstance(padding, str) else _pair(padding, nd)
    stride, dilation, output_padding = _pair(stride, nd), _pair(dilation, nd), _pair(output_padding, nd)
    if nd == 3:
        if isinstance(pad, str):
            _unsupported("a 3-d convolution", f"padding={pad!r}", "torch.export writes it out as numbers")
        if transposed:
            return _conv_transpose3d(x, w, bias, stride, pad, output_padding, dilation, groups)
        return _conv3d(x, w, bias, stride, pad, dilation, groups)
    if transposed:
        return o.conv_transpose(x, w, bias, stride=stride, padding=pad, output_padding=output_padding,
                                dilation=dilation, groups=groups)
    return o.conv(x, w, bias, stride=stride, padding=pad, dilation=dilation, groups=groups)


def _depth_taps(x, taps: int, start_step: int, stride: int, count: int):
    """The (N*count, C, H, W) slabs of an (N, C, D, H, W) array that depth tap ``j`` reads, for ``j < taps``:
    depths ``j * start_step + i * stride`` for ``i < count``, with the depths folded into the batch."""
    n, c, _, h, w = o.shape_of(x)
    for j in range(taps):
        first = j * start_step
        slab = o.getitem(x, (slice(None), slice(None), slice(first, first + stride * (count - 1) + 1, stride)))
        yield o.reshape(o.transpose(slab, (0, 2, 1, 3, 4)), (n * count, c, h, w))


def _unfold_depth(y, n: int, count: int):
    """(N*count, C, H, W) back to (N, C, count, H, W)."""
    _, c, h, w = o.shape_of(y)
    return o.transpose(o.reshape(y, (n, count, c, h, w)), (0, 2, 1, 3, 4))


def _bias3d(y, bias):
    return y if bias is None else o.add(y, o.reshape(bias, (1, -1, 1, 1, 1)))


def _conv3d(x, w, bias, stride, padding, dilation, groups):
    """A 3-d convolution as the sum over its depth taps of 2-d convolutions (``ops.conv``, each backend's kernel:
    ``lax.conv_general_dilated`` on jax) of the depth slices each tap reads: the same sum, in another order."""
    (sd, sh, sw), (pd, ph, pw), (dd, dh, dw) = stride, padding, dilation
    n, depth = o.shape_of(x)[0], o.shape_of(x)[2]
    kd = o.shape_of(w)[2]
    xp = o.pad(x, ((0, 0), (0, 0), (pd, pd), (0, 0), (0, 0))) if pd else x
    od = (depth + 2 * pd - dd * (kd - 1) - 1) // sd + 1
    out = None
    for j, slab in enumerate(_depth_taps(xp, kd, dd, sd, od)):
        y = o.conv(slab, o.getitem(w, (slice(None), slice(None), j)), None, stride=(sh, sw), padding=(ph, pw),
                   dilation=(dh, dw), groups=groups)
        out = y if out is None else o.add(out, y)
    return _bias3d(_unfold_depth(out, n, od), bias)


def _conv_transpose3d(x, w, bias, stride, padding, output_padding, dilation, groups):
    """A 3-d transposed convolution: each depth tap's 2-d transposed convolution of every input depth, placed at
    depth ``i * stride + j * dilation`` of the full output, summed, then cropped by the padding (``output_padding``
    extends the far side) -- the adjoint of ``_conv3d``'s sum."""
    (sd, sh, sw), (pd, ph, pw), (opd, oph, opw), (dd, dh, dw) = stride, padding, output_padding, dilation
    n, _, depth = o.shape_of(x)[:3]
    kd = o.shape_of(w)[2]
    full = (depth - 1) * sd + dd * (kd - 1) + 1 + opd
    out = None
    for j, slab in enumerate(_depth_taps(x, kd, 0, 1, depth)):
        y = _unfold_depth(o.conv_transpose(slab, o.getitem(w, (slice(None), slice(None), j)), None, stride=(sh, sw),
                                           padding=(ph, pw), output_padding=(oph, opw), dilation=(dh, dw),
                                           groups=groups), n, depth)
        if sd > 1:  # stride: the input depths land every sd-th output depth
            y = o.stack([y] + [o.zeros_like(y)] * (sd - 1), axis=3)
            shape = o.shape_of(y)
            y = o.getitem(o.reshape(y, shape[:2] + (shape[2] * sd,) + shape[4:]),
                          (slice(None), slice(None), slice(0, (depth - 1) * sd + 1)))
        start = j * dd
        y = o.pad(y, ((0, 0), (0, 0), (start, full - start - (depth - 1) * sd - 1), (0, 0), (0, 0)))
        out = y if out is None else o.add(out, y)
    out = o.getitem(out, (slice(None), slice(None), slice(pd, full - pd)))
    return _bias3d(out, bias)


@lower("aten.convolution.default")
def convolution(ctx, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):  # noqa: A002
    return _convolve(input, weight, bias, stride, padding, dilation, groups, transposed, output_padding)


@lower("aten.conv1d.default", "aten.conv2d.default", "aten.conv1d.padding", "aten.conv2d.padding")
def conv(ctx, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    return _convolve(input, weight, bias, stride, padding, dilation, groups)


@lower("aten.conv_transpose1d.default", "aten.conv_transpose2d.input")
def conv_transpose(ctx, input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,  # noqa: A002
                   dilation=1):
    return _convolve(input, weight, bias, stride, padding, dilation, groups, True, output_padding)


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
    """The rows of ``weight`` at ``indices``, with the gradient torch's backward declares.

    Two conventions of torch's are not derivatives of the forward: the
    ``padding_idx`` row gets no gradient, and ``scale_grad_by_freq`` divides
    each row's gradient by how often the batch looks it up.  The value is the
    rows exactly; the gradient goes through ``(out - stop(out)) * s`` with
    ``s`` 0 at padding positions and ``1 / count`` per looked-up row, so the
    tape and jax follow torch, and the referee, which holds every
    ``stop_gradient`` fixed at the case point, measures the same derivative.
    (``sparse=True`` changes only the gradient's storage.)
    """
    out = o.take(weight, indices, axis=0)
    pad = None if padding_idx is None or padding_idx < 0 else int(padding_idx)
    if pad is None and not scale_grad_by_freq:
        return out
    xp = _logic(indices)
    ids = xp.asarray(_raw(indices))
    scale = xp.ones(ids.shape, dtype=ctx.floats)
    if scale_grad_by_freq:
        rows = o.shape_of(weight)[0]
        counts = np.bincount(ids.ravel(), minlength=rows) if xp is np else xp.bincount(ids.ravel(), length=rows)
        scale = 1.0 / counts[ids].astype(ctx.floats)
    if pad is not None:
        scale = xp.where(ids == pad, 0.0, scale)
    held = o.stop_gradient(out)
    return o.add(held, o.mul(o.sub(out, held), o.asarray(scale[..., None], like=out) if xp is np else scale[..., None]))


@lower("aten.embedding_renorm.default")
def embedding_renorm(ctx, self, indices, max_norm, norm_type):
    """``max_norm``: each looked-up row whose ``norm_type``-norm exceeds ``max_norm`` scaled to it, torch's way.

    torch renormalises the table in place under ``no_grad`` and then
    differentiates the lookup as if the renormalised table were the
    parameter: the value is the renormalised table, the gradient the
    identity (held with ``stop_gradient``, which the referee holds too).
    """
    xp = _logic(self, indices)
    w = xp.asarray(_raw(self))
    looked = xp.zeros(w.shape[0], dtype=bool).at[xp.asarray(indices).ravel()].set(True) if xp is not np else (
        np.isin(np.arange(w.shape[0]), np.asarray(indices)))
    norms = xp.sum(xp.abs(w) ** norm_type, axis=1) ** (1.0 / norm_type)
    factor = xp.where(looked & (norms > max_norm), max_norm / (norms + 1e-7), 1.0)
    change = o.mul(self, o.asarray((factor - 1.0)[:, None].astype(w.dtype), like=self) if xp is np
                   else (factor - 1.0)[:, None].astype(w.dtype))
    return o.add(self, o.stop_gradient(change))


@lower("aten.native_dropout.default")
def native_dropout(ctx, input, p, train):  # noqa: A002
    """The case's keep mask for this node (``randomness.keep_factors`` of its draw): torch's run gets the same."""
    if not train or p == 0:
        return input, Unavailable("the mask of aten.native_dropout")
    if p >= 1:
        return o.mul(input, 0.0), Unavailable("the mask of aten.native_dropout")
    factors = _randomness().keep_factors(ctx.draw("uniform", o.shape_of(input)), p)
    return o.mul(input, o.asarray(factors, like=input)), Unavailable("the mask of aten.native_dropout")


def _randomness():
    from gradcheck.frontends.torch import randomness

    return randomness


@lower("aten.dropout.default")
def dropout(ctx, input, p, train):  # noqa: A002
    return native_dropout(ctx, input, p, train)[0]


# ---------------------------------------------------------------- pooling
def _batched(x, nd: int):
    """``(x, False)``, or an unbatched (C, spatial...) input as a batch of one and True (torch takes both)."""
    if len(o.shape_of(x)) == nd + 1:
        return o.expand_dims(x, 0), True
    return x, False


def _unbatched(y, was: bool):
    return o.squeeze(y, 0) if was else y


def _pool_extent(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> tuple[int, int, int]:
    """``(out, before, after)``: torch's output size along one dim, and the padding that makes the input exactly
    as long as its windows reach (``after`` below 0 crops rows no window reads).

    torch's ``pooling_output_shape``: ``(size + 2p - d(k-1) - 1) / s + 1`` windows, rounded down, or up with
    ``ceil_mode``, less one if that last window would start past the input and its left padding.
    """
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out, p, (out - 1) * s + d * (k - 1) + 1 - size - p


def _pad_or_crop(x, pairs, value=0.0):
    """``x`` padded with ``value`` by (before, after) per trailing dim; a negative width crops instead."""
    shape = o.shape_of(x)
    pairs = [(0, 0)] * (len(shape) - len(pairs)) + list(pairs)
    if any(a < 0 or b < 0 for a, b in pairs):
        x = o.getitem(x, tuple(slice(-builtins.min(a, 0), n + builtins.min(b, 0)) for (a, b), n in zip(pairs, shape)))
        pairs = [(builtins.max(a, 0), builtins.max(b, 0)) for a, b in pairs]
    return o.pad(x, tuple(pairs), value=value) if any(a or b for a, b in pairs) else x


def _pool_args(nd, kernel_size, stride, padding, dilation=1):
    k = _pair(kernel_size, nd)
    return k, _pair(stride, nd) if stride else k, _pair(padding, nd), _pair(dilation, nd)


def _below(x):
    """A finite value below every finite element of ``x``: the padding of a max pool, which no window's maximum
    is (every window holds an element of the input).

    Not -inf, which torch pads with: the kink record of the max pool and of
    the comparisons measures distances against its input's largest magnitude,
    and an infinity there would put every element at distance 0.
    """
    from gradcheck.ops import rules as common

    v = common.concrete(x)
    if v is None:  # traced (jax): the same bound, held constant
        import jax
        import jax.numpy as jnp

        lo = jnp.min(jnp.where(jnp.isfinite(x), x, 0))
        return jax.lax.stop_gradient(lo - (jnp.abs(lo) + 1))
    finite = v[np.isfinite(v)]
    lo = float(finite.min()) if finite.size else 0.0
    return lo - (abs(lo) + 1.0)


def _max_pool(x, nd, k, s, p, d, ceil_mode):
    """torch's max pooling on (N, C, spatial...), 2-d or 3-d: the input padded (``_below``) as far as its windows
    reach, then ``_max_pool2d`` per depth tap (3-d), the first maximum along depth kept (ties go to the earlier
    tap, as torch's row-major scan gives them)."""
    geometry = [_pool_extent(n, *a, ceil_mode) for n, a in zip(o.shape_of(x)[2:], zip(k, s, p, d))]
    xp = _pad_or_crop(x, [(b, a) for _, b, a in geometry], _below(x))
    if nd == 2:
        return _max_pool2d(xp, k, s, d)
    od = geometry[0][0]
    out = None
    for slab in _depth_taps(xp, k[0], d[0], s[0], od):
        y = _max_pool2d(slab, k[1:], s[1:], d[1:])
        out = y if out is None else o.where(o.greater(y, out), y, out)
    return _unfold_depth(out, o.shape_of(x)[0], od)


def _max_pool2d(x, k, s, d):
    """``ops.max_pool2d`` (``lax.reduce_window`` on jax) of an input exactly as long as its windows reach.

    With a dilation, window ``i`` reads ``x[i*s + j*d]``: phase ``(i*s) % d``
    of the input (every d-th row from an offset), at ``(i*s) // d + j``
    there.  So each phase is pooled undilated at stride 1, and each output
    is picked from its phase; the picks are a gather, whose gradient goes to
    the element its window's maximum is.
    """
    if tuple(d) == (1, 1):
        return o.max_pool2d(x, tuple(k), tuple(s), 0)
    (h, w), (dh, dw) = o.shape_of(x)[2:], d
    x = _pad_or_crop(x, [(0, -h % dh), (0, -w % dw)], _below(x))  # every phase equally long
    phases = [o.max_pool2d(o.getitem(x, (slice(None), slice(None), slice(a, None, dh), slice(b, None, dw))),
                           tuple(k), 1, 0) for a in range(dh) for b in range(dw)]
    rows = np.arange((h - dh * (k[0] - 1) - 1) // s[0] + 1) * s[0]
    cols = np.arange((w - dw * (k[1] - 1) - 1) // s[1] + 1) * s[1]
    phase = (rows % dh)[:, None] * dw + (cols % dw)[None, :]
    return o.getitem(o.stack(phases, axis=2), (slice(None), slice(None), phase, (rows // dh)[:, None],
                                                (cols // dw)[None, :]))


def _windows(starts, length: int, size: int, step: int = 1):
    """(..., out, length) positions each window reads along one dim; -1 outside ``[0, size)`` (padding).

    ``starts`` may be traced (jax): fractional pooling's come from its samples.
    """
    xp = _logic(starts)
    pos = xp.asarray(starts)[..., None] + np.arange(length) * step
    return xp.where((pos >= 0) & (pos < size), pos, -1)


def _strided_windows(size, k, s, p, d, ceil_mode) -> np.ndarray:
    out = _pool_extent(size, k, s, p, d, ceil_mode)[0]
    return _windows(np.arange(out) * s - p, k, size, d)


def _adaptive_windows(size: int, out: int) -> np.ndarray:
    """torch's adaptive bins ``[floor(i*size/out), ceil((i+1)*size/out))``, as positions (-1 past a short bin)."""
    i = np.arange(out)
    starts, ends = (i * size) // out, -((-(i + 1) * size) // out)
    pos = _windows(starts, int((ends - starts).max()), size)
    return np.where(pos < ends[:, None], pos, -1)


def _window_max(x, axis: int, windows: np.ndarray):
    """The maximum of ``x`` over each window of positions along ``axis`` of (N, C, ...), the first one at ties.

    ``windows`` is (out, L) or, one set per plane, (N, C, out, L), numpy or
    traced (jax); -1 marks no element, never in a window's first slot.  A
    gather of the windows, then a running maximum over the slots that keeps
    the earlier element at a tie, as torch's scan does (the gradient goes to
    that element); a missing element leaves the maximum as it is.
    """
    shape = o.shape_of(x)
    n, c = shape[0], shape[1]
    xp = _logic(windows)
    order = (0, 1, axis) + tuple(a for a in range(2, len(shape)) if a != axis)
    w = xp.broadcast_to(windows, (n, c) + tuple(windows.shape[-2:]))
    g = o.getitem(o.transpose(x, order), (np.arange(n)[:, None, None, None], np.arange(c)[None, :, None, None],
                                         xp.maximum(w, 0)))
    out = o.getitem(g, (slice(None),) * 3 + (0,))
    for j in range(1, w.shape[-1]):
        present = (w[..., j] >= 0).reshape(tuple(w.shape[:3]) + (1,) * (len(shape) - 3))
        t = o.where(present, o.getitem(g, (slice(None),) * 3 + (j,)), out)
        out = o.where(o.greater(t, out), t, out)
    return o.transpose(out, tuple(int(i) for i in np.argsort(order)))


def _window_argmax(x, windows: list) -> np.ndarray:
    """torch's indices of a max pool: per output, the flat spatial position of its window's first maximum.

    ``windows`` has one table per spatial dim, as ``_window_max`` takes them.
    Computed on the values (numpy, or jax when traced): positions carry no
    gradient; NaN counts as the largest, as in torch.
    """
    xp, v = _logic(x, *windows), _raw(x)
    shape = o.shape_of(x)
    n, c, spatial = shape[0], shape[1], shape[2:]
    tables = [xp.broadcast_to(t, (n, c) + tuple(t.shape[-2:])) for t in windows]
    outs = tuple(t.shape[2] for t in tables)
    pos = xp.zeros((n, c) + outs + tuple(t.shape[3] for t in tables), dtype=np.int64)
    valid = xp.ones(pos.shape, dtype=bool)
    stride = int(np.prod(spatial, dtype=np.int64))
    k = len(tables)
    for i, (t, size) in enumerate(zip(tables, spatial)):
        stride //= size
        # the window table of dim i, placed at its output axis 2+i and its tap axis 2+k+i
        shaped = t.reshape((n, c) + tuple(t.shape[2] if a == i else 1 for a in range(k))
                           + tuple(t.shape[3] if a == i else 1 for a in range(k)))
        pos = pos + xp.where(shaped < 0, 0, shaped) * stride
        valid = valid & (shaped >= 0)
    total = int(np.prod(spatial, dtype=np.int64))
    pos = xp.where(valid, pos, total).reshape((n, c) + outs + (-1,))
    flat = xp.concatenate([xp.reshape(v, (n, c, total)), xp.full((n, c, 1), -xp.inf, dtype=v.dtype)], axis=2)
    values = xp.take_along_axis(flat, xp.asarray(pos.reshape(n, c, -1)), axis=2).reshape(pos.shape)
    best = xp.argmax(values, axis=-1)
    return xp.take_along_axis(xp.asarray(pos), best[..., None], axis=-1)[..., 0]


def _indices(ctx, compute, what: str):
    """A max pool's indices when a node of the graph reads them (max unpooling, ``return_indices``), else
    Unavailable: they cost a gather of every window."""
    import operator

    users = ctx.node.users if ctx.node is not None else {}
    if any(u.target is operator.getitem and u.args[1] == 1 for u in users):
        return compute()
    return Unavailable(what)


@lower("aten.max_pool2d_with_indices.default", "aten.max_pool2d.default", "aten.max_pool3d_with_indices.default",
       "aten.max_pool3d.default")
def max_pool(ctx, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """torch's 2-d and 3-d max pooling: any stride, padding, dilation, ``ceil_mode``, batched or not."""
    nd = 3 if "pool3d" in ctx.op else 2
    x, was = _batched(self, nd)
    k, s, p, d = _pool_args(nd, kernel_size, stride, padding, dilation)
    y = _unbatched(_max_pool(x, nd, k, s, p, d, ceil_mode), was)
    if "with_indices" not in ctx.op:
        return y
    windows = [_strided_windows(n, *a, ceil_mode) for n, a in zip(o.shape_of(x)[2:], zip(k, s, p, d))]
    return y, _indices(ctx, lambda: _unbatched(_window_argmax(x, windows), was), f"the indices of {ctx.op}")


def max_pool2d_ceil(x, kernel_size, stride, padding, ceil_mode: bool):
    """``F.max_pool2d`` of (N, C, H, W) or (C, H, W) with torch's ``ceil_mode`` (dilation 1), on any backend: what
    torch's pinned float32 run calls for ``F.max_pool2d``, the same kink calls as the graph's lowering makes."""
    k, s, p, d = _pool_args(2, kernel_size, stride, padding)
    x, was = _batched(x, 2)
    return _unbatched(_max_pool(x, 2, k, s, p, d, ceil_mode), was)


def _output_size(x, output_size, nd):
    spatial = o.shape_of(x)[-nd:]
    return tuple(int(s) if s is not None else n for s, n in zip(_pair(output_size, nd), spatial))


@lower("aten.adaptive_max_pool2d.default", "aten.adaptive_max_pool3d.default")
def adaptive_max_pool(ctx, self, output_size):
    """torch's adaptive max pooling: a max pool where the bins divide the input, else the maximum over each bin."""
    nd = 3 if "pool3d" in ctx.op else 2
    x, was = _batched(self, nd)
    spatial, out = o.shape_of(x)[2:], _output_size(x, output_size, nd)
    windows = [_adaptive_windows(n, m) for n, m in zip(spatial, out)]
    if all(n % m == 0 for n, m in zip(spatial, out)):
        k = tuple(n // m for n, m in zip(spatial, out))
        y = _max_pool(x, nd, k, k, (0,) * nd, (1,) * nd, False)
    else:
        y = x
        for axis in range(len(spatial) + 1, 1, -1):  # the last dim first: torch's scan order at ties
            y = _window_max(y, axis, windows[axis - 2])
    return _unbatched(y, was), _indices(ctx, lambda: _unbatched(_window_argmax(x, windows), was),
                                        f"the indices of {ctx.op}")


def _fractional_starts(samples, size: int, out: int, k: int):
    """torch's ``generate_intervals`` in the samples' dtype: ``int((i + u) alpha) - int(u alpha)``, the last window
    at the end, ``alpha = (size - k) / (out - 1)``; numpy, or jax when the samples are traced."""
    xp = _logic(samples)
    u = _raw(samples)
    last = xp.full(tuple(u.shape) + (1,), size - k, dtype=np.int64)
    if out == 1:
        return last
    alpha = xp.asarray(size - k, dtype=u.dtype) / xp.asarray(out - 1, dtype=u.dtype)
    i = xp.arange(out - 1, dtype=u.dtype)
    body = ((i + u[..., None]) * alpha).astype(np.int64) - (u[..., None] * alpha).astype(np.int64)
    return xp.concatenate([body, last], axis=-1)


@lower("aten.fractional_max_pool2d.default", "aten.fractional_max_pool3d.default")
def fractional_max_pool(ctx, self, kernel_size, output_size, random_samples):
    """The maximum over windows of ``kernel_size`` at torch's pseudo-random starts, one set per plane, from the
    ``random_samples`` the graph holds (the case's draw, or the module's ``_random_samples``)."""
    nd = 3 if "pool3d" in ctx.op else 2
    x, was = _batched(self, nd)
    samples = o.getitem(random_samples, slice(0, o.shape_of(x)[0]))  # torch reads one row per sample (batch)
    k, out = _pair(kernel_size, nd), _pair(output_size, nd)
    # Which sample sets which dim's windows is torch's: in 2-d sample 0 is the width's, in 3-d the depth's.
    which = [1, 0] if nd == 2 else [0, 1, 2]
    windows = [_windows(_fractional_starts(samples[..., which[i]], n, m, ki), ki, n)
               for i, (n, m, ki) in enumerate(zip(o.shape_of(x)[2:], out, k))]
    y = x
    for axis in range(nd + 1, 1, -1):
        y = _window_max(y, axis, windows[axis - 2])
    return _unbatched(y, was), _indices(ctx, lambda: _unbatched(_window_argmax(x, windows), was),
                                        f"the indices of {ctx.op}")


def _avg_divisor(size, out, k, s, p, count_include_pad) -> np.ndarray:
    """torch's divisor per window along one dim: the window's extent within the padded input (``count_include_pad``)
    or within the input itself."""
    start = np.arange(out) * s - p
    end = np.minimum(start + k, size + p)
    return end - start if count_include_pad else np.minimum(end, size) - np.maximum(start, 0)


@lower("aten.avg_pool2d.default", "aten.avg_pool3d.default")
def avg_pool(ctx, self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
             divisor_override=None):
    """torch's 2-d and 3-d average pooling: ``ops.avg_pool2d``, or with ``ceil_mode``, a ``divisor_override`` or in
    3-d, each window's sum (zero padding, 2-d sums over the depth taps) divided as torch divides it."""
    nd = 3 if "pool3d" in ctx.op else 2
    x, was = _batched(self, nd)
    k, s, p, _ = _pool_args(nd, kernel_size, stride, padding)
    if nd == 2 and not ceil_mode and divisor_override is None:
        return _unbatched(o.avg_pool2d(x, k, s, p, count_include_pad=count_include_pad), was)
    spatial = o.shape_of(x)[2:]
    geometry = [_pool_extent(n, ki, si, pi, 1, ceil_mode) for n, ki, si, pi in zip(spatial, k, s, p)]
    xp = _pad_or_crop(x, [(b, a) for _, b, a in geometry], 0.0)

    def sums2d(v):
        return o.mul(o.avg_pool2d(v, k[-2:], s[-2:], 0), float(k[-2] * k[-1]))

    if nd == 2:
        total = sums2d(xp)
    else:
        od = geometry[0][0]
        total = None
        for slab in _depth_taps(xp, k[0], 1, s[0], od):
            y = sums2d(slab)
            total = y if total is None else o.add(total, y)
        total = _unfold_depth(total, o.shape_of(x)[0], od)
    if divisor_override is not None:
        return _unbatched(o.div(total, float(divisor_override)), was)
    divisor = np.ones(())
    for n, (m, _, _), ki, si, pi in zip(spatial, geometry, k, s, p):
        divisor = np.multiply.outer(divisor, _avg_divisor(n, m, ki, si, pi, count_include_pad))
    return _unbatched(o.div(total, o.asarray(divisor.astype(np.float64), like=total)), was)


@lower("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default",
       "aten.adaptive_avg_pool3d.default")
def adaptive_avg_pool(ctx, self, output_size):
    """``ops.adaptive_avg_pool2d``; in 3-d, the same contractions with torch's averaging matrices, one per dim."""
    nd = 3 if "pool3d" in ctx.op else 2
    x, was = _batched(self, nd)
    size = _output_size(x, output_size, nd)
    if nd == 2:
        return _unbatched(o.adaptive_avg_pool2d(x, size), was)
    d, h, w = o.shape_of(x)[2:]
    y = x
    for eq, n, m in (("ncdhw,pd->ncphw", d, size[0]), ("ncdhw,ph->ncdpw", h, size[1]), ("ncdhw,pw->ncdhp", w, size[2])):
        y = o.einsum(eq, y, o.asarray(o.adaptive_pool_matrix(n, m), like=y))
    return _unbatched(y, was)


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


def _triangle(x):
    """The bilinear filter: 1 - |x| on (-1, 1)."""
    return np.maximum(1.0 - np.abs(x), 0.0)


def _keys_cubic(x, a: float = -0.5):
    """torch's antialiasing bicubic filter (``HelperInterpCubic::aa_filter``): the cubic convolution kernel on
    (-2, 2) with Keys' a = -0.5, as Pillow's, where bicubic without antialiasing (and grid sampling) use -0.75."""
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _antialias_matrix(size: int, out: int, align_corners: bool, scale_factor=None, width: int = 2,
                      kernel=_triangle) -> np.ndarray:
    """The ``out x size`` weights of torch's antialiased resize along one dim (``_compute_weights_aa``).

    ``kernel`` (bilinear's triangle, ``width`` 2, or the cubic filter, 4)
    widened by the downscale factor (``support = width / 2 * scale`` when
    shrinking), centred at ``scale * (i + 0.5)``, its taps normalised to sum
    to one; for enlarging it is the plain filter, its taps past the edges
    dropped (normalising gives the rest their weight).
    """
    if align_corners:
        scale = (size - 1) / (out - 1) if out > 1 else 0.0
    else:
        scale = 1.0 / scale_factor if scale_factor is not None and scale_factor > 0 else size / out
    support = width / 2 * (scale if scale >= 1.0 else 1.0)
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    m = np.zeros((out, size))
    for i in range(out):
        center = scale * (i + 0.5)
        lo = builtins.max(int(center - support + 0.5), 0)
        hi = builtins.min(int(center + support + 0.5), size)
        taps = kernel((np.arange(lo, hi) - center + 0.5) * invscale)
        if taps.sum() != 0.0:
            m[i, lo:hi] = taps / taps.sum()
    return m


@lower("aten._upsample_bilinear2d_aa.default", "aten._upsample_bilinear2d_aa.vec")
def upsample_bilinear2d_aa(ctx, self, output_size, align_corners, scales_h=None, scales_w=None):
    """``F.interpolate(mode="bilinear", antialias=True)``: two contractions with torch's antialiasing weights."""
    return _resize_aa(ctx, self, output_size, align_corners, scales_h, scales_w, 2, _triangle)


@lower("aten._upsample_bicubic2d_aa.default", "aten._upsample_bicubic2d_aa.vec")
def upsample_bicubic2d_aa(ctx, self, output_size, align_corners, scales_h=None, scales_w=None):
    """``F.interpolate(mode="bicubic", antialias=True)``: the same contractions with the cubic filter (four taps
    wide, widened when shrinking), not the clamped four-tap stencil of bicubic without antialiasing."""
    return _resize_aa(ctx, self, output_size, align_corners, scales_h, scales_w, 4, _keys_cubic)


def _resize_aa(ctx, self, output_size, align_corners, scales_h, scales_w, width, kernel):
    """An antialiased 2-d resize as two contractions, one per dim, with ``_antialias_matrix``'s weights."""
    if ctx.op.endswith(".vec"):  # (input, output_size, align_corners, scale_factors)
        scales_h, scales_w = _pair(scales_h) if scales_h is not None else (None, None)
    x, was = _batched(self, 2)
    (h, w), (oh, ow) = o.shape_of(x)[2:], (tuple(output_size) if output_size is not None else (
        int(math.floor(o.shape_of(x)[2] * scales_h)), int(math.floor(o.shape_of(x)[3] * scales_w))))
    mh = o.asarray(_antialias_matrix(h, oh, align_corners, scales_h, width, kernel), like=x)
    mw = o.asarray(_antialias_matrix(w, ow, align_corners, scales_w, width, kernel), like=x)
    return _unbatched(o.einsum("ncoj,pj->ncop", o.einsum("nchw,oh->ncow", x, mh), mw), was)


def _grid_unnormalize(c, size: int, align_corners: bool):
    """torch's ``grid_sampler_unnormalize``: a grid coordinate in [-1, 1] as a pixel position of an axis of ``size``
    (-1 and 1 the first and last pixels' centres, or their outer edges), neither clipped nor reflected."""
    return o.mul(o.add(c, 1.0), (size - 1) / 2) if align_corners else o.div(o.sub(o.mul(o.add(c, 1.0), size), 1.0), 2)


def _grid_coordinate(c, size: int, padding_mode: int, align_corners: bool):
    """torch's ``grid_sampler_compute_source_index``: a grid coordinate in [-1, 1] as a pixel position of an axis
    of ``size``, clipped (border) or reflected (reflection) into it; differentiable in ``c``."""
    c = _grid_unnormalize(c, size, align_corners)
    if padding_mode == 2:  # reflection, about the first and last pixels' centres (corners aligned) or edges
        low, span = (0.0, size - 1.0) if align_corners else (-0.5, float(size))
        if span > 0:
            d = o.abs(o.sub(c, low))
            flips = _logic(d).floor_divide(_raw(d), span)  # how many times it is reflected: a step
            extra = o.sub(d, o.mul(flips, span))
            c = o.where(_logic(flips).equal(flips % 2, 0), o.add(extra, low), o.sub(span + low, extra))
        else:
            c = o.mul(c, 0.0)
    if padding_mode in (1, 2):
        c = o.minimum(o.maximum(c, 0.0), float(size - 1))
    return c


@lower("aten.grid_sampler_2d.default")
def grid_sampler_2d(ctx, input, grid, interpolation_mode, padding_mode, align_corners):  # noqa: A002
    """``F.grid_sample`` on (N, C, H, W) at a grid (N, Ho, Wo, 2) of (x, y) in [-1, 1]: bilinear, nearest or
    bicubic, with zeros, border or reflection padding, differentiable in the input and (bilinear, bicubic) in
    the grid.

    The four (one) pixels around each point are gathered at positions
    computed from the grid's values (a step: no gradient), the bilinear
    weights from its fractional parts; a pixel outside the input adds zero.
    Bicubic pads each of its sixteen taps instead (``_grid_sample_bicubic``).
    """
    if interpolation_mode == 2:
        return _grid_sample_bicubic(input, grid, padding_mode, align_corners)
    n, c, h, w = o.shape_of(input)
    ix = _grid_coordinate(o.getitem(grid, (Ellipsis, 0)), w, padding_mode, align_corners)
    iy = _grid_coordinate(o.getitem(grid, (Ellipsis, 1)), h, padding_mode, align_corners)
    xp = _logic(ix, iy)
    batch = np.arange(n)[:, None, None]

    def pick(row, col):  # the input at integer positions (N, Ho, Wo), 0 outside: (N, C, Ho, Wo)
        inside = (row >= 0) & (row < h) & (col >= 0) & (col < w)
        value = o.getitem(input, (batch, slice(None), xp.clip(row, 0, h - 1), xp.clip(col, 0, w - 1)))
        value = o.transpose(value, (0, 3, 1, 2))  # numpy puts the indexed axes first
        return o.where(xp.expand_dims(inside, 1), value, 0.0)

    if interpolation_mode == 1:  # nearest: torch rounds half to even
        return pick(xp.round(_raw(iy)).astype(np.int64), xp.round(_raw(ix)).astype(np.int64))
    x0, y0 = xp.floor(_raw(ix)), xp.floor(_raw(iy))
    fx, fy = o.sub(ix, x0), o.sub(iy, y0)  # the weights' dependence on the grid
    x0, y0 = x0.astype(np.int64), y0.astype(np.int64)
    gx, gy = o.sub(1.0, fx), o.sub(1.0, fy)
    out = None
    for row, col, weight in ((y0, x0, o.mul(gy, gx)), (y0, x0 + 1, o.mul(gy, fx)), (y0 + 1, x0, o.mul(fy, gx)),
                             (y0 + 1, x0 + 1, o.mul(fy, fx))):
        term = o.mul(pick(row, col), o.expand_dims(weight, 1))
        out = term if out is None else o.add(out, term)
    return out


_GRID_CUBIC_A = -0.75  # torch's bicubic grid sampling (and bicubic resizing without antialiasing)


def _cubic_coefficients(t, a: float = _GRID_CUBIC_A):
    """torch's ``get_cubic_upsample_coefficients``: the weights of the taps at -1, 0, 1 and 2 of a point ``t`` in
    [0, 1) past tap 0, by the cubic convolution kernel with parameter ``a``; differentiable in ``t``."""

    def near(x):  # |x| <= 1
        return o.add(o.mul(o.mul(o.sub(o.mul(x, a + 2), a + 3), x), x), 1.0)

    def far(x):  # 1 <= |x| < 2
        return o.sub(o.mul(o.add(o.mul(o.sub(o.mul(x, a), 5 * a), x), 8 * a), x), 4 * a)

    s = o.sub(1.0, t)
    return far(o.add(t, 1.0)), near(t), near(s), far(o.add(s, 1.0))


def _bounded_tap(p, size: int, padding_mode: int, align_corners: bool, xp):
    """torch's ``get_value_bounded`` for taps at whole positions ``p`` (floats, any distance past the edges): the
    index each reads and where it reads anything (None: everywhere).

    Bicubic pads each tap, not the point: zeros reads nothing outside,
    border reads the nearest edge pixel, reflection reflects the tap about
    the edge pixels' centres (corners aligned) or outer edges, then clips.
    """
    if padding_mode == 0:
        return xp.clip(p, 0, size - 1).astype(np.int64), (p >= 0) & (p < size)
    if padding_mode == 2:
        low, span = (0.0, size - 1.0) if align_corners else (-0.5, float(size))
        if span > 0:
            d = xp.abs(p - low)
            flips = xp.floor(d / span)
            extra = d - flips * span
            p = xp.where(flips % 2 == 0, extra + low, span + low - extra)
        else:
            p = p * 0.0
    return xp.clip(p, 0, size - 1).astype(np.int64), None


def _gather(input, index, inside, xp):  # noqa: A002
    """``input`` (N, C, *spatial) at whole positions, one (N, *out) index array per spatial dim: (N, C, *out),
    zero where ``inside`` (None: everywhere) is False."""
    k = index[0].ndim
    batch = np.arange(o.shape_of(input)[0]).reshape((-1,) + (1,) * (k - 1))
    value = o.getitem(input, (batch, slice(None), *index))
    value = o.transpose(value, (0, k, *range(1, k)))  # numpy puts the indexed axes first
    return value if inside is None else o.where(xp.expand_dims(inside, 1), value, 0.0)


def _grid_sample_bicubic(input, grid, padding_mode: int, align_corners: bool, a: float = _GRID_CUBIC_A):  # noqa: A002
    """``F.grid_sample(mode="bicubic")`` as torch computes it: from the unnormalised point, neither clipped nor
    reflected (a point is padded tap by tap), the 4x4 pixels around ``floor`` of it, each row interpolated along
    x, then the four rows along y, with the cubic convolution weights of the fractional parts (torch's a = -0.75).

    ``floor`` is a step (no gradient); the grid's gradient is that of the
    weights in the fractional parts, as torch's backward computes it.
    """
    h, w = o.shape_of(input)[2:]
    ix = _grid_unnormalize(o.getitem(grid, (Ellipsis, 0)), w, align_corners)
    iy = _grid_unnormalize(o.getitem(grid, (Ellipsis, 1)), h, align_corners)
    xp = _logic(ix, iy)
    x0, y0 = xp.floor(_raw(ix)), xp.floor(_raw(iy))
    wx, wy = _cubic_coefficients(o.sub(ix, x0), a), _cubic_coefficients(o.sub(iy, y0), a)
    cols = [_bounded_tap(x0 + k, w, padding_mode, align_corners, xp) for k in (-1, 0, 1, 2)]
    out = None
    for k, row_weight in zip((-1, 0, 1, 2), wy):
        row, row_inside = _bounded_tap(y0 + k, h, padding_mode, align_corners, xp)
        line = None
        for (col, col_inside), weight in zip(cols, wx):
            inside = None if row_inside is None else row_inside & col_inside
            term = o.mul(_gather(input, (row, col), inside, xp), o.expand_dims(weight, 1))
            line = term if line is None else o.add(line, term)
        term = o.mul(line, o.expand_dims(row_weight, 1))
        out = term if out is None else o.add(out, term)
    return out


@lower("aten.grid_sampler_3d.default")
def grid_sampler_3d(ctx, input, grid, interpolation_mode, padding_mode, align_corners):  # noqa: A002
    """``F.grid_sample`` on (N, C, D, H, W) at a grid (N, Do, Ho, Wo, 3) of (x, y, z) in [-1, 1]: trilinear or
    nearest, zeros, border or reflection padding, as the 2-d sampler with eight (one) taps per point."""
    if interpolation_mode not in (0, 1):
        _unsupported("aten.grid_sampler_3d", "mode='bicubic'" if interpolation_mode == 2 else
                     f"interpolation_mode={interpolation_mode}",
                     "trilinear and nearest are lowered (F.grid_sample samples volumes in no other mode)")
    sizes = o.shape_of(input)[2:]  # (D, H, W), read by the grid's (z, y, x)
    pos = [_grid_coordinate(o.getitem(grid, (Ellipsis, 2 - k)), size, padding_mode, align_corners)
           for k, size in enumerate(sizes)]
    xp = _logic(*pos)

    def pick(index):  # the input at whole positions (N, Do, Ho, Wo) per dim, 0 outside: (N, C, Do, Ho, Wo)
        inside = None
        for i, size in zip(index, sizes):
            within = (i >= 0) & (i < size)
            inside = within if inside is None else inside & within
        return _gather(input, [xp.clip(i, 0, size - 1) for i, size in zip(index, sizes)], inside, xp)

    if interpolation_mode == 1:  # nearest: torch rounds half to even
        return pick([xp.round(_raw(p)).astype(np.int64) for p in pos])
    lows = [xp.floor(_raw(p)) for p in pos]
    fracs = [o.sub(p, lo) for p, lo in zip(pos, lows)]  # the weights' dependence on the grid
    lows = [lo.astype(np.int64) for lo in lows]
    out = None
    for corner in np.ndindex(2, 2, 2):  # torch's order: z, then y, then x
        weight = None
        for up, f in zip(corner, fracs):
            factor = f if up else o.sub(1.0, f)
            weight = factor if weight is None else o.mul(weight, factor)
        term = o.mul(pick([lo + up for lo, up in zip(lows, corner)]), o.expand_dims(weight, 1))
        out = term if out is None else o.add(out, term)
    return out


@lower("aten.conv_tbc.default")
def conv_tbc(ctx, self, weight, bias, pad=0):
    """``F.conv_tbc``: a 1-d convolution of (time, batch, channels) with a (kernel, in, out) weight."""
    y = o.conv(o.transpose(self, (1, 2, 0)), o.transpose(weight, (2, 1, 0)), bias, padding=int(pad))
    return o.transpose(y, (2, 0, 1))


@lower("aten._pdist_forward.default")
def pdist(ctx, self, p=2.0):
    """``F.pdist``: the ``p``-norm distance of every pair of rows i < j, in row-major order of the pairs."""
    i, j = np.triu_indices(o.shape_of(self)[0], 1)
    return linalg_vector_norm(ctx, o.sub(o.take(self, i, axis=0), o.take(self, j, axis=0)), p, -1)


@lower("aten.nonzero.default")
def nonzero(ctx, self):
    """The (n, ndim) positions of the non-zero elements, row-major: of known values only, as its shape is theirs."""
    from gradcheck.ops import rules as common

    values = common.concrete(_raw(self))
    if values is not None:
        return np.argwhere(values).astype(np.int64)
    # Traced by jax: its output's shape is the number of positions.  A graph traced at the example inputs
    # recorded that number (the example's; Mixtral's experts hit), and is the graph of that point only.
    count = getattr(_traced_value(getattr(ctx, "node", None)), "shape", (None,))[0]
    if not isinstance(count, int):
        _unsupported("aten.nonzero", "an input traced by jax", "the number of positions, its output's shape, "
                     "is not known while it traces")
    import jax.numpy as jnp

    return jnp.argwhere(_raw(self), size=count).astype(jnp.int64)


@lower("aten.scaled_dot_product_attention.default")
def scaled_dot_product_attention(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    if enable_gqa:
        key, value = (_repeat_heads(t, o.shape_of(query)[-3]) for t in (key, value))
    mask = None
    if dropout_p > 0:
        mask = _randomness().keep_factors(ctx.draw("uniform", attention_shape(query, key)), dropout_p)
    if isinstance(attn_mask, np.ndarray) and attn_mask.dtype.kind == "f":
        attn_mask = attn_mask.astype(ctx.floats)
    return o.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_mask=mask,
                                          is_causal=is_causal, scale=scale)


def _repeat_heads(t, heads: int):
    """Grouped-query attention's keys or values (..., H_kv, S, E) with each head repeated for its ``heads / H_kv``
    queries, as torch's ``enable_gqa`` repeats them (``repeat_interleave`` along dim -3)."""
    shape = o.shape_of(t)
    r = heads // shape[-3]
    if r == 1:
        return t
    wide = o.broadcast_to(o.expand_dims(t, -3), shape[:-2] + (r,) + shape[-2:])
    return o.reshape(wide, shape[:-3] + (shape[-3] * r,) + shape[-2:])


def attention_shape(query, key) -> tuple[int, ...]:
    """The shape of the attention weights, (..., L, S): the dropout mask's shape."""
    return _randomness().attention_shape(o.shape_of(query), o.shape_of(key))


@lower("aten._scaled_dot_product_flash_attention_for_cpu.default")
def sdpa_flash_cpu(ctx, query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    out = scaled_dot_product_attention(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale)
    return out, Unavailable("the logsumexp of aten._scaled_dot_product_flash_attention_for_cpu")


@lower("aten._embedding_bag.default", "aten._embedding_bag_forward_only.default")
def embedding_bag(ctx, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """``nn.EmbeddingBag``: each bag's rows of ``weight`` summed (mode 0, times ``per_sample_weights``), averaged
    (1) or their maximum (2); ``padding_idx`` rows left out of the bag, an empty bag zeros.

    A bag is a row of slots, each an id or nothing, gathered as ``embedding``
    gathers and masked where empty or padding.  Ids and offsets may be traced
    (jax): then each row has a slot for every id, as no bag can be longer.
    """
    from gradcheck.ops import rules as common

    op = "aten._embedding_bag"
    if scale_grad_by_freq:
        _unsupported(op, "scale_grad_by_freq=True", "it rescales gradients by counts, which no AD of the forward does")
    n = o.shape_of(indices)[0]
    xp, bounds = _logic(offsets), _raw(offsets)
    bounds = xp.concatenate([xp.reshape(bounds, (-1,)), xp.asarray([n], dtype=bounds.dtype)]) if not \
        include_last_offset else xp.reshape(bounds, (-1,))
    starts, lengths = bounds[:-1], bounds[1:] - bounds[:-1]
    known = common.concrete(lengths)
    width = builtins.max(int(known.max(initial=0)) if known is not None else n, 1)
    filled = np.arange(width)[None, :] < lengths[:, None]  # (bags, width)
    slot = xp.where(filled, starts[:, None] + np.arange(width)[None, :], n)
    ids = o.getitem(o.concatenate([indices, np.zeros((1,), np.dtype(o.dtype_of(indices)))]), slot)
    keep = filled if padding_idx is None or padding_idx < 0 else _logic(ids, filled).logical_and(
        filled, _logic(ids).logical_not(_raw(o.equal(ids, padding_idx))))
    rows = o.take(weight, ids, axis=0)  # (bags, width, dim)
    unavailable = tuple(Unavailable(f"output {k} of {op}") for k in (1, 2, 3))
    if mode == 2:
        return (o.where(_any_kept(keep), o.max(o.where(keep[..., None], rows, _below(rows)), axis=1), 0.0),
                *unavailable)
    if per_sample_weights is not None:
        psw = o.getitem(o.concatenate([per_sample_weights, o.zeros_like(o.getitem(per_sample_weights, slice(0, 1)))]),
                        slot)
        rows = o.mul(rows, o.expand_dims(psw, -1))
    total = o.sum(o.where(keep[..., None], rows, 0.0), axis=1)
    if mode == 1:
        count = _logic(keep).sum(keep, axis=1, keepdims=True)
        total = o.div(total, _logic(count).maximum(count, 1).astype(ctx.floats))
    return (total, *unavailable)


def _any_kept(keep):
    """(bags, 1): whether a bag has a row (an empty bag's maximum is 0 in torch)."""
    return _logic(keep).any(keep, axis=1, keepdims=True)


@lower("torch_nn._linear_cross_entropy_batch_chunked.default",
       "torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default")
def linear_cross_entropy(ctx, input, linear_weight, target, linear_bias, weight, *options):  # noqa: A002
    """``F.linear_cross_entropy``'s chunked op (``nn.LinearCrossEntropyLoss`` with ``options``): the loss of the
    logits ``input @ W.T + b``, which the op computes chunk by chunk and differentiates by its own backward.

    The reducing op also returns the gradients it precomputed (outputs 1 to
    3): those are torch's backward, not a value of the forward.
    """
    reducing = ctx.op.endswith("chunked.default")
    reduction, ignore_index, label_smoothing = options[:3] if reducing else ("none", options[0], 0.0)
    loss = o.cross_entropy(o.linear(input, linear_weight, linear_bias), target, weight=weight,
                           ignore_index=-100 if ignore_index is None else ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)
    if not reducing:
        return loss
    return (loss,) + tuple(Unavailable(f"the gradient {k} the chunked cross-entropy precomputes") for k in (1, 2, 3))


# Graph bookkeeping that computes nothing.  torch.linalg's error check (a singular matrix, one not positive
# definite) raises in torch's own runs of the module; the tape and jax compute on, as the ops they lower do.
for _name in ("aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
              "aten.sym_constrain_range_for_size.default", "aten._assert_async.msg",
              "aten._functional_assert_async.msg", "aten._linalg_check_errors.default"):
    LOWERINGS[_name] = lambda ctx, *args, **kwargs: None


# Random ops: the case's draws (gradcheck.frontends.torch.randomness), the same values on every backend.
def _random_rows():
    from gradcheck.frontends.torch import randomness

    randomness.register(LOWERINGS)


_random_rows()


# ---------------------------------------------------------------- connectionist temporal classification
@lower("aten._ctc_loss.Tensor", "aten._ctc_loss.default")
def ctc_loss(ctx, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """``aten._ctc_loss``: each sample's negative log likelihood (N,) and the forward variables ``log_alpha``
    (N, T, 2S+1), S the longest target length, as torch's kernel computes them (``F.ctc_loss`` divides and reduces
    the first in the graph; the second is what torch's backward reads, and no forward node does).

    The alpha recursion over time in log space: state s of the extended target (the blank at even s, the labels
    at odd s) is reached from s and s-1, and from s-2 where s is a label unlike the one two states back (a
    repeated label needs the blank between).  The loss is minus the logsumexp of the last two states at the
    sample's last step.  Lengths and targets are concrete at capture, so which states a sample reaches is known
    in numpy (``_ctc_reachable``): each logsumexp runs over reachable predecessors only, since one over -inf
    alone has a NaN gradient, and the states never reached are -inf in ``log_alpha``, as torch's are.

    ``zero_infinity`` changes torch's backward only: a sample no alignment fits has loss inf, with NaN gradients,
    zeros with it (``ctc_loss`` then replaces the loss by 0 in the graph).  Such a loss is a constant here, so its
    gradient is 0 in both.
    """
    op = ctx.op
    if len(o.shape_of(log_probs)) != 3:
        _unsupported(op, f"log_probs of shape {o.shape_of(log_probs)}", "torch's kernel takes (T, N, C)")
    T, N, _ = o.shape_of(log_probs)
    il, tl = _ctc_ints(op, "input_lengths", input_lengths), _ctc_ints(op, "target_lengths", target_lengths)
    labels, skip = _ctc_labels(op, _ctc_ints(op, "targets", targets), tl, int(blank))
    reach = _ctc_reachable(il, tl, skip, T)
    steps = builtins.max(int(il.max(initial=0)), 1)
    fill = _ctc_fill(log_probs)
    emit = o.getitem(log_probs, (slice(0, steps), np.arange(N)[:, None], labels))  # (steps, N, 2S+1)
    alphas = [o.where(reach[0], o.getitem(emit, 0), fill)]
    for t in range(1, steps):
        alphas.append(o.where(reach[t], o.add(_ctc_step(alphas[-1], reach[t - 1], skip, fill), o.getitem(emit, t)),
                              fill))
    alpha = o.stack(alphas, axis=0)  # (steps, N, 2S+1), finite: ``fill`` where a state is not reached
    return _ctc_nll(alpha, reach, il, tl, fill), _ctc_log_alpha(alpha, reach, T)


def _ctc_ints(op, what, v) -> np.ndarray:
    """Targets or lengths as numpy integers: concrete at capture (the graph's constants, or a list)."""
    v = _raw(v)
    if backend_of(v) == "jax":
        _unsupported(op, f"traced {what}", "the recursion's bounds and the states it visits are numpy integers")
    return np.asarray(v, dtype=np.int64)


def _ctc_labels(op, targets, tl, blank) -> tuple[np.ndarray, np.ndarray]:
    """The extended targets (N, 2S+1): blank, l1, blank, l2, ..., blank (blanks past a sample's end), and where
    the transition from s-2 is allowed (s a label unlike l(s-2)).  ``targets`` padded (N, S') or concatenated."""
    n, width = len(tl), 2 * int(tl.max(initial=0)) + 1
    if targets.ndim == 2:
        rows = [targets[i, :tl[i]] for i in range(n)]
    elif targets.ndim == 1:
        starts = np.cumsum(tl) - tl
        rows = [targets[s:s + k] for s, k in zip(starts, tl)]
    else:
        _unsupported(op, f"targets of {targets.ndim} dims", "torch takes them padded (N, S) or concatenated (sum S)")
    labels = np.full((n, width), blank, dtype=np.int64)
    for i, row in enumerate(rows):
        labels[i, 1:2 * len(row):2] = row
    skip = np.zeros((n, width), dtype=bool)
    skip[:, 2:] = (labels[:, 2:] != blank) & (labels[:, 2:] != labels[:, :-2])
    return labels, skip


def _ctc_reachable(il, tl, skip, T) -> np.ndarray:
    """(T, N, 2S+1): whether a path of the sample's alignments is in state s at step t (t below its input length,
    s within its 2L+1 states); the reachable states are where log_alpha is finite."""
    n, width = skip.shape
    within = np.arange(width)[None, :] < 2 * tl[:, None] + 1
    reach = np.zeros((T, n, width), dtype=bool)
    reach[0] = (np.arange(width)[None, :] < 2) & within & (il[:, None] > 0)
    for t in range(1, T):
        prev = reach[t - 1]
        came = prev.copy()
        came[:, 1:] |= prev[:, :-1]
        came[:, 2:] |= prev[:, :-2] & skip[:, 2:]
        reach[t] = came & within & (t < il[:, None])
    return reach


def _ctc_fill(log_probs):
    """A finite stand-in for log 0 in the run's float dtype: exp of it less any log-probability is 0, and a
    logsumexp over it alone is finite, with a finite gradient (which ``where`` then drops)."""
    return float(np.finfo(np.dtype(o.dtype_of(log_probs))).min) / 8


def _ctc_shift(x, k: int, fill):
    """``x`` (N, W) moved k states on along its last axis, ``fill`` in the first k."""
    n, width = o.shape_of(x)
    head = o.asarray(np.full((n, builtins.min(k, width)), fill), like=x)
    return head if k >= width else o.concatenate([head, o.getitem(x, (slice(None), slice(0, width - k)))], axis=1)


def _ctc_step(prev, reached, skip, fill):
    """log sum over the predecessors of each state: s, s-1, and s-2 where ``skip`` allows it, each only where
    reached at the previous step (``fill`` elsewhere)."""
    came1, came2 = np.zeros_like(reached), np.zeros_like(reached)
    came1[:, 1:], came2[:, 2:] = reached[:, :-1], reached[:, :-2] & skip[:, 2:]
    options = [o.where(reached, prev, fill), o.where(came1, _ctc_shift(prev, 1, fill), fill),
               o.where(came2, _ctc_shift(prev, 2, fill), fill)]
    return o.logsumexp(o.stack(options, axis=0), axis=0)


def _ctc_nll(alpha, reach, il, tl, fill):
    """Each sample's -log p(target): the last blank and the last label at its last step; inf where no alignment
    fits (0 for an empty input with an empty target, as torch gives)."""
    n = len(il)
    last = np.maximum(il - 1, 0)
    rows = np.arange(n)
    ends = [2 * tl, np.maximum(2 * tl - 1, 0)]
    valid = [reach[last, rows, ends[0]] & (il > 0), reach[last, rows, ends[1]] & (il > 0) & (tl > 0)]
    pair = o.stack([o.where(v, o.getitem(alpha, (last, rows, e)), fill) for v, e in zip(valid, ends)], axis=1)
    nll = o.neg(o.logsumexp(pair, axis=1))
    fits = valid[0] | valid[1]
    return o.where(fits, nll, np.where((il == 0) & (tl == 0), 0.0, np.inf))


def _ctc_log_alpha(alpha, reach, T):
    """log_alpha as torch's (N, T, 2S+1): the reachable states' values, -inf elsewhere (torch's -inf, or memory it
    leaves uninitialised, ``_ctc_defined``), rows past the longest input included."""
    steps = o.shape_of(alpha)[0]
    la = o.where(reach[:steps], alpha, -np.inf)
    if steps < T:
        rest = np.full((T - steps,) + tuple(o.shape_of(alpha)[1:]), -np.inf)
        la = o.concatenate([la, o.asarray(rest, like=alpha)], axis=0)
    return o.transpose(la, (1, 0, 2))


@_partly_uninitialised("aten._ctc_loss.Tensor", "aten._ctc_loss.default")
def _ctc_defined(node, args, value):
    """torch's (nll, log_alpha) with log_alpha -inf where torch's kernel writes nothing: the rows from a sample's
    input length on and, past the first row (which it fills with -inf), the states past its 2L+1."""
    import torch

    nll, log_alpha = value
    il, tl = (np.asarray(a.cpu() if isinstance(a, torch.Tensor) else a, dtype=np.int64) for a in args[2:4])
    n, steps, width = log_alpha.shape
    t, s = np.arange(steps)[None, :, None], np.arange(width)[None, None, :]
    written = (t == 0) | ((t < il[:, None, None]) & (s < 2 * tl[:, None, None] + 1))
    log_alpha = log_alpha.detach().clone()
    log_alpha[torch.from_numpy(~written)] = -np.inf
    return nll, log_alpha

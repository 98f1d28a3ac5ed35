"""jax primitives -> ``gradcheck.ops``: one row per primitive, the table the tape, torch and the numpy referee
run a jaxpr by.

Each lowering takes the equation's operands (values already on the backend that runs: tape tensors, torch
tensors, numpy) and its params, as ``fn(ctx, *invals, **params)``, and computes the same thing with
``gradcheck.ops``, so every backend runs its own kernels: the tape its VJPs, torch ``F.conv2d``,
``torch.matmul``, ``F.max_pool2d``; numpy the referee's float64 forward.  ``jax`` itself never runs here: it
differentiates the user's own function (``gradcheck/frontends/jax/interpreter.py`` says how a jaxpr is run).

Conventions:

* ``ctx`` comes first: the run's float dtype (``ctx.floats``) and the equation (``ctx.eqn``, for messages).
  A float dtype in the jaxpr means the run's float dtype: one jaxpr is run in float64 (decides) and in
  float32 (measured).  Integer and bool dtypes stay.
* Integer and bool values are numpy arrays on every backend (the interpreter makes them so): they carry no
  gradient, and their values are known, since the tape, torch and numpy all run on concrete values.  So
  index arithmetic, masks and loop counters are computed with numpy, exactly, and positions (gather,
  scatter, dynamic_slice) are read from them.
* Float values go through ``gradcheck.ops``; comparisons of floats through ``ops.greater``/``ops.less``/
  ``ops.equal``, which the float64 reference records and float32 runs are pinned to (``gradcheck.check.kinks``).
  Which ops a lowering calls depends on dtypes and params only, never on the backend, so that every
  backend calls the same kink ops in the same order.
* The interpreter casts each output to the dtype the jaxpr gives it (a float one is the run's).
* A form of a primitive the table does not lower raises ``LoweringError`` naming the form
  (``_unsupported``); any other exception is a bug of the table, which ``interpreter.verify`` finds.
* Steps (floor, round, sign, argmax, a sort's order) are computed on the values: piecewise constant, their
  derivative is 0 wherever it exists, which is jax's gradient too.

A user lowers a primitive the table lacks with ``@gradcheck.frontends.jax.lowering("name")``.
"""

from __future__ import annotations

import builtins
import itertools
import math
import string
from collections.abc import Callable

import numpy as np

from gradcheck import ops as o
from gradcheck.backends import backend_of
from gradcheck.frontends.jax import scopes

LOWERINGS: dict[str, Callable] = {}

# Primitives that draw from jax random keys or derive new keys: the frontend evaluates them with jax
# (``interpreter.evaluate_constants``), and the tape and torch get their results as constants.  Wrapping key
# data as a key and unwrapping it are lowered (``key_data``): a key is its key data on every backend.
RANDOM = frozenset({"random_seed", "random_bits", "random_split", "random_fold_in",
                    "random_clone", "random_gamma", "threefry2x32", "threefry4x32",
                    "philox2x32", "philox4x32", "rng_bit_generator", "rng_uniform", "iota_2x32_shape"})


class LoweringError(NotImplementedError):
    """A primitive, or a form of one, that the table cannot run; the interpreter adds where it comes from."""


def _unsupported(prim: str, form: str, why: str = ""):
    raise LoweringError(f"{prim} with {form} is not lowered" + (f": {why}" if why else ""))


def lower(*names: str):
    """Register ``fn(ctx, *invals, **params)`` as the lowering of the jax primitives ``names``."""

    def register(fn):
        for name in names:
            LOWERINGS[name] = fn
        return fn

    return register


def lowering(name: str):
    """Lower the jax primitive ``name`` with ``fn(*invals, **params)``, written in ``gradcheck.ops``.

    The public way to run a primitive gradcheck does not know::

        @gradcheck.frontends.jax.lowering("my_prim")
        def my_prim(x, *, alpha):
            return ops.mul(ops.sin(x), alpha)

    ``invals`` are the equation's operands on the backend that runs (float ones tape tensors, torch
    tensors or numpy; integer and bool ones numpy); ``params`` are the equation's, with a float dtype
    among them given as the run's float dtype.  Return one value, or a tuple for a primitive with several
    results.  A lowering registered so replaces the table's own.
    """

    def register(fn):
        def lowered(ctx, *invals, **params):
            return fn(*invals, **{k: ctx.dtype(v) if _is_dtype(v) else v for k, v in params.items()})

        lowered.__name__ = lowered.__qualname__ = getattr(fn, "__name__", name)
        lowered.__wrapped__ = fn
        LOWERINGS[name] = lowered
        return fn

    return register


def _is_dtype(v) -> bool:
    return isinstance(v, np.dtype) or (isinstance(v, type) and issubclass(v, np.generic))


# The narrower floats a run follows where the jaxpr casts to them (a softmax the model computes in float32 inside
# its float64 run), as jax's own run of the model does: numpy and torch compute in them natively.  bfloat16 and
# the float8s numpy cannot compute in; the run's float stands for them, as it does for every wider float.
FOLLOWED = frozenset({"float32", "float16"})


def run_float(dtype, floats, follow: bool = True) -> np.dtype:
    """The dtype a float of the jaxpr has in a run whose float dtype is ``floats``: ``floats``, except a narrower
    float in ``FOLLOWED`` when ``follow`` (a run follows the model's casts; the lowering check, which binds
    jax's primitives in float64, does not)."""
    dt, floats = np.dtype(dtype), np.dtype(floats)
    if follow and dt.name in FOLLOWED and dt.itemsize < floats.itemsize:
        return dt
    return floats


class Context:
    """What a lowering knows besides its operands: the run's float dtype and the equation it lowers."""

    __slots__ = ("floats", "eqn", "outer", "follow")

    def __init__(self, floats, eqn=None, outer: tuple = (), follow: bool = True):
        self.floats = np.dtype(floats)
        self.eqn = eqn
        self.outer = outer  # the higher-order equations around this one, outermost first (for messages)
        self.follow = follow  # a narrower float the jaxpr casts to stays that float (run_float)

    def dtype(self, dtype) -> np.dtype:
        """A dtype of the jaxpr as the run's: a float dtype is the run's floats, or the narrower float the model
        casts to (``run_float``)."""
        dt = np.dtype(dtype)
        return run_float(dt, self.floats, self.follow) if is_float_dtype(dt) else dt

    def where(self) -> str:
        return where(self.eqn, self.outer) if self.eqn is not None else "an equation of no jaxpr"


def is_float_dtype(dt) -> bool:
    """float16/32/64 and ml_dtypes' bfloat16 and float8 kinds (numpy kind 'V')."""
    dt = np.dtype(dt)
    return dt.kind == "f" or dt.name.startswith(("bfloat", "float"))


def where(eqn, outer: tuple = ()) -> str:
    """Where ``eqn`` comes from in the user's code: ``max at LinenCNN/Conv_0, model.py:12:8 (CNN.__call__)``.

    The module path is the name stacks of ``eqn`` and of the higher-order equations ``outer`` around it
    (flax's module path); the line is the user's frame of ``eqn``'s source info, or of the innermost
    equation around it that has one (an equation inside ``jax.nn.relu`` has only jax's frames); the
    functions it is inside (``custom_jvp_call(relu)``, a ``scan``) follow.
    """
    from jax.extend import source_info_util

    chain = tuple(outer) + (eqn,)
    path = scopes.path(chain)
    line = next((text for text in (source_info_util.summarize(e.source_info) for e in reversed(chain))
                 if text and not text.startswith("unknown")), "an unknown line")
    inside = " > ".join(_label(e) for e in outer)
    return (f"{eqn.primitive.name} at {path + ', ' if path else ''}{line}"
            + (f", inside {inside}" if inside else ""))


def _label(eqn) -> str:
    name = eqn.params.get("name")
    return f"{eqn.primitive.name}({name})" if isinstance(name, str) else eqn.primitive.name


# ---------------------------------------------------------------- values
def _raw(x) -> np.ndarray:
    """The values of ``x`` as numpy (detached): for indices, masks and steps."""
    return np.asarray(o.to_numpy(x))


def raw_or_traced(x):
    """A comparison's result as numpy; a traced jax one (jax's pinned float32 run, ``interpreter.run_pinned``, where
    the comparison is the pinned kink) as it is."""
    try:
        return _raw(x)
    except TypeError:
        if backend_of(x) == "jax":
            return x
        raise


def _is_float(x) -> bool:
    return np.dtype(o.dtype_of(x)).kind == "f"


def _any_float(*xs) -> bool:
    return builtins.any(_is_float(x) for x in xs)


def _carries_gradient(x) -> bool:
    return backend_of(x) not in (None, "numpy")


def _shape(x) -> tuple[int, ...]:
    return tuple(o.shape_of(x))


def _ints(values) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _scalar(x) -> int:
    """A 0-d integer operand (a dynamic index, a branch index) as a Python int."""
    return int(_raw(x).reshape(()))


# ---------------------------------------------------------------- elementwise
def _unary(name: str, on_floats, on_ints=None):
    def lowering(ctx, x, **_):  # accuracy=: which approximation jax's kernel may use
        if _is_float(x):
            return on_floats(x)
        if on_ints is None:
            _unsupported(name, f"a {o.dtype_of(x)} operand", "it is defined for floats")
        return on_ints(_raw(x))

    lowering.__name__ = name
    lower(name)(lowering)


for _name, _f, _i in (("exp", o.exp, None), ("log", o.log, None), ("log1p", o.log1p, None),
                      ("expm1", o.expm1, None), ("tanh", o.tanh, None), ("logistic", o.sigmoid, None),
                      ("erf", o.erf, None), ("rsqrt", o.rsqrt, None), ("sqrt", o.sqrt, None),
                      ("sin", o.sin, None), ("cos", o.cos, None), ("atan", o.atan, None),
                      ("abs", o.abs, np.abs), ("neg", o.neg, np.negative),
                      ("square", lambda x: o.mul(x, x), np.square),
                      ("tan", lambda x: o.div(o.sin(x), o.cos(x)), None),
                      ("exp2", lambda x: o.exp(o.mul(x, math.log(2.0))), None),
                      # ops has no erfc: 1 - erf loses erfc's relative precision beyond x ~ 3.
                      ("erfc", lambda x: o.sub(1.0, o.erf(x)), None)):
    _unary(_name, _f, _i)


@lower("erf_inv")
def erf_inv(ctx, x, **_):
    """One Newton step on ``erf(y) = x`` from a root found on the values: ``y0 + (x - erf(y0)) / erf'(y0)``.

    Its value is ``y0`` (the residual is rounding) and its derivative ``1 / erf'(y0)``, erf_inv's own, on
    every backend and for the referee's finite differences alike (ops has no erf_inv).
    """
    y0 = _erf_inv_values(_raw(x).astype(np.float64))
    slope = math.sqrt(math.pi) / 2.0 * np.exp(y0 * y0)  # 1 / erf'(y0); inf at x = +-1, where y0 is
    dt = o.dtype_of(x)
    residual = o.sub(x, np.asarray(o.erf(y0), dt))
    step = o.mul(o.where(np.isfinite(y0), residual, 0.0), np.where(np.isfinite(y0), slope, 0.0).astype(dt))
    return o.add(y0.astype(dt), step)


def _erf_inv_values(x: np.ndarray) -> np.ndarray:
    """erf_inv in float64: Giles' single-precision approximation, then Newton steps on numpy's erf."""
    with np.errstate(divide="ignore", invalid="ignore"):
        w = -np.log((1.0 - x) * (1.0 + x))
        small = w < 5.0
        ws, wl = w - 2.5, np.sqrt(w) - 3.0
        ps = np.polyval([2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                         -0.00125372503, -0.00417768164, 0.246640727, 1.50140941], ws)
        pl = np.polyval([-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                         -0.0076224613, 0.00943887047, 1.00167406, 2.83297682], wl)
        y = np.where(small, ps, pl) * x
        for _ in range(3):
            y = y - (np.asarray(o.erf(y)) - x) / (2.0 / math.sqrt(math.pi) * np.exp(-y * y))
    y = np.where(np.abs(x) == 1.0, np.copysign(np.inf, x), y)
    return np.where(np.abs(x) > 1.0, np.nan, y)


def _binary(name: str, on_floats, on_ints):
    def lowering(ctx, a, b, **_):
        if _any_float(a, b):
            return on_floats(a, b)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return on_ints(_raw(a), _raw(b))

    lowering.__name__ = name
    lower(name)(lowering)


def _int_div(a, b):
    """C's integer division, rounding towards zero (lax.div), from numpy's, which rounds down."""
    q = np.floor_divide(a, b)
    return q + ((q < 0) & (q * b != a)).astype(q.dtype)


for _name, _f, _i in (("add", o.add, np.add), ("add_any", o.add, np.add), ("sub", o.sub, np.subtract),
                      ("mul", o.mul, np.multiply), ("div", o.div, _int_div),
                      ("max", o.maximum, np.maximum), ("min", o.minimum, np.minimum),
                      ("pow", o.pow, np.power), ("and", None, np.bitwise_and), ("or", None, np.bitwise_or),
                      ("xor", None, np.bitwise_xor)):
    _binary(_name, _f or (lambda a, b, n=_name: _unsupported(n, "float operands", "it is boolean")), _i)


@lower("rem")
def rem(ctx, x, y):
    """``x - y * trunc(x / y)`` (C's fmod); the quotient is a step: the gradient is 1 and ``-trunc(x / y)``."""
    if not _any_float(x, y):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.fmod(_raw(x), _raw(y))
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.trunc(_raw(x) / _raw(y))
    return o.sub(x, o.mul(y, q.astype(o.dtype_of(x))))


@lower("integer_pow")
def integer_pow(ctx, x, y):
    return o.pow(x, int(y)) if _is_float(x) else np.power(_raw(x), int(y))


@lower("sign")
def sign(ctx, x):
    """-1, 0 or 1 from two comparisons (recorded kinks); piecewise constant, so no gradient flows."""
    if not _is_float(x):
        return np.sign(_raw(x))
    pos, neg = raw_or_traced(o.greater(x, 0.0)), raw_or_traced(o.less(x, 0.0))
    return (pos.astype(ctx.floats) - neg.astype(ctx.floats)).astype(ctx.floats)


def _step(name: str, fn):
    def lowering(ctx, x, **params):  # round's rounding_method
        if not _is_float(x):
            return _raw(x)
        return fn(_raw(x), **params).astype(_raw(x).dtype)

    lowering.__name__ = name
    lower(name)(lowering)


def _round(x, rounding_method=0):
    """lax.round: halves away from zero (rounding_method 0, lax's default) or to even (1, jnp.round's)."""
    if int(rounding_method) == 1:
        return np.round(x)
    t = np.trunc(x)
    return np.where(np.abs(x - t) == 0.5, t + np.sign(x), np.round(x))


_step("floor", lambda x: np.floor(x))
_step("ceil", lambda x: np.ceil(x))
_step("round", _round)


@lower("is_finite")
def is_finite(ctx, x):
    return np.isfinite(_raw(x))


@lower("not")
def not_(ctx, x):
    return np.invert(_raw(x))


def _shift(name: str, fn):
    def lowering(ctx, x, s):
        a, b = _raw(x), _raw(s)
        bits = a.dtype.itemsize * 8
        out = fn(a, np.clip(b, 0, bits - 1).astype(a.dtype))
        # XLA: a shift by the width or more gives 0 (logical) or the sign (arithmetic).
        full = np.where(a < 0, -1, 0).astype(a.dtype) if name == "shift_right_arithmetic" else np.zeros_like(a)
        return np.where((b < 0) | (b >= bits), full, out)

    lowering.__name__ = name
    lower(name)(lowering)


def _logical_right(a, b):
    unsigned = np.dtype(f"uint{a.dtype.itemsize * 8}")
    return np.right_shift(a.view(unsigned), b.astype(unsigned)).view(a.dtype)


_shift("shift_left", np.left_shift)
_shift("shift_right_arithmetic", np.right_shift)
_shift("shift_right_logical", _logical_right)


# Comparisons of floats go through ops (recorded and pinned kinks); ge and le are a comparison or an equality,
# so that NaN compares false, as in jax.
def _compare(name: str, on_floats, on_ints):
    def lowering(ctx, a, b):
        if _any_float(a, b):
            return on_floats(a, b)
        return on_ints(_raw(a), _raw(b))

    lowering.__name__ = name
    lower(name)(lowering)


_compare("gt", lambda a, b: raw_or_traced(o.greater(a, b)), np.greater)
_compare("lt", lambda a, b: raw_or_traced(o.less(a, b)), np.less)
_compare("eq", lambda a, b: raw_or_traced(o.equal(a, b)), np.equal)
_compare("ne", lambda a, b: ~raw_or_traced(o.equal(a, b)), np.not_equal)
_compare("ge", lambda a, b: raw_or_traced(o.greater(a, b)) | raw_or_traced(o.equal(a, b)), np.greater_equal)
_compare("le", lambda a, b: raw_or_traced(o.less(a, b)) | raw_or_traced(o.equal(a, b)), np.less_equal)


@lower("select_n")
def select_n(ctx, which, *cases):
    """``cases[which]`` elementwise: a boolean ``which`` picks ``cases[1]`` where True; an integer one indexes."""
    w = _raw(which)
    if len(cases) == 1:
        return cases[0]
    if not _any_float(*cases):
        raw = [_raw(c) for c in cases]
        return np.where(w, raw[1], raw[0]) if w.dtype == np.bool_ else np.choose(w, raw)
    if w.dtype == np.bool_:
        return o.where(w, cases[1], cases[0])
    out = cases[-1]
    for k in range(len(cases) - 2, -1, -1):
        out = o.where(w == k, cases[k], out)
    return out


@lower("clamp")
def clamp(ctx, lo, x, hi):
    """``min(max(x, lo), hi)`` with ops' maximum/minimum (recorded kinks); at a tie they split the gradient,
    where jax gives it to neither side: a kink."""
    if not _any_float(lo, x, hi):
        return np.clip(_raw(x), _raw(lo), _raw(hi))
    return o.minimum(o.maximum(x, lo), hi)


# ---------------------------------------------------------------- dtypes and constants
@lower("convert_element_type")
def convert_element_type(ctx, x, new_dtype, **_):  # weak_type, sharding
    target = ctx.dtype(new_dtype)
    if _is_float(x):
        if target.kind == "f":
            return x if np.dtype(o.dtype_of(x)) == target else o.astype(x, target)
        return _float_to(_raw(x), target)
    return _raw(x).astype(target)


def _float_to(x: np.ndarray, target: np.dtype) -> np.ndarray:
    """A float as an integer or bool, as XLA converts: towards zero, NaN to 0, saturating."""
    if target == np.bool_:
        return x != 0
    info = np.iinfo(target)
    with np.errstate(invalid="ignore"):
        t = np.nan_to_num(np.trunc(x), nan=0.0, posinf=float(info.max), neginf=float(info.min))
        return np.clip(t, info.min, info.max).astype(target)


@lower("bitcast_convert_type")
def bitcast_convert_type(ctx, x, new_dtype):
    """The bits of ``x`` read as ``new_dtype``, in the dtypes the jaxpr has (a float run's own is another width)."""
    source = np.dtype(ctx.eqn.invars[0].aval.dtype)
    raw = np.ascontiguousarray(_raw(x).astype(source))
    target = np.dtype(new_dtype)
    if source.itemsize == target.itemsize:
        return raw.view(target)
    if source.itemsize > target.itemsize:  # one element becomes a trailing dim of narrower ones
        return raw.view(target).reshape(raw.shape + (source.itemsize // target.itemsize,))
    return raw.view(target).reshape(raw.shape[:-1])


@lower("iota")
def iota(ctx, dtype, shape, dimension, **_):  # sharding
    shape = _ints(shape)
    line = np.arange(shape[dimension]).reshape(tuple(n if d == dimension else 1 for d, n in enumerate(shape)))
    return np.array(np.broadcast_to(line, shape), dtype=ctx.dtype(dtype))


@lower("random_wrap", "random_unwrap")
def key_data(ctx, keys, **_):  # impl
    """A key as its key data (uint32): what the run holds for a key, wrapped or not, so both are identities."""
    if type(keys).__module__.split(".")[0] in ("jax", "jaxlib"):  # a typed key, as jax's own walk holds it
        import jax

        if jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key):
            return np.asarray(jax.random.key_data(keys))
    return _raw(keys)


@lower("stop_gradient")
def stop_gradient(ctx, x):
    # On numpy too: the referee holds every stop_gradient's value fixed at the case point (gradcheck.check.kinks).
    return o.stop_gradient(x) if _is_float(x) else x


def _identity(ctx, *xs, **_):
    return xs[0] if len(xs) == 1 else tuple(xs)


# copy is the primitive jax calls copy_p.
lower("copy", "sharding_constraint")(_identity)


@lower("device_put", "optimization_barrier")
def identity_all(ctx, *xs, **_):
    # Both have several results, one per operand.
    return tuple(xs)


# ---------------------------------------------------------------- shapes
@lower("broadcast_in_dim")
def broadcast_in_dim(ctx, x, *dynamic, shape, broadcast_dimensions, **_):  # sharding
    if dynamic:
        _unsupported("broadcast_in_dim", "dynamic shapes", "the shapes of a jaxpr gradcheck runs are static")
    shape = _ints(shape)
    inter = [1] * len(shape)
    for i, d in enumerate(broadcast_dimensions):
        inter[int(d)] = _shape(x)[i]
    y = x if tuple(inter) == _shape(x) else o.reshape(x, tuple(inter))
    return y if tuple(inter) == shape else o.broadcast_to(y, shape)


@lower("reshape")
def reshape(ctx, x, *dynamic, new_sizes, dimensions=None, **_):  # sharding
    if dynamic:
        _unsupported("reshape", "dynamic shapes", "the shapes of a jaxpr gradcheck runs are static")
    if dimensions is not None:
        x = o.transpose(x, _ints(dimensions))
    return o.reshape(x, _ints(new_sizes))


@lower("transpose")
def transpose(ctx, x, permutation):
    return o.transpose(x, _ints(permutation))


@lower("squeeze")
def squeeze(ctx, x, dimensions):
    drop = {int(d) % builtins.max(len(_shape(x)), 1) for d in dimensions}
    return o.reshape(x, tuple(n for i, n in enumerate(_shape(x)) if i not in drop))


@lower("rev")
def rev(ctx, x, dimensions):
    flip = {int(d) for d in dimensions}
    return o.getitem(x, tuple(slice(None, None, -1) if d in flip else slice(None) for d in range(len(_shape(x)))))


@lower("concatenate")
def concatenate(ctx, *xs, dimension):
    return o.concatenate(list(xs), axis=int(dimension))


@lower("stack")
def stack(ctx, *xs, axis):
    return o.stack(list(xs), axis=int(axis))


@lower("unstack")
def unstack(ctx, x, axis):
    axis = int(axis)
    return tuple(o.getitem(x, (slice(None),) * axis + (i,)) for i in range(_shape(x)[axis]))


@lower("split")
def split(ctx, x, sizes, axis):
    axis, start, parts = int(axis), 0, []
    for n in _ints(sizes):
        parts.append(o.getitem(x, (slice(None),) * axis + (slice(start, start + n),)))
        start += n
    return tuple(parts)


@lower("tile")
def tile(ctx, x, reps):
    """Each axis repeated ``reps`` times: a broadcast over a new axis in front of each, then a reshape."""
    reps = _ints(reps)
    shape = (1,) * (len(reps) - len(_shape(x))) + _shape(x)
    y = o.reshape(x, tuple(d for s in shape for d in (1, s)))
    y = o.broadcast_to(y, tuple(d for r, s in zip(reps, shape) for d in (r, s)))
    return o.reshape(y, tuple(r * s for r, s in zip(reps, shape)))


@lower("slice")
def slice_(ctx, x, start_indices, limit_indices, strides=None):
    strides = strides or (1,) * len(start_indices)
    return o.getitem(x, tuple(slice(int(s), int(e), int(k)) for s, e, k in zip(start_indices, limit_indices, strides)))


def _clamped_starts(starts, shape, sizes) -> list[int]:
    """Dynamic start indices clamped so that the window fits, as jax clamps them."""
    return [builtins.min(builtins.max(_scalar(s), 0), n - k) for s, n, k in zip(starts, shape, sizes)]


@lower("dynamic_slice")
def dynamic_slice(ctx, x, *starts, slice_sizes):
    sizes = _ints(slice_sizes)
    begin = _clamped_starts(starts, _shape(x), sizes)
    return o.getitem(x, tuple(slice(b, b + k) for b, k in zip(begin, sizes)))


@lower("dynamic_update_slice")
def dynamic_update_slice(ctx, x, update, *starts):
    """``x`` with ``update`` written at the clamped ``starts``: the update padded to ``x``'s shape, selected."""
    shape, sizes = _shape(x), _shape(update)
    begin = _clamped_starts(starts, shape, sizes)
    window = tuple(slice(b, b + k) for b, k in zip(begin, sizes))
    if not _any_float(x, update):
        out = _raw(x).copy()
        out[window] = _raw(update)
        return out
    inside = np.zeros(shape, dtype=bool)
    inside[window] = True
    return o.where(inside, o.pad(update, tuple((b, n - b - k) for b, n, k in zip(begin, shape, sizes))), x)


# ---------------------------------------------------------------- padding
@lower("pad")
def pad(ctx, x, padding_value, padding_config):
    """Interior padding first (between the elements), then the edges; a negative edge crops."""
    if _carries_gradient(padding_value):
        # A padding value that is differentiated: zeros where it goes, plus the value times that region.
        zero = np.zeros((), o.dtype_of(x))
        body = _padded(x, zero, padding_config)
        region = np.asarray(1.0 - _padded(np.ones(_shape(x), ctx.floats), np.zeros((), ctx.floats), padding_config))
        return o.add(body, o.mul(region.astype(o.dtype_of(x)), padding_value))
    return _padded(x, _raw(padding_value), padding_config)


def _padded(x, value: np.ndarray, padding_config):
    for axis, (_, _, interior) in enumerate(padding_config):
        if int(interior):
            x = _interior(x, axis, int(interior), value)
    return _pad_or_crop(x, [(int(lo), int(hi)) for lo, hi, _ in padding_config], value)


def _interior(x, axis: int, n: int, value):
    """``n`` copies of ``value`` between consecutive elements along ``axis`` (XLA's interior padding, a
    convolution's lhs dilation): each element gets ``n`` fill values after it, then the last ``n`` are cut."""
    shape = _shape(x)
    size = shape[axis]
    if size == 0:
        return x
    y = o.reshape(x, shape[: axis + 1] + (1,) + shape[axis + 1 :])
    fill = np.full(shape[: axis + 1] + (n,) + shape[axis + 1 :], value, dtype=o.dtype_of(x))
    y = o.concatenate([y, fill], axis=axis + 1)
    y = o.reshape(y, shape[:axis] + (size * (n + 1),) + shape[axis + 1 :])
    return o.getitem(y, (slice(None),) * axis + (slice(0, size * (n + 1) - n),))


def _pad_or_crop(x, pairs, value):
    """``x`` with ``(before, after)`` per axis added (filled with ``value``) or, where negative, cut off."""
    shape = _shape(x)
    if builtins.any(lo < 0 or hi < 0 for lo, hi in pairs):
        x = o.getitem(x, tuple(slice(-builtins.min(lo, 0), n - builtins.max(-hi, 0)) for (lo, hi), n in zip(pairs, shape)))
    widths = tuple((builtins.max(lo, 0), builtins.max(hi, 0)) for lo, hi in pairs)
    if not builtins.any(lo or hi for lo, hi in widths):
        return x
    if not _is_float(x):
        return np.pad(_raw(x), widths, constant_values=np.asarray(value).reshape(()).item())
    return o.pad(x, widths, value=float(np.asarray(value).reshape(())))


# ---------------------------------------------------------------- reductions
def _axes(axes) -> tuple[int, ...]:
    return _ints(axes)


def _reduction(name: str, on_floats, on_ints):
    def lowering(ctx, x, axes, **_):  # out_sharding
        if _is_float(x):
            if on_floats is None:
                _unsupported(name, "a float operand", "it is boolean")
            return on_floats(x, axis=_axes(axes))
        return on_ints(_raw(x), axis=_axes(axes))

    lowering.__name__ = name
    lower(name)(lowering)


_reduction("reduce_sum", o.sum, np.sum)
_reduction("reduce_max", o.max, np.max)
_reduction("reduce_min", o.min, np.min)
_reduction("reduce_prod", o.prod, np.prod)
_reduction("reduce_and", None, np.bitwise_and.reduce)
_reduction("reduce_or", None, np.bitwise_or.reduce)
_reduction("reduce_xor", None, np.bitwise_xor.reduce)


def _arg(name: str, fn):
    """argmax/argmin along the one axis: the first position of the extreme (NaN counts as it), as jax's."""

    def lowering(ctx, x, axes, index_dtype):
        (axis,) = _axes(axes)
        return fn(_raw(x), axis=axis).astype(np.dtype(index_dtype))

    lowering.__name__ = name
    lower(name)(lowering)


_arg("argmax", np.argmax)
_arg("argmin", np.argmin)


def _collective(name: str, on_floats, on_ints):
    """psum/pmax/pmin over positional axes: what ``vmap(..., axis_name=...)`` leaves of a collective (the
    mapped axis is an array axis then); over a named axis (pmap, shard_map) there is no one-device meaning."""

    def lowering(ctx, *xs, axes, axis_index_groups=None, **_):
        named = [a for a in axes if not isinstance(a, (int, np.integer))]
        if named or axis_index_groups is not None:
            _unsupported(name, f"the named axes {named}" if named else "axis_index_groups",
                         "only vmap's collectives, over array axes, are lowered; check the model under vmap, "
                         "not pmap or shard_map")
        out = tuple(on_floats(x, axis=_ints(axes)) if _is_float(x) else on_ints(_raw(x), axis=_ints(axes))
                    for x in xs)
        return out

    lowering.__name__ = name
    lower(name)(lowering)


_collective("psum", o.sum, np.sum)
_collective("pmax", o.max, np.max)
_collective("pmin", o.min, np.min)


# ---------------------------------------------------------------- cumulative
def _move_last(x, axis: int):
    nd = len(_shape(x))
    perm = tuple(d for d in range(nd) if d != axis) + (axis,)
    return o.transpose(x, perm), tuple(int(i) for i in np.argsort(perm))


@lower("cumsum")
def cumsum(ctx, x, axis, reverse=False):
    """A product with the triangle of ones along ``axis`` (differentiable wherever matmul is)."""
    axis = int(axis)
    if not _is_float(x):
        return _int_cumulative(np.cumsum, _raw(x), axis, reverse)
    n = _shape(x)[axis]
    y, back = _move_last(x, axis)
    ones = np.ones((n, n), ctx.floats)
    y = o.matmul(y, np.tril(ones) if reverse else np.triu(ones))
    return o.transpose(y, back)


def _int_cumulative(fn, x: np.ndarray, axis: int, reverse: bool):
    if reverse:
        return np.flip(fn(np.flip(x, axis), axis=axis), axis)
    return fn(x, axis=axis)


def _cumulative(name: str, reduce, fill, on_ints):
    """``out[i] = reduce(x[j] for j <= i)`` (``j >= i`` reversed) as one reduction over a masked square: its
    gradient is the reduction's (the product rule with zeros, the max's to the elements picked)."""

    def lowering(ctx, x, axis, reverse=False):
        axis = int(axis)
        if not _is_float(x):
            if on_ints is None:
                _unsupported(name, f"a {o.dtype_of(x)} operand", "it is defined for floats")
            return _int_cumulative(on_ints, _raw(x), axis, reverse)
        n = _shape(x)[axis]
        y, back = _move_last(x, axis)
        square = o.broadcast_to(o.expand_dims(y, -2), _shape(y) + (n,))
        j, i = np.meshgrid(np.arange(n), np.arange(n))
        keep = (j >= i) if reverse else (j <= i)
        out = reduce(o.where(keep, square, fill), axis=-1)
        return o.transpose(out, back)

    lowering.__name__ = name
    lower(name)(lowering)


_cumulative("cumprod", o.prod, 1.0, np.cumprod)
_cumulative("cummax", o.max, -np.inf, np.maximum.accumulate)
_cumulative("cummin", o.min, np.inf, np.minimum.accumulate)
_cumulative("cumlogsumexp", o.logsumexp, -np.inf, None)


# ---------------------------------------------------------------- sorting
def _along(positions: np.ndarray, axis: int) -> tuple:
    """The numpy index that reads ``positions`` along ``axis`` and every other axis in place."""
    grid = list(np.ogrid[tuple(slice(n) for n in positions.shape)])
    grid[axis] = positions
    return tuple(grid)


@lower("sort")
def sort(ctx, *operands, dimension, is_stable, num_keys):
    """The order of the first ``num_keys`` operands (stable), from their values; every operand gathered in it."""
    axis = int(dimension)
    # np.lexsort's most significant key is the last; like jax's sort it ties -0.0 with 0.0 and puts NaN last.
    keys = [np.moveaxis(_raw(operands[k]), axis, -1) for k in reversed(range(int(num_keys)))]
    order = np.moveaxis(np.lexsort(keys), -1, axis)
    index = _along(order, axis)
    return tuple(o.getitem(x, index) if _is_float(x) else _raw(x)[index] for x in operands)


@lower("top_k")
def top_k(ctx, x, k, axis=-1, **_):
    axis = int(axis) % len(_shape(x))
    if _is_float(x):
        values, indices = o.topk(x, int(k), axis=axis)
        return values, _raw(indices)
    raw = _raw(x)
    order = np.take(np.argsort(-raw.astype(np.int64) if raw.dtype.kind == "u" else -raw, axis=axis, kind="stable"),
                    np.arange(int(k)), axis=axis)
    return raw[_along(order, axis)], order


# ---------------------------------------------------------------- contractions
@lower("dot_general")
def dot_general(ctx, lhs, rhs, dimension_numbers, **_):  # precision, preferred_element_type, out_sharding
    """``ops.matmul`` (``ops.linear`` for ``x @ w.T``) where the contraction is one, else ``ops.einsum``."""
    (lc, rc), (lb, rb) = ((_ints(a), _ints(b)) for a, b in dimension_numbers)
    nl, nr = len(_shape(lhs)), len(_shape(rhs))
    if not _any_float(lhs, rhs):
        return np.einsum(_dot_subscripts(nl, nr, lc, rc, lb, rb), _raw(lhs), _raw(rhs))
    nb = len(lb)
    batch = lb == rb == tuple(range(nb))
    if batch and lc == (nl - 1,) and nl >= nb + 1:
        if nb == 0 and nr in (1, 2) and rc == (0,):
            return o.matmul(lhs, rhs)  # flax's Dense: x @ kernel
        if nb == 0 and nr == 2 and rc == (1,):
            return o.linear(lhs, rhs)  # an embedding's attend, a torch-layout weight: x @ w.T
        if nb > 0 and nl == nr == nb + 2 and rc == (nb,):
            return o.matmul(lhs, rhs)  # batched matrices
    return o.einsum(_dot_subscripts(nl, nr, lc, rc, lb, rb), lhs, rhs)


def _dot_subscripts(nl, nr, lc, rc, lb, rb) -> str:
    """dot_general's einsum: batch dims, then lhs's free dims, then rhs's."""
    letters = iter(string.ascii_letters)
    left, right = [None] * nl, [None] * nr
    for a, b in itertools.chain(zip(lb, rb), zip(lc, rc)):
        left[a] = right[b] = next(letters)
    left = [c or next(letters) for c in left]
    right = [c or next(letters) for c in right]
    out = ([left[a] for a in lb] + [left[i] for i in range(nl) if i not in lb and i not in lc]
           + [right[i] for i in range(nr) if i not in rb and i not in rc])
    return f"{''.join(left)},{''.join(right)}->{''.join(out)}"


# ---------------------------------------------------------------- convolution
@lower("conv_general_dilated")
def conv_general_dilated(ctx, lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
                         feature_group_count, batch_group_count, **_):  # precision, preferred_element_type
    """``ops.conv`` on gradcheck's NCHW/OIHW layout (transposes in and out); an lhs dilation, flax's
    ConvTranspose, is ``ops.conv_transpose`` where torch's rules allow it, else the dilation written out."""
    if int(batch_group_count) != 1:
        _unsupported("conv_general_dilated", f"batch_group_count={batch_group_count}",
                     "it appears in the gradient of a grouped convolution, not in a model's forward")
    nsp = len(window_strides)
    if nsp not in (1, 2):
        _unsupported("conv_general_dilated", f"{nsp} spatial dims", "ops.conv is 1-d (NCL) or 2-d (NCHW)")
    lhs_spec, rhs_spec, out_spec = (_ints(s) for s in dimension_numbers)
    x, w = o.transpose(lhs, lhs_spec), o.transpose(rhs, rhs_spec)
    strides, dil, ldil = _ints(window_strides), _ints(rhs_dilation), _ints(lhs_dilation)
    pairs = [(int(lo), int(hi)) for lo, hi in padding]
    groups = int(feature_group_count)
    y = None
    if builtins.any(d != 1 for d in ldil):
        y = _as_conv_transpose(x, w, strides, pairs, dil, ldil, groups)
        if y is None:  # torch's transposed convolution cannot take this geometry: dilate the input itself
            for k, d in enumerate(ldil):
                if d != 1:
                    x = _interior(x, 2 + k, d - 1, np.zeros((), ctx.floats))
    if y is None:
        y = _conv(x, w, strides, pairs, dil, groups, ctx)
    return o.transpose(y, tuple(int(i) for i in np.argsort(out_spec)))


def _conv(x, w, strides, pairs, dilation, groups, ctx):
    if builtins.all(lo == hi >= 0 for lo, hi in pairs):
        padding = tuple(lo for lo, _ in pairs)
    else:  # asymmetric ("SAME" with an even kernel) or negative: padded or cropped first
        x = _pad_or_crop(x, [(0, 0), (0, 0)] + pairs, np.zeros((), ctx.floats))
        padding = (0,) * len(pairs)
    return o.conv(x, w, stride=strides, padding=padding, dilation=dilation, groups=groups)


def _as_conv_transpose(x, w, strides, pairs, dilation, ldil, groups):
    """A convolution of the input dilated by ``ldil`` as torch's transposed convolution of stride ``ldil``,
    or None where torch's rules do not allow it.

    Torch's transposed convolution dilates its input by the stride, pads each side with
    ``dilation * (k - 1) - padding`` (and ``output_padding`` more after), and correlates with the kernel
    flipped and its in/out channels swapped: so ``padding = d (k - 1) - lo``, ``output_padding = hi - lo``;
    a negative ``output_padding`` (flax's "SAME", padding (2, 1) for a 3-tap kernel) is cut off after.
    """
    if builtins.any(s != 1 for s in strides):
        return None
    ks = _shape(w)[2:]
    pad = [d * (k - 1) - lo for (lo, _), d, k in zip(pairs, dilation, ks)]
    extra = [hi - lo for lo, hi in pairs]
    if builtins.any(p < 0 for p in pad) or builtins.any(e >= builtins.max(s, d) for e, s, d in zip(extra, ldil, dilation)):
        return None
    out_c, in_per_group = _shape(w)[:2]
    wt = o.reshape(w, (groups, out_c // groups, in_per_group) + ks)
    wt = o.reshape(o.transpose(wt, (0, 2, 1) + tuple(range(3, 3 + len(ks)))),
                   (groups * in_per_group, out_c // groups) + ks)
    wt = o.getitem(wt, (slice(None), slice(None)) + (slice(None, None, -1),) * len(ks))
    y = o.conv_transpose(x, wt, stride=ldil, padding=tuple(pad), output_padding=tuple(builtins.max(e, 0) for e in extra),
                         dilation=dilation, groups=groups)
    if builtins.all(e >= 0 for e in extra):
        return y
    return o.getitem(y, (slice(None), slice(None)) + tuple(slice(0, n + builtins.min(e, 0))
                                                         for n, e in zip(_shape(y)[2:], extra)))


# ---------------------------------------------------------------- windows (pooling)
_WINDOW_FILL = {"sum": 0.0, "max": -np.inf, "min": np.inf}


def _window(kind: str):
    def lowering(ctx, x, window_dimensions, window_strides, padding, base_dilation, window_dilation):
        """Pooling as flax and equinox write it: ``ops.max_pool2d``/``ops.avg_pool2d`` over the (at most two)
        axes with a window, the others folded into the batch; a window dilation or more axes are taps."""
        if not _is_float(x):
            _unsupported(f"reduce_window_{kind}", f"a {o.dtype_of(x)} operand", "only float pooling is lowered")
        window, strides = _ints(window_dimensions), _ints(window_strides)
        fill = np.asarray(_WINDOW_FILL[kind], ctx.floats)
        for axis, d in enumerate(_ints(base_dilation)):
            if d != 1:
                x = _interior(x, axis, d - 1, fill)
        x = _pad_or_crop(x, [(int(lo), int(hi)) for lo, hi in padding], fill)
        axes = [a for a in range(len(window)) if window[a] != 1 or strides[a] != 1]
        if builtins.any(d != 1 for d in _ints(window_dilation)) or len(axes) > 2:
            return _taps(x, kind, window, strides, _ints(window_dilation))
        return _pool(x, kind, axes, window, strides) if axes else x

    lowering.__name__ = f"reduce_window_{kind}"
    return lowering


for _kind in ("sum", "max", "min"):
    lower(f"reduce_window_{_kind}")(_window(_kind))


def _pool(x, kind: str, axes, window, strides):
    """A 2-d pool of ``x`` (already padded) over ``axes``, as NCHW with every other axis in the batch."""
    nd = len(_shape(x))
    rest = [a for a in range(nd) if a not in axes]
    perm = tuple(rest + axes)
    y = o.transpose(x, perm)
    lead = _shape(y)[: len(rest)]
    spatial = _shape(y)[len(rest) :]
    k, s = tuple(window[a] for a in axes), tuple(strides[a] for a in axes)
    if len(axes) == 1:
        spatial, k, s = (1,) + spatial, (1,) + k, (1,) + s
    y = o.reshape(y, (int(np.prod(lead, dtype=np.int64)), 1) + spatial)
    if kind == "max":
        y = o.max_pool2d(y, k, s)
    elif kind == "min":
        y = o.neg(o.max_pool2d(o.neg(y), k, s))
    else:  # count_include_pad with no padding left: the mean of every window, times its size
        y = o.mul(o.avg_pool2d(y, k, s), float(k[0] * k[1]))
    out = _shape(y)[2:] if len(axes) == 2 else _shape(y)[3:]
    y = o.reshape(y, lead + out)
    return o.transpose(y, tuple(int(i) for i in np.argsort(perm)))


def _taps(x, kind: str, window, strides, dilation):
    """Every window position as a strided slice, stacked on a last axis and reduced: the sum, or the first
    maximum (minimum) of each window picked by a mask from the values, which is where jax's gradient goes."""
    shape = _shape(x)
    out = [(n - (k - 1) * d - 1) // s + 1 for n, k, d, s in zip(shape, window, dilation, strides)]
    taps = []
    for offsets in itertools.product(*(range(k) for k in window)):
        taps.append(o.getitem(x, tuple(slice(j * d, j * d + (m - 1) * s + 1, s)
                                       for j, d, m, s in zip(offsets, dilation, out, strides))))
    stacked = o.stack(taps, axis=-1)
    if kind == "sum":
        return o.sum(stacked, axis=-1)
    values = _raw(stacked)
    first = (np.argmax if kind == "max" else np.argmin)(values, axis=-1)[..., None]
    picked = np.arange(len(taps)) == first
    return o.sum(o.where(picked, stacked, 0.0), axis=-1)


# ---------------------------------------------------------------- gather and scatter
def _mode(mode) -> str:
    """GatherScatterMode as its name: CLIP, FILL_OR_DROP, PROMISE_IN_BOUNDS, ONE_HOT."""
    return getattr(mode, "name", str(mode)).rsplit(".", 1)[-1]


def _starts(indices: np.ndarray, rank: int, index_map, operand_batching, indices_batching) -> np.ndarray:
    """Each slice's start in the operand, ``indices.shape[:-1] + (rank,)``: the index vector (the last axis of
    ``indices``) at the dims ``index_map`` names; a batching dim starts at its batch position."""
    batch = indices.shape[:-1]
    starts = np.zeros(batch + (rank,), np.int64)
    for k, d in enumerate(index_map):
        starts[..., d] = indices[..., k]
    for d, b in zip(operand_batching, indices_batching):
        starts[..., d] = np.arange(batch[b]).reshape(tuple(-1 if i == b else 1 for i in range(len(batch))))
    return starts


def _positions(shape, starts: np.ndarray, sizes, kept) -> np.ndarray:
    """The flat operand position of every element of every window, ``batch + (sizes[d] for d in kept)``."""
    nb, nk = starts.ndim - 1, len(kept)
    strides = np.cumprod((1,) + tuple(shape[::-1]))[:-1][::-1]
    flat = np.zeros(starts.shape[:-1] + (1,) * nk, np.int64)
    for d in range(len(shape)):
        coord = starts[..., d].reshape(starts.shape[:-1] + (1,) * nk)
        if d in kept:
            j = kept.index(d)
            coord = coord + np.arange(sizes[d]).reshape((1,) * nb + tuple(sizes[d] if i == j else 1 for i in range(nk)))
        flat = flat + coord * strides[d]
    return flat


def _layout(nb: int, window_positions, rank: int) -> tuple[int, ...]:
    """The transpose from (batch..., window...) to an array whose window dims sit at ``window_positions``."""
    window_positions = list(window_positions)
    batch = iter(range(nb))
    return tuple(nb + window_positions.index(p) if p in window_positions else next(batch) for p in range(rank))


def _in_bounds(starts: np.ndarray, shape, sizes, dims) -> np.ndarray:
    ok = np.ones(starts.shape[:-1], bool)
    for d in dims:
        ok &= (starts[..., d] >= 0) & (starts[..., d] <= shape[d] - sizes[d])
    return ok


@lower("gather")
def gather(ctx, operand, indices, dimension_numbers, slice_sizes, mode, fill_value=None, **_):
    """XLA's gather: a window of ``slice_sizes`` at each index vector; ``ops.take`` along the one axis an
    embedding or ``x[ids]`` reads, else one ``ops.take`` of the flat operand at every element's position."""
    dn, shape, sizes = dimension_numbers, _shape(operand), _ints(slice_sizes)
    idx = _raw(indices).astype(np.int64)
    index_map, collapsed = _ints(dn.start_index_map), _ints(dn.collapsed_slice_dims)
    obatch, ibatch = _ints(getattr(dn, "operand_batching_dims", ())), _ints(getattr(dn, "start_indices_batching_dims", ()))
    offset_dims = _ints(dn.offset_dims)
    starts = _starts(idx, len(shape), index_map, obatch, ibatch)
    filled = _mode(mode) == "FILL_OR_DROP"
    valid = _in_bounds(starts, shape, sizes, index_map) if filled else None
    for d in range(len(shape)):  # every mode clamps; FILL_OR_DROP then fills what was out of bounds
        starts[..., d] = np.clip(starts[..., d], 0, shape[d] - sizes[d])
    kept = [d for d in range(len(shape)) if d not in collapsed and d not in obatch]
    nb = starts.ndim - 1
    rank = nb + len(kept)
    perm = _layout(nb, offset_dims, rank)
    one_axis = (len(index_map) == 1 and collapsed == index_map and not obatch
                and builtins.all(sizes[d] == shape[d] for d in kept) and _is_float(operand))
    if one_axis:
        (axis,) = index_map
        out = o.take(operand, starts[..., axis], axis=axis)  # (kept before axis, batch, kept after axis)
        before = [k for k in kept if k < axis]
        order = [nb + kept.index(k) for k in before] + list(range(nb)) + [nb + kept.index(k) for k in kept if k > axis]
        axes = tuple(order.index(c) for c in perm)
        out = out if axes == tuple(range(rank)) else o.transpose(out, axes)
    else:
        flat = np.transpose(_positions(shape, starts, sizes, kept), perm)
        out = o.take(o.reshape(operand, (-1,)), flat, axis=0) if _is_float(operand) else _raw(operand).reshape(-1)[flat]
    if valid is None or valid.all():
        return out
    mask = np.transpose(valid.reshape(valid.shape + (1,) * len(kept)), perm)
    fill = _gather_fill(fill_value, o.dtype_of(operand))
    return o.where(mask, out, fill) if _is_float(operand) else np.where(mask, out, fill)


def _gather_fill(fill_value, dtype) -> float | int | bool:
    """jax's default fill: NaN for floats, the most negative int (signed), the largest (unsigned), True (bool)."""
    if fill_value is not None:
        return fill_value
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return math.nan
    if dt == np.bool_:
        return True
    return np.iinfo(dt).min if dt.kind == "i" else np.iinfo(dt).max


def _scatter_positions(operand, indices, updates, dn, mode):
    """The flat operand position of every element of ``updates`` (in its layout) and whether it is written."""
    shape, ushape = _shape(operand), _shape(updates)
    window_dims = _ints(dn.update_window_dims)
    inserted = _ints(dn.inserted_window_dims)
    obatch, ibatch = _ints(getattr(dn, "operand_batching_dims", ())), _ints(getattr(dn, "scatter_indices_batching_dims", ()))
    kept = [d for d in range(len(shape)) if d not in inserted and d not in obatch]
    sizes = [1] * len(shape)
    for j, d in enumerate(kept):
        sizes[d] = ushape[window_dims[j]]
    starts = _starts(_raw(indices).astype(np.int64), len(shape), _ints(dn.scatter_dims_to_operand_dims), obatch, ibatch)
    if _mode(mode) == "CLIP":
        for d in range(len(shape)):
            starts[..., d] = np.clip(starts[..., d], 0, shape[d] - sizes[d])
    # XLA skips a window that does not fit (FILL_OR_DROP drops it; PROMISE_IN_BOUNDS promised there is none).
    valid = _in_bounds(starts, shape, sizes, range(len(shape)))
    nb = starts.ndim - 1
    perm = _layout(nb, window_dims, len(ushape))
    positions = np.transpose(_positions(shape, starts, sizes, kept), perm)
    written = np.broadcast_to(np.transpose(valid.reshape(valid.shape + (1,) * len(kept)), perm), positions.shape)
    return positions.reshape(-1), written.reshape(-1)


def _scatter_setup(name, operand, indices, updates, dimension_numbers, mode):
    if not _any_float(operand, updates):
        _unsupported(name, f"{o.dtype_of(operand)} values", "only float scatters are lowered")
    positions, written = _scatter_positions(operand, indices, updates, dimension_numbers, mode)
    flat = o.reshape(updates, (-1,))
    if not written.all():
        keep = np.nonzero(written)[0]
        flat, positions = o.take(flat, keep, axis=0), positions[keep]
    return flat, positions


@lower("scatter-add", "scatter-sub")
def scatter_add(ctx, operand, indices, updates, dimension_numbers, mode, **_):
    """``operand`` plus (minus) the updates summed at their positions: linear in both, repeats add up."""
    name = ctx.eqn.primitive.name if ctx.eqn is not None else "scatter-add"
    flat, positions = _scatter_setup(name, operand, indices, updates, dimension_numbers, mode)
    if positions.size == 0:
        return operand
    shape = _shape(operand)
    summed = o.reshape(_segment_sum(flat, positions, int(np.prod(shape, dtype=np.int64))), shape)
    return o.sub(operand, summed) if name == "scatter-sub" else o.add(operand, summed)


def _segment_sum(values, positions: np.ndarray, size: int):
    """For each p < ``size``, the sum of ``values[k]`` over the k with ``positions[k] == p`` (0 where none).

    The values of each touched position gathered into a row (padded with a zero) and summed, then placed
    by one more gather: linear in ``values``, so its gradient is the gather back.
    """
    touched, slot, counts = np.unique(positions, return_inverse=True, return_counts=True)
    zero = o.zeros_like(o.getitem(values, slice(0, 1)))
    if counts.max() == 1:
        sums = o.take(values, np.argsort(slot, kind="stable"), axis=0)
    else:
        order = np.argsort(slot, kind="stable")
        width = int(counts.max())
        first = np.cumsum(counts) - counts
        col = np.arange(width)[None, :]
        rows = np.where(col < counts[:, None], order[np.minimum(first[:, None] + col, order.size - 1)], order.size)
        sums = o.sum(o.take(o.concatenate([values, zero]), rows, axis=0), axis=1)
    place = np.zeros(size, np.int64)
    place[touched] = 1 + np.arange(touched.size)
    return o.take(o.concatenate([zero, sums]), place, axis=0)


@lower("scatter")
def scatter(ctx, operand, indices, updates, dimension_numbers, mode, **_):
    """``operand`` with the updates written at their positions: a gather from operand and updates side by side.

    A position written twice with different values is refused: which one XLA keeps is not defined.
    """
    flat, positions = _scatter_setup("scatter", operand, indices, updates, dimension_numbers, mode)
    shape = _shape(operand)
    size = int(np.prod(shape, dtype=np.int64))
    if positions.size == 0:
        return operand
    if np.unique(positions).size != positions.size and not _same_at_repeats(_raw(flat), positions):
        _unsupported("scatter", "different values written at one position", "XLA keeps one of them, and which "
                     "one is not defined")
    source = np.arange(size)
    source[positions] = size + np.arange(positions.size)
    return o.reshape(o.take(o.concatenate([o.reshape(operand, (-1,)), flat]), source, axis=0), shape)


def _same_at_repeats(values: np.ndarray, positions: np.ndarray) -> bool:
    order = np.argsort(positions, kind="stable")
    p, v = positions[order], values[order]
    repeat = p[1:] == p[:-1]
    return bool(np.all(v[1:][repeat] == v[:-1][repeat]))

"""Run a jaxpr with ``gradcheck.ops``, and check each lowering against jax's own primitive once.

``run`` walks a ``ClosedJaxpr``'s equations in order and calls each one's lowering
(``gradcheck.frontends.jax.primitives``) on whatever backend the values are on: tape tensors (the tape AD),
torch tensors (autograd), numpy float64 (the reference forward and the referee).  jax never runs here: it
differentiates the user's own function, with the user's own ``custom_jvp``/``custom_vjp`` rules; the tape
and torch differentiate the primal math.  Higher-order primitives are interpreted: ``jit``, ``closed_call``,
``custom_jvp_call``, ``custom_vjp_call`` and ``remat`` run their body (the primal one); ``scan`` is unrolled,
``while`` runs until its condition, evaluated on the concrete values, is false; ``cond`` runs the branch its
concrete index picks.

``run_pinned`` is jax's float32 run pinned to the float64 reference's kinks: the same walk on jax values, every
equation bound as jax's own primitive (custom rules, loops and conds whole, by the user's rules), except the
ones where ``run`` takes kink decisions (``kink_calls``), which go through their lowering, gradcheck.ops on
jax, as the pin reaches them on the tape and torch.

The key-dependent part of a jaxpr (random bits, dropout masks) is evaluated once, by jax
(``evaluate_constants``), and handed to ``run`` as ``known`` values: the equations that only compute known
values are not run, so every backend sees jax's own masks.  ``constant_part`` says which variables that
part holds.

``verify`` runs once per jaxpr, in float64: every equation is evaluated by jax (its primitive, bound on
jax's values) and by its lowering on the same values, and the two compared.  A lowering that computes
something else than its primitive is gradcheck's bug, named with the primitive, the equation, the user's
source line and module path; without this check the tape, torch and the referee would agree among
themselves against jax, and jax would be blamed.

Keys of ``known``: a variable of the outermost jaxpr is its own key; a variable inside a higher-order
equation is ``(site, var)``, ``site`` a tuple of steps ``(equation index, sub-jaxpr param, iteration)``
from the outermost jaxpr in (the iteration is the scan or while step, the branch index of a cond, 0 for a
body run once), so that a mask drawn in every step of a scan is known per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
from jax.extend import core as jcore

from gradcheck import ops as o
from gradcheck.backends import backend_of
from gradcheck.frontends.arrays import array_differ, backend_of_values, float_dtype_of  # noqa: F401 (used as interpreter.*)
from gradcheck.frontends.jax.primitives import (
    LOWERINGS,
    RANDOM,
    Context,
    LoweringError,
    is_float_dtype,
    raw_or_traced,
    run_float,
    where,
)

# Relative error (max |lowering - jax| / max |jax|) a float64 lowering may have: kernels that sum in another
# order differ by a few ulps times the reduction length, ten thousand times below this.  The scale is at
# least that of the equation's inputs (``_input_scale``): an output that is cancellation noise (a mean of
# centred values) is rounding of the inputs' size, not of its own.
VERIFY_RTOL = 1e-8
# Magnitudes from here up are a float type's extremes, which masks fill with (finfo.min), not data.
EXTREME = 1e30

WAYS_TO_LOWER = ("lower it with @gradcheck.frontends.jax.lowering({name!r}) on a function fn(*invals, **params) "
                 "written in gradcheck.ops, or check this model with the jax backend alone")


@dataclass(frozen=True)
class Facts:
    """What every equation of one run shares: the run's float dtype (float64 decides, float32 is measured)."""

    floats: np.dtype = np.dtype(np.float64)


def _floats(ctx_facts) -> np.dtype:
    floats = np.dtype(getattr(ctx_facts, "floats", ctx_facts))
    if floats.kind != "f":
        raise ValueError(f"run: the run's float dtype is {floats}; give Facts(floats=np.float64) or np.float32")
    return floats


# ---------------------------------------------------------------- the public calls
def run(closed_jaxpr, args, ctx_facts, known: dict | None = None, watch=None) -> list:
    """The jaxpr's outputs, in order, from ``args`` (one per invar, on the tape, torch or numpy).

    ``ctx_facts``: ``Facts`` or the run's float dtype itself.  ``known``: values of variables that are not
    computed (``evaluate_constants``'s result); an equation whose outputs are all known, or unused, is
    skipped.  Integer and bool values are numpy arrays throughout (and in the outputs).
    ``watch(site, i, eqn, invals, outs) -> outs``, when given, sees every equation that runs (equation ``i``
    of the jaxpr at ``site``) as it is computed and may replace its outputs (a replay records values and
    adds its cotangent probes so).
    """
    walk = _Run(_floats(ctx_facts), known, watch)
    jaxpr, consts = _open(closed_jaxpr)
    _arity("run", jaxpr, args)
    return walk.jaxpr(jaxpr, consts, [walk.argument(a) for a in args], (), ())


def run_equation(eqn, site: tuple, i: int, args, ctx_facts, known: dict | None = None) -> list:
    """Equation ``i`` of the jaxpr at ``site`` alone, on ``args`` (its operands), as ``run`` runs it there:
    a higher-order one's body with the constants ``known`` holds for that site (a unit replayed alone)."""
    walk = _Run(_floats(ctx_facts), known)
    invals = [walk.argument(a) for a in args]
    return walk.equation(eqn, invals, HIGHER.get(eqn.primitive.name), site, i, ((i, eqn),))


def run_span(eqns, site: tuple, inputs: list, outputs: list, args, ctx_facts, known: dict | None = None) -> list:
    """Equations of the jaxpr at ``site`` alone (``(index, equation)`` pairs, in order: a module's span,
    ``regions.Span``), on ``args``, the values of the variables ``inputs``; the values of ``outputs``.  Each
    equation runs as ``run`` runs it there, with the constants ``known`` holds for that site."""
    walk = _Run(_floats(ctx_facts), known)
    env = {v: walk.argument(a) for v, a in zip(inputs, args)}
    walk.equations(eqns, env, site, ())
    return [walk.read(env, v) for v in outputs]


def live_equations(jaxpr, known_here: dict) -> list:
    """``(index, equation)`` for the equations ``run`` runs in ``jaxpr`` (``known_here``: the site's known values)."""
    return [(i, e) for i, (e, live) in enumerate(zip(jaxpr.eqns, _live(jaxpr, known_here))) if live]


def kink_calls(closed_jaxpr, args, ctx_facts, known: dict | None = None) -> dict:
    """How many kink op calls (``gradcheck.check.kinks``) ``run`` makes in each equation, at ``args`` (numpy):
    ``(site, index) -> count``, a call's body's counted in the call too; equations that make none are left out."""
    from gradcheck.check import cost, kinks

    walk = _Counting(_floats(ctx_facts), known)
    jaxpr, consts = _open(closed_jaxpr)
    _arity("kink_calls", jaxpr, args)
    with cost.counting(), kinks.recording(stats=False) as walk.recording:
        walk.jaxpr(jaxpr, consts, [walk.argument(a) for a in args], (), ())
    return walk.counts


def run_pinned(closed_jaxpr, args, ctx_facts, known: dict | None, calls: dict) -> list:
    """The jaxpr's outputs by jax, on jax values, with its kinks pinned (``gradcheck.check.kinks.pinned``): every
    equation bound as jax's own primitive, custom rules, loops and conds whole (jax differentiates them by the
    user's rules), except where ``run`` makes kink op calls outside those (``calls``, from ``kink_calls``): there
    the lowering, gradcheck.ops on jax, which the pin reaches.  The kink calls a custom rule, loop or cond holds
    are passed over in the pin's order (``kinks.skip``): they stay jax's own decisions."""
    walk = _Pinned(_floats(ctx_facts), known, calls)
    jaxpr, consts = _open(closed_jaxpr)
    _arity("run_pinned", jaxpr, args)
    return walk.jaxpr(jaxpr, consts, list(args), (), ())


def constant_part(closed_jaxpr, const_invars) -> set:
    """The variables of the outermost jaxpr, equations' outputs, that depend only on ``const_invars`` (rng keys,
    integer inputs), on the jaxpr's constants, or on nothing; a higher-order equation is looked into
    (a ``jit`` with one output from the key alone, a ``scan`` carry that only a key feeds)."""
    jaxpr, _ = _open(closed_jaxpr)
    given = {v for v in const_invars}
    const, _ = _constant_flow(jaxpr, [v in given for v in jaxpr.invars])
    return {v for eqn in jaxpr.eqns for v in eqn.outvars if v in const}


def evaluate_constants(closed_jaxpr, values_for_const_invars: dict) -> dict:
    """The values, computed by jax, of the constant part that the rest of the jaxpr reads (``run``'s ``known``).

    ``values_for_const_invars``: invar -> value (key data, integer arrays).  The result maps each constant
    variable drawn from those values or from the jaxpr's constants, that a non-constant equation reads or
    that the jaxpr returns, to its numpy value (a key as its key data); variables inside higher-order
    equations are keyed ``(site, var)`` (see the module's doc).  Constants made from literals alone are left
    to every backend to compute.
    """
    _require_x64()
    walk = _Constants()
    jaxpr, consts = _open(closed_jaxpr)
    args = [walk.drawn(_jax_value(values_for_const_invars[v])) if v in values_for_const_invars else _UNKNOWN
            for v in jaxpr.invars]
    # Eagerly, wherever it is asked: the jax backend's compiled call may be the first to ask for a run dtype's
    # program (jax alone, where the tape and torch cannot run it), and under its trace each bind would give back
    # a tracer, which the walk cannot turn into the numpy value it keeps.
    with jax.ensure_compile_time_eval():
        walk.jaxpr(jaxpr, consts, args, (), ())
    return walk.found


def verify(closed_jaxpr, args64, known: dict | None = None) -> dict[str, str]:
    """Problems found running every equation ``run`` runs by jax and by its lowering, on jax's values (float64).

    ``args64``: one value per invar (float64 arrays; key data; integer arrays).  ``known``: as for ``run``
    (equations it skips are not checked).  Keys name the equation: ``"3:jit/1:max"`` is equation 1 of the
    body of equation 3; values say what differs, where (primitive, module path, source line) and what to do.
    """
    _require_x64()
    walk = _Verify(known)
    jaxpr, consts = _open(closed_jaxpr)
    _arity("verify", jaxpr, args64)
    args = [_jax_value(a, widen=True) for a in args64]
    walk.tapped = _tap(jaxpr, [_jax_value(c, widen=True) for c in consts], args, walk.known)
    walk.jaxpr(jaxpr, consts, args, (), ())
    return walk.problems


# ---------------------------------------------------------------- walking a jaxpr
_UNKNOWN = type("Unknown", (), {"__repr__": lambda self: "<not a constant>"})()


def _open(jaxpr):
    """``(jaxpr, consts)`` of a ClosedJaxpr or an open Jaxpr."""
    if isinstance(jaxpr, jcore.ClosedJaxpr):
        return jaxpr.jaxpr, list(jaxpr.consts)
    return jaxpr, []


def _arity(what, jaxpr, args):
    if len(args) != len(jaxpr.invars):
        raise ValueError(f"{what}: {len(args)} arguments for a jaxpr of {len(jaxpr.invars)} inputs "
                         f"({', '.join(v.aval.str_short() for v in jaxpr.invars)}); give one value per invar, in order")


def is_var(a) -> bool:
    """A variable (not a literal, not a dropped output)."""
    return isinstance(a, jcore.Var) and not isinstance(a, jcore.DropVar)


def _is_key_dtype(dt) -> bool:
    return jax.dtypes.issubdtype(dt, jax.dtypes.prng_key)


def known_by_site(known: dict | None) -> dict:
    """``known`` as site -> {var: value}."""
    sites: dict = {}
    for key, value in (known or {}).items():
        site, var = key if isinstance(key, tuple) else ((), key)
        sites.setdefault(site, {})[var] = value
    return sites


def _live(jaxpr, known_here) -> list[bool]:
    """Which equations compute something the outputs need that is not known (the rest is not run)."""
    needed = {v for v in jaxpr.outvars if is_var(v) and v not in known_here}
    live = [False] * len(jaxpr.eqns)
    for i in range(len(jaxpr.eqns) - 1, -1, -1):
        eqn = jaxpr.eqns[i]
        if any(v in needed for v in eqn.outvars if is_var(v)):
            live[i] = True
            needed.update(v for v in eqn.invars if is_var(v) and v not in known_here)
    return live


class _Walk:
    """Evaluates a jaxpr on one kind of value; subclasses say how a first-order equation is evaluated and how
    the control flow of scan, while and cond reads values (``index``, ``stack``, ``truth``, ``branch``)."""

    def __init__(self, known=None):
        self.known = known_by_site(known)
        self._live_cache: dict = {}

    def jaxpr(self, jaxpr, consts, args, site: tuple, trail: tuple) -> list:
        env = {v: self.constant(x) for v, x in zip(jaxpr.constvars, consts)}
        env.update(zip(jaxpr.invars, args))
        live = self._liveness(jaxpr, self.known.get(site, {}))
        self.equations(((i, eqn) for i, (eqn, keep) in enumerate(zip(jaxpr.eqns, live)) if keep), env, site, trail)
        self.done(jaxpr, env, site)
        return [self.read(env, a) for a in jaxpr.outvars]

    def equations(self, eqns, env: dict, site: tuple, trail: tuple) -> None:
        """``(index, equation)`` pairs of the jaxpr at ``site``, in order, on ``env`` (its values so far, to which
        the site's known values are added and each equation's outputs), as ``jaxpr`` runs them (``run_span``
        runs a module's span so)."""
        here = self.known.get(site, {})
        env.update((v, self.constant(x)) for v, x in here.items())
        for i, eqn in eqns:
            invals = [self.read(env, a) for a in eqn.invars]
            outs = self.equation(eqn, invals, HIGHER.get(eqn.primitive.name), site, i, trail + ((i, eqn),))
            env.update((v, x) for v, x in zip(eqn.outvars, outs) if is_var(v) and v not in here)

    def equation(self, eqn, invals, handler, site, i, trail) -> list:
        if handler is not None:
            return handler(self, eqn, invals, site, i, trail)
        return self.first_order(eqn, invals, trail)

    def _liveness(self, jaxpr, here):
        if here:
            return _live(jaxpr, here)
        cached = self._live_cache.get(id(jaxpr))
        if cached is None or cached[0] is not jaxpr:
            cached = self._live_cache[id(jaxpr)] = (jaxpr, _live(jaxpr, {}))
        return cached[1]

    def read(self, env, a):
        return self.literal(a) if isinstance(a, jcore.Literal) else env[a]

    def done(self, jaxpr, env, site):
        """Called with a jaxpr's values once it is evaluated (the constants' walk records some)."""


def _outer(trail) -> tuple:
    """The higher-order equations around the last one of ``trail`` (``(index, equation)`` pairs, outermost first)."""
    return tuple(eqn for _, eqn in trail[:-1])


class _Run(_Walk):
    """The backend's own values (tape, torch, numpy) through the table's lowerings."""

    def __init__(self, floats, known, watch=None):
        super().__init__(known)
        self.floats = floats
        self.watch = watch
        self._literals: dict = {}

    def equation(self, eqn, invals, handler, site, i, trail) -> list:
        outs = super().equation(eqn, invals, handler, site, i, trail)
        return outs if self.watch is None else list(self.watch(site, i, eqn, invals, outs))

    def argument(self, x):
        return _host(x, self.floats)

    def constant(self, x):
        return _host(x, self.floats)

    def literal(self, lit):
        found = self._literals.get(id(lit))
        if found is None or found[0] is not lit:
            found = self._literals[id(lit)] = (lit, _host(np.asarray(lit.val), self.floats))
        return found[1]

    def first_order(self, eqn, invals, trail):
        ctx = Context(self.floats, eqn, _outer(trail))
        try:
            return apply(ctx, eqn, invals)
        except LoweringError:
            raise
        except Exception as exc:
            exc.add_note(f"while running the lowering of {ctx.where()} (gradcheck/frontends/jax/primitives.py)")
            raise

    def index(self, x, t):
        return o.getitem(x, t) if _is_float_value(x) else np.asarray(x)[t]

    def stack(self, xs, aval):
        if not xs:
            return np.zeros(aval.shape, _run_dtype(aval.dtype, self.floats))
        if any(_is_float_value(x) for x in xs):
            return o.stack(xs, axis=0)
        return np.stack([np.asarray(x) for x in xs])

    def truth(self, x):
        return bool(np.asarray(o.to_numpy(x)).reshape(()))

    def branch(self, x, n):
        return _branch_index(int(np.asarray(o.to_numpy(x)).reshape(())), n)


class _Counting(_Run):
    """``run``'s walk on numpy, counting the kink op calls each equation makes (``kink_calls``)."""

    def __init__(self, floats, known):
        super().__init__(floats, known)
        self.recording = None
        self.counts: dict = {}

    def equation(self, eqn, invals, handler, site, i, trail) -> list:
        before = len(self.recording.branches)
        outs = super().equation(eqn, invals, handler, site, i, trail)
        if len(self.recording.branches) > before:
            self.counts[(site, i)] = len(self.recording.branches) - before
        return outs


# Calls whose body runs once, walked by the pinned run so that the kinks in them are pinned; every other
# higher-order equation (custom rules, loops, conds) is bound whole.
_WALKED = frozenset({"jit", "pjit", "closed_call", "core_call", "remat2", "checkpoint", "remat"})


class _Pinned(_Walk):
    """jax's own primitives on jax values, the kink-taking equations through their lowerings (``run_pinned``)."""

    def __init__(self, floats, known, calls: dict):
        super().__init__(known)
        self.floats = floats
        self.calls = calls

    def constant(self, x):
        return _jax_value(x)

    def literal(self, lit):
        return _jax_value(np.asarray(lit.val))

    def equation(self, eqn, invals, handler, site, i, trail) -> list:
        from gradcheck.check import kinks

        name = eqn.primitive.name
        if name in _WALKED:
            return handler(self, eqn, invals, site, i, trail)
        if name == "custom_jvp_call" and _is_relu(eqn.params["call_jaxpr"]) and _is_float_value(invals[0]):
            return [o.relu(invals[0])]  # as ``run`` lowers it (``_custom_jvp``): the kink the pin reaches
        calls = self.calls.get((site, i), 0)
        if handler is None and calls:
            at = kinks.mark()
            try:
                return apply(Context(self.floats, eqn, _outer(trail)), eqn, invals)
            except Exception:  # noqa: BLE001 - a lowering that reads its operands' values (numpy on them), which
                # a trace has not: jax's own primitive there, its kinks passed over, as for a custom rule
                kinks.rewind(at)
        kinks.skip(calls)
        return _bind(eqn, invals, False)


def _is_float_value(x) -> bool:
    return np.dtype(o.dtype_of(x)).kind == "f"


def _run_dtype(dt, floats) -> np.dtype:
    return run_float(dt, floats) if is_float_dtype(dt) else np.dtype(dt)


def _host(x, floats):
    """A value for the run: a key as its key data, integer and bool ones as numpy, numpy floats in the run's
    dtype (or the narrower float they are, ``run_float``); a backend's float tensor (an argument) unchanged."""
    if isinstance(x, jax.Array) and _is_key_dtype(x.dtype):
        return np.asarray(jax.random.key_data(x))
    if backend_of(x) in ("tape", "torch"):
        return x if _is_float_value(x) else np.asarray(o.to_numpy(x))
    a = np.asarray(x)
    if not is_float_dtype(a.dtype):
        return a
    target = run_float(a.dtype, floats)
    return a if a.dtype == target else a.astype(target)


def _branch_index(b: int, n: int) -> int:
    # XLA's conditional runs the last branch for an index out of range (lax.switch clamps before).
    return b if 0 <= b < n else n - 1


def apply(ctx: Context, eqn, invals) -> list:
    """The outputs of ``eqn``'s lowering on ``invals``, each in the dtype the jaxpr gives it (floats the run's)."""
    name = eqn.primitive.name
    fn = LOWERINGS.get(name)
    if fn is None:
        raise LoweringError(unknown_primitive(eqn, ctx.outer))
    try:
        out = fn(ctx, *invals, **eqn.params)
    except LoweringError as exc:
        raise LoweringError(f"{exc} ({ctx.where()}); {WAYS_TO_LOWER.format(name=name)}") from exc
    if eqn.primitive.multiple_results:
        outs = list(out)
    else:
        outs = [out[0] if isinstance(out, (tuple, list)) and len(out) == 1 else out]
    if len(outs) != len(eqn.outvars):
        raise RuntimeError(f"the lowering of {name} returned {len(outs)} values for {len(eqn.outvars)} outputs "
                           f"({ctx.where()}); this is a bug in gradcheck/frontends/jax/primitives.py")
    return [_in_jaxpr_dtype(ctx, v, var.aval.dtype) for v, var in zip(outs, eqn.outvars)]


def unknown_primitive(eqn, outer: tuple = ()) -> str:
    """Why ``eqn`` cannot run on the tape and torch, and what to do."""
    name = eqn.primitive.name
    if name in RANDOM:
        return (f"the jax random primitive {name} ({where(eqn, outer)}) is evaluated by jax, not lowered: pass "
                "known=evaluate_constants(closed_jaxpr, {key invar: key data}) to run, so that its results are "
                "constants of every backend (a draw that depends on a differentiated value cannot be one)")
    return (f"the jax primitive {name!r} has no lowering to gradcheck.ops ({where(eqn, outer)}); "
            + WAYS_TO_LOWER.format(name=name))


def _in_jaxpr_dtype(ctx: Context, v, dt):
    """``v`` in the dtype the jaxpr gives it: a float one the run's (``Context.dtype``), an integer or bool one
    numpy's exactly."""
    if _is_key_dtype(dt):
        return v
    if is_float_dtype(dt):
        target = ctx.dtype(dt)
        if isinstance(v, (bool, int, float)):
            return np.asarray(v, target)
        return v if np.dtype(o.dtype_of(v)) == target else o.astype(v, target)
    a = v if isinstance(v, np.ndarray) else raw_or_traced(v)
    want = np.dtype(dt)
    return a if a.dtype == want else a.astype(want)


# ---------------------------------------------------------------- higher-order primitives
def _call(part: str):
    """A body run once on the equation's operands: jit, closed_call, custom_jvp_call, custom_vjp_call (the
    primal body: the tape and torch differentiate the primal math, jax runs the user's rule), remat."""

    def handler(walk, eqn, invals, site, i, trail):
        jaxpr, consts = _open(eqn.params[part])
        return walk.jaxpr(jaxpr, consts, invals, site + ((i, part, 0),), trail)

    return handler


def _scan(walk, eqn, invals, site, i, trail):
    """Unrolled: the body once per step on the carry and that step's slices; the outputs stacked."""
    p = eqn.params
    nc, nk, length = p["num_consts"], p["num_carry"], int(p["length"])
    consts, carry, xs = invals[:nc], list(invals[nc:nc + nk]), invals[nc + nk:]
    jaxpr, jconsts = _open(p["jaxpr"])
    ys = [None] * length
    for t in (range(length - 1, -1, -1) if p["reverse"] else range(length)):
        out = walk.jaxpr(jaxpr, jconsts, consts + carry + [walk.index(x, t) for x in xs], site + ((i, "jaxpr", t),),
                         trail)
        carry, ys[t] = out[:nk], out[nk:]
    avals = [v.aval for v in eqn.outvars[nk:]]
    return carry + [walk.stack([y[k] for y in ys], aval) for k, aval in enumerate(avals)]


def _while(walk, eqn, invals, site, i, trail):
    """The body until the condition, evaluated on the concrete carry, is false."""
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = invals[:cn], invals[cn:cn + bn], list(invals[cn + bn:])
    cond, cond_consts = _open(p["cond_jaxpr"])
    body, body_consts = _open(p["body_jaxpr"])
    t = 0
    while True:
        (go,) = walk.jaxpr(cond, cond_consts, cconsts + carry, site + ((i, "cond_jaxpr", t),), trail)
        go = walk.truth(go)
        if go is None:  # the constants' walk: a condition that is not constant (no step of it is known)
            return [_UNKNOWN] * len(eqn.outvars)
        if not go:
            return carry
        carry = walk.jaxpr(body, body_consts, bconsts + carry, site + ((i, "body_jaxpr", t),), trail)
        t += 1


def _cond(walk, eqn, invals, site, i, trail):
    """The branch the concrete index picks (the constants' walk, with no index known, looks into every one)."""
    branches = eqn.params["branches"]
    b = walk.branch(invals[0], len(branches))
    picked = range(len(branches)) if b is None else [b]
    outs = None
    for k in picked:
        jaxpr, consts = _open(branches[k])
        outs = walk.jaxpr(jaxpr, consts, list(invals[1:]), site + ((i, "branches", k),), trail)
    return outs if b is not None else [_UNKNOWN] * len(eqn.outvars)


def _custom_jvp(walk, eqn, invals, site, i, trail):
    """The primal body, except where the rule is a documented convention the body does not have: jax.nn.relu's
    gradient is 0 at 0, where its body ``max(x, 0)`` splits it; ``ops.relu`` has that convention (and is a kink
    the float64 reference records and float32 runs are pinned to)."""
    if isinstance(walk, _Run) and _is_relu(eqn.params["call_jaxpr"]):
        x = invals[0]
        return [o.relu(x) if _is_float_value(x) else np.maximum(np.asarray(x), 0)]
    return _call("call_jaxpr")(walk, eqn, invals, site, i, trail)


def _is_relu(body) -> bool:
    """Whether a rule's primal body is ``max(x, 0)`` alone (through single-equation ``jit`` calls)."""
    jaxpr = getattr(body, "jaxpr", body)
    while len(jaxpr.eqns) == 1 and jaxpr.eqns[0].primitive.name in ("jit", "pjit"):
        jaxpr = getattr(jaxpr.eqns[0].params["jaxpr"], "jaxpr", jaxpr.eqns[0].params["jaxpr"])
    if len(jaxpr.eqns) != 1 or jaxpr.eqns[0].primitive.name != "max" or len(jaxpr.invars) != 1:
        return False
    a, b = jaxpr.eqns[0].invars
    zero = [x for x in (a, b) if isinstance(x, jcore.Literal) and np.all(np.asarray(x.val) == 0)]
    return len(zero) == 1 and jaxpr.invars[0] in (a, b) and list(jaxpr.outvars) == list(jaxpr.eqns[0].outvars)


HIGHER = {
    "jit": _call("jaxpr"), "pjit": _call("jaxpr"), "closed_call": _call("call_jaxpr"),
    "core_call": _call("call_jaxpr"), "custom_jvp_call": _custom_jvp,
    "custom_vjp_call": _call("call_jaxpr"), "custom_vjp_call_jaxpr": _call("fun_jaxpr"),
    "remat2": _call("jaxpr"), "checkpoint": _call("jaxpr"), "remat": _call("jaxpr"),
    "scan": _scan, "while": _while, "cond": _cond,
}


# ---------------------------------------------------------------- jax's own values
def _require_x64():
    if not jax.config.jax_enable_x64:
        raise RuntimeError("jax_enable_x64 is off: jax would compute the float64 check in float32; call "
                           "jax.config.update('jax_enable_x64', True) before tracing the model")


def _jax_value(x, widen: bool = False):
    """A value for jax's walk: a key as it is, anything else numpy (a float one float64 when ``widen``)."""
    if isinstance(x, jax.Array) and _is_key_dtype(x.dtype):
        return x
    if x is _UNKNOWN:
        return x
    a = np.asarray(o.to_numpy(x)) if backend_of(x) in ("tape", "torch") else np.asarray(x)
    return a.astype(np.float64) if widen and is_float_dtype(a.dtype) and a.dtype != np.float64 else a


def _widened(params: dict) -> dict:
    """An equation's params with every float dtype float64, so that jax computes it in float64 as the run does."""
    out = {}
    for k, v in params.items():
        if isinstance(v, np.dtype) and is_float_dtype(v):
            v = np.dtype(np.float64)
        elif isinstance(v, type) and issubclass(v, np.generic) and is_float_dtype(v):
            v = np.float64
        out[k] = v
    return out


# Primitives whose meaning is their operands' dtypes: jax runs them in the jaxpr's own dtypes.
_EXACT_DTYPES = frozenset({"bitcast_convert_type"})


def _bind(eqn, invals, widen: bool) -> list:
    """``eqn``'s primitive bound on ``invals`` (jax values or tracers), in float64 where ``widen``."""
    params = eqn.primitive.get_bind_params(eqn.params)
    if widen and eqn.primitive.name in _EXACT_DTYPES:
        invals = [jax.numpy.asarray(x).astype(v.aval.dtype) for x, v in zip(invals, eqn.invars)]
    elif widen:
        params = _widened(params)
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


# Higher-order primitives that call their body once: the tapped program evaluates the body in their place.
_INLINED = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
            "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
            "remat2": "jaxpr", "checkpoint": "jaxpr", "remat": "jaxpr"}


def _tap(jaxpr, consts, args, known: dict) -> dict:
    """jax's float64 values of every first-order equation outside loops and conds, keyed ``(site, index)``,
    from one compiled program; ``{}`` where the jaxpr cannot be compiled so (each equation is bound alone then).

    The program binds each equation as ``_Jax.bind`` does (float dtypes widened), with the bodies of calls
    (``jit``, custom rules' primal bodies, ``remat``) evaluated in their place, and returns every value: one
    compilation for the model instead of one per primitive and shape, which is most of what an equation-by-
    equation check costs.  Like the walk it takes the ``known`` values (by site, ``_by_site``) and leaves out
    the equations that only compute those (the random draws).  Loops and conds are bound whole; their bodies
    are checked step by step as before.
    """
    keys: list = []

    def evaluate(jaxpr, consts, args, site, out):
        here = known.get(site, {})
        env = dict(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        env.update((v, _jax_value(x, True)) for v, x in here.items())

        def read(a):
            return _jax_value(np.asarray(a.val), True) if isinstance(a, jcore.Literal) else env[a]

        for i, (eqn, live) in enumerate(zip(jaxpr.eqns, _live(jaxpr, here))):
            if not live:
                continue
            invals = [read(a) for a in eqn.invars]
            part = _INLINED.get(eqn.primitive.name)
            if part is not None:
                sub, sub_consts = _open(eqn.params[part])
                outs = evaluate(sub, [_jax_value(c, True) for c in sub_consts], invals, site + ((i, part, 0),), out)
            else:
                outs = _bind(eqn, invals, True)
                if eqn.primitive.name not in HIGHER:
                    keys.append((site, i))
                    out.append(outs)
            env.update((v, x) for v, x in zip(eqn.outvars, outs) if is_var(v) and v not in here)
        return [read(a) for a in jaxpr.outvars]

    def program(*args):
        out: list = []
        keys.clear()
        evaluate(jaxpr, consts, list(args), (), out)
        return out

    try:
        values = compiled(program, args)(*args)
    except Exception:  # an effect, a primitive jit cannot stage: the walk binds each equation alone
        return {}
    return {k: [_jax_value(x, True) for x in outs] for k, outs in zip(keys, values)}


# A program compiled to be run once or a few times (a check, a reference forward): XLA's backend optimisations
# cost more than they save there, and leave every float operation as it is (no fast-math either way).
QUICK_COMPILE = {"xla_backend_optimization_level": 0}


def compiled(fn, args):
    """``fn`` compiled for ``args`` with ``QUICK_COMPILE`` (or jax's defaults where the backend takes no such
    option)."""
    lowered = jax.jit(fn).lower(*args)
    try:
        return lowered.compile(QUICK_COMPILE)
    except Exception:  # an XLA backend without the option
        return lowered.compile()


class _Jax(_Walk):
    """jax's values: every first-order equation bound with jax, on numpy values (keys as jax keys).

    Equation by equation, eagerly: jax compiles each primitive once per shape and params (cached), which on
    a CPU costs less than compiling a level of the jaxpr as one program (XLA's whole-program passes).
    """

    def __init__(self, known=None, widen: bool = False):
        super().__init__(known)
        self.widen = widen

    def constant(self, x):
        return _jax_value(x, self.widen)

    def literal(self, lit):
        return _jax_value(np.asarray(lit.val), self.widen)

    def first_order(self, eqn, invals, trail):
        return self.bind(eqn, invals)

    def bind(self, eqn, invals) -> list:
        """``eqn``'s primitive bound by jax on ``invals`` (in float64 where ``widen``: its float dtypes widened)."""
        return [_jax_value(x, self.widen) for x in _bind(eqn, invals, self.widen)]

    def index(self, x, t):
        return x if x is _UNKNOWN else x[t]

    def stack(self, xs, aval):
        if any(x is _UNKNOWN for x in xs):
            return _UNKNOWN
        if not xs:
            return np.zeros(aval.shape, np.float64 if self.widen and is_float_dtype(aval.dtype) else aval.dtype)
        if isinstance(xs[0], jax.Array):  # keys
            return jax.numpy.stack(xs)
        return np.stack(xs)

    def truth(self, x):
        return None if x is _UNKNOWN else bool(np.asarray(x).reshape(()))

    def branch(self, x, n):
        return None if x is _UNKNOWN else _branch_index(int(np.asarray(x).reshape(())), n)


class _Constants(_Jax):
    """The constant part, by jax in the jaxpr's own dtypes: values where every input is known, ``_UNKNOWN``
    elsewhere; records the constants that the rest reads (``found``).

    Only values *drawn* from the given inputs (the keys, integer inputs) or from the jaxpr's constants are
    recorded: a value made from literals alone (``broadcast_in_dim 0.0``, an ``iota``) is as cheap for every
    backend to compute as to be handed, and recording it would make a known value of every loop step.
    ``_drawn`` holds those values by identity (kept alive, so that no id is reused during the walk): an
    equation's outputs are drawn when one of its operands is, and a higher-order equation's body sees its
    operands as they are.
    """

    def __init__(self):
        super().__init__()
        self.found: dict = {}
        self._drawn: dict[int, object] = {}
        self._programs: dict[int, tuple] = {}  # id(eqn) -> (eqn, its compiled program): a loop's steps share one

    def bind_whole(self, eqn, invals) -> list:
        """A higher-order equation run whole by jax (a random draw's ``jit``), compiled once (``QUICK_COMPILE``)."""
        entry = self._programs.get(id(eqn))
        if entry is None:
            entry = self._programs[id(eqn)] = (eqn, compiled(lambda *xs: _bind(eqn, xs, False), invals))
        return [_jax_value(x) for x in entry[1](*invals)]

    def drawn(self, x):
        """``x``, marked as drawn from the given inputs or constants."""
        if x is not _UNKNOWN:
            self._drawn[id(x)] = x
        return x

    def _is_drawn(self, x) -> bool:
        return id(x) in self._drawn

    def constant(self, x):
        return self.drawn(super().constant(x))

    def equation(self, eqn, invals, handler, site, i, trail):
        if all(x is not _UNKNOWN for x in invals):
            outs = self.bind(eqn, invals) if handler is None else self.bind_whole(eqn, invals)
            return [self.drawn(x) for x in outs] if any(self._is_drawn(x) for x in invals) else outs
        if handler is not None:
            return handler(self, eqn, invals, site, i, trail)
        return [_UNKNOWN] * len(eqn.outvars)

    def index(self, x, t):
        out = super().index(x, t)
        return self.drawn(out) if self._is_drawn(x) else out

    def stack(self, xs, aval):
        out = super().stack(xs, aval)
        return self.drawn(out) if any(self._is_drawn(x) for x in xs) else out

    def done(self, jaxpr, env, site):
        given = set(jaxpr.invars) | set(jaxpr.constvars)
        read = [a for eqn in jaxpr.eqns if any(self._value(env, b) is _UNKNOWN for b in eqn.invars)
                for a in eqn.invars]
        for a in read + list(jaxpr.outvars):
            if is_var(a) and a not in given and self._is_drawn(env.get(a, _UNKNOWN)):
                self.found[a if not site else (site, a)] = _numpy_constant(env[a])

    def _value(self, env, a):
        return self.literal(a) if isinstance(a, jcore.Literal) else env.get(a, _UNKNOWN)


def _numpy_constant(x) -> np.ndarray:
    if isinstance(x, jax.Array) and _is_key_dtype(x.dtype):
        return np.asarray(jax.random.key_data(x))
    return np.asarray(x)


# ---------------------------------------------------------------- the constant part, statically
def _constant_flow(jaxpr, in_const) -> tuple[set, list[bool]]:
    """``(constant vars, which outputs are constant)`` of ``jaxpr`` given which of its inputs are."""
    const = set(jaxpr.constvars) | {v for v, c in zip(jaxpr.invars, in_const) if c}
    is_const = lambda a: isinstance(a, jcore.Literal) or a in const
    for eqn in jaxpr.eqns:
        ins = [is_const(a) for a in eqn.invars]
        flow = _FLOW.get(eqn.primitive.name)
        outs = [True] * len(eqn.outvars) if all(ins) else flow(eqn, ins) if flow else [False] * len(eqn.outvars)
        const.update(v for v, c in zip(eqn.outvars, outs) if c and is_var(v))
    return const, [is_const(a) for a in jaxpr.outvars]


def _flow_call(part):
    def flow(eqn, ins):
        return _constant_flow(_open(eqn.params[part])[0], ins)[1]

    return flow


def _flow_scan(eqn, ins):
    p = eqn.params
    nc, nk = p["num_consts"], p["num_carry"]
    body = _open(p["jaxpr"])[0]
    carry = ins[nc:nc + nk]
    while True:  # the carries that stay constant through every step: a fixpoint, from the initial ones
        outs = _constant_flow(body, ins[:nc] + carry + ins[nc + nk:])[1]
        new = [c and o_ for c, o_ in zip(carry, outs[:nk])]
        if new == carry:
            return carry + outs[nk:]
        carry = new


def _flow_while(eqn, ins):
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    body, cond = _open(p["body_jaxpr"])[0], _open(p["cond_jaxpr"])[0]
    carry = ins[cn + bn:]
    while True:
        outs = _constant_flow(body, ins[cn:cn + bn] + carry)[1]
        new = [c and o_ for c, o_ in zip(carry, outs)]
        if new == carry:
            break
        carry = new
    # Every carry depends on how many steps run: on the condition.
    (known_steps,) = _constant_flow(cond, ins[:cn] + carry)[1]
    return carry if known_steps else [False] * len(carry)


def _flow_cond(eqn, ins):
    if not ins[0]:
        return [False] * len(eqn.outvars)
    per_branch = [_constant_flow(_open(b)[0], ins[1:])[1] for b in eqn.params["branches"]]
    return [all(c) for c in zip(*per_branch)]


_FLOW = {name: _flow_call(part) for name, part in (
    ("jit", "jaxpr"), ("pjit", "jaxpr"), ("closed_call", "call_jaxpr"), ("core_call", "call_jaxpr"),
    ("custom_jvp_call", "call_jaxpr"), ("custom_vjp_call", "call_jaxpr"), ("custom_vjp_call_jaxpr", "fun_jaxpr"),
    ("remat2", "jaxpr"), ("checkpoint", "jaxpr"), ("remat", "jaxpr"))}
_FLOW.update(scan=_flow_scan, **{"while": _flow_while, "cond": _flow_cond})


# ---------------------------------------------------------------- checking the lowerings
class _Verify(_Jax):
    """jax's values in float64, each equation ``run`` runs also run by its lowering and compared."""

    def __init__(self, known):
        super().__init__(known, widen=True)
        self.problems: dict[str, str] = {}
        self.tapped: dict = {}  # (site, index) -> jax's outputs, from one compiled program (``_tap``)

    def equation(self, eqn, invals, handler, site, i, trail):
        if handler is not None:
            return handler(self, eqn, invals, site, i, trail)
        outs = self.tapped.get((site, i))
        if outs is None:
            outs = self.bind(eqn, invals)
        key = "/".join(f"{k}:{e.primitive.name}" for k, e in trail)
        if key not in self.problems:
            why = self.check(eqn, invals, outs, trail, site)
            if why:
                self.problems[key] = why
        return outs

    def check(self, eqn, invals, outs, trail, site) -> str | None:
        name = eqn.primitive.name
        # float64 throughout, as jax's primitive is bound here (widened): each lowering is checked as math
        ctx = Context(np.float64, eqn, _outer(trail), follow=False)
        if name not in LOWERINGS:
            return unknown_primitive(eqn, ctx.outer)
        try:
            lowered = apply(ctx, eqn, [_copy(x) for x in invals])
        except LoweringError as exc:  # a form the table does not lower: said as such
            return str(exc)
        except Exception as exc:  # jax ran the primitive on these operands, so the lowering should have: a bug
            return (f"the lowering of {name} raised {type(exc).__name__}: {exc}, on operands jax's {name} takes "
                    f"({ctx.where()}: {_short(eqn)}); this is a bug in gradcheck/frontends/jax/primitives.py")
        floor = _input_scale(invals)
        for k, (want, got) in enumerate(zip(outs, lowered)):
            why = _differ(want, got, floor=floor)
            if why:
                which = f"output {k}: " if len(outs) > 1 else ""
                return (f"the lowering of {name} disagrees with jax's ({which}{why}): {ctx.where()}"
                        f"{_loop_steps(site, trail)}, `{_short(eqn)}`; this is a bug in "
                        "gradcheck/frontends/jax/primitives.py (a form "
                        "it does not lower should raise LoweringError): the tape and torch cannot check this model "
                        "until it is fixed")
        return None


def _loop_steps(site, trail) -> str:
    """", in step 3 of the scan" for an equation inside loops (the first step where it differs is reported)."""
    steps = [f"step {t} of the {eqn.primitive.name}" for (_, _, t), (_, eqn) in zip(site, trail)
             if eqn.primitive.name in ("scan", "while")]
    return f", in {', '.join(reversed(steps))}" if steps else ""


def _copy(x):
    return x if isinstance(x, jax.Array) else np.array(x, copy=True)


def _short(eqn) -> str:
    """The equation as one line: ``f64[2,3] = dot_general[dimension_numbers=...] f64[2,5] f64[5,3]``."""

    def atom(a):
        return f"{np.asarray(a.val).tolist()}" if isinstance(a, jcore.Literal) else a.aval.str_short()

    params = ", ".join(f"{k}={v}" for k, v in eqn.params.items()
                       if not isinstance(v, (jcore.Jaxpr, jcore.ClosedJaxpr)) and "sharding" not in k)
    params = params if len(params) <= 160 else params[:157] + "..."
    outs = " ".join(v.aval.str_short() for v in eqn.outvars)
    return f"{outs} = {eqn.primitive.name}{f'[{params}]' if params else ''} {' '.join(atom(a) for a in eqn.invars)}"


def _input_scale(invals) -> float:
    """The typical magnitude of an equation's float inputs, below which its output's rounding noise is not judged
    (a value computed by cancellation is rounding of the inputs' size)."""
    scale = 0.0
    for v in invals:
        if isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size:
            scale = max(scale, _typical_magnitude(v))
    return scale


def _typical_magnitude(values: np.ndarray) -> float:
    """The median of the finite, non-zero magnitudes (a subsample's, for a large array), float extremes (a mask
    filled with finfo.min) left out; 0.0 when there are none."""
    a = np.abs(values[np.isfinite(values)]).ravel()
    a = a[:: max(1, a.size // 65536)]
    a = a[(a > 0) & (a < EXTREME)]
    return float(np.median(a)) if a.size else 0.0


def _differ(want, got, rtol: float = VERIFY_RTOL, floor: float = 0.0) -> str | None:
    """Why a lowering's output ``got`` differs from jax's ``want`` (shape, dtype, values), or None.

    Values differ beyond ``rtol`` times the larger of jax's largest magnitude and ``floor`` (the scale of the
    equation's inputs).  An integer or bool output must have jax's dtype and equal it exactly.
    """
    if isinstance(want, jax.Array):  # a key: compared as its data
        want = np.asarray(jax.random.key_data(want))
        got = np.asarray(jax.random.key_data(got) if isinstance(got, jax.Array) and _is_key_dtype(got.dtype) else got)
    t = np.asarray(want)
    a = np.asarray(o.to_numpy(got)) if backend_of(got) in ("tape", "torch") else np.asarray(got)
    return array_differ(a, t, rtol, floor, "jax")

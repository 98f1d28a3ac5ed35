"""Second order: Hessian-vector products per leaf across backends (``--order 2``).

For one random direction ``v`` over every trainable leaf (standard normal,
from the case seed), each backend computes ``H v``, the gradient of
``<grad f, v>``, through its own drivers: a ``gradient`` inside a
``gradient`` (``base.evaluate_eagerly`` links the inner call to the outer one,
so the tape records its backward pass with ``create_graph`` and torch runs
double backward; jax's driver stays traced when nested, so the outer
``value_and_grad`` is grad-of-grad, compiled once).  ``v`` is an argument of
the outer function, not a constant closed over, so jax traces it instead of
baking a model's worth of numbers into the program.

``H v`` splits into one array per trainable leaf, a leaf of role ``hvp``
named ``hvp:<path>``, and each is judged like a first-order gradient:

* **float64 decides**: ``compare.compare_leaf`` across backends, elementwise
  and tightly, then ``verdict.decide`` with the referee below;
* **float32 is measured**: each backend's float32 ``H v`` (pinned to the
  float64 reference's kinks, as first order is) against its own float64 one,
  ``verdict.float32_part``.

**The referee is each backend's own float64 gradient**, differenced along
``v``: ``(g_b(x + h v) - g_b(x - h v)) / 2h`` approximates ``H v`` whatever
``H`` is, and is projected per leaf on a second random direction ``w`` to a
number with a resolution (the same two-step error estimate, rounding floor
and kink guard as ``gradcheck.check.referee``).  Why a backend's own gradient and
not the tape's for every backend: the first-order check has already held each
backend's gradient against the float64 finite difference of the loss, so a
backend whose ``H v`` is the derivative of its own gradient is right by a
chain of checks down to the forward; a double whose first derivative is right
and second is not misses its own difference and is blamed by name; no backend
is judge in its own and the others' case (the tape is not asked to referee a
model it cannot differentiate twice, or that was run without it); and the
cost is four gradient calls per backend for every leaf at once, compiled
where the backend compiles.

**A backend that cannot differentiate twice** (the tape's max-pool VJP, a
torch op without double backward, a jax primitive without a transpose rule)
says so by name, "tape: max_pool2d has no second derivative": that backend's
second order is unavailable, recorded on the case (``SecondOrder.unavailable``)
and on every second-order leaf (``LeafResult.unavailable``), and the others
are compared.  It neither fails the case nor passes silently.  Any other
exception is that backend's error, as in first order.
"""

from __future__ import annotations

import re
import time

import numpy as np

from gradcheck import ops
from gradcheck.backends import get_backend, own_hvp, reference_rank
from gradcheck.backends.base import all_leaves
from gradcheck.check import kinks, sums, verdict
from gradcheck.check import referee as ref
from gradcheck.check.compare import MISSING, compare_leaf
from gradcheck.check.errors import short_error
from gradcheck.results import LeafResult, RefereeCheck, SecondOrder, Timing, worst_verdict
from gradcheck.tree import leaf_owner_types, replace_leaves

ORDERS = (1, 2)  # RunOptions.order: 1 gradients, 2 Hessian-vector products too
HVP_PREFIX = "hvp:"
V_PREFIX = "hvp.v"  # the direction's argument: its leaves' gradients (the first-order gradient) are dropped

# Errors that say a backend cannot differentiate something twice; ``op`` names what.
_NO_SECOND = (
    # the tape: a VJP whose own VJP is not defined (max-pool routes to the arg-max, "max_pool2d_grad")
    re.compile(r"tape op '(?P<op>[\w.]+?)(?:_grad)?' has no gradient"),
    # torch: "the derivative for '_cdist_backward' is not implemented."
    re.compile(r"derivative for '?(?:aten::)?_?(?P<op>[\w.]+?)(?:_backward)?'? is not implemented"),
    re.compile(r"(?P<op>once_differentiable)"),
    # jax: a primitive without a JVP or transpose rule
    re.compile(r"(?:Differentiation|Transpose) rule for '(?P<op>[\w.]+)' not implemented"),
)


def no_second_derivative(backend: str, exc: BaseException) -> str | None:
    """"tape: max_pool2d has no second derivative" when ``exc`` says so, else None."""
    text = f"{exc}"
    for pattern in _NO_SECOND:
        m = pattern.search(text)
        if m:
            op = m.group("op")
            if op == "once_differentiable":
                return f"{backend}: an op marked @once_differentiable has no second derivative"
            return f"{backend}: {op} has no second derivative"
    return None


def directions(point: dict[str, np.ndarray], seed: int, salt: int) -> dict[str, np.ndarray]:
    """One standard normal direction per leaf from the case seed; ``salt`` separates v from w."""
    out = {}
    for path, value in point.items():
        digest = int(np.frombuffer(path.encode(), dtype=np.uint8).astype(np.uint64).sum())
        out[path] = np.random.default_rng([seed, digest, len(path), 2, salt]).standard_normal(np.shape(value))
    return out


def hvp(driver, f, args, prefixes, v: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``H v`` of ``f``'s loss on one backend: the gradient of ``<grad f, v>``, per trainable leaf.

    The tape and torch: a ``gradient`` inside a ``gradient`` (create_graph, double backward).  jax:
    forward over reverse, the JVP along ``v`` of the driver's own gradient, compiled, which XLA
    compiles faster than grad-of-grad (BENCHMARKS.md, "Second order on jax").
    """
    own = own_hvp(driver.name)  # the backend's own, from its registry row (jax's: _hvp_jax)
    if own is not None:
        return own(driver, f, args, prefixes, v)

    def inner_product(*outer):
        *xs, vv = outer
        state = kinks.active()
        g = driver.evaluate(_resumed(f, state), tuple(xs), prefixes).grads
        total = None
        for path, gp in g.items():
            if path in vv:
                term = ops.sum(ops.mul(gp, vv[path]))
                total = term if total is None else ops.add(total, term)
        return total

    grads = driver.evaluate(inner_product, tuple(args) + (dict(v),), tuple(prefixes) + (V_PREFIX,)).grads
    return {p: g for p, g in grads.items() if not p.startswith(V_PREFIX + ".")}


def _hvp_jax(driver, f, args, prefixes, v):
    from gradcheck.backends.jax.driver import configure_jax

    jax = configure_jax()
    paths = [leaf.path for leaf in all_leaves(args, prefixes) if leaf.trainable]
    values = {leaf.path: leaf.value for leaf in all_leaves(args, prefixes)}
    state = kinks.active()

    def grads(train):
        # Nested inside the JVP's trace, the driver stays traced and hands back jax values.
        xs = [replace_leaves(a, dict(zip(paths, train)), p) for a, p in zip(args, prefixes)]
        g = driver.evaluate(_resumed(f, state), xs, prefixes).grads
        return [g[p] for p in paths]

    run = jax.jit(lambda t, d: jax.jvp(grads, (t,), (d,))[1])
    with kinks.suspended():  # the kink state is resumed inside f only, as the driver does
        out = run([jax.device_put(np.asarray(values[p])) for p in paths],
                  [jax.device_put(np.asarray(v[p], np.asarray(values[p]).dtype)) for p in paths])
    return {p: np.array(o) for p, o in zip(paths, out)}


def _resumed(f, state):
    """``f`` with the kink state of the outer call active: jax's driver suspends it around its own run."""
    if state is None:
        return f

    def g(*args):
        with kinks.resumed(state):
            return f(*args)

    return g


def check_options(order: int) -> None:
    """``RunOptions.order``, or a ValueError saying what it must be."""
    if isinstance(order, bool) or order not in ORDERS:
        raise ValueError(f"order={order!r}; expected 1 (gradients) or 2 (Hessian-vector products too)")


def check(cr, runs: dict, options, res) -> None:
    """The check's entry point (``gradcheck.check.checks``): add the second-order leaves (role ``hvp``) to
    ``res``, ``res.second_order`` saying how they were checked, and fold them into its verdict."""
    leaves, errors = _check(cr, runs, options, res)
    res.errors.update(errors)
    res.leaves.extend(leaves)
    res.leaves_compared += sum(1 for leaf in leaves if leaf.verdict != "skipped" and (leaf.pairs or leaf.referee))
    worst = [leaf.verdict for leaf in leaves if leaf.verdict != "vacuous"]
    res.verdict = worst_verdict([res.verdict, *worst, *(["error"] if errors else [])])


def _check(cr, runs, options, res) -> tuple[list[LeafResult], dict]:
    so = res.second_order = SecondOrder()
    train = [leaf for leaf in all_leaves(cr.args64, cr.prefixes) if leaf.trainable]
    if not train:
        res.notes.append("second order: no trainable leaf, nothing to differentiate twice")
        return [], {}
    point = {leaf.path: np.asarray(leaf.value, np.float64) for leaf in train}
    v = directions(point, cr.case.seed, salt=0)
    owners = {}
    for a, p in zip(cr.args64, cr.prefixes):
        owners.update(leaf_owner_types(a, p))
    f64, f32 = cr.f64, cr.f32
    v32 = {p: d.astype(np.float32) for p, d in v.items()}
    hv64, hv32, errors = {}, {}, {}
    for name in sorted(runs, key=reference_rank):
        driver = get_backend(name)
        timing = so.timings[name] = Timing()
        try:
            t0 = time.perf_counter()
            hv64[name] = hvp(driver, f64, cr.args64, cr.prefixes, v)
            timing.float64 = time.perf_counter() - t0
        except Exception as exc:
            why = no_second_derivative(name, exc)
            if why is None:
                errors[f"{name} (second order)"] = short_error(exc)
            else:
                so.unavailable[name] = why
            del so.timings[name]
            continue
        if cr.args32 is not None:
            try:
                t0 = time.perf_counter()
                hv32[name] = _float32(driver, f32, cr, v32, res, name)
                timing.first = time.perf_counter() - t0
            except Exception as exc:
                errors[f"{name} (second order, float32)"] = short_error(exc)
    so.backends = sorted(hv64, key=reference_rank)
    for why in so.unavailable.values():
        res.notes.append(f"second order: {why}; its Hessian-vector products are not compared")
    if not hv64:
        if not errors:
            res.notes.append("second order: no backend could differentiate this case twice")
        return [], errors

    rules = options.rules
    names = so.backends
    scale = max((float(np.max(np.abs(a), initial=0.0)) for by in hv64.values() for a in by.values()), default=0.0)
    leaves = []
    for leaf in train:
        layer = owners.get(leaf.path, "")
        # Tolerance rules (leaf globs, layer types) are the parameter's own: resolved on its path.
        judged = compare_leaf(leaf.path, "param", {b: hv64[b].get(leaf.path, MISSING) for b in names},
                              dtype="float64", rules=rules, layer=layer, case_scale=scale)
        if judged.verdict == "vacuous":
            judged.message = judged.message.replace("the gradient is ~0", "the Hessian-vector product is ~0")
        if hv32 and judged.verdict in ("agree", "disagree"):
            tol = rules.resolve(leaf.path, "float32", layer)
            judged.float32 = verdict.float32_part({b: hv32[b].get(leaf.path, MISSING) for b in hv32},
                                                  {b: hv64[b].get(leaf.path, MISSING) for b in names},
                                                  tol.imprecise_factor, tol.imprecise_floor)
        leaves.append(judged)

    checks = {}
    if options.referee != "off":
        checks, passes = _referee(cr, names, f64, hv64, point, v, rules, owners, res)
        so.referee_passes = passes
        so.referee = ("float64 central differences of each backend's own float64 gradient along v, projected on a "
                      "second random direction per leaf")
    for leaf in leaves:
        verdict.decide(leaf, names, checks.get(leaf.path) if leaf.verdict != "vacuous" else None)
        if leaf.verdict in ("agree", "disagree") and leaf.referee:
            leaf.message = _message(leaf, names) if leaf.verdict == "disagree" else ""
        verdict.apply_policy(leaf, options.imprecise)
        leaf.path, leaf.role = HVP_PREFIX + leaf.path, "hvp"
        leaf.unavailable = dict(so.unavailable)
        if so.unavailable:
            said = "; ".join(so.unavailable.values())
            leaf.message = f"{leaf.message} ({said})" if leaf.message else said
    if leaves and all(leaf.verdict == "vacuous" for leaf in leaves):
        res.notes.append("second order: the Hessian-vector product is ~0 on every leaf and backend (the loss is "
                         "piecewise linear in every leaf here), so second order checks nothing in this case")
    return leaves, errors


def _float32(driver, f32, cr, v32, res, name):
    """The float32 ``H v``, pinned to the float64 reference's kinks (as first order is)."""
    try:
        with kinks.pinned(cr.kinks):
            return hvp(driver, f32, cr.args32, cr.prefixes, v32)
    except kinks.KinkMismatch as exc:
        note = (f"{name}: second-order float32 not pinned to the float64 kinks ({exc}); its float32 error may "
                "include kink crossings")
        if note not in res.notes:
            res.notes.append(note)
        return hvp(driver, f32, cr.args32, cr.prefixes, v32)


# ---------------------------------------------------------------- the referee
def _referee(cr, names, f64, hv64, point, v, rules, owners, res) -> tuple[dict[str, list[RefereeCheck]], int]:
    """Per leaf, each backend's ``<H v, w>`` against central differences of its own float64 gradient along v."""
    w = directions(point, cr.case.seed, salt=1)
    h = min(ref.step_for(x) for x in point.values())
    crossed = 0
    for _ in range(ref.RETRIES + 1):
        # A step across a kink (a relu input, a max-pool window) makes the gradient jump: the float64 reference
        # forward at each point says whether it moved any decision.
        crossed = sum(cr.loss64({p: point[p] + s * h * v[p] for p in point})[1] for s in (1, -1, 2, -2))
        if not crossed:
            break
        h /= ref.SHRINK
    passes = 0
    grads = {}  # backend -> step multiple -> {path: gradient}
    for name in names:
        driver = get_backend(name)
        at = {}
        try:
            for s in (1, -1, 2, -2):
                shifted = {p: point[p] + s * h * v[p] for p in point}
                args = [replace_leaves(a, shifted, pre) for a, pre in zip(cr.args64, cr.prefixes)]
                at[s] = driver.evaluate(f64, args, cr.prefixes).grads
                passes += 1
        except Exception as exc:  # it ran at the point itself; a referee that cannot run here abstains for it
            res.notes.append(f"second-order referee: {name}'s float64 gradient failed near the point ({exc}); "
                             "it is not refereed")
            continue
        grads[name] = at
    out: dict[str, list[RefereeCheck]] = {}
    for path in point:
        rtol = rules.resolve(path, "float64", owners.get(path, "")).referee_rtol
        wp = w[path]
        norms = [sums.norm(hv64[b][path]) for b in grads if path in hv64[b]]
        norm = float(np.median(norms)) if norms else 0.0
        checks = []
        for name, at in grads.items():
            hv = hv64[name].get(path)
            if hv is None or any(path not in at[s] for s in at):
                continue
            g = {s: np.asarray(at[s][path], np.float64) for s in at}
            d1 = sums.inner(g[1] - g[-1], wp) / (2 * h)
            d2 = sums.inner(g[2] - g[-2], wp) / (4 * h)
            answer = sums.inner(hv, wp)
            scale = abs(d1) + 0.1 * norm
            spread = abs(d1 - d2)
            rounding = ref.ROUNDING * ref.EPS * sums.inner(np.abs(g[1]), np.abs(wp)) / h
            resolution = ref.SAFETY * max(spread, rounding) + rtol * scale
            if resolution == 0:
                resolution = ref.EPS
            stable = spread <= ref.UNSTABLE * scale and not crossed
            err = abs(answer - d1) / resolution if np.isfinite(answer) else float("inf")
            checks.append(RefereeCheck(backend=name, directional=answer, numeric=d1, error=float(err),
                                       agrees=bool(err <= 1.0), stable=bool(stable), resolution=float(resolution)))
        if checks:
            out[path] = checks
    return out, passes


def _message(leaf: LeafResult, names: list[str]) -> str:
    """The second-order verdict in words: each backend's referee is its own gradient, so each has its own number."""
    stable = [c for c in leaf.referee if c.stable]
    missed = [c for c in stable if not c.agrees]
    held = [c for c in stable if c.agrees]
    worst = max(leaf.pairs, key=lambda p: p.headroom, default=None)
    detail = f" — {worst.message}" if worst is not None and worst.verdict == "disagree" else ""

    def numbers(cs):
        return "; ".join(f"{c.backend} <Hv, w> {c.directional:.10g} against {c.numeric:.10g} ± {c.resolution:.2g}"
                         for c in cs)

    if not leaf.pairs:
        return (f"{verdict.joined(c.backend for c in missed)}: the Hessian-vector product misses the float64 central "
                f"difference of the backend's own gradient ({numbers(missed)}); no other backend to compare with")
    if not any(p.verdict == "disagree" for p in leaf.pairs):
        return (f"{verdict.joined(names)} agree with each other, but the central difference of "
                f"{'its' if len(missed) == 1 else 'their'} own gradient differs for {verdict.joined(c.backend for c in missed)} "
                f"({numbers(missed)}): the gradient is not smooth within the referee's step here, or every "
                "backend's second derivative shares one wrong rule")
    if leaf.blame and missed and held:
        one = len(leaf.blame) == 1
        return (f"{', '.join(leaf.blame)}: {'its' if one else 'their'} Hessian-vector product is not the derivative "
                f"of {'its' if one else 'their'} own gradient ({numbers(missed)}); {verdict.joined(c.backend for c in held)} "
                f"{'matches' if len(held) == 1 else 'match'} the float64 central difference of "
                f"{'its' if len(held) == 1 else 'their'} own ({numbers(held)}){detail}")
    if not stable:
        why = "the referee abstained: the gradient's central difference was unstable here"
    elif not missed:
        why = "each backend matches the central difference of its own gradient within the referee's resolution"
    else:
        why = f"the referee finds every backend off ({numbers(missed)})"
    if leaf.blame:
        right = [n for n in names if n not in leaf.blame]
        return (f"{', '.join(leaf.blame)}: {verdict.joined(right)} agree in float64 and "
                f"{'it does' if len(leaf.blame) == 1 else 'they do'} not (by majority; {why}){detail}")
    return f"{verdict.joined(names)} disagree in float64 and neither a majority nor the referee decides ({why}){detail}"


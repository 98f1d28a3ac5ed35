"""The verdict rules: float64 decides correctness, float32 is measured against float64.

A float32 case runs every backend twice, in float64 and in float32, from
the same parameters and inputs (the float32 values, widened exactly); a
float64 case runs float64 only and has no float32 part.

**float64 decides.**  Each leaf is compared across every pair of backends,
tightly and (by default) elementwise (``gradcheck.check.compare``, defaults in
``gradcheck.check.tolerance``).  When they disagree, blame needs evidence
(``decide``): the float64 referee's word where it separates the backends
(some within its resolution, some outside it), else a clear majority (every
other backend agreeing among themselves and none with the odd one); when
neither decides, nobody is blamed and the message says so.  With one
backend (the others unavailable, or one asked for alone) there is no pair and
no majority: the stable referee alone decides, and the message says that only
that backend and the referee were compared.  Blame never contradicts the
referee record shown beside it: the referee's own numbers are what the
message quotes.

**float32 is measured** (``float32_part``).  A backend's float32 result is
held against its own float64 one: ``e_b = ||x32 - x64|| / ||x64||``.  A wrong
VJP is wrong in both precisions, so what remains is what float32 costs that
backend on that leaf: rounding, and the fused kernels that round less.
Deep float32 models legitimately differ elementwise far beyond any fixed
tolerance, so no fixed bar is set between frameworks; instead a backend is
``imprecise`` when ``e_b > factor * min_b' e_b' + floor``: further from
float64 than a stated multiple of the best backend (the rule of
torch._dynamo's ``same(..., fp64_ref=...)`` and thunder's ``assert_closer``).
Kinks do not make a backend imprecise: every float32 run takes the float64
reference's branch at them (``gradcheck.check.kinks``; where a run cannot be
pinned, the case's notes say so).  Whether ``imprecise`` fails a case is a
setting (``imprecise = "warn" | "fail"``); by default it warns, so a run in
which nothing is wrong never fails on precision.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gradcheck.backends import reference_rank
from gradcheck.check import sums
from gradcheck.check.compare import MISSING
from gradcheck.results import (
    FLOAT32_VERDICTS,
    Float32Result,
    LeafResult,
    RefereeCheck,
    worst_verdict,
)

POLICIES = ("warn", "fail")
# Whether a float32 result too far from float64 fails the case, and whether a backend that was asked for
# but unavailable does (``RunOptions.imprecise``, ``RunOptions.unavailable``).
IMPRECISE_POLICIES = UNAVAILABLE_POLICIES = POLICIES


# ---------------------------------------------------------------- float64: blame from evidence
def decide(leaf: LeafResult, names: list[str], referee: list[RefereeCheck] | None = None) -> LeafResult:
    """Set ``leaf``'s verdict, blame and message from its float64 pairs and the referee's checks.

    ``names`` are the backends whose float64 results the leaf holds.  With
    one of them there are no pairs, and the stable referee's word alone
    decides.  A leaf with no pairs but several backends (the referee's joint
    direction, ``runner._joint_referee``) is decided by the referee's split.
    """
    if referee is not None:
        leaf.referee = list(referee)
    if leaf.verdict not in ("agree", "disagree"):  # structural, nonfinite, vacuous: decided by the comparison
        return leaf
    disagreeing = [p for p in leaf.pairs if p.verdict == "disagree"]
    stable = [r for r in leaf.referee if r.stable]
    missed = sorted((r.backend for r in stable if not r.agrees), key=reference_rank)
    held = sorted((r.backend for r in stable if r.agrees), key=reference_rank)
    if not disagreeing and not missed:
        leaf.verdict, leaf.blame, leaf.message = "agree", [], ""
        return leaf
    leaf.verdict = "disagree"
    worst = max(leaf.pairs, key=lambda p: p.headroom, default=None)
    detail = f" — {worst.message}" if worst is not None and worst.verdict == "disagree" else ""
    if len(names) == 1:
        # No second backend to hold it against: the referee resolved it outside its resolution, which is the
        # evidence, and the message says how little was compared.
        leaf.blame = list(missed)
        leaf.message = (f"{names[0]}: the float64 finite difference differs from its gradient "
                        f"({_referee_numbers(stable)}); only {names[0]} and the referee were compared")
        return leaf
    if not disagreeing and (leaf.pairs or not held):
        # The backends agree with each other (or, without pairs, the referee misses every one of them) and the
        # referee misses some or all of them (those at the edge of its resolution): evidence against a rule they
        # share, or of a function not smooth within the referee's step, not against one backend.
        leaf.blame = []
        if leaf.pairs:
            which = _every(names) if not held else joined(missed)
            head = f"{joined(names)} agree with each other, but the float64 finite difference differs from {which}"
        else:
            head = f"the float64 finite difference differs from {_every(names, named=True)}"
        leaf.message = (f"{head} ({_referee_numbers(stable)}): either every backend shares one wrong rule or the "
                        "function is not smooth within the referee's step here")
        return leaf
    odd = _odd_one_out(names, leaf.pairs)
    if missed and held:
        leaf.blame = missed
        leaf.message = (f"{', '.join(leaf.blame)}: the float64 referee and {joined(held)} agree "
                        f"({_referee_numbers(stable)}){detail}")
    elif odd:
        leaf.blame = odd
        right = [n for n in names if n not in odd]
        why = _referee_abstains(leaf.referee, stable, missed, names)
        leaf.message = f"{', '.join(odd)}: {joined(right)} agree in float64 and {'it does' if len(odd) == 1 else 'they do'} not"
        leaf.message += f" (by majority; {why}){detail}"
    else:
        leaf.blame = []
        why = _referee_abstains(leaf.referee, stable, missed, names)
        # Two backends have no majority: only the referee could decide between them.
        decides = "neither a majority nor the referee decides" if len(names) > 2 else \
            "the referee does not decide between them"
        leaf.message = f"{joined(names)} disagree in float64 and {decides} ({why}){detail}"
    return leaf


def _each(names) -> str:
    return "both backends" if len(names) == 2 else "every backend"


def _every(names, named: bool = False) -> str:
    """"both of them" / "all of them", or with ``named`` "both tape and torch" / "all of tape, torch and jax"."""
    if len(names) == 2:
        return f"both {names[0]} and {names[1]}" if named else "both of them"
    return f"all of {joined(names)}" if named else "all of them"


def _referee_numbers(checks: list[RefereeCheck]) -> str:
    if not checks:
        return "no referee check"
    numeric = checks[0].numeric
    parts = ", ".join(f"{c.backend} {c.directional:.10g}" for c in checks)
    return f"finite difference {numeric:.10g} ± {checks[0].resolution:.2g}; {parts}"


def _referee_abstains(all_checks, stable, missed, names) -> str:
    if not all_checks:
        return "the referee did not check this leaf"
    if not stable:
        return "the referee abstained: its finite difference was unstable here"
    if not missed:
        return f"the referee's resolution, {stable[0].resolution:.2g} on {stable[0].numeric:.6g}, covers {_each(names)}"
    return f"the referee finds {_each(names)} off ({_referee_numbers(stable)})"


def _odd_one_out(names, pairs) -> list[str]:
    """The backends a clear majority outvotes: the others all agree among themselves and with none of these."""
    if len(names) < 3:
        return []
    agree = {n: set() for n in names}
    for p in pairs:
        if p.verdict == "agree":
            agree[p.backend].add(p.reference)
            agree[p.reference].add(p.backend)
    for size in range(len(names) - 1, len(names) // 2, -1):
        for majority in _subsets(names, size):
            if all(agree[a] >= (set(majority) - {a}) for a in majority):
                rest = [n for n in names if n not in majority]
                if all(not (agree[r] & set(majority)) for r in rest):
                    return sorted(rest, key=reference_rank)
    return []


def _subsets(names, size):
    import itertools

    return itertools.combinations(names, size)


def joined(items) -> str:
    """"a", "a and b", "a, b and c" ("nobody" for none)."""
    items = list(items)
    if not items:
        return "nobody"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def nondeterminism(leaf: LeafResult, limit: float) -> None:
    """A backend whose two calls on the same inputs differ by more than ``limit`` (of the leaf's largest
    value) is at fault for that, not the others: the leaf is ``nondeterministic`` and blames it alone.
    Smaller spreads (an atomic add's reordering) stay recorded on the leaf."""
    wild = sorted((b for b, d in leaf.nondeterministic.items() if d > limit), key=reference_rank)
    if not wild or leaf.verdict in ("structural", "nonfinite"):
        return
    leaf.verdict, leaf.blame = "nondeterministic", wild
    leaf.message = "; ".join(f"{b} gives different results on two calls with the same inputs (spread "
                             f"{leaf.nondeterministic[b]:.3g} of the leaf's largest value)" for b in wild)


# ---------------------------------------------------------------- float32: measured against float64
def rel_error(a, b, scale=None) -> float | None:
    """``||a - b|| / ||b||`` in float64, or None when it is undefined (missing, shape, non-finite, ||b|| = 0).

    ``scale``, for a running statistic (``compare.statistic_scales``): the scale of the values it summarises,
    added to ``|b|`` element by element as the float64 comparison adds it.  A running mean of centred values is
    ~1e-17 in float64, and every float32 error relative to that alone is huge, precise backend or not."""
    if a is None or b is None or a is MISSING or b is MISSING:
        return None
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    b = b.astype(np.float64, copy=False)
    nb = sums.norm(b if scale is None else np.abs(b) + np.asarray(scale, np.float64))
    if nb == 0:
        return None
    return sums.norm(np.subtract(a, b, dtype=np.float64)) / nb


@dataclass(frozen=True)
class Measured32:
    """One backend's float32 result for one leaf, measured against its own float64 one (``measure_float32``): all
    that ``float32_part`` reads of the pair, so that the runner need not hold a model's float32 gradients until the
    comparison (``runner._measured32``).  ``problem``: what is wrong with the float32 result ("structural": none, a
    wrong shape or dtype; "nonfinite": NaN/Inf where float64 is finite), ``message`` says it; otherwise ``error``
    is ``rel_error`` (None: undefined, as when the float64 result is missing)."""

    error: float | None = None
    problem: str = ""
    message: str = ""


def measure_float32(name: str, a, b, value_scale=None) -> Measured32:
    """Backend ``name``'s float32 result ``a`` against its float64 ``b`` (see ``Measured32``)."""
    if a is MISSING or a is None:
        return Measured32(problem="structural", message=f"{name} gives no float32 result")
    a = np.asarray(a)
    if b is MISSING or b is None:
        return Measured32()
    b = np.asarray(b)
    if a.shape != b.shape:
        return Measured32(problem="structural",
                          message=f"{name}'s float32 result has shape {a.shape}, its float64 one {b.shape}")
    if a.dtype.kind == "f" and a.dtype != np.float32:
        return Measured32(problem="structural", message=f"{name} computes this float32 leaf in {a.dtype}")
    if not np.isfinite(a).all() and np.isfinite(b).all():
        return Measured32(problem="nonfinite")
    return Measured32(error=rel_error(a, b, value_scale))


def float32_part(arrays32: dict, arrays64: dict, factor: float, floor: float, value_scale=None) -> Float32Result:
    """Each backend's float32 result against its own float64 one, and who is imprecise (see the module doc).
    A backend's entry in ``arrays32`` is its float32 array, or that array already measured (``Measured32``).
    ``value_scale``: a running statistic's scale (``rel_error``)."""
    out = Float32Result()
    problems, broken, nonfinite = [], [], []
    for name in sorted(arrays32, key=reference_rank):
        m = arrays32[name]
        if not isinstance(m, Measured32):
            m = measure_float32(name, m, arrays64.get(name, MISSING), value_scale)
        if m.problem == "structural":
            problems.append(m.message)
            broken.append(name)
        elif m.problem == "nonfinite":
            nonfinite.append(name)
        elif m.error is not None:
            out.errors[name] = m.error
    if broken:
        out.verdict, out.imprecise, out.message = "structural", broken, "; ".join(problems)
        return out
    if nonfinite:
        out.verdict, out.imprecise = "nonfinite", nonfinite
        out.message = f"{joined(nonfinite)}: NaN/Inf in float32 where float64 is finite (float32 overflows or underflows)"
        return out
    if not out.errors:
        out.verdict = "unmeasured"
        out.message = "no backend's float32 error could be measured (the float64 result is zero, missing or not finite)"
        return out
    out.best = min(out.errors, key=lambda n: (out.errors[n], reference_rank(n)))
    best = out.errors[out.best]
    out.limit = factor * best + floor
    out.imprecise = [n for n, e in out.errors.items() if e > out.limit]
    if out.imprecise:
        out.verdict = "imprecise"
        out.message = "; ".join(
            f"{n} float32 is {_times(out.errors[n], best)} further from float64 than {out.best} "
            f"({out.errors[n]:.2g} against {best:.2g}; the limit is {factor:g}x the best + {floor:g})"
            for n in out.imprecise)
    return out


def _times(e: float, best: float) -> str:
    return f"{e / best:.0f}x" if best > 0 else "infinitely"


def worst_float32(parts) -> str:
    """The case's float32 verdict: the worst of its leaves'.  A leaf with nothing to measure (its float64 result
    exactly zero: a constant buffer, a gradient an exact zero) decides only when no leaf could be measured, as a
    vacuous leaf decides a case only when every gradient is vacuous."""
    verdicts = [p.verdict for p in parts if p is not None]
    measured = [v for v in verdicts if v != "unmeasured"] or verdicts
    for v in FLOAT32_VERDICTS:
        if v in measured:
            return v
    return "ok" if verdicts else ""


# ---------------------------------------------------------------- the case
def apply_policy(leaf: LeafResult, policy: str) -> None:
    """Fold the float32 part into an agreeing leaf's verdict: a float32 structural defect always fails; imprecise
    (or NaN/Inf in float32 only) fails as ``imprecise`` under "fail" only."""
    part = leaf.float32
    if part is None or leaf.verdict not in ("agree",):
        return
    if part.verdict == "structural":
        leaf.verdict, leaf.blame, leaf.message = "structural", list(part.imprecise), f"float32: {part.message}"
    elif part.verdict in ("imprecise", "nonfinite") and policy == "fail":
        leaf.verdict, leaf.blame, leaf.message = "imprecise", list(part.imprecise), f"float32: {part.message}"


def case_verdict(leaves: list[LeafResult], errors: dict, unavailable: dict | None = None,
                 policy: str = "warn") -> str:
    """The worst leaf verdict; a vacuous leaf only decides when every gradient leaf is vacuous.

    A backend asked for but ``unavailable`` makes the case ``partial`` under
    ``policy="fail"``; under "warn" every report says it beside the verdict.
    """
    verdicts = [leaf.verdict for leaf in leaves if leaf.verdict != "vacuous"]
    if errors:
        verdicts.append("error")
    if unavailable and policy == "fail":
        verdicts.append("partial")
    grads = [leaf for leaf in leaves if leaf.role in ("param", "input")]
    if grads and all(leaf.verdict == "vacuous" for leaf in grads):
        verdicts.append("vacuous")
    return worst_verdict(verdicts)

"""Helpers every renderer shares: number formatting, per-leaf numbers, run counts, file writing.

Each output (terminal, HTML, Markdown, JUnit, annotations) must say the same
thing about the same leaf — the same "worst pair", the same rounding — so a
person who reads the CI log and then opens the HTML report sees one story.
The sentences themselves live in ``reports/text.py``; this module holds the
numbers they are made of.

Which leaves fail is decided in one place, ``LeafResult.failing`` (a vacuous
leaf is never a failure of its own); every renderer asks it.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gradcheck.results import (
    CaseResult,
    Float32Result,
    LeafResult,
    PairResult,
    RunResult,
)

# A short, fixed label per verdict: reports never rely on colour alone.
SYMBOL = {
    "agree": "✓",
    "disagree": "✗",
    "structural": "≠",
    "nonfinite": "∞",
    "error": "!",
    "imprecise": "≈",
    "partial": "◐",
    "vacuous": "∅",
    "skipped": "–",
}
# Float32Result.verdict values that flag a leaf (FLOAT32_VERDICTS minus "unmeasured" and "ok").
FLOAT32_FLAGGED = ("structural", "nonfinite", "imprecise")
GRADIENT_ROLES = ("param", "input")


def fmt(x, digits: int = 3) -> str:
    """A number in a few significant digits; None (no value) as an em dash."""
    if x is None:
        return "—"
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e4:
        # Round to `digits` significant digits but never switch to exponent form in this range.
        return f"{float(f'{x:.{digits}g}'):g}"
    # Exponent form without trailing zeros in the mantissa: 1e-08, 2.4e+03, -9.1e-04.
    return re.sub(r"\.?0+e", "e", f"{x:.{max(digits - 1, 0)}e}")


def fmt_seconds(s) -> str:
    if s is None:
        return "—"
    s = float(s)
    if not math.isfinite(s):
        return fmt(s)
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.0f} ms" if s >= 0.01 else f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s" if s < 100 else f"{s:.0f} s"


def fmt_index(index) -> str:
    return "[" + ", ".join(str(i) for i in index) + "]" if index else "[]"


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def worst_pair(leaf: LeafResult) -> PairResult | None:
    """The pair whose headroom is largest: the one the headline numbers come from."""
    return max(leaf.pairs, key=lambda p: _num(p.headroom), default=None)


def _num(x) -> float:
    # NaN compares as "worse than anything" so it is never hidden behind a finite number.
    try:
        x = float(x)
    except (TypeError, ValueError):
        return -math.inf
    return math.inf if math.isnan(x) else x


@dataclass
class LeafNumbers:
    """The headline numbers of one leaf, taken over all its pairs."""

    headroom: float | None
    max_abs: float | None
    max_rel: float | None

    @classmethod
    def of(cls, leaf: LeafResult) -> LeafNumbers:
        if not leaf.pairs:
            return cls(None, None, None)
        return cls(
            headroom=max((p.headroom for p in leaf.pairs), key=_num),
            max_abs=max((p.max_abs for p in leaf.pairs), key=_num),
            max_rel=max((p.max_rel for p in leaf.pairs), key=_num),
        )


def blame_text(leaf: LeafResult) -> str:
    return ", ".join(leaf.blame) if leaf.blame else "—"


def reason(leaf: LeafResult) -> str:
    """The leaf's explanation without the numbers the comparison appended after " — "."""
    return leaf.message.split(" — ", 1)[0]


# ---------------------------------------------------------------- which leaves
def failing_leaves(case: CaseResult) -> list[LeafResult]:
    """The one rule (``LeafResult.failing``): vacuous leaves are never failures of their own."""
    return case.failing_leaves()


def vacuous_leaves(case: CaseResult) -> list[LeafResult]:
    return [leaf for leaf in case.leaves if leaf.verdict == "vacuous"]


def f32_flagged(leaf: LeafResult) -> bool:
    """The leaf's float32 result is too far from float64 on some backend (or not finite, or misshapen)."""
    f = leaf.float32
    return f is not None and (f.verdict in FLOAT32_FLAGGED or bool(f.imprecise))


def imprecise_leaves(case: CaseResult) -> list[LeafResult]:
    """Flagged float32 leaves that are not already failures: warnings under ``imprecise="warn"``.

    Under ``"fail"`` the comparison marks such a leaf ``imprecise`` (a failing
    verdict) and it is listed with the failures; one whose verdict was left as
    it was is listed here, and the renderers call it a failure then too.
    """
    return [leaf for leaf in case.leaves if f32_flagged(leaf) and not leaf.failing]


def imprecise_fails(case: CaseResult) -> bool:
    return case.imprecise == "fail"


def f32_ratio(f: Float32Result, backend: str) -> float | None:
    """How many times further from float64 ``backend``'s float32 result is than the best backend's."""
    err, best = f.errors.get(backend), f.errors.get(f.best)
    if not finite(err) or best is None:
        return math.inf if err is not None and not finite(err) else None
    if not finite(best):
        return None
    if best == 0:
        return 1.0 if err == 0 else math.inf
    return err / best


def f32_worst(leaf: LeafResult) -> tuple[str, float] | None:
    """The backend furthest from the best on this leaf, and its ratio (None without a float32 part)."""
    f = leaf.float32
    if f is None or not f.errors:
        return None
    out = None
    for b in f.errors:
        if b == f.best:
            continue
        r = f32_ratio(f, b)
        if r is not None and (out is None or _num(r) > _num(out[1])):
            out = (b, r)
    return out


def case_f32_worst(case: CaseResult) -> tuple[str, float, str] | None:
    """(backend, ratio, leaf path) of the largest float32 ratio in the case."""
    out = None
    for leaf in case.leaves:
        w = f32_worst(leaf)
        if w is not None and (out is None or _num(w[1]) > _num(out[1])):
            out = (w[0], w[1], leaf.path)
    return out


def f32_leaves(case: CaseResult) -> list[LeafResult]:
    """Gradient leaves with a float32 part, in forward order: the x axis of the precision chart."""
    return [leaf for leaf in case.leaves if leaf.float32 is not None and leaf.role in GRADIENT_ROLES]


def case_headroom(case: CaseResult) -> float | None:
    """The worst headroom of the case; vacuous leaves (rounding noise around zero) are left out."""
    values = [LeafNumbers.of(leaf).headroom for leaf in case.leaves if leaf.pairs and leaf.verdict != "vacuous"]
    return max(values, key=_num) if values else None


def compared(case: CaseResult) -> int:
    """Leaves held against something (``LeafResult.compared``), counted from the leaves, as :func:`agreeing` is:
    a count of agreeing leaves can never exceed it (an output that one backend alone gave agrees with nothing)."""
    return case.compared


def agreeing(case: CaseResult) -> int:
    """Compared leaves that agree (``CaseResult.agreeing``)."""
    return case.agreeing


def backends_of(run: RunResult) -> list[str]:
    """Every backend the run mentions, in first-seen order."""
    seen: dict[str, None] = {}
    for case in run.cases:
        for name in [*case.backends, *case.timings, *case.unavailable]:
            seen.setdefault(name, None)
    return list(seen)


def timing_parts(t) -> tuple:
    """(float32 first, float32 second, float64) seconds of a Timing; older results have no float64."""
    return t.first, t.second, getattr(t, "float64", None)


def case_time(case: CaseResult) -> float:
    """Seconds the case's backends spent (float32 first and second calls, float64 call), for CI time columns."""
    total = 0.0
    for t in case.timings.values():
        for s in timing_parts(t):
            if finite(s) and s > 0:
                total += s
    return total


def incomplete(run: RunResult) -> bool:
    """Interrupted, or fewer cases than planned ran: never to be read as a pass."""
    return bool(run.interrupted) or (run.planned is not None and len(run.cases) < run.planned)


def run_status(run: RunResult) -> str:
    """The word a report leads with: ``interrupted``, ``empty``, the worst failing verdict, or ``agree``."""
    if incomplete(run):
        return "interrupted"
    if not run.cases:
        return "empty"
    return run.verdict if run.failed else "agree"


def run_failed(run: RunResult) -> bool:
    return run.failed or incomplete(run)


@dataclass
class RunCounts:
    cases: int
    failed_cases: int
    compared: int
    agreeing: int
    failing_leaves: int
    vacuous: int
    imprecise: int  # flagged float32 leaves that are not failures (warnings under "warn")
    kinks_crossed: int
    by_verdict: dict[str, int]
    blamed: dict[str, int]

    @classmethod
    def of(cls, run: RunResult) -> RunCounts:
        by_verdict: dict[str, int] = {}
        blamed: dict[str, int] = {}
        failing = vacuous = imprecise = crossed = 0
        for case in run.cases:
            for leaf in case.leaves:
                by_verdict[leaf.verdict] = by_verdict.get(leaf.verdict, 0) + 1
                if leaf.failing:
                    failing += 1
                    for b in leaf.blame:
                        blamed[b] = blamed.get(b, 0) + 1
                elif leaf.verdict == "vacuous":
                    vacuous += 1
            imprecise += len(imprecise_leaves(case))
            crossed += sum(1 for k in case.kinks if any(v for v in k.crossed.values()))
        return cls(
            cases=len(run.cases),
            failed_cases=sum(1 for c in run.cases if c.failed),
            compared=sum(compared(c) for c in run.cases),
            agreeing=sum(agreeing(c) for c in run.cases),
            failing_leaves=failing,
            vacuous=vacuous,
            imprecise=imprecise,
            kinks_crossed=crossed,
            by_verdict=by_verdict,
            blamed=blamed,
        )


def write_text(path, text: str) -> Path:
    """Write atomically (temp file + rename) so a CI artifact is never half a report."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a report is for others to read
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path

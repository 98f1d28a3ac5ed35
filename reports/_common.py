"""Helpers every renderer shares: number formatting, per-leaf summaries, run counts, file writing.

Each output (terminal, HTML, Markdown, JUnit, annotations) must say the same
thing about the same leaf — the same "worst pair", the same rounding — so a
person who reads the CI log and then opens the HTML report sees one story.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gradcheck.results import FAILING, VERDICTS, CaseResult, LeafResult, PairResult, RunResult

# A short, fixed label per verdict: reports never rely on colour alone.
SYMBOL = {
    "agree": "✓",
    "disagree": "✗",
    "structural": "≠",
    "nonfinite": "∞",
    "error": "!",
    "vacuous": "∅",
    "skipped": "–",
}

# Headline per run verdict (the worst case verdict).
HEADLINE = {
    "agree": "All gradients agree",
    "disagree": "Gradients disagree",
    "structural": "Gradients differ in structure",
    "nonfinite": "Gradients are not finite",
    "error": "The run hit errors",
    "vacuous": "Some checks were vacuous",
    "skipped": "Everything was skipped",
}

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean_line(text) -> str:
    """One printable line: control characters (ANSI escapes, NULs) become visible, newlines spaces.

    Case names and layer paths come from user code; a stray escape sequence in
    one must not recolour a CI log or hide the text after it.
    """
    text = str(text).replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


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


def verdict_rank(verdict: str) -> int:
    """0 for the worst verdict; unknown verdicts (a newer writer) sort as the worst."""
    return VERDICTS.index(verdict) if verdict in VERDICTS else -1


def is_failing(verdict: str) -> bool:
    return verdict in FAILING or verdict not in VERDICTS


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


def failing_leaves(case: CaseResult) -> list[LeafResult]:
    return [leaf for leaf in case.leaves if is_failing(leaf.verdict)]


def case_headroom(case: CaseResult) -> float | None:
    values = [LeafNumbers.of(leaf).headroom for leaf in case.leaves if leaf.pairs]
    return max(values, key=_num) if values else None


def compared(case: CaseResult) -> int:
    """Leaves compared; older or partial results may leave ``leaves_compared`` at 0."""
    return case.leaves_compared or sum(1 for leaf in case.leaves if leaf.verdict != "skipped")


def backends_of(run: RunResult) -> list[str]:
    """Every backend the run mentions, in first-seen order."""
    seen: dict[str, None] = {}
    for case in run.cases:
        for name in [*case.backends, *case.timings, *case.unavailable]:
            seen.setdefault(name, None)
    return list(seen)


def case_time(case: CaseResult) -> float:
    """Seconds the case's backends spent (first and second calls), for CI time columns."""
    total = 0.0
    for t in case.timings.values():
        for s in (t.first, t.second):
            if s is not None and math.isfinite(s) and s > 0:
                total += s
    return total


@dataclass
class RunCounts:
    cases: int
    failed_cases: int
    compared: int
    agreeing: int
    failing_leaves: int
    by_verdict: dict[str, int]
    blamed: dict[str, int]

    @classmethod
    def of(cls, run: RunResult) -> RunCounts:
        by_verdict: dict[str, int] = {}
        blamed: dict[str, int] = {}
        for case in run.cases:
            for leaf in case.leaves:
                by_verdict[leaf.verdict] = by_verdict.get(leaf.verdict, 0) + 1
                if is_failing(leaf.verdict):
                    for b in leaf.blame:
                        blamed[b] = blamed.get(b, 0) + 1
        return cls(
            cases=len(run.cases),
            failed_cases=sum(1 for c in run.cases if c.failed),
            compared=sum(compared(c) for c in run.cases),
            agreeing=by_verdict.get("agree", 0),
            failing_leaves=sum(n for v, n in by_verdict.items() if is_failing(v)),
            by_verdict=by_verdict,
            blamed=blamed,
        )


def run_sentence(run: RunResult) -> str:
    """One line a person can read out: what happened overall."""
    n = RunCounts.of(run)
    if not run.cases:
        return "no case ran"
    parts = [f"{n.failed_cases} of {n.cases} case{'s' if n.cases != 1 else ''} failed"
             if n.failed_cases else f"all {n.cases} case{'s' if n.cases != 1 else ''} passed"]
    roles: dict[str, int] = {}
    for case in run.cases:
        for leaf in case.leaves:
            if leaf.verdict != "skipped":
                roles[leaf.role] = roles.get(leaf.role, 0) + 1
    # Say what the leaves are: "62 parameter gradients" is what a reader counts on.
    names = {"param": "parameter gradient", "input": "input gradient", "output": "output", "buffer": "buffer"}
    detail = ", ".join(f"{roles[r]} {names[r]}{'s' if roles[r] != 1 else ''}" for r in names if roles.get(r))
    parts.append(f"{n.agreeing} of {n.compared} leaves agree" + (f" ({detail})" if detail else ""))
    if n.blamed:
        parts.append("blamed: " + ", ".join(f"{b} ×{k}" for b, k in sorted(n.blamed.items(), key=lambda kv: -kv[1])))
    return "; ".join(parts)


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

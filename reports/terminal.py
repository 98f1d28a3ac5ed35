"""The summary printed at the end of a run: a table per case, a line per failing leaf, a verdict.

Written for two readers: a person at a terminal (colour, aligned columns) and
a CI log (``color=False``: plain text that greps well — every failing leaf is
one line starting with its verdict in capitals, naming case, leaf, numbers and
the blamed backend).
"""

from __future__ import annotations

from gradcheck.results import RunResult

from ._common import (
    SYMBOL,
    LeafNumbers,
    RunCounts,
    backends_of,
    blame_text,
    case_headroom,
    clean_line,
    compared,
    failing_leaves,
    fmt,
    fmt_index,
    fmt_seconds,
    is_failing,
    reason,
    run_sentence,
    worst_pair,
)

# ANSI SGR codes per verdict; the verdict word is always printed too, so colour only helps.
_COLOR = {
    "agree": "32",
    "disagree": "31;1",
    "structural": "35;1",
    "nonfinite": "33;1",
    "error": "41;97;1",
    "vacuous": "33",
    "skipped": "2",
}


def _paint(text: str, verdict: str, color: bool) -> str:
    if not color:
        return text
    return f"\x1b[{_COLOR.get(verdict, '1')}m{text}\x1b[0m"


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    """Align columns; ``right`` holds the indices of numeric columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
    return out


def _timing_cell(case, backend: str) -> str:
    if backend in case.unavailable:
        return "n/a"
    t = case.timings.get(backend)
    if t is None:
        return "—" if backend not in case.errors else "error"
    if t.first is None and backend in case.errors:
        return "error"
    return f"{fmt_seconds(t.first)} / {fmt_seconds(t.second)}"


def _leaf_line(case, leaf, color: bool) -> str:
    label = _paint(f"{SYMBOL.get(leaf.verdict, '?')} {leaf.verdict.upper()}", leaf.verdict, color)
    nums = LeafNumbers.of(leaf)
    parts = [f"{label} {clean_line(case.name)} :: {clean_line(leaf.path)}"]
    pair = worst_pair(leaf)
    if pair is not None and nums.headroom is not None:
        parts.append(f"max rel {fmt(nums.max_rel)}, max abs {fmt(nums.max_abs)} at {fmt_index(pair.max_abs_index)}"
                     f" ({pair.backend} vs {pair.reference}), headroom {fmt(nums.headroom)}")
    parts.append(f"blamed: {blame_text(leaf)}")
    why = reason(leaf)
    if why:
        parts.append(clean_line(why))
    return " — ".join(parts)


def render_summary(run: RunResult, color: bool = False, max_leaf_lines: int = 50) -> str:
    """The end-of-run summary: case table, one line per failing leaf (at most ``max_leaf_lines``), verdict."""
    backends = backends_of(run)
    header = ["case", "verdict", "compared", "agree", "headroom"] + [f"{b} 1st / 2nd" for b in backends]
    rows = [header]
    verdicts = []
    for case in run.cases:
        rows.append([clean_line(case.name), f"{SYMBOL.get(case.verdict, '?')} {case.verdict}",
                     str(compared(case)), str(case.count("agree")), fmt(case_headroom(case))]
                    + [_timing_cell(case, b) for b in backends])
        verdicts.append(case.verdict)
    lines = _table(rows, right={2, 3, 4})
    if color:
        # Colour after aligning: escape codes would otherwise count as width.
        lines[0] = f"\x1b[1m{lines[0]}\x1b[0m"
        for i, v in enumerate(verdicts, start=1):
            lines[i] = lines[i].replace(f"{SYMBOL.get(v, '?')} {v}", _paint(f"{SYMBOL.get(v, '?')} {v}", v, True), 1)

    details = []
    for case in run.cases:
        for backend, text in case.errors.items():
            first = next((ln for ln in reversed(str(text).splitlines()) if ln.strip()), "")
            details.append(f"{_paint('! ERROR', 'error', color)} {clean_line(case.name)} :: {clean_line(backend)}"
                           f" — {clean_line(first)}")
        for leaf in failing_leaves(case):
            details.append(_leaf_line(case, leaf, color))
        for backend, why in case.unavailable.items():
            details.append(f"{_paint('– UNAVAILABLE', 'skipped', color)} {clean_line(case.name)} :: "
                           f"{clean_line(backend)} — {clean_line(why)}")
    if len(details) > max_leaf_lines:
        more = len(details) - max_leaf_lines
        details = details[:max_leaf_lines] + [f"… and {more} more (see the HTML report or JSON results)"]
    if details:
        lines += [""] + details

    lines += ["", _verdict_line(run, color)]
    return "\n".join(lines)


def _verdict_line(run: RunResult, color: bool) -> str:
    n = RunCounts.of(run)
    failed = run.failed
    word = "FAIL" if failed else "PASS"
    verdict = run.verdict if failed else "agree"
    extra = ""
    if failed and n.failing_leaves:
        kinds = ", ".join(f"{k} {v}" for v, k in n.by_verdict.items() if is_failing(v))
        extra = f" ({kinds})"
    return _paint(f"gradcheck {word}: {run_sentence(run)}{extra}", verdict, color)

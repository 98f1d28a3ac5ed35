"""The summary printed at the end of a run: a case table, a timing table, failures, notices, a verdict.

Written for two readers: a person at a terminal (colour, aligned columns that
fit 80 columns) and a CI log (``color=False``: plain text that greps well —
every failing leaf is one line starting with its verdict in capitals, naming
case, leaf, numbers and the blamed backend).  Failures come first, then the
notices (float32 warnings, vacuous leaves, kinks, one line per unavailable
backend), so the line that matters is never below fifty that do not.

Every line goes through ``text.clean_line``: a case name cannot start a line
of its own, recolour the terminal or become a CI workflow command.
"""

from __future__ import annotations

from gradcheck.results import CaseResult, RunResult

from ._common import (
    SYMBOL,
    agreeing,
    backends_of,
    case_headroom,
    compared,
    failing_leaves,
    fmt,
    fmt_seconds,
    imprecise_fails,
    imprecise_leaves,
    incomplete,
    run_failed,
    timing_parts,
)
from .text import (
    case_failure,
    clean_line,
    coverage_label,
    error_line,
    float32_cell,
    imprecise_sentence,
    kink_sentence,
    leaf_detail,
    loss_sentence,
    origin_sentence,
    run_sentence,
    trajectory_head,
    trajectory_steps,
    unavailable_notices,
    unavailable_sentence,
    vacuous_sentence,
)

WIDTH = 80  # the summary table and the progress bar fit a classic terminal
# ANSI SGR codes per verdict; the verdict word is always printed too, so colour only helps.
_COLOR = {
    "agree": "32",
    "ok": "32",
    "disagree": "31;1",
    "structural": "35;1",
    "nonfinite": "33;1",
    "error": "41;97;1",
    "imprecise": "93;1",
    "partial": "34;1",
    "vacuous": "33",
    "skipped": "2",
    "kink": "36",
    "interrupted": "41;97;1",
}


def _paint(text: str, verdict: str, color: bool) -> str:
    if not color:
        return text
    return f"\x1b[{_COLOR.get(verdict, '1')}m{text}\x1b[0m"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _table(rows: list[list[str]], right: set[int], width: int = WIDTH, shrink: tuple[int, ...] = (0,),
           paint=None) -> list[str]:
    """Align columns (``right``: numeric ones); the ``shrink`` columns, in turn, are cut with "…" (to 8
    characters at most) until the table fits ``width``.

    ``paint(row, col, padded)`` may colour a cell after it is padded, so escape codes never count as width.
    """
    n = len(rows[0])
    widths = [max(len(r[i]) for r in rows) for i in range(n)]
    for col in shrink:
        over = sum(widths) + 2 * (n - 1) - width
        if over > 0:
            widths[col] = max(8, widths[col] - over)
    out = []
    for k, r in enumerate(rows):
        cells = []
        for i, (c, w) in enumerate(zip(r, widths, strict=True)):
            c = _cut(c, w)
            c = c.rjust(w) if i in right else c.ljust(w)
            cells.append(paint(k, i, c) if paint else c)
        out.append("  ".join(cells).rstrip())
    return out


def _secs(s) -> str:
    return fmt_seconds(s).replace(" ", "")


def _timing_cell(case: CaseResult, backend: str) -> str:
    if backend in case.unavailable:
        return "n/a"
    t = case.timings.get(backend)
    if t is None:
        return "error" if backend in case.errors else "—"
    first, second, f64 = timing_parts(t)
    if first is None and f64 is None and backend in case.errors:
        return "error"
    return f"{_secs(first)}/{_secs(second)}/{_secs(f64)}"


def _case_table(run: RunResult, color: bool, width: int) -> list[str]:
    rows = [["case", "float64", "agree", "headroom", "float32"]]
    for case in run.cases:
        # A partial case says what it was checked on beside its verdict: "✓ agree, torch only".
        label = coverage_label(case)
        rows.append([clean_line(case.name), f"{SYMBOL.get(case.verdict, '?')} {case.verdict}"
                     + (f", {label}" if label else ""),
                     f"{agreeing(case)}/{compared(case)}", fmt(case_headroom(case)), float32_cell(case)])

    def paint(k, i, cell):
        if not color:
            return cell
        if k == 0:
            return f"\x1b[1m{cell}\x1b[0m"
        case = run.cases[k - 1]
        if i == 1:
            return _paint(cell, case.verdict, True)
        if i == 4 and case.float32 and case.float32 != "ok":
            return _paint(cell, "imprecise", True)
        return cell

    # The case name first, then a partial case's "…, torch only" label, give way to fit the terminal.
    return _table(rows, right={2, 3}, width=width, shrink=(0, 1), paint=paint)


def _timing_head(backend: str) -> str:
    return f"{_cut(clean_line(backend), 14)} 1st/2nd/f64"


def _timing_tables(run: RunResult, color: bool, width: int) -> list[str]:
    backends = backends_of(run)
    if not backends or not any(c.timings or c.unavailable for c in run.cases):
        return []
    names = [clean_line(c.name) for c in run.cases]
    name_w = min(max(len(n) for n in names + ["seconds"]), 24)
    out = ["", "seconds: float32 first call / second call (compiling backends) / float64 call"]
    chunk: list[str] = []
    chunks: list[list[str]] = []
    for b in backends:
        cells = [_timing_head(b)] + [_timing_cell(c, b) for c in run.cases]
        need = max(len(x) for x in cells) + 2
        used = name_w + sum(max(len(_timing_head(x)), 17) + 2 for x in chunk)
        if chunk and used + need > width:
            chunks.append(chunk)
            chunk = []
        chunk.append(b)
    chunks.append(chunk)
    for part in chunks:
        rows = [["case"] + [_timing_head(b) for b in part]]
        rows += [[n] + [_timing_cell(c, b) for b in part] for n, c in zip(names, run.cases, strict=True)]
        paint = (lambda k, i, cell: f"\x1b[1m{cell}\x1b[0m" if k == 0 else cell) if color else None
        out += _table(rows, right=set(range(1, len(part) + 1)), width=width, paint=paint)
    return out


def _failures(run: RunResult, color: bool) -> list[str]:
    out = []
    for case in run.cases:
        name = clean_line(case.name)
        for backend, text in case.errors.items():
            out.append(f"{_paint('! ERROR', 'error', color)} {name} :: {clean_line(backend)} — {error_line(text)}")
        for leaf in failing_leaves(case):
            label = _paint(f"{SYMBOL.get(leaf.verdict, '?')} {leaf.verdict.upper()}", leaf.verdict, color)
            out.append(f"{label} {name} :: {clean_line(leaf.path)} — {leaf_detail(leaf)}")
        origin = origin_sentence(case)
        if origin:
            out.append(f"{_paint('→ ORIGIN', case.verdict, color)} {name} — {origin}")
        if imprecise_fails(case):
            for leaf in imprecise_leaves(case):
                out.append(f"{_paint('≈ IMPRECISE', 'imprecise', color)} {name} :: {clean_line(leaf.path)} — "
                           f"{imprecise_sentence(leaf)}")
        if case.failed and not case.errors and not failing_leaves(case) and not (
                imprecise_fails(case) and imprecise_leaves(case)):
            label = _paint(f"{SYMBOL.get(case.verdict, '?')} {case.verdict.upper()}", case.verdict, color)
            out.append(f"{label} {name} — {case_failure(case)}")
    return out


def _notices(run: RunResult, color: bool) -> list[str]:
    out = []
    for case in run.cases:
        name = clean_line(case.name)
        if not imprecise_fails(case):
            for leaf in imprecise_leaves(case):
                out.append(f"{_paint('≈ IMPRECISE (warning)', 'imprecise', color)} {name} :: {clean_line(leaf.path)}"
                           f" — {imprecise_sentence(leaf)}")
        so = getattr(case, "second_order", None)
        for why in (so.unavailable.values() if so is not None else ()):
            out.append(f"{_paint('– SECOND ORDER', 'skipped', color)} {name} — {clean_line(why)}; its "
                       "Hessian-vector products are not compared")
        if case.verdict != "vacuous":
            vac = vacuous_sentence(case)
            if vac:
                out.append(f"{_paint('∅ VACUOUS', 'vacuous', color)} {name} — {vac}")
        # A kink some float32 forward crossed gets its line; the ones merely near (every deep model has
        # dozens) one line together, so the notices stay readable.  The HTML report lists every one.
        quiet = []
        for kink in case.kinks:
            if any(kink.crossed.values()) or kink.below_float64:
                out.append(f"{_paint('∧ KINK', 'kink', color)} {name} — {kink_sentence(kink)}")
            else:
                quiet.append(kink)
        if quiet:
            out.append(f"{_paint('∧ KINK', 'kink', color)} {name} — {sum(k.near for k in quiet)} more inputs in "
                       f"{len(quiet)} op calls lie within float32's reach of a kink; no float32 forward crossed "
                       "them (the HTML report lists each)")
    for backend, why, n in unavailable_notices(run):
        out.append(f"{_paint('– UNAVAILABLE', 'skipped', color)} {unavailable_sentence(clean_line(backend), why, n)}")
    return out


def _trajectories(run: RunResult, color: bool) -> list[str]:
    """Per case with ``--steps``: where the trajectories part (or that they do not), then the loss per step."""
    out = []
    for case in run.cases:
        traj = getattr(case, "trajectory", None)
        if traj is None:
            continue
        verdict = traj.verdict if traj.verdict in _COLOR else "error"
        label = _paint(f"{SYMBOL.get(verdict, '?')} TRAJECTORY", verdict, color)
        out.append(f"{label} {clean_line(case.name)} — {trajectory_head(traj)}")
        out += [f"  {loss_sentence(traj, k)}" for k in trajectory_steps(traj)]
    return out


def _capped(lines: list[str], cap: int, what: str) -> list[str]:
    if len(lines) <= cap:
        return lines
    return lines[:cap] + [f"… and {len(lines) - cap} more {what} (see the HTML report or JSON results)"]


def render_summary(run: RunResult, color: bool = False, max_leaf_lines: int = 50, width: int = WIDTH) -> str:
    """The end-of-run summary: tables, failures then notices (each at most ``max_leaf_lines``), verdict."""
    lines = _case_table(run, color, width) if run.cases else []
    lines += _timing_tables(run, color, width)
    trajectories = _trajectories(run, color)
    if trajectories:
        lines += [""] + trajectories
    failures = _capped(_failures(run, color), max_leaf_lines, "failures")
    notices = _capped(_notices(run, color), max_leaf_lines, "notices")
    if failures:
        lines += [""] + failures
    if notices:
        lines += [""] + notices
    lines += ["", _verdict_line(run, color)]
    while lines and lines[0] == "":
        lines.pop(0)
    return "\n".join(lines)


def _verdict_line(run: RunResult, color: bool) -> str:
    if incomplete(run):
        word, verdict = "INCOMPLETE", "interrupted"
    elif run_failed(run):
        word, verdict = "FAIL", run.verdict
    else:
        word, verdict = "PASS", "agree"
    kinds: dict[str, int] = {}
    for case in run.cases:
        for leaf in failing_leaves(case):
            kinds[leaf.verdict] = kinds.get(leaf.verdict, 0) + 1
    extra = f" ({', '.join(f'{v} {k}' for v, k in kinds.items())})" if kinds else ""
    return _paint(f"gradcheck {word}: {run_sentence(run)}{extra}", verdict, color)


# ---------------------------------------------------------------- progress (used while a run goes)
def progress_bar(done: int, total: int, name: str, width: int = WIDTH) -> str:
    """``[#####.......] 3/200 case-name`` for a TTY, one character short of ``width`` so it never wraps."""
    bar = 20
    filled = int(bar * done / max(total, 1))
    head = f"[{'#' * filled}{'.' * (bar - filled)}] {done}/{total} "
    room = max(width - 1 - len(head), 0)
    return head + _cut(clean_line(name), room).ljust(room)


def progress_line(done: int, total: int, result: CaseResult, elapsed: float) -> str:
    """One finished case for a log: ``[4/200] resnet18: agree (104 leaves, 12.3s; float32 ok, jax 3.1×)``."""
    f32 = f"; float32 {float32_cell(result)}" if result.float32 else ""
    return clean_line(f"[{done}/{total}] {result.name}: {result.verdict} ({result.leaves_compared} leaves, "
                      f"{elapsed:.1f}s{f32})")

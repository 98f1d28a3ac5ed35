"""A Markdown summary for ``$GITHUB_STEP_SUMMARY`` (and merge-request comments).

GitHub rejects a step summary over 1 MiB, and renders Markdown with inline
HTML, so: every user-provided string is escaped for both, and rows are dropped
from the end (with a note saying how many) until the summary fits
``limit_bytes``.

Sections, failures before notices: the cases, errors, failing leaves, the
float32 precision (per case, the imprecise leaves, the kinks), then notices
(vacuous leaves, unavailable backends, once per backend).
"""

from __future__ import annotations

import re

from gradcheck.results import RunResult

from ._common import (
    LeafNumbers,
    agreeing,
    backends_of,
    blame_text,
    case_f32_worst,
    case_headroom,
    case_time,
    compared,
    f32_ratio,
    failing_leaves,
    fmt,
    fmt_seconds,
    imprecise_fails,
    imprecise_leaves,
    incomplete,
    run_status,
)
from .text import (
    HEADLINE,
    case_failure,
    clean_line,
    coverage_label,
    error_parts,
    float32_cell,
    kink_sentence,
    pinning_sentence,
    run_sentence,
    unavailable_notices,
    unavailable_sentence,
    vacuous_sentence,
)

_EMOJI = {"agree": "✅", "ok": "✅", "skipped": "⏭️", "unmeasured": "⏭️", "imprecise": "⚠️"}  # else: a failure
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~!#])")


def md(text) -> str:
    """Text that shows as itself inside a GFM table cell: no HTML, no emphasis, no cell breaks."""
    text = clean_line(text).replace("&", "&amp;")
    return _MD_SPECIAL.sub(r"\\\1", text)


def _badge(verdict: str) -> str:
    return f"{_EMOJI.get(verdict, '❌')} {md(verdict)}"


def _fence(text: str) -> list[str]:
    """A code block that no backtick run inside ``text`` can close early."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + "sh", text.replace("\r", ""), fence]


def _case_rows(run: RunResult) -> list[str]:
    rows = []
    for case in run.cases:
        first = md(case.first_disagreement) if case.first_disagreement else "—"
        origin = getattr(case, "origin", None)
        if origin is not None:  # the per-layer replay's word on where it starts
            first += f" · starts in {md(origin.path)} ({md(origin.kind)}" + (
                f", blamed: {md(', '.join(origin.blame))})" if origin.blame else ")")
        label = coverage_label(case)  # a partial case: what it was checked on ("torch only")
        verdict = _badge(case.verdict) + (f" · {md(label)}" if label else "")
        rows.append(f"| {md(case.name)} | {verdict} | {agreeing(case)} / {compared(case)} | "
                    f"{fmt(case_headroom(case))} | {md(float32_cell(case))} | {first} | "
                    f"{fmt_seconds(case_time(case))} |")
    return rows


def _leaf_rows(run: RunResult) -> list[str]:
    rows = []
    for case in run.cases:
        for leaf in failing_leaves(case):
            n = LeafNumbers.of(leaf)
            who = ", ".join(leaf.float32.imprecise) if leaf.verdict == "imprecise" and leaf.float32 else blame_text(leaf)
            rows.append(f"| {md(case.name)} | {md(leaf.path)} | {_badge(leaf.verdict)} | {md(who or '—')} | "
                        f"{fmt(n.max_rel)} | {fmt(n.headroom)} |")
        if case.failed and not case.errors and not failing_leaves(case):
            rows.append(f"| {md(case.name)} | — | {_badge(case.verdict)} | — | — | {md(case_failure(case))} |")
    return rows


def _error_rows(run: RunResult) -> list[str]:
    rows = []
    for case in run.cases:
        for backend, text in case.errors.items():
            head, frames = error_parts(text)
            where = "; ".join(frames[-2:]) if frames else "—"
            rows.append(f"| {md(case.name)} | {md(backend)} | {md(head[:300])} | {md(where[:300])} |")
    return rows


def _precision_rows(run: RunResult) -> list[str]:
    rows = []
    for case in run.cases:
        if not case.float32:
            continue
        worst = case_f32_worst(case)
        at = md(worst[2]) if worst else "—"
        flagged = len(imprecise_leaves(case)) + sum(1 for leaf in case.leaves if leaf.verdict == "imprecise")
        crossed = sum(1 for k in case.kinks if any(k.crossed.values()))
        kinks = f"{len(case.kinks)} ({crossed} crossed, pinned)" if case.kinks else "0"
        rows.append(f"| {md(case.name)} | {_badge(case.float32)} | {md(float32_cell(case))} | {at} | {flagged} | "
                    f"{kinks} | {md(case.imprecise)} |")
    return rows


def _imprecise_rows(run: RunResult) -> list[str]:
    rows = []
    for case in run.cases:
        leaves = [leaf for leaf in case.leaves if leaf.verdict == "imprecise"] + imprecise_leaves(case)
        counts = "failure" if imprecise_fails(case) else "warning"
        for leaf in leaves:
            f = leaf.float32
            if f is None:
                continue
            for b in f.imprecise or [x for x in f.errors if x != f.best]:
                ratio = f32_ratio(f, b)
                rows.append(f"| {md(case.name)} | {md(leaf.path)} | {md(b)} | {fmt(f.errors.get(b))} | "
                            f"{md(f.best or '—')} {fmt(f.errors.get(f.best))} | {fmt(f.limit)} | "
                            f"{fmt(ratio, 2)}× | {counts} |")
    return rows


def _kink_rows(run: RunResult) -> list[str]:
    rows = [f"- **{md(case.name)}**: {md(kink_sentence(k))}" for case in run.cases for k in case.kinks]
    return rows + [f"- **{md(case.name)}**: {md(pinning_sentence(case))}" for case in run.cases
                   if case.kinks and case.unpinned]


def _notice_rows(run: RunResult) -> list[str]:
    rows = []
    for case in run.cases:
        vac = vacuous_sentence(case) if case.verdict != "vacuous" else ""
        if vac:
            rows.append(f"- **{md(case.name)}**: {md(vac)}")
    for backend, why, n in unavailable_notices(run):
        rows.append(f"- unavailable: {md(unavailable_sentence(backend, why, n))}")
    return rows


def render_markdown(run: RunResult, limit_bytes: int = 1_000_000) -> str:
    """The summary; never more than ``limit_bytes`` bytes of UTF-8."""
    status = run_status(run)
    emoji = "✅" if status == "agree" else "⏹️" if status == "interrupted" else "❌"
    head = [f"## {emoji} gradcheck: {HEADLINE.get(status, md(status))}", ""]
    if incomplete(run):
        missing = f"; {run.planned - len(run.cases)} never ran" if run.planned is not None else ""
        head += [f"> **{md(run_sentence(run).split(';')[0])}**{md(missing)}. This is not a pass: "
                 "what is below covers the cases that finished.", ""]
    head += [md(run_sentence(run)) + (f" · seed {md(run.env['seed'])}" if run.env.get("seed") is not None else "")
             + (f" · backends: {md(', '.join(backends_of(run)))}" if backends_of(run) else ""), ""]
    # (title, head lines, rows); errors before leaves: there are few and each one hides a whole backend.
    sections = [
        ("Cases", ["| case | float64 | agree / compared | worst headroom | float32 | first disagreement | time |",
                   "|---|---|---:|---:|---|---|---:|"], _case_rows(run)),
        ("Errors", ["| case | backend | error | raised at |", "|---|---|---|---|"], _error_rows(run)),
        ("Failing leaves", ["| case | leaf | verdict | blamed | max rel diff | headroom |",
                            "|---|---|---|---|---:|---:|"], _leaf_rows(run)),
        ("float32 precision", ["Each backend's float32 gradients measured against its own float64 ones "
                               "(‖g32 − g64‖ ÷ ‖g64‖); a backend is imprecise beyond a multiple of the best "
                               "backend's error, plus a floor.", "",
                               "| case | float32 | worst ratio | at | imprecise leaves | kink sites | policy |",
                               "|---|---|---|---|---:|---|---|"], _precision_rows(run)),
        ("Imprecise leaves", ["| case | leaf | backend | float32 error | best | limit | × best | counts as |",
                              "|---|---|---|---:|---|---:|---:|---|"], _imprecise_rows(run)),
        ("Kinks", ["Every float32 run takes the float64 branch at these kinks (unless a line says otherwise), so "
                   "crossings do not count against float32.", ""], _kink_rows(run)),
        ("Notices", [], _notice_rows(run)),
    ]
    sections = [(t, h, rows) for t, h, rows in sections if rows or (t == "Cases" and run.cases)]
    tail = ["", "Reproduce:", "", *_fence(str(run.env["command"]))] if run.env.get("command") else []

    def size(lines) -> int:
        return sum(len(ln.encode("utf-8")) + 1 for ln in lines)

    def heading(title, table_head) -> list[str]:
        return [f"### {title}", "", *table_head]

    budget = limit_bytes - size(head) - size(tail) - sum(size(heading(t, h)) + 1 for t, h, _ in sections)
    note_reserve = 300  # room for the truncation note itself
    remaining = sum(len(rows) for _, _, rows in sections)
    lines, dropped, cut = list(head), [], False
    for title, table_head, rows in sections:
        kept = []
        for row in rows:
            # Once one section is cut, later ones get no rows: the reader sees one cut, not holes.
            cost = size([row]) + (note_reserve if remaining > 1 else 0)
            if cut or cost > budget:
                cut = True
                break
            kept.append(row)
            budget -= size([row])
            remaining -= 1
        if lines[-1] != "":
            lines.append("")
        lines += heading(title, table_head) + kept
        if len(kept) < len(rows):
            dropped.append(f"{len(rows) - len(kept)} of {len(rows)} {title.lower()} rows")
    if dropped:
        lines += ["", f"> **Truncated:** {', '.join(dropped)} are not shown, to stay under {limit_bytes} bytes. "
                      "The HTML report and the JSON results have everything."]
    lines += tail
    text = "\n".join(lines) + "\n"
    return _cut(text, limit_bytes)


def _cut(text: str, limit_bytes: int) -> str:
    """Last resort for absurdly small limits: cut at a UTF-8 character boundary."""
    data = text.encode("utf-8")
    if len(data) <= limit_bytes:
        return text
    return data[: max(limit_bytes, 0)].decode("utf-8", errors="ignore")

"""A Markdown summary for ``$GITHUB_STEP_SUMMARY`` (and merge-request comments).

GitHub rejects a step summary over 1 MiB, and renders Markdown with inline
HTML, so: every user-provided string is escaped for both, and rows are dropped
from the end (with a note saying how many) until the summary fits
``limit_bytes``.
"""

from __future__ import annotations

import re

from gradcheck.results import RunResult

from ._common import (
    HEADLINE,
    LeafNumbers,
    backends_of,
    blame_text,
    case_headroom,
    case_time,
    clean_line,
    compared,
    failing_leaves,
    fmt,
    fmt_seconds,
    run_sentence,
    write_text,
)

_EMOJI = {"agree": "✅", "skipped": "⏭️"}  # everything else is a failure
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
        rows.append(f"| {md(case.name)} | {_badge(case.verdict)} | {case.count('agree')} / {compared(case)} | "
                    f"{fmt(case_headroom(case))} | {first} | {fmt_seconds(case_time(case))} |")
    return rows


def _leaf_rows(run: RunResult) -> list[str]:
    rows = []
    for case in run.cases:
        for leaf in failing_leaves(case):
            n = LeafNumbers.of(leaf)
            rows.append(f"| {md(case.name)} | {md(leaf.path)} | {_badge(leaf.verdict)} | {md(blame_text(leaf))} | "
                        f"{fmt(n.max_rel)} | {fmt(n.headroom)} |")
    return rows


def _error_rows(run: RunResult) -> list[str]:
    rows = []
    for case in run.cases:
        for backend, text in case.errors.items():
            last = next((ln for ln in reversed(str(text).splitlines()) if ln.strip()), "")
            rows.append(f"| {md(case.name)} | {md(backend)} | {md(last[:300])} |")
    return rows


def render_markdown(run: RunResult, limit_bytes: int = 1_000_000) -> str:
    """The summary; never more than ``limit_bytes`` bytes of UTF-8."""
    verdict = run.verdict if run.failed else "agree"
    head = [f"## {_EMOJI.get(verdict, '❌')} gradcheck: {HEADLINE.get(verdict, md(verdict))}", "",
            md(run_sentence(run)) + (f" · seed {md(run.env['seed'])}" if run.env.get("seed") is not None else "")
            + (f" · backends: {md(', '.join(backends_of(run)))}" if backends_of(run) else ""), ""]
    # (title, table head, rows); errors before leaves: there are few and each one hides a whole backend.
    sections = [
        ("Cases", ["| case | verdict | agree / compared | worst headroom | first disagreement | time |",
                   "|---|---|---:|---:|---|---:|"], _case_rows(run)),
        ("Errors", ["| case | backend | error (last line) |", "|---|---|---|"], _error_rows(run)),
        ("Failing leaves", ["| case | leaf | verdict | blamed | max rel diff | headroom |",
                            "|---|---|---|---|---:|---:|"], _leaf_rows(run)),
    ]
    sections = [(t, h, rows) for t, h, rows in sections if rows or t == "Cases"]
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


def write_markdown(run: RunResult, path, limit_bytes: int = 1_000_000):
    return write_text(path, render_markdown(run, limit_bytes))


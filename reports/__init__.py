"""How results are shown: HTML report, JUnit XML, Markdown summary, terminal summary, JSON.

Every renderer takes a :class:`gradcheck.results.RunResult` and nothing else,
so ``gradcheck report`` can re-render any of them from stored JSON results.
The sentences they share (and ``assert_gradients_agree``'s message) are made
in :mod:`gradcheck.reports.text`.  The report formats a run can write
(``--html``, ``--json``, ...) are the rows of :mod:`gradcheck.reports.formats`.
"""

from __future__ import annotations

from gradcheck.results import RunResult, dumps

from ._common import write_text
from .github import github_annotations
from .html import render_html, write_html
from .junit import render_junit, write_junit
from .markdown import render_markdown
from .terminal import progress_bar, progress_line, render_summary


def render_json(run: RunResult) -> str:
    """The results as one JSON document (``docs/results-schema.md``): the result model's own form."""
    return dumps(run) + "\n"


def write_json(run: RunResult, path):
    """The results as one JSON document; ``gradcheck.results.load`` reads it back."""
    return write_text(path, render_json(run))


__all__ = [
    "github_annotations",
    "progress_bar",
    "progress_line",
    "render_html",
    "render_json",
    "render_junit",
    "render_markdown",
    "render_summary",
    "write_html",
    "write_json",
    "write_junit",
    "write_text",
]

"""How results are shown: HTML report, JUnit XML, Markdown summary, terminal summary, JSON.

Every renderer takes a :class:`gradcheck.results.RunResult` and nothing else,
so ``gradcheck report`` can re-render any of them from stored JSON results.
"""

from __future__ import annotations

from gradcheck.results import RunResult, dumps

from ._common import write_text
from .github import github_annotations
from .html import render_html, write_html
from .junit import render_junit, write_junit
from .markdown import render_markdown, write_markdown
from .terminal import render_summary


def write_json(run: RunResult, path):
    """The results as one JSON document (``docs/results-schema.md``); ``gradcheck.results.load`` reads it back."""
    return write_text(path, dumps(run) + "\n")


__all__ = [
    "github_annotations",
    "render_html",
    "render_junit",
    "render_markdown",
    "render_summary",
    "write_html",
    "write_json",
    "write_junit",
    "write_markdown",
]

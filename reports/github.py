"""GitHub Actions workflow commands so failures show up as annotations on the run.

``::error`` per failing leaf or backend error (the exception first, where it
was raised after), an interrupted run, an empty one; ``::warning`` once per
case with float32-imprecise leaves (under ``imprecise="warn"``), once per kind
of partial check ("7 of 24 cases checked on torch and the referee alone: tape,
jax unavailable"; under ``unavailable="fail"`` each such case is an ``::error``)
and once per unavailable backend, however many cases noted it.  GitHub shows at most 10
error and 10 warning annotations per step, so each list is capped: the last
error slot says how many more there are instead of silently dropping them.
"""

from __future__ import annotations

from gradcheck.results import RunResult

from ._common import failing_leaves, imprecise_fails, imprecise_leaves, incomplete
from .text import (
    case_failure,
    clean_line,
    error_line,
    imprecise_sentence,
    leaf_sentence,
    partial_runs,
    run_sentence,
    unavailable_notices,
    unavailable_sentence,
)


def _escape_data(text: str) -> str:
    # The escapes GitHub's runner undoes for a command's message (actions/toolkit, command.ts).
    return str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    # Property values additionally may not contain ':' or ',' (they delimit properties).
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _command(kind: str, title: str, message: str) -> str:
    return f"::{kind} title={_escape_property(clean_line(title))}::{_escape_data(clean_line(message))}"


def github_annotations(run: RunResult, limit: int = 10) -> list[str]:
    """``::error`` lines (failures), then ``::warning`` lines (float32 warnings, unavailable backends)."""
    errors: list[str] = []
    warnings: list[str] = []
    if incomplete(run):
        errors.append(_command("error", "gradcheck: run incomplete", run_sentence(run)))
    elif not run.cases:
        errors.append(_command("error", "gradcheck: nothing was checked", run_sentence(run)))
    for case in run.cases:
        for backend, text in case.errors.items():
            errors.append(_command("error", f"gradcheck {case.name}: {backend} error", error_line(text)))
        for leaf in failing_leaves(case):
            errors.append(_command("error", f"gradcheck {case.name}: {leaf.path} {leaf.verdict}", leaf_sentence(leaf)))
        flagged = imprecise_leaves(case)
        if case.failed and not case.errors and not failing_leaves(case):
            errors.append(_command("error", f"gradcheck {case.name}: {case.verdict}", case_failure(case)))
        elif flagged and not imprecise_fails(case):
            first = imprecise_sentence(flagged[0])
            more = f" (and {len(flagged) - 1} more leaves)" if len(flagged) > 1 else ""
            warnings.append(_command("warning", f"gradcheck {case.name}: float32 imprecise", first + more))
    for line in partial_runs(run):  # a check on fewer backends than asked, passing or not
        warnings.append(_command("warning", "gradcheck: partial check", line))
    for backend, why, n in unavailable_notices(run):
        warnings.append(_command("warning", f"gradcheck: {backend} unavailable", unavailable_sentence(backend, why, n)))
    if len(errors) > limit:
        more = len(errors) - (limit - 1)
        errors = errors[: limit - 1] + [_command(
            "error", f"gradcheck: {more} more failures",
            f"{more} more failing leaves or errors; see the job summary or the HTML report")]
    return errors + list(dict.fromkeys(warnings))[:limit]

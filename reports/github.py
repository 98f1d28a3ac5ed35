"""GitHub Actions workflow commands (``::error``) so failing leaves show up as annotations on the run.

GitHub shows at most 10 error annotations per step (50 per job), so the list
is capped: the last slot says how many more there are instead of silently
dropping them.
"""

from __future__ import annotations

from gradcheck.results import RunResult

from ._common import LeafNumbers, blame_text, clean_line, failing_leaves, fmt, reason


def _escape_data(text: str) -> str:
    # The escapes GitHub's runner undoes for a command's message (actions/toolkit, command.ts).
    return str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    # Property values additionally may not contain ':' or ',' (they delimit properties).
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _command(kind: str, title: str, message: str) -> str:
    return f"::{kind} title={_escape_property(clean_line(title))}::{_escape_data(message)}"


def github_annotations(run: RunResult, limit: int = 10) -> list[str]:
    """``::error`` lines, one per failing leaf or backend error, then ``::warning`` per unavailable backend."""
    errors: list[str] = []
    warnings: list[str] = []
    if not run.cases:
        errors.append(_command("error", "gradcheck: no case ran", "the run produced no case results"))
    for case in run.cases:
        for backend, text in case.errors.items():
            last = next((ln for ln in reversed(str(text).splitlines()) if ln.strip()), str(text))
            errors.append(_command("error", f"gradcheck {case.name}: {backend} error", clean_line(last)))
        for leaf in failing_leaves(case):
            n = LeafNumbers.of(leaf)
            msg = f"{leaf.path}: {leaf.verdict}"
            if n.headroom is not None:
                msg += f", max rel diff {fmt(n.max_rel)}, max abs diff {fmt(n.max_abs)}, headroom {fmt(n.headroom)}"
            msg += f"; blamed: {blame_text(leaf)}"
            if reason(leaf):
                msg += f" ({reason(leaf)})"
            errors.append(_command("error", f"gradcheck {case.name}: {leaf.path} {leaf.verdict}", clean_line(msg)))
        for backend, why in case.unavailable.items():
            warnings.append(_command("warning", f"gradcheck {case.name}: {backend} unavailable", clean_line(why)))
    if len(errors) > limit:
        more = len(errors) - (limit - 1)
        errors = errors[: limit - 1] + [_command(
            "error", f"gradcheck: {more} more failures",
            f"{more} more failing leaves or errors; see the job summary or the HTML report")]
    # Unavailable backends repeat per case; one warning per distinct message is enough.
    return errors + list(dict.fromkeys(warnings))[:limit]

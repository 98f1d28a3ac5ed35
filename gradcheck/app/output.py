"""Where reports go: every output path checked before a run starts, every report written atomically.

``gradcheck run``, ``gradcheck report`` and the pytest plugin all write their
reports here, so a path that cannot be written is refused the same way, up
front (a usage error that names the path, not a traceback after an hour's
run), and a report on disk is always whole: a temporary file in the same
folder, renamed over the target.  The formats are the rows of
:mod:`gradcheck.reports.formats`: a registered format is rendered and written
here like the built-in ones.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gradcheck.reports import formats


def __getattr__(name):
    # FORMATS, the registered formats' names as they are when asked (the pytest plugin's flags read it).
    if name == "FORMATS":
        return formats.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class OutputError(ValueError):
    """An output path that cannot be written (the message names the option, the path and why)."""


def check_file(path, label: str) -> Path:
    """Refuse ``path`` unless a file can be created there: its folder is made now, a probe file written."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{label} {path}: is a folder; give the path of a file, e.g. {path / _example(label)}")
    check_folder(path.parent if str(path.parent) else Path("."), label, path)
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"{label} {path}: the file exists and cannot be overwritten (permission denied)")
    return path


def check_folder(folder, label: str, target=None) -> Path:
    """Make ``folder`` (and its parents) and prove a file can be created in it."""
    folder = Path(folder)
    what = f"{label} {target if target is not None else folder}"
    for parent in (folder, *folder.parents):
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"{what}: {parent} is a file, not a folder; choose another path")
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".gradcheck-probe.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"{what}: cannot write in {folder} ({exc.strerror or exc}); choose another path") from None
    return folder


def _example(label: str) -> str:
    """A file name for the folder ``label`` was given: its format's example (--html, --gradcheck-junit)."""
    name = label.lstrip("-").removeprefix("gradcheck-")
    if name == "results":  # gradcheck run --results: the JSON lines every run streams
        return "results.jsonl"
    return formats.get(name).example if name in formats.names() else "report"


def write_atomic(path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file renamed over it (readable by others)."""
    from gradcheck.reports._common import write_text

    return write_text(path, text)


def render(fmt: str, run) -> str:
    """The text of the report format named ``fmt`` for a RunResult (a ValueError listing the registered ones)."""
    return formats.get(fmt).renderer()(run)


def write_reports(run, paths: dict, step_summary=None) -> list[tuple[str, Path]]:
    """Write each report of ``paths`` (format -> path); returns ``[(format, path)]`` as written.

    ``step_summary`` (GitHub's ``$GITHUB_STEP_SUMMARY``) gets the Markdown
    summary appended: the step shares that file, so it is added to, in one
    write, never replaced.  A Markdown path equal to it is appended too.
    """
    for fmt in paths:  # every name known before the first report is written
        formats.get(fmt)
    written = []
    summary = Path(step_summary).resolve() if step_summary else None
    for fmt, path in paths.items():
        if not path:
            continue
        path = Path(path)
        text = render(fmt, run)
        if fmt == "markdown" and summary is not None and path.resolve() == summary:
            continue  # appended below
        write_atomic(path, text)
        written.append((fmt, path))
    if summary is not None:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(render("markdown", run))
        written.append(("markdown", Path(step_summary)))
    return written

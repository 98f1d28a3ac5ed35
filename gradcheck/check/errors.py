"""How an exception becomes a result: one short text for a backend's error, one wrapper for gradcheck's own.

A backend that raises is that backend's recorded error (``short_error``), and
the other backends go on.  An exception in gradcheck's own code (the
comparison, or a check such as the second order or the trajectories) is a bug
in gradcheck: it is recorded on the case as such (``internal_error``), and the
run goes on with the next case.
"""

from __future__ import annotations

import traceback

BUG = "a bug in gradcheck; please report it"


def short_error(exc: BaseException) -> str:
    """The error's type and message first, then where it was raised (the last few frames)."""
    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    where = "".join(f"  {f.filename.split('site-packages/')[-1]}:{f.lineno} in {f.name}\n" for f in frames)
    return f"{type(exc).__name__}: {exc}\n{where}".rstrip()


def internal_error(head: str, exc: BaseException) -> str:
    """``<head> (a bug in gradcheck; please report it): <short_error(exc)>``, e.g. with the head
    ``internal error while comparing`` or ``per-layer replay failed``."""
    return f"{head} ({BUG}): {short_error(exc)}"

"""The cores an eager backend takes while a compiling backend compiles beside it.

jax's programs for a case are compiled on a background thread while the tape
and torch run (``runner._prepare_compiled``).  One XLA compilation already
keeps about 1.7 cores busy, so an eager backend that also asks for every
core (torch's intra-op pool, numpy's BLAS) oversubscribes them: its threads
wait on descheduled ones.  On 2 cores, `gradcheck run resnet18` with the
eager backends at one thread each while jax compiled took 18.8 s (median of
3) against 20.7 s at two, and 22.4 s with no overlap at all
(docs/decisions.md, "Sharing the cores with a compilation").

While a backend reports work in the background (``Backend.busy``), the eager
one runs with half the cores (at least one, never more than it had); the
thread counts are restored when it returns.  Results do not depend on it:
the thread count of a float64 or float32 run changes rounding, which the
float32 measurement already allows, and never which gradient is computed.
"""

from __future__ import annotations

import contextlib
import os
import sys


def available() -> int:
    """The cores this process may run on (its CPU affinity, which a container or ``taskset`` may narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def shared():
    """torch's and the BLAS libraries' threads lowered to half the cores for the duration."""
    share = max(1, available() // 2)
    torch = sys.modules.get("torch")  # only a torch already loaded: importing it here would cost seconds
    before = torch.get_num_threads() if torch is not None else None
    if before is not None and before > share:
        torch.set_num_threads(share)
    try:
        with _blas_limited(share):
            yield share
    finally:
        if before is not None and torch.get_num_threads() != before:
            torch.set_num_threads(before)


@contextlib.contextmanager
def _blas_limited(share: int):
    try:
        import threadpoolctl
    except ImportError:  # an install without it: torch alone is limited
        yield
        return
    controller = threadpoolctl.ThreadpoolController()
    most = max((lib.num_threads for lib in controller.lib_controllers), default=share)
    with controller.limit(limits=min(share, most)):
        yield

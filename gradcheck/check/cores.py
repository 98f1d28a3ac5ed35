"""The cores an eager backend takes while a compiling backend compiles beside it.

jax's programs for a case are compiled on a background thread while the tape
runs (``runner._prepare_compiled``; torch runs after jax, ``runner._turn``,
for the reason below).  One XLA compilation already
keeps about 1.7 cores busy, so an eager backend that also asks for every
core oversubscribes them: its threads wait on descheduled ones.  While a
backend reports work in the background (``Backend.busy``), the BLAS
libraries (numpy's, which the tape runs on) take half the cores (at least
one, never more than they had), restored when the call returns
(docs/decisions.md, "Sharing the cores with a compilation").

torch's own threads (its intra-op pool, OpenMP) are left as they are.
Lowering them was measured to pay too, but it runs the user's model on a
configuration they did not choose, where torch's kernels may differ: torch
2.13's oneDNN convolution backward corrupts the heap on one thread (a 1x1,
stride-2 kernel over a channels-last float32 input) and computes a wrong
float32 weight gradient on two or more.  The process died where torch at its
default runs the model.  A checker must not crash a model its users run.

The BLAS thread count of a run changes rounding only, which the float32
measurement already allows.
"""

from __future__ import annotations

import contextlib
import os


def available() -> int:
    """The cores this process may run on (its CPU affinity, which a container or ``taskset`` may narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def shared():
    """The BLAS libraries' threads lowered to half the cores for the duration; torch's are not touched."""
    share = max(1, available() // 2)
    try:
        import threadpoolctl
    except ImportError:  # an install without it: nothing is limited
        yield share
        return
    # user_api "blas" only: "openmp" is torch's intra-op pool (its libgomp), which stays as torch has it.
    controller = threadpoolctl.ThreadpoolController()
    most = max((lib.num_threads for lib in controller.lib_controllers if lib.user_api == "blas"), default=share)
    with controller.limit(limits=min(share, most), user_api="blas"):
        yield share

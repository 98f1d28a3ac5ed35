"""Inner products and norms of whole arrays, as the checks take them: accumulated in float64, on one thread.

numpy's ``dot``, ``vdot`` and ``linalg.norm`` hand a flat array to BLAS,
which splits the sum over all its threads.  A sum is bound by memory, and
the threads then wait on each other whenever another process has a core (a
CI runner's neighbours, ``gradcheck run --jobs``, pytest-xdist): on 2 cores
with one taken, comparing ResNet-18's leaves took 9.3 s instead of 0.4 s.
``einsum`` runs numpy's own loop on the calling thread, at the same speed on
a quiet machine, and accumulates float32 operands in float64 without a
float64 copy (docs/decisions.md, "A sum over an array on one thread").
"""

from __future__ import annotations

import numpy as np


def inner(a, b) -> float:
    """``<a, b>`` of two arrays of one size (any shapes, read in C order), in float64."""
    return float(np.einsum("i,i->", np.ravel(a), np.ravel(b), dtype=np.float64))


def norm(a) -> float:
    """The 2-norm of an array (any shape), in float64."""
    flat = np.ravel(a)
    return float(np.sqrt(np.einsum("i,i->", flat, flat, dtype=np.float64)))

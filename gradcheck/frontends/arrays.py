"""Arrays as every frontend sees them: which backend and float dtype a call runs in, and how a lowering's output
differs from the framework's own."""

from __future__ import annotations

import numpy as np

from gradcheck import ops
from gradcheck.backends import backend_of


def backend_of_values(values) -> str:
    """The backend a call on ``values`` runs on: the first array's that is not numpy's (numpy if none)."""
    for v in values:
        b = backend_of(v)
        if b not in (None, "numpy"):
            return b
    return "numpy"


def float_dtype_of(values) -> np.dtype:
    """The float dtype a call on ``values`` computes in: the first float array's (float32 if none)."""
    for v in values:
        if hasattr(v, "dtype") and np.dtype(ops.dtype_of(v)).kind == "f":
            return np.dtype(ops.dtype_of(v))
    return np.dtype(np.float32)


def array_differ(a: np.ndarray, t: np.ndarray, rtol: float, floor: float, framework: str) -> str | None:
    """Why ``a`` (a lowering's output) differs from ``t`` (``framework``'s), or None.

    Values differ beyond ``rtol`` times the larger of the framework's largest
    magnitude and ``floor`` (the scale of the op's inputs).  An integer or
    bool output must have the framework's dtype and equal it exactly; NaN and
    the infinities must sit where the framework's do.
    """
    if a.shape != t.shape:
        return f"shape {a.shape}, {framework}'s {t.shape}"
    tk, ak = t.dtype.kind, a.dtype.kind
    if (tk == "f") != (ak == "f") or (tk != "f" and a.dtype != t.dtype):
        return f"dtype {a.dtype}, {framework}'s {t.dtype}"
    if tk != "f":
        if not np.array_equal(a, t):
            return f"{int(np.sum(a != t))} of {t.size} elements differ"
        return None
    a64, t64 = a.astype(np.float64), t.astype(np.float64)
    # Which entries are NaN, +inf and -inf (a NaN's sign is NaN: it must not reach the comparison).
    same_special = np.array_equal(np.isnan(a64), np.isnan(t64)) and np.array_equal(
        np.where(np.isinf(a64), np.sign(a64), 0.0), np.where(np.isinf(t64), np.sign(t64), 0.0))
    if not same_special:
        return "NaN or infinite entries differ"
    finite = np.isfinite(t64)
    if not finite.any():
        return None
    err = float(np.max(np.abs(a64[finite] - t64[finite]), initial=0.0))
    scale = float(np.max(np.abs(t64[finite]), initial=0.0))
    if err > rtol * max(scale, floor, np.finfo(np.float64).tiny):
        inputs = f" and its inputs' {floor:.3g}" if floor > scale else ""
        return f"max |difference| {err:.3g} where max |{framework}| is {scale:.3g}{inputs}"
    return None

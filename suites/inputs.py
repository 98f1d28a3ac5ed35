"""Input draws that keep cases away from kinks.

Where a function is not differentiable (relu at 0, max and max-pool at a
tie), torch, jax and the tape may legitimately pick different subgradients,
and a finite difference straddling the kink is wrong for all of them.  A
check there would report a disagreement that is nobody's bug, so the suites
draw inputs that stay clear of kinks:

* ``kink_free`` places the values on a shuffled grid of distinct points:
  every value is at least ``margin`` from 0 and any two values differ by at
  least ``2 * margin``, so relu, leaky_relu, elu, abs and max-pool windows
  (no near-ties anywhere in the tensor) are smooth within ``margin`` of every
  input.
* Kinks *inside* a model (relu after a convolution) cannot be steered this
  way.  Those are rare (a pre-activation within the referee's step of 0)
  and the ties that do occur in practice, max-pool windows of relu zeros,
  are harmless: whichever zero the gradient is routed to, relu's gradient
  there is 0 on every backend.
"""

from __future__ import annotations

import numpy as np


def kink_free(rng: np.random.Generator, shape, scale: float = 1.0, margin: float = 1e-3) -> np.ndarray:
    """float64 values in ``[-scale, scale]``, all distinct and clear of 0 (see the module doc).

    The grid spacing is ``max(2 * scale / n, 4 * margin)``; with more than
    ``scale / (2 * margin)`` elements the range widens rather than the margin
    shrinking.
    """
    n = int(np.prod(shape, dtype=np.int64))
    slots = n + n % 2  # an even number of slots keeps the grid symmetric about 0
    step = max(2.0 * scale / max(slots, 1), 4.0 * margin)
    # Half-integer grid positions: none is 0, neighbours are one step apart;
    # jitter of a quarter step keeps |x| >= step/4 and gaps >= step/2.
    grid = rng.permutation(slots)[:n] - slots // 2 + 0.5
    jitter = rng.uniform(-0.25, 0.25, size=n)
    return ((grid + jitter) * step).reshape(shape)


def normal(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
    """Plain normal draws, for smooth layers (no kinks to avoid)."""
    return rng.standard_normal(shape) * scale


def positive(rng: np.random.Generator, shape, low: float = 0.5, high: float = 1.5) -> np.ndarray:
    """Values bounded away from 0 (variances, scales)."""
    return rng.uniform(low, high, size=shape)


def integers(rng: np.random.Generator, shape, high: int, low: int = 0) -> np.ndarray:
    """int64 ids in ``[low, high)`` (token ids, class labels)."""
    return rng.integers(low, high, size=shape, dtype=np.int64)


def probabilities(rng: np.random.Generator, shape, axis: int = 1) -> np.ndarray:
    """Rows that sum to 1 along ``axis`` (soft targets)."""
    p = rng.uniform(0.1, 1.0, size=shape)
    return p / p.sum(axis=axis, keepdims=True)

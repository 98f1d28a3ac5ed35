"""Dropout with a mask fixed at build time, so every backend drops the same units."""

from __future__ import annotations

import numpy as np

from gradcheck import ops
from gradcheck.layers import init
from gradcheck.module import Module, static


class Dropout(Module):
    """torch.nn.Dropout: in training mode zero each element with probability ``p``, scale the rest by 1/(1-p).

    The mask is not drawn per call from a framework's generator (each backend
    would drop different units and no gradient could agree): a seed is drawn
    from ``rng`` when the layer is built, and every call regenerates the same
    mask from it in numpy, ``default_rng(seed).random(shape) >= p``.  Calling
    one layer twice on the same shape therefore reuses its mask.

    So every backend, torch included, multiplies by that numpy mask rather
    than calling its framework's dropout (``F.dropout``, ``jax.random``): no
    framework dropout takes a given mask.  (Attention dropout is different:
    torch's attention math kernel does take one; see
    ``ops.scaled_dot_product_attention``.)
    """

    p: float = static()
    seed: int = static()

    def __init__(self, p: float = 0.5, rng=None):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout(p={p}): p is a probability and must lie in [0, 1]")
        self.p = float(p)
        self.seed = int(init.get_rng(rng).integers(2**31 - 1))

    def __call__(self, x):
        return dropout(x, self.p, self.seed, self.training)


def dropout_mask(seed: int, shape, p: float) -> np.ndarray:
    """The float64 keep-and-scale factors (0 or 1/(1-p)) a dropout of ``shape`` multiplies by."""
    if p == 1.0:
        return np.zeros(shape)
    keep = np.random.default_rng(seed).random(shape) >= p
    return keep / (1.0 - p)


def dropout(x, p: float = 0.5, seed: int = 0, training: bool = True):
    """Functional dropout with an explicit mask seed (see ``Dropout``); identity when not training."""
    if not training or p == 0.0:
        return x
    return ops.mul(x, ops.asarray(dropout_mask(seed, ops.shape_of(x), p), like=x))

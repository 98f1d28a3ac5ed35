"""Losses as functions with torch.nn.functional's names, arguments and reductions.

Thin wrappers of the ops of the same names (``ops.cross_entropy`` ...): torch
runs ``F.cross_entropy`` and the others, the tape and the numpy referee run
the derived compositions, which pick a label's log-probability with a one-hot
mask and ``where`` rather than by indexing.  Integer labels reach the ops as
constants (``constant_index``: the tape driver hands them over as tape
tensors).
"""

from __future__ import annotations

import numpy as np

from gradcheck import ops
from gradcheck.layers.embedding import constant_index


def _labels(target):
    """Integer labels as a constant; float targets (probabilities) stay what they are, differentiable."""
    return target if np.dtype(ops.dtype_of(target)).kind == "f" else constant_index(target)


def _constant(value):
    """A weight given as a list or a number, as the numpy constant the ops take."""
    return np.asarray(value, dtype=np.float64) if isinstance(value, (list, tuple, int, float)) else value


def mse_loss(input, target, reduction: str = "mean"):
    return ops.mse_loss(input, target, reduction=reduction)


def cross_entropy(input, target, weight=None, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0):
    """torch.nn.functional.cross_entropy on logits (N, C) or (N, C, d1, ...).

    ``target`` holds class indices (N,) / (N, d1, ...), or class
    probabilities of the logits' shape (a float array).  ``weight`` is a
    constant per-class weight (C,).
    """
    return ops.cross_entropy(input, _labels(target), weight=_constant(weight), ignore_index=ignore_index,
                             reduction=reduction, label_smoothing=label_smoothing)


def nll_loss(input, target, reduction: str = "mean", *, weight=None, ignore_index: int = -100):
    """Negative log-likelihood of log-probabilities (N, C, ...) at integer targets."""
    return ops.nll_loss(input, constant_index(target), weight=_constant(weight), ignore_index=ignore_index,
                        reduction=reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, reduction: str = "mean", pos_weight=None):
    """torch's form ``(1 - y) x + (1 + (pos_weight - 1) y) softplus(-x)``, stable for large |x|."""
    return ops.binary_cross_entropy_with_logits(input, target, weight=_constant(weight), reduction=reduction,
                                                pos_weight=_constant(pos_weight))

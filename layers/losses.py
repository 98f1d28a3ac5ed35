"""Losses as functions with torch.nn.functional's names, arguments and reductions.

Integer labels never go through indexing: ``cross_entropy`` picks the
target log-probability with a one-hot mask and ``where``, which every backend
differentiates the same way.
"""

from __future__ import annotations

import numpy as np

from gradcheck import ops
from gradcheck.layers.embedding import constant_index, one_hot


def _reduce(loss, reduction: str, denominator=None):
    if reduction == "none":
        return loss
    if reduction == "sum":
        return ops.sum(loss)
    if reduction == "mean":
        return ops.mean(loss) if denominator is None else ops.div(ops.sum(loss), denominator)
    raise ValueError(f"reduction={reduction!r}; expected 'mean', 'sum' or 'none'")


def mse_loss(input, target, reduction: str = "mean"):
    d = input - target
    return _reduce(d * d, reduction)


def cross_entropy(input, target, weight=None, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0):
    """torch.nn.functional.cross_entropy on logits (N, C) or (N, C, d1, ...).

    ``target`` holds class indices (N,) / (N, d1, ...), or class
    probabilities of the logits' shape (a float array).  ``weight`` is a
    constant per-class weight (C,).
    """
    logp = ops.log_softmax(input, axis=1)
    shape = ops.shape_of(input)
    if len(shape) < 2:
        raise ValueError(f"cross_entropy: logits of shape {shape}; expected (N, C) or (N, C, d1, ...)")
    bshape = (1, shape[1]) + (1,) * (len(shape) - 2)
    w = None if weight is None else ops.reshape(ops.asarray(weight, like=input), bshape)
    if np.dtype(ops.dtype_of(target)).kind == "f":
        if ops.shape_of(target) != shape:
            raise ValueError(f"cross_entropy: probability targets of shape {ops.shape_of(target)} must match logits {shape}")
        if label_smoothing:
            target = target * (1.0 - label_smoothing) + label_smoothing / shape[1]
        weighted = logp * target if w is None else logp * target * w
        # torch's "mean" over probability targets divides by every output element.
        return _reduce(ops.neg(ops.sum(weighted, axis=1)), reduction)
    labels = constant_index(target)
    hot = one_hot(labels, shape[1], axis=1)
    nll = ops.neg(ops.sum(ops.where(hot, logp, 0.0), axis=1))
    zeros = ops.zeros_like(nll)
    # Per-sample weight: the target class's weight, 0 where the label is ignored.
    keep = ops.where(ops.equal(labels, ignore_index), zeros, zeros + 1.0)
    if w is not None:
        keep = keep * ops.sum(ops.where(hot, w, 0.0), axis=1)
    loss = nll * keep
    if label_smoothing:
        if w is not None:
            raise NotImplementedError("cross_entropy: label_smoothing together with class weight is not supported")
        smooth = ops.neg(ops.mean(logp, axis=1)) * keep
        loss = loss * (1.0 - label_smoothing) + smooth * label_smoothing
    return _reduce(loss, reduction, denominator=ops.sum(keep) if reduction == "mean" else None)


def nll_loss(input, target, reduction: str = "mean"):
    """Negative log-likelihood of log-probabilities (N, C, ...) at integer targets."""
    hot = one_hot(target, ops.shape_of(input)[1], axis=1)
    return _reduce(ops.neg(ops.sum(ops.where(hot, input, 0.0), axis=1)), reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, reduction: str = "mean", pos_weight=None):
    """torch's form ``(1 - y) x + (1 + (pos_weight - 1) y) softplus(-x)``, stable for large |x|."""
    sp = ops.softplus(ops.neg(input))
    if pos_weight is not None:
        sp = sp * ((ops.asarray(pos_weight, like=input) - 1.0) * target + 1.0)
    loss = (1.0 - target) * input + sp
    if weight is not None:
        loss = loss * ops.asarray(weight, like=input)
    return _reduce(loss, reduction)

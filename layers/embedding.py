"""Embedding lookup with torch.nn.Embedding's names, init and padding_idx semantics."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradcheck import ops
from gradcheck.backends import backend_of
from gradcheck.layers import init
from gradcheck.module import Module, param, static


def constant_index(ids):
    """Integer ids in a form every backend's indexing accepts.

    The tape's ``getitem`` takes numpy integer arrays only, but the tape
    driver hands integer inputs over as (non-differentiable) tape tensors, so
    they are unwrapped here; torch and jax index with their own integer arrays.
    """
    return ops.to_numpy(ids) if backend_of(ids) == "tape" else ids


class Embedding(Module):
    """torch.nn.Embedding: ``weight[ids]``, weight (num_embeddings, embedding_dim) drawn N(0, 1).

    With ``padding_idx`` that row starts at zero and never receives a
    gradient, as in torch.  Here the padding positions of the output are the
    constant zero that row holds in torch (zero at init, never updated), so
    the function does not depend on the row at all and the zero gradient is
    its true derivative: a finite-difference referee perturbing the row
    agrees.  The outputs differ from torch's only if the padding row was
    overwritten with non-zeros.  The lookup is ``ops.embedding``: torch runs
    ``F.embedding`` (with ``padding_idx``), which gives the same output and
    gradients while the row is zero.
    """

    weight: Any = param()
    padding_idx: int | None = static()

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, rng=None):
        self.weight = init.normal(rng, (num_embeddings, embedding_dim))
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(
                    f"Embedding({num_embeddings}, {embedding_dim}): padding_idx={padding_idx} is out of range"
                )
            padding_idx %= num_embeddings
            self.weight[padding_idx] = 0.0
        self.padding_idx = padding_idx

    def __call__(self, ids):
        return ops.embedding(constant_index(ids), self.weight, self.padding_idx)


def one_hot(ids, num_classes: int, axis: int = -1):
    """A boolean one-hot of integer ``ids`` along a new ``axis`` (works on every backend)."""
    ids = constant_index(ids)
    ndim = len(ops.shape_of(ids)) + 1
    axis %= ndim
    classes = np.arange(num_classes).reshape((1,) * axis + (num_classes,) + (1,) * (ndim - axis - 1))
    return ops.equal(ops.expand_dims(ids, axis), classes)

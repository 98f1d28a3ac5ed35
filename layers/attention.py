"""Scaled dot-product attention and torch.nn.MultiheadAttention (names, layouts, init)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gradcheck import ops
from gradcheck.backends import backend_of
from gradcheck.layers import init
from gradcheck.layers.core import Dense
from gradcheck.layers.dropout import dropout_mask
from gradcheck.module import Module, child, param, static


def causal_mask(length: int, source_length: int | None = None) -> np.ndarray:
    """Boolean (L, S) mask, True where a query may attend: key index <= query index (top-left aligned, as torch)."""
    return np.tril(np.ones((length, source_length or length), dtype=bool))


def _swap_last(x):
    n = len(ops.shape_of(x))
    return ops.transpose(x, tuple(range(n - 2)) + (n - 1, n - 2))


def _mask_scores(scores, keep):
    """Scores with -inf where ``keep`` (a boolean array, True = attend) is False."""
    if backend_of(keep) == "tape":
        keep = ops.to_numpy(keep)
    if isinstance(keep, np.ndarray):
        # An additive -inf/0 bias in the scores' dtype: the same op on every backend.
        return scores + ops.asarray(np.where(keep, 0.0, -np.inf), like=scores)
    return ops.where(keep, scores, -math.inf)


def _additive(mask, scores):
    """A float mask in the scores' dtype: a float64 numpy constant would promote float32 scores."""
    return ops.asarray(mask, like=scores) if backend_of(mask) == "numpy" else mask


def _is_bool(mask) -> bool:
    return np.dtype(ops.dtype_of(mask)) == np.bool_


def _constant_bool(mask):
    """A boolean mask on the tape as the numpy constant the tape's ops take; others unchanged."""
    return ops.to_numpy(mask) if mask is not None and backend_of(mask) == "tape" and _is_bool(mask) else mask


def _apply(scores, mask):
    """Scores with ``mask`` applied as ``ops.scaled_dot_product_attention`` does (bool: True = attend; float: added)."""
    if mask is None:
        return scores
    return _mask_scores(scores, mask) if _is_bool(mask) else scores + _additive(mask, scores)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None, dropout_seed: int = 0,
                                 return_weights: bool = False):
    """torch.nn.functional.scaled_dot_product_attention on (..., L, E) queries and (..., S, E) keys.

    A boolean ``attn_mask`` marks with True the pairs that take part (torch's
    convention here); a float mask is added to the scores.  Dropout on the
    attention weights uses the deterministic mask of ``dropout_seed`` (see
    ``Dropout``) instead of torch's random one.  It runs as
    ``ops.scaled_dot_product_attention`` (torch: F.scaled_dot_product_attention,
    or its math kernel with the given dropout mask); ``return_weights=True``
    needs the attention weights, which no framework kernel returns, so that
    path is the composition in ops.
    """
    L, E = ops.shape_of(query)[-2:]
    S = ops.shape_of(key)[-2]
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: give attn_mask or is_causal=True, not both (as torch)")
    attn_mask = _constant_bool(attn_mask)
    drop = None
    if dropout_p > 0.0:
        batch = np.broadcast_shapes(ops.shape_of(query)[:-2], ops.shape_of(key)[:-2],
                                    () if attn_mask is None else ops.shape_of(attn_mask)[:-2])
        drop = dropout_mask(dropout_seed, tuple(batch) + (L, S), dropout_p)
    if not return_weights:
        return ops.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_mask=drop,
                                                is_causal=is_causal, scale=scale)
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    scores = ops.matmul(query, _swap_last(key)) * scale
    weights = ops.softmax(_apply(scores, causal_mask(L, S) if is_causal else attn_mask), axis=-1)
    if drop is not None:
        weights = weights * ops.asarray(drop, like=weights)
    return ops.matmul(weights, value), weights


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention: ``in_proj_weight`` (3E, E), ``in_proj_bias``, ``out_proj``.

    Differences from torch, all for checking gradients: ``batch_first``
    defaults to True; ``causal=True`` applies a causal mask on every call;
    the call returns the output alone unless ``need_weights=True`` (then
    ``(output, weights)``, averaged over heads as torch does); attention
    dropout uses a mask fixed by a seed drawn at build time.  As in torch, a
    boolean ``attn_mask`` or ``key_padding_mask`` marks with True what must
    NOT be attended to.  With ``kdim``/``vdim`` different from ``embed_dim``
    the projections are ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight``.

    As torch's module does, the projections are ``ops.linear`` (of the
    ``in_proj_weight`` slices) and the attention one call of
    ``ops.scaled_dot_product_attention``, the causal mask, ``attn_mask`` and
    ``key_padding_mask`` merged into one mask first (``_merged_mask``).
    ``need_weights=True`` returns the weights, which no attention kernel
    does: that call composes the attention from matmul and softmax.
    """

    in_proj_weight: Any = param()
    q_proj_weight: Any = param()
    k_proj_weight: Any = param()
    v_proj_weight: Any = param()
    in_proj_bias: Any = param()
    out_proj: Any = child()
    embed_dim: int = static()
    num_heads: int = static()
    dropout: float = static()
    batch_first: bool = static()
    causal: bool = static()
    seed: int = static()

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = True, causal: bool = False, rng=None):
        if embed_dim % num_heads:
            raise ValueError(
                f"MultiheadAttention: embed_dim={embed_dim} must be divisible by num_heads={num_heads}"
            )
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("MultiheadAttention: add_bias_kv and add_zero_attn are not supported; leave them False")
        rng = init.get_rng(rng)
        kdim, vdim = kdim or embed_dim, vdim or embed_dim
        E = embed_dim
        if kdim == E and vdim == E:
            self.in_proj_weight = init.xavier_uniform(rng, (3 * E, E))
            self.q_proj_weight = self.k_proj_weight = self.v_proj_weight = None
        else:
            self.in_proj_weight = None
            self.q_proj_weight = init.xavier_uniform(rng, (E, E))
            self.k_proj_weight = init.xavier_uniform(rng, (E, kdim))
            self.v_proj_weight = init.xavier_uniform(rng, (E, vdim))
        self.in_proj_bias = init.zeros((3 * E,)) if bias else None
        self.out_proj = Dense(E, E, bias=bias, rng=rng)
        if bias:  # torch zeroes out_proj.bias after Linear's default init
            self.out_proj.bias = init.zeros((E,))
        self.embed_dim, self.num_heads, self.dropout = E, num_heads, dropout
        self.batch_first, self.causal = batch_first, causal
        self.seed = int(rng.integers(2**31 - 1))

    def _project(self, x, i):
        E = self.embed_dim
        if self.in_proj_weight is not None:
            w = ops.getitem(self.in_proj_weight, slice(i * E, (i + 1) * E))
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[i]
        b = None if self.in_proj_bias is None else ops.getitem(self.in_proj_bias, slice(i * E, (i + 1) * E))
        return ops.linear(x, w, b)

    def _heads(self, x):
        """(N, T, E) -> (N, heads, T, E / heads)."""
        n, t, _ = ops.shape_of(x)
        return ops.transpose(ops.reshape(x, (n, t, self.num_heads, -1)), (0, 2, 1, 3))

    def __call__(self, query, key=None, value=None, key_padding_mask=None, need_weights: bool = False,
                 attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        key = query if key is None else key
        value = key if value is None else value
        if not self.batch_first:
            query, key, value = (ops.transpose(t, (1, 0, 2)) for t in (query, key, value))
        n, L, _ = ops.shape_of(query)
        S = ops.shape_of(key)[1]
        q, k, v = (self._heads(self._project(t, i)) for i, t in enumerate((query, key, value)))
        causal = self.causal or is_causal
        drop = None
        if self.dropout > 0.0 and self.training:
            drop = dropout_mask(self.seed, (n, self.num_heads, L, S), self.dropout)
        if need_weights:
            # The weights are part of the result and no framework kernel returns them: the composition.
            mask = self._merged_mask(attn_mask, key_padding_mask, causal, n, L, S)
            scores = ops.matmul(q, _swap_last(k)) * (1.0 / math.sqrt(self.embed_dim // self.num_heads))
            weights = ops.softmax(_apply(scores, mask), axis=-1)
            if drop is not None:
                weights = weights * ops.asarray(drop, like=weights)
            out = ops.matmul(weights, v)  # (N, heads, L, d)
        elif attn_mask is None and key_padding_mask is None:
            out = ops.scaled_dot_product_attention(q, k, v, dropout_mask=drop, is_causal=causal)
        else:
            mask = self._merged_mask(attn_mask, key_padding_mask, causal, n, L, S)
            out = ops.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_mask=drop)
        out = self.out_proj(ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (n, L, self.embed_dim)))
        if not self.batch_first:
            out = ops.transpose(out, (1, 0, 2))
        if not need_weights:
            return out
        return out, (ops.mean(weights, axis=1) if average_attn_weights else weights)

    def _merged_mask(self, attn_mask, key_padding_mask, causal, n, L, S):
        """The causal mask, ``attn_mask`` and ``key_padding_mask`` as one mask, merged as torch.nn.MultiheadAttention does.

        The result is in ``ops.scaled_dot_product_attention``'s convention
        (bool: True = attend; float: added to the scores).  torch's boolean
        masks mark with True what must NOT be attended to; float masks (either
        one) are added, and a pair that any boolean mask excludes gets -inf.
        """
        keep = causal_mask(L, S) if causal else None  # bool, True = attend
        added = None  # the sum of the float masks
        # torch's shapes: attn_mask (L, S) or (N * heads, L, S); key_padding_mask (N, S).
        for mask, shape, always in ((attn_mask, (n, self.num_heads, L, S), False),
                                    (key_padding_mask, (n, 1, 1, S), True)):
            if mask is None:
                continue
            if always or len(ops.shape_of(mask)) == 3:
                mask = ops.reshape(mask, shape)
            if not _is_bool(mask):
                added = mask if added is None else ops.add(added, mask)
            elif backend_of(mask) in ("numpy", "tape"):
                excluded = np.asarray(ops.to_numpy(mask))
                keep = ~excluded if keep is None else keep & ~excluded
            else:  # a framework's boolean array: negated and combined with its own ops
                keep = ops.where(mask, False, True if keep is None else keep)
        if added is None:
            return keep
        return added if keep is None else ops.where(keep, added, -math.inf)

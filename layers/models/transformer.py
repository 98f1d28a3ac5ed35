"""A GPT-style decoder: token + position embeddings, pre-LayerNorm blocks, final LayerNorm, head.

Each block is ``x + attn(ln_1(x))`` with causal multi-head self-attention,
then ``x + mlp(ln_2(x))`` with a 4x GELU MLP.  Paths: ``tok_emb.weight``,
``pos_emb.weight``, ``blocks.0.attn.in_proj_weight``, ``blocks.0.mlp.0.weight``,
``ln_f.weight``, ``head.weight``.
"""

from __future__ import annotations

from typing import Any

from gradcheck import ops
from gradcheck.layers import init
from gradcheck.layers.activations import GELU
from gradcheck.layers.attention import MultiheadAttention
from gradcheck.layers.core import Chain, Linear
from gradcheck.layers.dropout import Dropout
from gradcheck.layers.embedding import Embedding
from gradcheck.layers.norm import LayerNorm
from gradcheck.module import Module, child, static


class Block(Module):
    ln_1: Any = child()
    attn: Any = child()
    ln_2: Any = child()
    mlp: Any = child()

    def __init__(self, d_model, n_head, dropout=0.0, rng=None):
        self.ln_1 = LayerNorm(d_model)
        self.attn = MultiheadAttention(d_model, n_head, dropout=dropout, batch_first=True, causal=True, rng=rng)
        self.ln_2 = LayerNorm(d_model)
        mlp = [Linear(d_model, 4 * d_model, rng=rng), GELU(), Linear(4 * d_model, d_model, rng=rng)]
        self.mlp = Chain(*mlp, *([Dropout(dropout, rng=rng)] if dropout else []))

    def __call__(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(Module):
    tok_emb: Any = child()
    pos_emb: Any = child()
    blocks: list = child()
    ln_f: Any = child()
    head: Any = child()
    block_size: int = static()

    def __init__(self, vocab_size=128, block_size=32, d_model=64, n_head=4, n_layer=2, dropout=0.0, rng=None):
        rng = init.get_rng(rng)
        self.tok_emb = Embedding(vocab_size, d_model, rng=rng)
        self.pos_emb = Embedding(block_size, d_model, rng=rng)
        self.blocks = [Block(d_model, n_head, dropout, rng=rng) for _ in range(n_layer)]
        self.ln_f = LayerNorm(d_model)
        self.head = Linear(d_model, vocab_size, bias=False, rng=rng)
        self.block_size = block_size

    def __call__(self, ids):
        shape = ops.shape_of(ids)
        if len(shape) != 2 or shape[1] > self.block_size:
            raise ValueError(
                f"GPT: token ids of shape {shape}; expected (N, T) with T <= block_size={self.block_size} "
                "(build with a larger block_size for longer sequences)"
            )
        # Positions 0..T-1 are a slice of the table: cheaper than a gather on every backend.
        x = self.tok_emb(ids) + ops.getitem(self.pos_emb.weight, slice(0, shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def transformer(vocab_size=128, block_size=32, d_model=64, n_head=4, n_layer=2, dropout=0.0, rng=None):
    return GPT(vocab_size, block_size, d_model, n_head, n_layer, dropout, rng=rng)

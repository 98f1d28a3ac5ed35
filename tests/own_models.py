"""A user's own torch model, as a model library writes it: nothing here knows gradcheck.

Its classes are pickled by their import path into reproducers, which must
load them without gradcheck installed (tests/test_own_torch_model.py).
"""

from __future__ import annotations

import torch
from torch import nn


class WrongSiLU(torch.autograd.Function):
    """SiLU whose backward is 1e-4 too large: the kind of bug a hand-written kernel has."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return g * s * (1 + x * (1 - s)) * (1 + 1e-4)


class Act(nn.Module):
    def __init__(self, kind="silu"):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        if self.kind == "wrong":
            return WrongSiLU.apply(x)
        return torch.tanh(x) if self.kind == "tanh" else nn.functional.silu(x)


class Block(nn.Module):
    def __init__(self, kind="silu"):
        super().__init__()
        self.lin = nn.Linear(12, 12)
        self.norm = nn.LayerNorm(12)
        self.act = Act(kind)

    def forward(self, x):
        return x + self.act(self.norm(self.lin(x)))


class ResidualMLP(nn.Module):
    """Six residual blocks; block ``odd`` gets the activation ``kind``."""

    def __init__(self, odd=3, kind="silu"):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([Block(kind if i == odd else "silu") for i in range(6)])
        self.head = nn.Linear(12, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class KeyCache:
    """What a transformers cache is to a cross-attention: filled by the first call, read by later ones."""

    def __init__(self):
        self.keys = None


class CrossGate(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = nn.Linear(12, 12)

    def forward(self, x, memory, cache):
        if cache.keys is None:
            cache.keys = self.k(memory)
        return x * torch.sigmoid(cache.keys)


class CachedBlock(nn.Module):
    def __init__(self, kind="silu"):
        super().__init__()
        self.cross = CrossGate()
        self.act = Act(kind)

    def forward(self, x, memory, cache):
        return x + self.act(self.cross(x, memory, cache))


class CachedDecoder(nn.Module):
    """Three blocks gated by keys of an encoded memory, each block's kept in a cache object it is handed; block
    ``odd`` gets the activation ``kind``."""

    def __init__(self, odd=1, kind="silu"):
        super().__init__()
        torch.manual_seed(0)
        self.enc = nn.Linear(12, 12)
        self.blocks = nn.ModuleList([CachedBlock(kind if i == odd else "silu") for i in range(3)])
        self.head = nn.Linear(12, 4)

    def forward(self, x):
        memory = torch.tanh(self.enc(x))
        for block in self.blocks:
            x = block(x, memory, KeyCache())
        return self.head(x)

"""The ``smoke`` suite: a fast subset for CI (well under a minute for three backends on two cores).

One configuration of each main layer family and two models (an MLP and a
one-block transformer) at tiny sizes, each checked in float64 and measured in float32.
Most of the time goes to jax compiling each case once.
"""

from __future__ import annotations

from gradcheck import layers as L
from gradcheck.layers.models import MODELS
from gradcheck.suites.layers import lstm_flat, rows
from gradcheck.suites.table import Row, cases, make, normal

# Labels from the layers suite (see suites/layers.py) picked to touch each op family once.
SMOKE_LAYERS = (
    "Linear[in4,out3]",
    "Conv2d[k3,s2,p1,g2]",
    "ConvTranspose2d[k3,s2,p1,op1]",
    "BatchNorm2d[train]",
    "LayerNorm[8]",
    "MaxPool2d[k3,s2,p1]",
    "AdaptiveAvgPool2d[(2,3)]",
    "Embedding[10x4]",
    "MultiheadAttention[E8,h2,causal]",
    "GELU",
    "cross_entropy[mean]",
    "SkipConnection[Linear]",
)

# Unrolled recurrences cost jax a compile per time step: two steps are enough here.
SMOKE_ROWS = (
    Row("LSTM", "in2,h3,L2", make(L.LSTM, 2, 3, batch_first=True), normal(2, 2, 2), forward=lstm_flat),
)

SMOKE_MODELS = {
    "mlp": {"in_features": 6, "hidden": (8,), "out_features": 3, "batch": 3},
    "transformer": {"vocab_size": 11, "block_size": 4, "d_model": 8, "n_head": 2, "n_layer": 1, "batch": 2},
}


def smoke_cases(seed: int = 0, dtype: str | None = None):
    """A fast subset for CI: one configuration per layer family, two tiny models."""
    by_label = {r.label: r for r in rows()}
    missing = [label for label in SMOKE_LAYERS if label not in by_label]
    if missing:
        raise KeyError(f"smoke suite names layer rows that do not exist: {missing}; see suites/layers.py")
    picked = [by_label[label] for label in SMOKE_LAYERS] + list(SMOKE_ROWS)
    out = cases(picked, seed=seed, dtype=dtype)
    out += [MODELS[name].case(seed=seed, dtype=dtype or "float32", **settings) for name, settings in SMOKE_MODELS.items()]
    return out

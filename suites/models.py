"""The ``models`` suite: every model of the zoo at the small size its spec names.

The ResNets run at 64x64 with batch 2 (224x224 stays the default of
``gradcheck run resnet18``): smaller inputs leave layer4's train-mode
BatchNorms too few values per channel to be well conditioned.  The
transformer is tiny.  ResNet-18 runs in eval mode too, so
BatchNorm's running-statistics path is checked inside a real network.
"""

from __future__ import annotations

from gradcheck.layers.models import MODELS


def model_cases(seed: int = 0, dtype: str | None = None):
    """Every model (mlp, lenet5, resnet18/34/50, transformer, lstm_lm, unet_small) at a small size."""
    dt = dtype or "float32"
    out = [spec.case(seed=seed, dtype=dt, size="small") for spec in MODELS.values()]
    small = MODELS["resnet18"].case(seed=seed, dtype=dt, size="small", mode="eval")
    out.append(small.with_(name=small.name[:-1] + ",eval]"))
    return out

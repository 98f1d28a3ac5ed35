"""Framework-neutral layers, written once against ``gradcheck.ops``."""

from gradcheck.layers.conv import Conv1d, Conv2d
from gradcheck.layers.core import Chain, Dense, Linear
from gradcheck.layers.norm import BatchNorm1d, BatchNorm2d

__all__ = ["BatchNorm1d", "BatchNorm2d", "Chain", "Conv1d", "Conv2d", "Dense", "Linear"]

"""Normalisation layers; running statistics are buffers, updated in training mode."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradcheck import ops
from gradcheck.module import Module, buffer, param, static


class _BatchNorm(Module):
    weight: Any = param()
    bias: Any = param()
    running_mean: Any = buffer()
    running_var: Any = buffer()
    num_batches_tracked: Any = buffer()
    eps: float = static()
    momentum: float = static()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 track_running_stats: bool = True):
        self.weight = np.ones(num_features, np.float32) if affine else None
        self.bias = np.zeros(num_features, np.float32) if affine else None
        if track_running_stats:
            self.running_mean = np.zeros(num_features, np.float32)
            self.running_var = np.ones(num_features, np.float32)
            self.num_batches_tracked = np.zeros((), np.int64)
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None
        self.eps, self.momentum = eps, momentum

    def __call__(self, x):
        axes = (0,) + tuple(range(2, len(ops.shape_of(x))))
        shape = (1, -1) + (1,) * (len(axes) - 1)
        if self.training or self.running_mean is None:
            mean = ops.mean(x, axis=axes)
            var = ops.var(x, axis=axes)
            if self.training and self.running_mean is not None:
                self._update_running(mean, var, x, axes)
        else:
            mean, var = self.running_mean, self.running_var
        y = (x - ops.reshape(mean, shape)) * ops.reshape(ops.rsqrt(var + self.eps), shape)
        if self.weight is not None:
            y = y * ops.reshape(self.weight, shape) + ops.reshape(self.bias, shape)
        return y

    def _update_running(self, mean, var, x, axes):
        # torch updates running_var with the unbiased batch variance.
        n = int(np.prod([ops.shape_of(x)[a] for a in axes]))
        m = self.momentum
        mean, var = ops.stop_gradient(mean), ops.stop_gradient(var)
        self.running_mean = self.running_mean * (1 - m) + mean * m
        self.running_var = self.running_var * (1 - m) + var * (m * n / max(n - 1, 1))
        self.num_batches_tracked = self.num_batches_tracked + 1


class BatchNorm2d(_BatchNorm):
    """BatchNorm over NCHW (statistics per channel over N, H, W)."""


class BatchNorm1d(_BatchNorm):
    """BatchNorm over NC or NCL."""

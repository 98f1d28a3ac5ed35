"""Normalisation layers; running statistics are buffers, updated in training mode.

Batch statistics go through ``ops.normalize``: one node on the tape, a fused
forward on numpy, the composition on torch and jax (see
``torch_ops.normalize`` for why not torch's own kernels).  In eval mode BatchNorm applies its running statistics, with the
affine weight folded into the per-channel scale before it touches the
full-size activation.
"""

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
    num_features: int = static()

    # Input ranks torch accepts for this class.
    ranks = (4,)

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, rng=None):
        self.weight = np.ones(num_features, np.float32) if affine else None
        self.bias = np.zeros(num_features, np.float32) if affine else None
        if track_running_stats:
            self.running_mean = np.zeros(num_features, np.float32)
            self.running_var = np.ones(num_features, np.float32)
            self.num_batches_tracked = np.zeros((), np.int64)
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None
        self.eps, self.momentum, self.num_features = eps, momentum, num_features

    def __call__(self, x):
        shape = ops.shape_of(x)
        if len(shape) not in self.ranks or shape[1] != self.num_features:
            raise ValueError(
                f"{type(self).__name__}({self.num_features}): input of shape {shape}; expected "
                f"rank {' or '.join(map(str, self.ranks))} with {self.num_features} channels in dim 1"
            )
        axes = (0,) + tuple(range(2, len(shape)))
        bshape = (1, shape[1]) + (1,) * (len(shape) - 2)
        weight, bias = (None if a is None else ops.reshape(a, bshape) for a in (self.weight, self.bias))
        if self.training or self.running_mean is None:
            n = int(np.prod([shape[a] for a in axes]))
            if self.training and n <= 1:
                raise ValueError(
                    f"{type(self).__name__}: expected more than 1 value per channel when training, "
                    f"got input of shape {shape}; use a larger batch or eval mode"
                )
            y, mean, var = ops.normalize(x, axes, self.eps, weight=weight, bias=bias)
            if self.training and self.running_mean is not None:
                self._update_running(ops.reshape(mean, (-1,)), ops.reshape(var, (-1,)), n)
            return y
        centred = x - ops.reshape(self.running_mean, bshape)
        scale = ops.rsqrt(ops.reshape(self.running_var, bshape) + self.eps)
        if weight is not None:
            scale = scale * weight
        y = centred * scale
        return y + bias if bias is not None else y

    def _update_running(self, mean, var, n):
        # torch updates running_var with the unbiased batch variance, and with
        # momentum=None keeps a cumulative average (factor 1/num_batches_tracked).
        self.num_batches_tracked = self.num_batches_tracked + 1
        m = self.momentum
        if m is None:
            m = ops.div(1.0, ops.astype(self.num_batches_tracked, ops.dtype_of(mean)))
        mean, var = ops.stop_gradient(mean), ops.stop_gradient(var)
        self.running_mean = self.running_mean * (1 - m) + mean * m
        self.running_var = self.running_var * (1 - m) + var * (m * (n / (n - 1)))


class BatchNorm2d(_BatchNorm):
    """BatchNorm over NCHW (statistics per channel over N, H, W)."""

    ranks = (4,)


class BatchNorm1d(_BatchNorm):
    """BatchNorm over NC or NCL."""

    ranks = (2, 3)


class LayerNorm(Module):
    """torch.nn.LayerNorm: normalise over the trailing ``normalized_shape`` dims."""

    weight: Any = param()
    bias: Any = param()
    normalized_shape: tuple = static()
    eps: float = static()

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 rng=None):
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = shape, eps
        self.weight = np.ones(shape, np.float32) if elementwise_affine else None
        self.bias = np.zeros(shape, np.float32) if elementwise_affine and bias else None

    def __call__(self, x):
        shape = ops.shape_of(x)
        k = len(self.normalized_shape)
        if shape[len(shape) - k :] != self.normalized_shape:
            raise ValueError(
                f"LayerNorm(normalized_shape={self.normalized_shape}): input of shape {shape} "
                "does not end with those dims"
            )
        axes = tuple(range(len(shape) - k, len(shape)))
        return ops.normalize(x, axes, self.eps, weight=self.weight, bias=self.bias)[0]


class GroupNorm(Module):
    """torch.nn.GroupNorm: statistics per sample over each group of channels (and all spatial dims)."""

    weight: Any = param()
    bias: Any = param()
    num_groups: int = static()
    num_channels: int = static()
    eps: float = static()

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, rng=None):
        if num_channels % num_groups:
            raise ValueError(
                f"GroupNorm: num_channels={num_channels} is not divisible by num_groups={num_groups}"
            )
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = np.ones(num_channels, np.float32) if affine else None
        self.bias = np.zeros(num_channels, np.float32) if affine else None

    def __call__(self, x):
        shape = ops.shape_of(x)
        if len(shape) < 2 or shape[1] != self.num_channels:
            raise ValueError(
                f"GroupNorm({self.num_groups}, {self.num_channels}): input of shape {shape}; "
                f"expected (N, {self.num_channels}, ...)"
            )
        grouped = ops.reshape(x, (shape[0], self.num_groups, -1))
        y = ops.reshape(ops.normalize(grouped, (2,), self.eps)[0], shape)
        bshape = (1, shape[1]) + (1,) * (len(shape) - 2)
        if self.weight is not None:
            y = y * ops.reshape(self.weight, bshape) + ops.reshape(self.bias, bshape)
        return y


class RMSNorm(Module):
    """torch.nn.RMSNorm: ``x / sqrt(mean(x^2) + eps) * weight`` over the trailing dims.

    ``eps=None`` uses the machine epsilon of the input's dtype, as torch does.
    """

    weight: Any = param()
    normalized_shape: tuple = static()
    eps: float | None = static()

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, rng=None):
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = shape, eps
        self.weight = np.ones(shape, np.float32) if elementwise_affine else None

    def __call__(self, x):
        shape = ops.shape_of(x)
        k = len(self.normalized_shape)
        if shape[len(shape) - k :] != self.normalized_shape:
            raise ValueError(
                f"RMSNorm(normalized_shape={self.normalized_shape}): input of shape {shape} "
                "does not end with those dims"
            )
        eps = self.eps if self.eps is not None else float(np.finfo(ops.dtype_of(x)).eps)
        ms = ops.mean(x * x, axis=tuple(range(len(shape) - k, len(shape))), keepdims=True)
        y = x * ops.rsqrt(ms + eps)
        return y * self.weight if self.weight is not None else y

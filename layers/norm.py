"""Normalisation layers; running statistics are buffers, updated in training mode.

Each layer calls the framework kernel of its name in ``gradcheck.ops``
(``batch_norm``, ``layer_norm``, ``group_norm``, ``rms_norm``): torch runs
``F.batch_norm`` and the others, the tape and the numpy referee run the
derived compositions there (statistics through ``ops.normalize``, one node on
the tape).
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
        if self.training and int(np.prod([shape[0], *shape[2:]])) <= 1:
            raise ValueError(
                f"{type(self).__name__}: expected more than 1 value per channel when training, "
                f"got input of shape {shape}; use a larger batch or eval mode"
            )
        # As torch.nn.BatchNorm: batch statistics in training and whenever there are no running
        # statistics; running statistics updated only in training, with num_batches_tracked.
        tracking = self.running_mean is not None
        momentum = 0.0
        if self.training and tracking:
            self.num_batches_tracked = self.num_batches_tracked + 1
            momentum = self.momentum
            if momentum is None:  # a cumulative average: factor 1 / num_batches_tracked, counted after this batch
                momentum = ops.div(1.0, ops.astype(self.num_batches_tracked, ops.dtype_of(x)))
        y, running_mean, running_var = ops.batch_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias,
            training=self.training or not tracking, momentum=momentum, eps=self.eps,
        )
        if self.training and tracking:
            self.running_mean, self.running_var = running_mean, running_var
        return y


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
        return ops.layer_norm(x, self.normalized_shape, self.weight, self.bias, eps=self.eps)


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
        return ops.group_norm(x, self.num_groups, self.weight, self.bias, eps=self.eps)


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
        return ops.rms_norm(x, self.normalized_shape, self.weight, eps=self.eps)

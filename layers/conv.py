"""Convolutions with torch.nn's layouts, names and default initialisation."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradcheck import ops
from gradcheck.layers import init
from gradcheck.module import Module, param, static


def _tuple(v, n):
    return (v,) * n if isinstance(v, int) else tuple(v)


class _ConvNd(Module):
    weight: Any = param()
    bias: Any = param()
    stride: Any = static()
    padding: Any = static()
    dilation: Any = static()
    groups: int = static()

    nd = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, rng=None):
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"{type(self).__name__}: in_channels={in_channels} and out_channels={out_channels} "
                f"must both be divisible by groups={groups}"
            )
        rng = init.get_rng(rng)
        k = _tuple(kernel_size, self.nd)
        shape = (out_channels, in_channels // groups) + k
        fan_in = shape[1] * int(np.prod(k))
        self.weight = init.kaiming_uniform(rng, shape, fan_in)
        self.bias = init.fan_in_bias(rng, (out_channels,), fan_in) if bias else None
        self.stride, self.dilation, self.groups = stride, dilation, groups
        self.padding = padding

    def __call__(self, x):
        return ops.conv(x, self.weight, self.bias, stride=self.stride, padding=self.padding,
                        dilation=self.dilation, groups=self.groups)


class Conv2d(_ConvNd):
    """2-d convolution on NCHW; weight (out, in/groups, kh, kw)."""

    nd = 2


class Conv1d(_ConvNd):
    """1-d convolution on NCL; weight (out, in/groups, k)."""

    nd = 1

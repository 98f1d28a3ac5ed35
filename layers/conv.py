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
    # padding: an int, a tuple per spatial dim, "same" (stride 1 only, the odd
    # pixel on the right as torch) or "valid".
    weight: Any = param()
    bias: Any = param()
    stride: Any = static()
    padding: Any = static()
    dilation: Any = static()
    groups: int = static()

    nd = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, rng=None, weight_init=None):
        """``weight_init(rng, shape)`` replaces torch's default weight init (torchvision's
        ResNet uses ``init.kaiming_normal_fan_out``); the bias keeps the default."""
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"{type(self).__name__}: in_channels={in_channels} and out_channels={out_channels} "
                f"must both be divisible by groups={groups}"
            )
        rng = init.get_rng(rng)
        k = _tuple(kernel_size, self.nd)
        shape = (out_channels, in_channels // groups) + k
        fan_in = shape[1] * int(np.prod(k))
        if weight_init is None:
            self.weight = init.kaiming_uniform(rng, shape, fan_in)
        else:
            self.weight = np.asarray(weight_init(rng, shape), dtype=np.float32)
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


class _ConvTransposeNd(Module):
    weight: Any = param()
    bias: Any = param()
    stride: Any = static()
    padding: Any = static()
    output_padding: Any = static()
    groups: int = static()
    dilation: Any = static()

    nd = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0,
                 groups=1, bias=True, dilation=1, rng=None):
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"{type(self).__name__}: in_channels={in_channels} and out_channels={out_channels} "
                f"must both be divisible by groups={groups}"
            )
        if isinstance(padding, str):
            raise ValueError(
                f"{type(self).__name__}: padding={padding!r} is not supported for transposed "
                "convolutions (torch neither); give an int or a tuple"
            )
        rng = init.get_rng(rng)
        k = _tuple(kernel_size, self.nd)
        # torch's layout (in, out/groups, *k); its default init computes fan_in
        # from dim 1, i.e. out/groups * prod(k).
        shape = (in_channels, out_channels // groups) + k
        fan_in = shape[1] * int(np.prod(k))
        self.weight = init.kaiming_uniform(rng, shape, fan_in)
        self.bias = init.fan_in_bias(rng, (out_channels,), fan_in) if bias else None
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        self.groups, self.dilation = groups, dilation

    def __call__(self, x):
        return ops.conv_transpose(x, self.weight, self.bias, stride=self.stride, padding=self.padding,
                                  output_padding=self.output_padding, dilation=self.dilation,
                                  groups=self.groups)


class ConvTranspose2d(_ConvTransposeNd):
    """Transposed 2-d convolution on NCHW; weight (in, out/groups, kh, kw) as torch."""

    nd = 2


class ConvTranspose1d(_ConvTransposeNd):
    """Transposed 1-d convolution on NCL; weight (in, out/groups, k) as torch."""

    nd = 1

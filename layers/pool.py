"""Pooling layers on NCHW with torch.nn's arguments."""

from __future__ import annotations

from typing import Any

from gradcheck import ops
from gradcheck.module import Module, static


def _unsupported(layer: str, **given):
    for name, (value, default) in given.items():
        if value != default:
            raise NotImplementedError(
                f"{layer}({name}={value!r}) is not supported (the ops namespace has no such pooling); "
                f"leave {name}={default!r}"
            )


class MaxPool2d(Module):
    """torch.nn.MaxPool2d (padding with -inf); ``stride`` defaults to ``kernel_size``.

    Max pooling has a kink wherever two entries of a window tie; the suites
    draw inputs without near-ties (see ``gradcheck.suites.inputs``).
    """

    kernel_size: Any = static()
    stride: Any = static()
    padding: Any = static()

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, rng=None):
        _unsupported("MaxPool2d", dilation=(dilation, 1), ceil_mode=(ceil_mode, False))
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def __call__(self, x):
        return ops.max_pool2d(x, self.kernel_size, self.stride, self.padding)


class AvgPool2d(Module):
    """torch.nn.AvgPool2d; ``count_include_pad=False`` divides by the real pixels of each window."""

    kernel_size: Any = static()
    stride: Any = static()
    padding: Any = static()
    count_include_pad: bool = static()

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None, rng=None):
        _unsupported("AvgPool2d", ceil_mode=(ceil_mode, False), divisor_override=(divisor_override, None))
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.count_include_pad = count_include_pad

    def __call__(self, x):
        return ops.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.count_include_pad)


class AdaptiveAvgPool2d(Module):
    """torch.nn.AdaptiveAvgPool2d; ``None`` in ``output_size`` keeps that input dim."""

    output_size: Any = static()

    def __init__(self, output_size, rng=None):
        self.output_size = output_size

    def __call__(self, x):
        n, c, h, w = ops.shape_of(x)
        oh, ow = (self.output_size,) * 2 if isinstance(self.output_size, int) else self.output_size
        oh, ow = h if oh is None else oh, w if ow is None else ow
        if (oh, ow) == (1, 1):
            # A global mean is one reduction; the general path is two contractions.
            return ops.mean(x, axis=(2, 3), keepdims=True)
        return ops.adaptive_avg_pool2d(x, (oh, ow))

"""Dense layers and combinators."""

from __future__ import annotations

from typing import Any, Callable

from gradcheck import ops
from gradcheck.layers import init
from gradcheck.module import Module, child, param, static


class Chain(Module):
    """Layers applied in order; paths number them as torch.nn.Sequential does (``0.weight``)."""

    layers: list = child(inline=True)

    def __init__(self, *layers):
        self.layers = list(layers)

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self):
        return len(self.layers)


class Dense(Module):
    """``activation(x @ weight.T + bias)``; weight is (out, in) as torch.nn.Linear."""

    weight: Any = param()
    bias: Any = param()
    activation: Callable | None = static()

    def __init__(self, in_features: int, out_features: int, activation=None, bias: bool = True, rng=None):
        rng = init.get_rng(rng)
        self.weight = init.kaiming_uniform(rng, (out_features, in_features), in_features)
        self.bias = init.fan_in_bias(rng, (out_features,), in_features) if bias else None
        self.activation = activation

    def __call__(self, x):
        y = ops.matmul(x, ops.transpose(self.weight))
        if self.bias is not None:
            y = y + self.bias
        return self.activation(y) if self.activation is not None else y


Linear = Dense

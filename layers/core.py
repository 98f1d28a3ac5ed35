"""Dense layers, reshaping layers and combinators."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


Sequential = Chain


class Dense(Module):
    """``activation(x @ weight.T + bias)``; weight is (out, in) as torch.nn.Linear (``ops.linear``: F.linear on torch)."""

    weight: Any = param()
    bias: Any = param()
    activation: Callable | None = static()

    def __init__(self, in_features: int, out_features: int, activation=None, bias: bool = True, rng=None):
        rng = init.get_rng(rng)
        self.weight = init.kaiming_uniform(rng, (out_features, in_features), in_features)
        self.bias = init.fan_in_bias(rng, (out_features,), in_features) if bias else None
        self.activation = activation

    def __call__(self, x):
        y = ops.linear(x, self.weight, self.bias)
        return self.activation(y) if self.activation is not None else y


Linear = Dense


def add_all(*xs):
    """The default way Parallel combines its branches."""
    out = xs[0]
    for x in xs[1:]:
        out = ops.add(out, x)
    return out


def concat_channels(*xs):
    """Concatenate along axis 1 (channels of NCHW / features of NC), as U-Net skips do."""
    return ops.concatenate(list(xs), axis=1)


class Parallel(Module):
    """Branches applied to the same input (or one input each), outputs merged by ``combine``.

    As Flux's ``Parallel(connection, layers...)``: ``combine(*outputs)``, by
    default their sum.  Called with as many inputs as branches, branch ``i``
    gets input ``i``.  Paths number the branches (``0.weight``, ``1.weight``).
    """

    branches: list = child(inline=True)
    combine: Callable = static()

    def __init__(self, *branches, combine: Callable = add_all):
        if not branches:
            raise ValueError("Parallel needs at least one branch, got none")
        self.branches = list(branches)
        self.combine = combine

    def __call__(self, *xs):
        if len(xs) == 1:
            outs = [b(xs[0]) for b in self.branches]
        elif len(xs) == len(self.branches):
            outs = [b(x) for b, x in zip(self.branches, xs)]
        else:
            raise ValueError(
                f"Parallel with {len(self.branches)} branches called with {len(xs)} inputs; "
                "pass one input (shared) or one per branch"
            )
        return self.combine(*outs)


class SkipConnection(Module):
    """``combine(layer(x), x)``; by default the residual ``layer(x) + x``."""

    layer: Any = child()
    combine: Callable | None = static()

    def __init__(self, layer, combine: Callable | None = None):
        self.layer = layer
        self.combine = combine

    def __call__(self, x):
        y = self.layer(x)
        return ops.add(y, x) if self.combine is None else self.combine(y, x)


Residual = SkipConnection


class Lambda(Module):
    """A parameter-free function as a layer: ``fn(*inputs, **kwargs)``.

    Lets a plain function (an activation, a loss, scaled dot-product
    attention) be a case's model; its float inputs are what gets checked.
    """

    fn: Callable = static()
    kwargs: Any = static()

    def __init__(self, fn: Callable, rng=None, **kwargs):
        self.fn = fn
        self.kwargs = tuple(sorted(kwargs.items()))

    def __call__(self, *xs):
        return self.fn(*xs, **dict(self.kwargs))


class Identity(Module):
    def __init__(self, *args, rng=None, **kwargs):
        pass

    def __call__(self, x):
        return x


class Flatten(Module):
    """torch.nn.Flatten: merge dims ``start_dim..end_dim`` (default: all but the batch dim)."""

    start_dim: int = static()
    end_dim: int = static()

    def __init__(self, start_dim: int = 1, end_dim: int = -1, rng=None):
        self.start_dim, self.end_dim = start_dim, end_dim

    def __call__(self, x):
        shape = ops.shape_of(x)
        start, end = self.start_dim % len(shape), self.end_dim % len(shape)
        if end < start:
            raise ValueError(
                f"Flatten(start_dim={self.start_dim}, end_dim={self.end_dim}) on shape {shape}: "
                "end_dim comes before start_dim"
            )
        merged = 1
        for d in shape[start : end + 1]:
            merged *= d
        return ops.reshape(x, shape[:start] + (merged,) + shape[end + 1 :])

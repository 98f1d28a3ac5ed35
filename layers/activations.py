"""Activations, as functions and as torch.nn-style layer objects (parameter-free).

The functions take the array first and torch's keyword names; each layer
holds its hyperparameters as static fields, so they show in reports but are
never differentiated.
"""

from __future__ import annotations

from gradcheck import ops
from gradcheck.module import Module, static

relu = ops.relu
tanh = ops.tanh
sigmoid = ops.sigmoid
silu = ops.silu


def leaky_relu(x, negative_slope: float = 0.01):
    return ops.leaky_relu(x, negative_slope)


def elu(x, alpha: float = 1.0):
    return ops.elu(x, alpha)


def gelu(x, approximate: str = "none"):
    return ops.gelu(x, approximate)


def softplus(x, beta: float = 1.0, threshold: float = 20.0):
    """torch's softplus: ``log(1 + exp(beta x)) / beta``, and ``x`` itself where ``beta x > threshold``."""
    bx = x if beta == 1.0 else ops.mul(x, beta)
    soft = ops.softplus(bx) if beta == 1.0 else ops.div(ops.softplus(bx), beta)
    return ops.where(ops.greater(bx, threshold), x, soft)


def softmax(x, dim: int = -1):
    return ops.softmax(x, axis=dim)


def log_softmax(x, dim: int = -1):
    return ops.log_softmax(x, axis=dim)


class ReLU(Module):
    def __init__(self, rng=None):
        pass

    def __call__(self, x):
        return ops.relu(x)


class Tanh(Module):
    def __init__(self, rng=None):
        pass

    def __call__(self, x):
        return ops.tanh(x)


class Sigmoid(Module):
    def __init__(self, rng=None):
        pass

    def __call__(self, x):
        return ops.sigmoid(x)


class SiLU(Module):
    def __init__(self, rng=None):
        pass

    def __call__(self, x):
        return ops.silu(x)


class LeakyReLU(Module):
    negative_slope: float = static()

    def __init__(self, negative_slope: float = 0.01, rng=None):
        self.negative_slope = negative_slope

    def __call__(self, x):
        return ops.leaky_relu(x, self.negative_slope)


class ELU(Module):
    alpha: float = static()

    def __init__(self, alpha: float = 1.0, rng=None):
        self.alpha = alpha

    def __call__(self, x):
        return ops.elu(x, self.alpha)


class GELU(Module):
    approximate: str = static()

    def __init__(self, approximate: str = "none", rng=None):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU(approximate={approximate!r}): expected 'none' or 'tanh'")
        self.approximate = approximate

    def __call__(self, x):
        return ops.gelu(x, self.approximate)


class Softplus(Module):
    beta: float = static()
    threshold: float = static()

    def __init__(self, beta: float = 1.0, threshold: float = 20.0, rng=None):
        self.beta, self.threshold = beta, threshold

    def __call__(self, x):
        return softplus(x, self.beta, self.threshold)


class Softmax(Module):
    dim: int = static()

    def __init__(self, dim: int = -1, rng=None):
        self.dim = dim

    def __call__(self, x):
        return ops.softmax(x, axis=self.dim)


class LogSoftmax(Module):
    dim: int = static()

    def __init__(self, dim: int = -1, rng=None):
        self.dim = dim

    def __call__(self, x):
        return ops.log_softmax(x, axis=self.dim)


# name -> (function, layer class), for suites and the CLI.
ACTIVATIONS = {
    "relu": (relu, ReLU),
    "leaky_relu": (leaky_relu, LeakyReLU),
    "elu": (elu, ELU),
    "gelu": (gelu, GELU),
    "silu": (silu, SiLU),
    "tanh": (tanh, Tanh),
    "sigmoid": (sigmoid, Sigmoid),
    "softplus": (softplus, Softplus),
    "softmax": (softmax, Softmax),
    "log_softmax": (log_softmax, LogSoftmax),
}

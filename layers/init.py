"""Deterministic parameter initialisation with PyTorch's default schemes, on numpy.

Every layer takes an optional ``rng`` (a ``numpy.random.Generator``); without
one it draws from a process-wide generator that ``seed`` resets, so a model
built after ``seed(0)`` has the same bits every time, on every backend.
"""

from __future__ import annotations

import math

import numpy as np

_default = np.random.default_rng(0)
SQRT5 = math.sqrt(5)  # torch's default negative slope for Linear and Conv weights


def seed(value: int) -> None:
    """Reset the generator layers draw from when no ``rng`` is passed."""
    global _default
    _default = np.random.default_rng(value)


def get_rng(rng=None) -> np.random.Generator:
    if rng is None:
        return _default
    if isinstance(rng, (int, np.integer)):
        return np.random.default_rng(int(rng))
    return rng


def uniform(rng, shape, bound, dtype=np.float32) -> np.ndarray:
    return get_rng(rng).uniform(-bound, bound, size=shape).astype(dtype)


def kaiming_uniform(rng, shape, fan_in, a=SQRT5, dtype=np.float32) -> np.ndarray:
    """torch.nn.init.kaiming_uniform_ (the default for Linear and Conv weights uses a=sqrt(5))."""
    gain = math.sqrt(2.0 / (1 + a * a))
    return uniform(rng, shape, gain * math.sqrt(3.0 / fan_in), dtype)


def kaiming_normal_fan_out(rng, shape, dtype=np.float32) -> np.ndarray:
    """kaiming_normal_(mode="fan_out", nonlinearity="relu"), torchvision's ResNet conv init."""
    fan_out = shape[0] * int(np.prod(shape[2:]))
    std = math.sqrt(2.0 / fan_out)
    return (get_rng(rng).standard_normal(shape) * std).astype(dtype)


def fan_in_bias(rng, shape, fan_in, dtype=np.float32) -> np.ndarray:
    """The default bias of Linear and Conv: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    return uniform(rng, shape, 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0, dtype)


def normal(rng, shape, std=1.0, dtype=np.float32) -> np.ndarray:
    return (get_rng(rng).standard_normal(shape) * std).astype(dtype)


def xavier_uniform(rng, shape, gain=1.0, dtype=np.float32) -> np.ndarray:
    """torch.nn.init.xavier_uniform_ (MultiheadAttention's in_proj_weight)."""
    fan_in, fan_out = fans(shape)
    return uniform(rng, shape, gain * math.sqrt(6.0 / (fan_in + fan_out)), dtype)


def fans(shape) -> tuple[int, int]:
    """torch's (fan_in, fan_out): dims 1 and 0 times the receptive field (the trailing dims)."""
    if len(shape) < 2:
        raise ValueError(f"fan in/out need at least 2 dims, got shape {tuple(shape)}")
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def ones(shape, dtype=np.float32) -> np.ndarray:
    return np.ones(shape, dtype)


def zeros(shape, dtype=np.float32) -> np.ndarray:
    return np.zeros(shape, dtype)

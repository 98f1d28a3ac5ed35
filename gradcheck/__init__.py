"""gradcheck: do the gradients agree?

Run a layer or model through gradcheck's own tape AD, PyTorch and JAX,
compare the per-parameter gradients, and let a float64 finite-difference
referee say which backend is wrong when they differ.
"""

from gradcheck import ops
from gradcheck.api import gradient, withgradient
from gradcheck.assertions import assert_gradients_agree as assert_gradients_agree
from gradcheck.module import Module, buffer, child, param, static

__version__ = "0.1.0"


def __getattr__(name):
    # from_torch and from_jax on first use: importing gradcheck must not import torch or jax.
    if name == "from_torch":
        from gradcheck.frontends.torch import from_torch

        return from_torch
    if name == "from_jax":
        from gradcheck.frontends.jax import from_jax

        return from_jax
    raise AttributeError(f"module 'gradcheck' has no attribute {name!r}")


__all__ = [
    "Module",
    "assert_gradients_agree",
    "buffer",
    "child",
    "from_jax",
    "from_torch",
    "gradient",
    "ops",
    "param",
    "static",
    "withgradient",
]

"""Custom rules as JAX users write them, in models of their own: a user's package, importing nothing of gradcheck.

The reproducer tests (``tests/test_repro_jax.py``) check these with ``from_jax`` and run the scripts the
reproducers hold in a process where gradcheck cannot be imported, so this module must not import it.

* ``smooth_relu``: a module-level ``custom_jvp`` (softplus times a scale) whose tangent rule is off by
  ``(1 + 1e-3)``, called inside a flax.linen module;
* ``make_inner_rule``: a ``custom_vjp`` made anew inside the model's forward on each call, wrong by
  ``(1 + 1e-3)``: no import path names it.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

ERROR = 1.0 + 1e-3  # how far the wrong rules' gradients are off


@jax.custom_jvp
def smooth_relu(x, scale):
    """``scale * softplus(x)``; its tangent rule scales ``x``'s part by ERROR."""
    return scale * jnp.logaddexp(x, 0.0)


@smooth_relu.defjvp
def _smooth_relu_jvp(primals, tangents):
    x, scale = primals
    dx, dscale = tangents
    return smooth_relu(x, scale), ERROR * scale * jax.nn.sigmoid(x) * dx + jnp.logaddexp(x, 0.0) * dscale


class SmoothMLP(nn.Module):
    """Dense -> smooth_relu (a learned scale) -> Dense."""

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", lambda key: jnp.full((6,), 1.5, jnp.float32))
        h = smooth_relu(nn.Dense(6)(x), scale)
        return nn.Dense(3)(h)


def make_smooth_mlp():
    x = jax.random.normal(jax.random.key(1), (4, 5), jnp.float32)
    model = SmoothMLP()
    return model, (jax.jit(model.init)(jax.random.key(0), x), x), {}


def make_inner_rule(params, x):
    """``tanh(x @ w) * a`` where the product with ``a`` is a custom_vjp made here, on every call."""

    @jax.custom_vjp
    def times(h, a):
        return h * a

    def fwd(h, a):
        return h * a, (h, a)

    def bwd(res, g):
        h, a = res
        return g * a, ERROR * jnp.sum(g * h, axis=0)

    times.defvjp(fwd, bwd)
    return times(jnp.tanh(x @ params["w"]), params["a"])


def make_inner():
    k1, k2, k3 = jax.random.split(jax.random.key(2), 3)
    params = {"w": 0.5 * jax.random.normal(k1, (5, 3), jnp.float32),
              "a": 1.0 + 0.1 * jax.random.normal(k2, (3,), jnp.float32)}
    return make_inner_rule, (params, jax.random.normal(k3, (4, 5), jnp.float32)), {}

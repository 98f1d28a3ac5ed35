"""The jaxpr interpreter and its primitive table: every lowering against jax's own primitive, and gradients.

One table row per primitive and configuration; each row is a small jax function that uses it.  A row is
checked twice:

* forward: the function's jaxpr has the row's primitive; ``interpreter.verify`` (each equation's lowering on
  numpy against jax's primitive bound on the same values, float64) finds nothing; ``interpreter.run`` on
  numpy gives jax's outputs, in float64 and, measured, in float32;
* gradient (rows whose outputs are differentiable): ``jax.grad`` of a random-cotangent loss of the user's
  function against the tape's and torch's gradients of the same loss of the interpreted jaxpr, on several
  seeds.

Then the higher-order primitives' semantics, the constant part (dropout masks drawn by jax, identical on every
backend), optax's losses (the models of flax.linen, flax.nnx and equinox are checked through ``from_jax``, in
``test_from_jax.py``), and the negative controls: a wrong lowering is caught by ``verify`` with the primitive,
the source line and the module path; an unknown primitive names the public decorator; a random draw without
its constants says how to give them.

Inputs keep away from kinks (relu, abs at 0, ties of max, sort and pooling), so that the backends' gradients
are the one derivative there is.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)  # before any tracing, or float64 silently becomes float32

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.extend import core as jcore  # noqa: E402

import gradcheck  # noqa: E402
from gradcheck import ops  # noqa: E402
from gradcheck.frontends.jax import interpreter, primitives  # noqa: E402

BACKENDS = ("tape", "torch")
SEEDS = (0, 1)
# float64: the lowerings compute what jax's kernels do, in another order at most.
FORWARD = dict(rtol=1e-12, atol=1e-12)
GRAD = dict(rtol=1e-9, atol=1e-12)
# float32: measured against float64 (each backend rounds in its own order).
FLOAT32 = dict(rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------------- inputs
def normal(*shape):
    return lambda rng: rng.standard_normal(shape)


def positive(*shape, lo=0.3, hi=2.0):
    return lambda rng: rng.uniform(lo, hi, shape)


def away(*shape, gap=0.1):
    """Values at least ``gap`` from zero (abs, sign, relu)."""
    return lambda rng: rng.choice([-1.0, 1.0], size=shape) * rng.uniform(gap, 2.0, shape)


def distinct(*shape, spacing=0.05):
    """All values different by at least ``spacing`` (no ties for max, sort, pooling)."""

    def draw(rng):
        n = int(np.prod(shape, dtype=np.int64))
        return ((rng.permutation(n) - n / 2) * spacing + rng.uniform(0, spacing / 4)).reshape(shape)

    return draw


def halves_away(*shape):
    """Values at least 0.1 from every integer and half-integer (floor, round: no step at an input)."""
    return lambda rng: np.floor(rng.uniform(-4, 4, shape)) + rng.choice([0.15, 0.35, 0.65, 0.85], size=shape)


def ints(lo, hi, *shape, dtype=np.int32):
    return lambda rng: rng.integers(lo, hi, shape).astype(dtype)


def const(value, dtype=None):
    return lambda rng: np.asarray(value, dtype)


def bools(*shape):
    return lambda rng: rng.random(shape) < 0.5


# ---------------------------------------------------------------- the table
@dataclass(frozen=True)
class Row:
    prim: str  # the primitive the row is for: the traced jaxpr must contain it
    name: str  # what the row checks, for its test id
    fn: Callable  # a jax function of the inputs
    args: tuple  # one draw(rng) -> numpy array per input
    grad: bool = True  # whether the float outputs are differentiable in the float inputs (not a step, not an index)

    @property
    def id(self):
        return f"{self.prim}:{self.name}"


def _dot_t(x, w):
    return lax.dot_general(x, w, (((1,), (1,)), ((), ())))


def _conv(lhs, rhs, strides, padding, dn, **kw):
    return lax.conv_general_dilated(lhs, rhs, strides, padding, dimension_numbers=dn, **kw)


def _window(op, init):
    return lambda x, **kw: lax.reduce_window(x, init, op, **kw)


def _grad_inside(x):
    """A function that differentiates inside (a gradient penalty): its jaxpr holds add_any."""
    return jax.grad(lambda y: jnp.sum(jnp.sin(y) * y))(x) * x


@jax.custom_jvp
def _smooth(x):
    return jnp.log1p(jnp.exp(x))


_smooth.defjvp(lambda primals, tangents: (_smooth(primals[0]), jax.nn.sigmoid(primals[0]) * tangents[0]))


@jax.custom_vjp
def _clip_grad(x):
    return jnp.sin(x) * 2.0


_clip_grad.defvjp(lambda x: (_clip_grad(x), x), lambda x, g: (g * 2.0 * jnp.cos(x),))


def _gru_like(h0, xs, w):
    def step(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h * 2.0

    return lax.scan(step, h0, xs)


ROWS = [
    # elementwise, floats
    Row("exp", "exp", jnp.exp, (normal(3, 4),)),
    Row("log", "log", jnp.log, (positive(3, 4),)),
    Row("log1p", "log1p", jnp.log1p, (positive(3, 4),)),
    Row("expm1", "expm1", jnp.expm1, (normal(3, 4),)),
    Row("tanh", "tanh", jnp.tanh, (normal(3, 4),)),
    Row("logistic", "sigmoid", jax.nn.sigmoid, (normal(3, 4),)),
    Row("erf", "erf", lax.erf, (normal(3, 4),)),
    Row("erfc", "erfc", lax.erfc, (normal(3, 4),)),
    Row("erf_inv", "erf_inv", lax.erf_inv, (lambda rng: rng.uniform(-0.95, 0.95, (3, 4)),)),
    Row("rsqrt", "rsqrt", lax.rsqrt, (positive(3, 4),)),
    Row("sqrt", "sqrt", jnp.sqrt, (positive(3, 4),)),
    Row("sin", "sin", jnp.sin, (normal(3, 4),)),
    Row("cos", "cos", jnp.cos, (normal(3, 4),)),
    Row("tan", "tan", jnp.tan, (lambda rng: rng.uniform(-1.2, 1.2, (3, 4)),)),
    Row("atan", "atan", jnp.arctan, (normal(3, 4),)),
    Row("exp2", "exp2", jnp.exp2, (normal(3, 4),)),
    Row("abs", "abs", jnp.abs, (away(3, 4),)),
    Row("neg", "neg", jnp.negative, (normal(3, 4),)),
    Row("square", "square", jnp.square, (normal(3, 4),)),
    Row("sign", "sign times x", lambda x: jnp.sign(x) * x, (away(3, 4),)),
    Row("floor", "floor plus x", lambda x: jnp.floor(x) + x, (halves_away(3, 4),)),
    Row("ceil", "ceil plus x", lambda x: jnp.ceil(x) * x, (halves_away(3, 4),)),
    Row("round", "away from zero", lambda x: lax.round(x) + x, (halves_away(3, 4),)),
    Row("round", "to even (jnp.round)", lambda x: jnp.round(x) * x, (halves_away(3, 4),)),
    Row("round", "halves", lambda x: lax.round(x), (const([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5]),), grad=False),
    Row("is_finite", "where finite", lambda x: jnp.where(jnp.isfinite(x), x, 0.0),
        (const([1.0, np.inf, -2.0, np.nan, 0.5]),), grad=False),
    Row("integer_pow", "cube", lambda x: x ** 3, (normal(3, 4),)),
    Row("integer_pow", "inverse square", lambda x: lax.integer_pow(x, -2), (away(3, 4),)),
    Row("pow", "float exponent", lambda x, y: x ** y, (positive(3, 4), normal(3, 4))),
    Row("pow", "scalar exponent", lambda x: x ** 2.5, (positive(3, 4),)),
    Row("add", "broadcast", lambda x, y: x + y, (normal(3, 4), normal(4))),
    Row("sub", "sub", lambda x, y: x - y, (normal(3, 4), normal(3, 4))),
    Row("mul", "mul", lambda x, y: x * y, (normal(3, 4), normal(3, 4))),
    Row("div", "div", lambda x, y: x / y, (normal(3, 4), positive(3, 4))),
    Row("max", "max", jnp.maximum, (distinct(3, 4), distinct(3, 4, spacing=0.0371))),
    Row("min", "min", jnp.minimum, (distinct(3, 4), distinct(3, 4, spacing=0.0371))),
    Row("rem", "floats", lax.rem, (normal(3, 4), positive(3, 4, lo=0.7))),
    Row("rem", "jnp.mod", lambda x: jnp.mod(x, 1.5), (halves_away(3, 4),)),
    Row("add_any", "gradient inside", _grad_inside, (normal(3, 4),)),
    Row("clamp", "clamp", lambda x: lax.clamp(-0.5, x, 0.5), (lambda rng: rng.choice([-1, 1], (3, 4)) * rng.choice(
        [0.1, 0.3, 0.7, 1.2], (3, 4)),)),
    Row("select_n", "where", lambda x, y: jnp.where(x > y, x, y * 2.0), (distinct(3, 4), normal(3, 4))),
    Row("select_n", "three cases", lambda i, a, b, c: lax.select_n(i, a, b, c),
        (ints(0, 3, 3, 4), normal(3, 4), normal(3, 4), normal(3, 4))),
    Row("gt", "gt", lambda x, y: jnp.where(x > y, x, -y), (distinct(3, 4), distinct(3, 4, spacing=0.0371))),
    Row("lt", "lt", lambda x, y: jnp.where(x < y, x, -y), (distinct(3, 4), distinct(3, 4, spacing=0.0371))),
    Row("ge", "ge", lambda x, y: jnp.where(x >= y, x, -y), (distinct(3, 4), distinct(3, 4, spacing=0.0371))),
    Row("le", "le", lambda x, y: jnp.where(x <= y, x, -y), (distinct(3, 4), distinct(3, 4, spacing=0.0371))),
    Row("eq", "eq", lambda x: jnp.where(x == jnp.floor(x), x, 2.0 * x), (const([1.0, 1.5, -2.0, 0.25]),)),
    Row("ne", "ne (isnan)", lambda x: jnp.where(jnp.isnan(x), 0.0, x), (const([1.0, np.nan, -2.0]),), grad=False),
    Row("ge", "NaN compares false", lambda x: x >= 0.0, (const([1.0, np.nan, -2.0, 0.0]),), grad=False),
    # elementwise, integers and booleans: numpy, exactly
    Row("add", "int", lambda i, j: i + j, (ints(-5, 5, 3, 4), ints(-5, 5, 3, 4)), grad=False),
    Row("div", "int rounds towards zero", lambda i, j: lax.div(i, j), (ints(-9, 9, 3, 4), const([[3, -2, 4, -5]] * 3, np.int32)),
        grad=False),
    Row("rem", "int", lambda i, j: lax.rem(i, j), (ints(-9, 9, 3, 4), const([[3, -2, 4, -5]] * 3, np.int32)), grad=False),
    Row("pow", "int exponent", lambda x, i: lax.pow(x, i), (normal(5), ints(-2, 4, 5))),
    Row("max", "int", lambda i, j: jnp.maximum(i, j), (ints(-5, 5, 6), ints(-5, 5, 6)), grad=False),
    Row("abs", "int", jnp.abs, (ints(-5, 5, 6),), grad=False),
    Row("sign", "int", jnp.sign, (ints(-5, 5, 6),), grad=False),
    Row("and", "bool", jnp.logical_and, (bools(6), bools(6)), grad=False),
    Row("or", "int", jnp.bitwise_or, (ints(0, 16, 6), ints(0, 16, 6)), grad=False),
    Row("xor", "bool", jnp.logical_xor, (bools(6), bools(6)), grad=False),
    Row("not", "bool", jnp.logical_not, (bools(6),), grad=False),
    Row("not", "int", jnp.invert, (ints(-5, 5, 6),), grad=False),
    Row("shift_left", "uint32", lax.shift_left, (ints(0, 2**20, 6, dtype=np.uint32), const(np.array(
        [0, 1, 5, 31, 32, 40], np.uint32))), grad=False),
    Row("shift_right_logical", "int32", lax.shift_right_logical, (ints(-2**20, 2**20, 6), const(np.array(
        [0, 1, 5, 31, 32, 40], np.int32))), grad=False),
    Row("shift_right_arithmetic", "int32", lax.shift_right_arithmetic, (ints(-2**20, 2**20, 6), const(np.array(
        [0, 1, 5, 31, 32, 40], np.int32))), grad=False),
    Row("lt", "int", lambda i: i < 2, (ints(-5, 5, 6),), grad=False),
    # dtypes and constants
    # The run computes a float32 of the jaxpr in its own floats: values float32 holds exactly convert exactly (jax's
    # gradient through it is rounded to float32, the run's is not: no gradient row).
    Row("convert_element_type", "float32 and back", lambda x: x.astype(jnp.float32).astype(jnp.float64) * x,
        (lambda rng: rng.standard_normal((3, 4)).astype(np.float32).astype(np.float64),), grad=False),
    Row("convert_element_type", "float to int", lambda x: x.astype(jnp.int32), (normal(3, 4),), grad=False),
    Row("convert_element_type", "int and bool to float", lambda i, x: i.astype(jnp.float64) * x + (x > 0),
        (ints(-3, 3, 3, 4), away(3, 4))),
    Row("bitcast_convert_type", "uint32 bits as float32", lambda u: lax.bitcast_convert_type(u, jnp.float32),
        (ints(0x3F000000, 0x40000000, 6, dtype=np.uint32),), grad=False),
    Row("bitcast_convert_type", "float64 bits", lambda x: lax.bitcast_convert_type(x, jnp.uint64), (normal(6),),
        grad=False),
    Row("iota", "float", lambda x: x * lax.iota(jnp.float64, 4), (normal(3, 4),)),
    Row("iota", "int, broadcast", lambda x: lax.broadcasted_iota(jnp.int32, (3, 4), 1) + x.astype(jnp.int32),
        (normal(3, 4),), grad=False),
    Row("random_wrap", "key data wrapped and unwrapped", lambda k: jax.random.key_data(jax.random.wrap_key_data(k)),
        (const(np.array([0, 42], np.uint32)),), grad=False),
    Row("random_unwrap", "an array of keys", lambda k: jax.random.key_data(jax.random.wrap_key_data(k)),
        (const(np.array([[0, 42], [7, 9]], np.uint32)),), grad=False),
    Row("stop_gradient", "stop_gradient", lambda x: x * lax.stop_gradient(x), (normal(3, 4),)),
    Row("copy", "jnp.copy", lambda x: jnp.copy(x) * x, (normal(3, 4),)),
    Row("sharding_constraint", "one device", lambda x: lax.with_sharding_constraint(
        x, jax.sharding.SingleDeviceSharding(jax.devices()[0])) * x, (normal(3, 4),)),
    Row("device_put", "device_put", lambda x: jax.device_put(x) * 2.0, (normal(3, 4),)),
    Row("optimization_barrier", "two values", lambda x, y: sum(lax.optimization_barrier((x, y))),
        (normal(3, 4), normal(3, 4))),
    # shapes
    Row("broadcast_in_dim", "outer", lambda x, y: x[:, None] * y[None, :], (normal(3), normal(4))),
    Row("reshape", "reshape", lambda x: x.reshape(2, 6) * 2.0, (normal(3, 4),)),
    Row("transpose", "transpose", lambda x: jnp.transpose(x, (2, 0, 1)), (normal(2, 3, 4),)),
    Row("squeeze", "squeeze", lambda x: jnp.squeeze(x, (0, 2)), (normal(1, 3, 1, 4),)),
    Row("rev", "flip", lambda x: jnp.flip(x, (0, 1)), (normal(3, 4),)),
    Row("concatenate", "with a constant", lambda x, y: jnp.concatenate([x, y, jnp.ones((3, 1))], axis=1),
        (normal(3, 4), normal(3, 2))),
    Row("stack", "stack", lambda x, y: jnp.stack([x, y], axis=1), (normal(3, 4), normal(3, 4))),
    Row("unstack", "unstack", lambda x: jnp.unstack(x, axis=1)[2] * 2.0, (normal(3, 4),)),
    Row("split", "split", lambda x: jnp.split(x, [1, 3], axis=1)[1], (normal(3, 4),)),
    Row("tile", "tile", lambda x: jnp.tile(x, (2, 1, 3)), (normal(3, 4),)),
    Row("slice", "strided", lambda x: x[1:, ::2], (normal(3, 5),)),
    Row("dynamic_slice", "in range", lambda x, i: lax.dynamic_slice(x, (i, 1), (2, 2)), (normal(4, 4), const(1))),
    Row("dynamic_slice", "clamped", lambda x, i: lax.dynamic_slice(x, (i, -3), (2, 2)), (normal(4, 4), const(7))),
    Row("dynamic_update_slice", "clamped", lambda x, u, i: lax.dynamic_update_slice(x, u, (i, 1)),
        (normal(4, 4), normal(2, 2), const(5))),
    Row("pad", "edges, crop and interior", lambda x: lax.pad(x, 0.5, [(1, -1, 2), (2, 0, 0)]), (normal(3, 4),)),
    Row("pad", "-inf", lambda x: jnp.max(lax.pad(x, -jnp.inf, [(1, 1, 0), (0, 2, 1)]), axis=0), (distinct(3, 4),)),
    Row("pad", "a differentiated value", lambda x, v: lax.pad(x, v, [(1, 0, 1), (0, 1, 0)]),
        (normal(3, 4), normal())),
    # gather and scatter
    Row("gather", "embedding rows", lambda w, i: jnp.take(w, i, axis=0), (normal(6, 3), ints(0, 6, 2, 4))),
    Row("gather", "x[ids, 1:3]", lambda x, i: x[i, 1:3], (normal(5, 4), ints(-5, 5, 3))),
    Row("gather", "take_along_axis", lambda x, i: jnp.take_along_axis(x, i, axis=1), (normal(3, 4), ints(0, 4, 3, 2))),
    Row("gather", "points", lambda x, i, j: x[i, j], (normal(5, 4), ints(0, 5, 6), ints(0, 4, 6))),
    Row("gather", "fill out of bounds", lambda x, i: jnp.take(x, i, axis=0, mode="fill", fill_value=-1.0),
        (normal(5, 3), const([0, 7, 2, -9]))),
    Row("gather", "clip", lambda x, i: jnp.take(x, i, axis=1, mode="clip"), (normal(3, 5), const([0, 7, 2, -9]))),
    Row("gather", "int operand", lambda x, i: x[i], (ints(0, 9, 5), ints(0, 5, 3)), grad=False),
    Row("scatter-add", "repeated", lambda x, u, i: x.at[i].add(u), (normal(5, 3), normal(4, 3), const([0, 3, 3, 0]))),
    Row("scatter-add", "dropped out of bounds", lambda x, u, i: x.at[i].add(u),
        (normal(5, 3), normal(3, 3), const([1, 9, 4]))),
    Row("scatter-add", "points", lambda x, u, i, j: x.at[i, j].add(u),
        (normal(4, 4), normal(5), const([0, 1, 1, 3, 0]), const([2, 2, 2, 0, 2]))),
    Row("scatter-sub", "subtract", lambda x, u, i: x.at[i].subtract(u), (normal(5, 3), normal(2, 3), const([4, 1]))),
    Row("scatter", "set", lambda x, u, i: x.at[i].set(u), (normal(5, 3), normal(2, 3), const([4, 1]))),
    Row("scatter", "the same value twice", lambda x, i: x.at[i].set(2.0), (normal(5, 3), const([4, 1, 4]))),
    # reductions
    Row("reduce_sum", "two axes", lambda x: jnp.sum(x, axis=(0, 2)), (normal(2, 3, 4),)),
    Row("reduce_sum", "int", lambda i: jnp.sum(i, axis=1), (ints(-5, 5, 3, 4),), grad=False),
    Row("reduce_max", "reduce_max", lambda x: jnp.max(x, axis=1), (distinct(3, 4),)),
    Row("reduce_min", "reduce_min", lambda x: jnp.min(x, axis=(0, 1)), (distinct(3, 4),)),
    Row("reduce_prod", "reduce_prod", lambda x: jnp.prod(x, axis=0), (normal(3, 4),)),
    Row("reduce_and", "all", lambda b: jnp.all(b, axis=0), (bools(3, 4),), grad=False),
    Row("reduce_or", "any", lambda b: jnp.any(b, axis=1), (bools(3, 4),), grad=False),
    Row("reduce_xor", "xor", lambda b: lax.reduce(b, False, lax.bitwise_xor, (0,)), (bools(3, 4),), grad=False),
    Row("argmax", "argmax picks", lambda x: jnp.take_along_axis(x, jnp.argmax(x, axis=1)[:, None], axis=1),
        (distinct(3, 4),)),
    Row("argmin", "argmin", lambda x: jnp.argmin(x, axis=0), (distinct(3, 4),), grad=False),
    Row("psum", "vmap's", lambda x: jax.vmap(lambda v: v - lax.pmean(v, "b"), axis_name="b")(x), (normal(4, 3),)),
    Row("pmax", "vmap's", lambda x: jax.vmap(lambda v: lax.pmax(v, "b"), axis_name="b")(x), (distinct(4, 3),),
        grad=False),
    Row("pmin", "vmap's", lambda x: jax.vmap(lambda v: lax.pmin(v, "b"), axis_name="b")(x), (distinct(4, 3),),
        grad=False),
    # cumulative
    Row("cumsum", "cumsum", lambda x: jnp.cumsum(x, axis=1), (normal(3, 4),)),
    Row("cumsum", "reverse", lambda x: lax.cumsum(x, axis=0, reverse=True), (normal(3, 4),)),
    Row("cumsum", "int", lambda i: jnp.cumsum(i, axis=0), (ints(-5, 5, 3, 4),), grad=False),
    Row("cumprod", "with a zero", lambda x: lax.cumprod(x.at[1, 1].set(0.0), axis=1), (normal(3, 4),)),
    Row("cumprod", "reverse", lambda x: lax.cumprod(x, axis=0, reverse=True), (normal(3, 4),)),
    Row("cummax", "cummax", lambda x: lax.cummax(x, axis=1), (distinct(3, 5),)),
    Row("cummin", "reverse", lambda x: lax.cummin(x, axis=1, reverse=True), (distinct(3, 5),)),
    Row("cumlogsumexp", "cumlogsumexp", lambda x: lax.cumlogsumexp(x, axis=1), (normal(3, 4),)),
    # sorting
    Row("sort", "jnp.sort", lambda x: jnp.sort(x, axis=1), (distinct(3, 5),)),
    Row("sort", "by a key", lambda x, y: lax.sort((x, y), num_keys=1)[1], (distinct(3, 5), normal(3, 5))),
    Row("sort", "two keys with ties", lambda i, j, y: lax.sort((i, j, y), num_keys=2)[2],
        (ints(0, 2, 8), ints(0, 3, 8), normal(8))),
    Row("sort", "argsort", lambda x: jnp.argsort(x, axis=0), (distinct(4, 3),), grad=False),
    Row("sort", "-0.0 ties with 0.0, NaN last", lambda x: lax.sort((x, lax.iota(jnp.int32, 7)), num_keys=1)[1],
        (const([0.0, -0.0, 1.0, -0.0, np.nan, -np.nan, -1.0]),), grad=False),
    Row("top_k", "values", lambda x: lax.top_k(x, 2)[0], (distinct(3, 5),)),
    Row("top_k", "indices", lambda x: lax.top_k(x, 3)[1], (distinct(3, 5),), grad=False),
    # contractions
    Row("dot_general", "Dense: x @ kernel", lambda x, w: x @ w, (normal(2, 3, 4), normal(4, 5))),
    Row("dot_general", "x @ w.T (linear)", _dot_t, (normal(2, 4), normal(5, 4))),
    Row("dot_general", "batched matmul", jnp.matmul, (normal(2, 3, 4), normal(2, 4, 5))),
    Row("dot_general", "attention scores", lambda q, k: jnp.einsum("bqhd,bkhd->bhqk", q, k),
        (normal(2, 3, 2, 4), normal(2, 5, 2, 4))),
    Row("dot_general", "vector", lambda v, w: (v @ w, w @ jnp.ones(5) * v.sum()), (normal(4), normal(4, 5))),
    Row("dot_general", "int", lambda i, j: i @ j, (ints(-3, 3, 2, 3), ints(-3, 3, 3, 2)), grad=False),
    # convolutions
    Row("conv_general_dilated", "flax NHWC SAME", lambda x, w: _conv(x, w, (1, 1), "SAME", ("NHWC", "HWIO", "NHWC")),
        (normal(2, 5, 5, 3), normal(3, 3, 3, 4))),
    Row("conv_general_dilated", "NCHW stride 2 VALID", lambda x, w: _conv(x, w, (2, 2), "VALID", ("NCHW", "OIHW", "NCHW")),
        (normal(2, 3, 7, 6), normal(4, 3, 3, 2))),
    Row("conv_general_dilated", "groups, rhs dilation", lambda x, w: _conv(
        x, w, (1, 1), ((2, 2), (1, 1)), ("NCHW", "OIHW", "NCHW"), rhs_dilation=(2, 1), feature_group_count=2),
        (normal(1, 4, 6, 6), normal(6, 2, 3, 3))),
    Row("conv_general_dilated", "1-d", lambda x, w: _conv(x, w, (1,), ((1, 1),), ("NWC", "WIO", "NWC")),
        (normal(2, 7, 3), normal(3, 3, 2))),
    Row("conv_general_dilated", "asymmetric padding", lambda x, w: _conv(
        x, w, (2, 1), ((0, 1), (2, -1)), ("NCHW", "OIHW", "NCHW")), (normal(1, 2, 6, 6), normal(3, 2, 2, 3))),
    Row("conv_general_dilated", "ConvTranspose SAME (torch's transposed conv)", lambda x, w: lax.conv_transpose(
        x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")), (normal(1, 4, 4, 2), normal(3, 3, 2, 3))),
    Row("conv_general_dilated", "ConvTranspose VALID, grouped", lambda x, w: _conv(
        x, w, (1, 1), ((2, 2), (1, 1)), ("NCHW", "OIHW", "NCHW"), lhs_dilation=(2, 3), feature_group_count=2),
        (normal(1, 4, 3, 3), normal(4, 2, 3, 2))),
    Row("conv_general_dilated", "lhs dilation and stride (dilated input)", lambda x, w: _conv(
        x, w, (2, 1), ((1, 0), (0, 0)), ("NCHW", "OIHW", "NCHW"), lhs_dilation=(2, 2)),
        (normal(1, 2, 4, 4), normal(3, 2, 2, 2))),
    # windows
    Row("reduce_window_sum", "flax avg_pool", lambda x: _window(lax.add, 0.0)(
        x, window_dimensions=(1, 2, 2, 1), window_strides=(1, 2, 2, 1), padding="VALID") / 4.0, (normal(2, 6, 6, 3),)),
    Row("reduce_window_sum", "SAME padding", lambda x: _window(lax.add, 0.0)(
        x, window_dimensions=(1, 1, 3, 3), window_strides=(1, 1, 2, 1), padding="SAME"), (normal(2, 3, 5, 5),)),
    Row("reduce_window_max", "flax max_pool", lambda x: _window(lax.max, -jnp.inf)(
        x, window_dimensions=(1, 2, 2, 1), window_strides=(1, 2, 2, 1), padding="VALID"), (distinct(2, 6, 6, 3),)),
    Row("reduce_window_max", "SAME stride 1", lambda x: _window(lax.max, -jnp.inf)(
        x, window_dimensions=(1, 3, 3, 1), window_strides=(1, 1, 1, 1), padding="SAME"), (distinct(1, 5, 5, 2),)),
    Row("reduce_window_max", "1-d", lambda x: _window(lax.max, -jnp.inf)(
        x, window_dimensions=(1, 3), window_strides=(1, 2), padding=((1, 1), (1, 1))), (distinct(3, 7),)),
    Row("reduce_window_max", "three axes (taps)", lambda x: _window(lax.max, -jnp.inf)(
        x, window_dimensions=(2, 2, 2), window_strides=(1, 2, 1), padding="VALID"), (distinct(3, 4, 4),)),
    # jax has no VJP for a max pool with window dilation: the forward alone.
    Row("reduce_window_max", "window dilation (taps)", lambda x: _window(lax.max, -jnp.inf)(
        x, window_dimensions=(1, 2, 2), window_strides=(1, 1, 1), padding="VALID", window_dilation=(1, 2, 2)),
        (distinct(2, 5, 5),), grad=False),
    Row("reduce_window_sum", "window dilation (taps)", lambda x: _window(lax.add, 0.0)(
        x, window_dimensions=(1, 2, 2), window_strides=(1, 2, 1), padding="VALID", window_dilation=(1, 2, 2)),
        (normal(2, 5, 5),)),
    Row("reduce_window_sum", "base dilation", lambda x: _window(lax.add, 0.0)(
        x, window_dimensions=(1, 2, 2), window_strides=(1, 1, 1), padding="VALID", base_dilation=(1, 2, 2)),
        (normal(2, 3, 3),)),
    Row("reduce_window_min", "min pool", lambda x: _window(lax.min, jnp.inf)(
        x, window_dimensions=(1, 2, 2), window_strides=(1, 2, 2), padding="VALID"), (distinct(2, 4, 4),)),
    # higher-order primitives
    Row("jit", "nested", lambda x: jax.jit(lambda y: jax.jit(jnp.sin)(y) * y)(x), (normal(3, 4),)),
    Row("custom_jvp_call", "a custom_jvp", _smooth, (normal(3, 4),)),
    Row("custom_jvp_call", "jax.nn.relu", jax.nn.relu, (away(3, 4),)),
    Row("custom_vjp_call", "a correct custom_vjp", _clip_grad, (normal(3, 4),)),
    Row("remat2", "jax.checkpoint", jax.checkpoint(lambda x: jnp.sin(jnp.sin(x)) * x), (normal(3, 4),)),
    Row("scan", "a recurrence", _gru_like, (normal(3), normal(5, 3), normal(3, 3))),
    Row("scan", "reverse", lambda xs: lax.scan(lambda c, x: (c * x + 1.0, c), jnp.ones(2), xs, reverse=True),
        (normal(4, 2),)),
    Row("scan", "no steps", lambda c, xs: lax.scan(lambda c, x: (c + x, c * x), c, xs), (normal(2), normal(0, 2))),
    Row("while", "a counter", lambda x: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.sin(c[1]) * 1.5),
                                                       (0, x))[1], (normal(3, 4),), grad=False),
    Row("while", "a trip count from the values", lambda x: lax.while_loop(
        lambda c: jnp.sum(jnp.abs(c)) < 50.0, lambda c: c * 1.7, x), (positive(3, 4),), grad=False),
    Row("cond", "lax.cond", lambda p, x: lax.cond(p > 0, jnp.sin, lambda y: jnp.cos(y) * 2.0, x),
        (normal(), normal(3, 4))),
    Row("cond", "lax.switch", lambda i, x: lax.switch(i, [jnp.sin, jnp.cos, jnp.tanh], x), (ints(0, 3), normal(3, 4))),
]

# Higher-order primitives' names of other jax versions (pjit: before 0.4.36's jit; checkpoint, remat: remat2's),
# and call primitives no public jax 0.10 function makes: interpreted by the same handler as a row's.
NOT_MADE_BY_JAX_0_10 = {"pjit", "checkpoint", "remat", "closed_call", "core_call", "custom_vjp_call_jaxpr"}


def _primitives(jaxpr, found=None) -> set[str]:
    found = set() if found is None else found
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        found.add(eqn.primitive.name)
        for sub in jcore.jaxprs_in_params(eqn.params):
            _primitives(sub, found)
    return found


def _draw(row: Row, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.asarray(d(rng)) for d in row.args]


_TRACED: dict = {}


def _traced(row: Row, args):
    """The row's jaxpr (traced once: it depends on shapes and dtypes only)."""
    if row.id not in _TRACED:
        _TRACED[row.id] = jax.make_jaxpr(row.fn)(*args)
    return _TRACED[row.id]


def _outputs(fn, args) -> list[np.ndarray]:
    """The user's function as jax runs it (on jax arrays: ``x.at[...]`` is theirs)."""
    return [np.asarray(v) for v in jax.tree_util.tree_leaves(fn(*_on_jax(args)))]


def _on_jax(args) -> list:
    return [a if isinstance(a, jax.Array) else jnp.asarray(a) for a in args]


def _is_float(a) -> bool:
    dt = getattr(a, "dtype", None)
    dt = np.asarray(a).dtype if dt is None else dt
    return not jax.dtypes.issubdtype(dt, jax.dtypes.prng_key) and np.dtype(dt).kind == "f"


# ---------------------------------------------------------------- forward
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_lowering_agrees_with_jax(row):
    args = _draw(row, 0)
    cj = _traced(row, args)
    assert row.prim in _primitives(cj), f"the row for {row.prim} traces to {sorted(_primitives(cj))}"
    assert interpreter.verify(cj, args) == {}
    want = _outputs(row.fn, args)
    got = interpreter.run(cj, args, np.float64)
    assert len(got) == len(want)
    for w, g in zip(want, got):
        g = np.asarray(g)
        # A float output is the run's float, or the narrower one the jaxpr casts to, as jax's own is (run_float).
        assert g.shape == w.shape and g.dtype == (w.dtype if not _is_float(w) else primitives.run_float(w.dtype, np.float64)), \
            (g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, **FORWARD, err_msg=f"{row.id}: the numpy run against jax")


@pytest.mark.parametrize("row", [r for r in ROWS if r.grad or any(_is_float(a) for a in _draw(r, 0))],
                         ids=lambda r: r.id)
def test_float32_run_is_float32(row):
    """The same jaxpr run in float32: every float output float32, measured against the float64 run."""
    args = _draw(row, 0)
    cj = _traced(row, args)
    want = interpreter.run(cj, args, np.float64)
    got = interpreter.run(cj, [a.astype(np.float32) if _is_float(a) else a for a in args], np.float32)
    for w, g in zip(want, got):
        g = np.asarray(g)
        assert g.dtype == (np.float32 if _is_float(w) else np.asarray(w).dtype)
        if _is_float(w) and row.grad:  # a step's float32 output may land on the other side of it
            np.testing.assert_allclose(g, w, **FLOAT32)


# ---------------------------------------------------------------- gradients
def _float_args(args) -> list[int]:
    return [k for k, a in enumerate(args) if _is_float(a)]


def _check_gradients(fn, cj, args, seed, known=None, what=""):
    """jax.grad of <r, fn(args)> against the tape's and torch's gradients of <r, run(jaxpr)>, r random."""
    rng = np.random.default_rng(1000 + seed)
    outs = _outputs(fn, args)
    picked = [k for k, v in enumerate(outs) if _is_float(v)]
    cotangents = {k: rng.standard_normal(outs[k].shape) for k in picked}
    floats = _float_args(args)

    def jax_loss(*xs):
        full = _on_jax(args)
        for k, x in zip(floats, xs):
            full[k] = x
        values = jax.tree_util.tree_leaves(fn(*full))
        return sum(jnp.sum(values[k] * r) for k, r in cotangents.items())

    expected = jax.grad(jax_loss, argnums=tuple(range(len(floats))))(*[args[k] for k in floats])

    def loss(*xs):
        values = interpreter.run(cj, list(xs), np.float64, known)
        total = None
        for k, r in cotangents.items():
            term = ops.sum(ops.mul(values[k], r))
            total = term if total is None else ops.add(total, term)
        return total

    # Rounding is relative to the terms a gradient sums, which are of the size of the largest gradient.
    scale = max((float(np.max(np.abs(np.asarray(e)), initial=0.0)) for e in expected), default=0.0)
    for backend in BACKENDS:
        grads = gradcheck.gradient(loss, *args, backend=backend)
        for k, e in zip(floats, expected):
            np.testing.assert_allclose(grads[k], np.asarray(e), rtol=GRAD["rtol"], atol=GRAD["atol"] * max(scale, 1.0),
                                       err_msg=f"{what}: {backend}'s gradient of input {k} against jax.grad")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("row", [r for r in ROWS if r.grad], ids=lambda r: r.id)
def test_gradient_agrees_with_jax(row, seed):
    args = _draw(row, seed)
    _check_gradients(row.fn, _traced(row, args), args, seed, what=row.id)


def test_every_lowering_and_higher_order_primitive_has_a_row():
    rows = {r.prim for r in ROWS}
    assert set(primitives.LOWERINGS) - rows == set()
    assert set(interpreter.HIGHER) - rows - NOT_MADE_BY_JAX_0_10 == set()


# ---------------------------------------------------------------- the higher-order primitives' semantics
def test_custom_vjp_runs_the_primal_body_and_jax_the_rule():
    """A custom_vjp whose backward is wrong: jax.grad follows the rule, the tape and torch the primal math."""

    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (g * jnp.cos(x) * (1 + 1e-3),))
    x = np.random.default_rng(0).standard_normal(5)
    cj = jax.make_jaxpr(f)(x)
    assert "custom_vjp_call" in _primitives(cj)
    loss = lambda y: ops.sum(interpreter.run(cj, [y], np.float64)[0])
    rule = np.asarray(jax.grad(lambda y: jnp.sum(f(y)))(x))
    for backend in BACKENDS:
        (g,) = gradcheck.gradient(loss, x, backend=backend)
        np.testing.assert_allclose(g, np.cos(x), **GRAD)  # the primal's derivative
        np.testing.assert_allclose(rule, np.cos(x) * (1 + 1e-3), **GRAD)  # jax's, the wrong rule's


def test_while_runs_as_many_steps_as_the_concrete_values_say():
    body = lambda c: (c[0] + 1, c[1] * 1.5)
    fn = lambda x: lax.while_loop(lambda c: jnp.sum(c[1]) < 10.0, body, (0, x))
    for x in (np.full(2, 0.5), np.full(2, 3.0)):
        cj = jax.make_jaxpr(fn)(x)
        steps, value = interpreter.run(cj, [x], np.float64)
        want_steps, want_value = fn(x)
        assert int(steps) == int(want_steps)
        np.testing.assert_allclose(value, want_value, **FORWARD)
    # On the tape the condition reads the tape's values: the gradient is that of the steps taken.
    x = np.full(2, 0.5)
    cj = jax.make_jaxpr(fn)(x)
    (g,) = gradcheck.gradient(lambda y: ops.sum(interpreter.run(cj, [y], np.float64)[1]), x, backend="tape")
    np.testing.assert_allclose(g, np.full(2, 1.5 ** int(fn(x)[0])), **GRAD)


@pytest.mark.parametrize("p", [1.0, -1.0])
def test_cond_runs_the_branch_its_predicate_picks(p):
    fn = lambda p, x: lax.cond(p > 0, lambda y: jnp.sin(y) * 3.0, jnp.cos, x)
    x = np.random.default_rng(0).standard_normal(4)
    cj = jax.make_jaxpr(fn)(np.asarray(p), x)
    (out,) = interpreter.run(cj, [np.asarray(p), x], np.float64)
    np.testing.assert_allclose(out, np.sin(x) * 3.0 if p > 0 else np.cos(x), **FORWARD)
    _check_gradients(fn, cj, [np.asarray(p), x], 0, what="cond")


def test_remat_and_jit_are_run_through():
    fn = jax.jit(jax.checkpoint(lambda x, w: jnp.tanh(x @ w) @ w.T))
    args = [np.random.default_rng(1).standard_normal(s) for s in ((2, 3), (3, 3))]
    cj = jax.make_jaxpr(fn)(*args)
    assert {"jit", "remat2"} <= _primitives(cj)
    assert interpreter.verify(cj, args) == {}
    _check_gradients(fn, cj, args, 0, what="jit of remat")


def test_scan_is_unrolled_step_by_step():
    cj = jax.make_jaxpr(_gru_like)(np.zeros(3), np.zeros((5, 3)), np.zeros((3, 3)))
    args = _draw(next(r for r in ROWS if r.fn is _gru_like), 3)
    h, ys = interpreter.run(cj, args, np.float64)
    want_h, want_ys = _gru_like(*args)
    np.testing.assert_allclose(h, want_h, **FORWARD)
    np.testing.assert_allclose(ys, want_ys, **FORWARD)


# ---------------------------------------------------------------- the constant part: jax's own random draws
def _dropout(x, key_data, rate=0.4):
    key = jax.random.wrap_key_data(key_data)
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0) * x


def _key(seed: int = 0) -> np.ndarray:
    return np.asarray(jax.random.key_data(jax.random.key(seed)))


def test_constant_part_is_the_key_dependent_part():
    x, key = np.ones((4, 5)), _key(3)
    cj = jax.make_jaxpr(_dropout)(x, key)
    keyvar = cj.jaxpr.invars[1]
    part = interpreter.constant_part(cj, [keyvar])
    outputs = {v for eqn in cj.jaxpr.eqns for v in eqn.outvars}
    assert part and part < outputs
    # Everything computed from x is outside it; the mask (a bool made from the key alone) is inside.
    xvar = cj.jaxpr.invars[0]
    depends_on_x = {xvar}
    for eqn in cj.jaxpr.eqns:
        if any(v in depends_on_x for v in eqn.invars if isinstance(v, jcore.Var)):
            depends_on_x.update(eqn.outvars)
    assert not part & depends_on_x
    assert any(v.aval.dtype == np.bool_ for v in part)
    known = interpreter.evaluate_constants(cj, {keyvar: key})
    assert set(k for k in known if not isinstance(k, tuple)) <= part


@pytest.mark.parametrize("seed", SEEDS)
def test_dropout_masks_are_jaxs_on_every_backend(seed):
    rng = np.random.default_rng(seed)
    x, key = rng.standard_normal((6, 5)), _key(seed)
    cj = jax.make_jaxpr(_dropout)(x, key)
    keyvar = cj.jaxpr.invars[1]
    known = interpreter.evaluate_constants(cj, {keyvar: key})
    mask = np.asarray(jax.random.bernoulli(jax.random.wrap_key_data(key), 0.6, x.shape))
    (masks,) = [v for v in known.values() if v.dtype == np.bool_]
    np.testing.assert_array_equal(masks, mask)
    (out,) = interpreter.run(cj, [x, key], np.float64, known)
    np.testing.assert_allclose(out, np.asarray(_dropout(x, key)), **FORWARD)
    np.testing.assert_array_equal(out == 0, ~mask)
    assert interpreter.verify(cj, [x, key], known) == {}
    fn = lambda x: _dropout(x, key)  # the key closed over: a constant of the jaxpr
    cj = jax.make_jaxpr(fn)(x)
    _check_gradients(fn, cj, [x], seed, known=interpreter.evaluate_constants(cj, {}), what="dropout")


def _scan_dropout(x, key_data):
    """A mask drawn in every step of a scan from a key split per step: constants inside a higher-order primitive."""
    keys = jax.random.split(jax.random.wrap_key_data(key_data), x.shape[0])

    def step(h, inputs):
        row, k = inputs
        keep = jax.random.bernoulli(k, 0.5, row.shape)
        h = jnp.tanh(h + jnp.where(keep, row, 0.0))
        return h, h

    return lax.scan(step, jnp.zeros(x.shape[1]), (x, keys))


def test_masks_drawn_inside_a_scan_are_known_per_step():
    rng = np.random.default_rng(0)
    x, key = rng.standard_normal((4, 6)), _key(5)
    cj = jax.make_jaxpr(_scan_dropout)(x, key)
    known = interpreter.evaluate_constants(cj, {cj.jaxpr.invars[1]: key})
    sites = {k[0] for k in known if isinstance(k, tuple)}
    assert len(sites) == 4  # one site per step of the scan
    for out, want in zip(interpreter.run(cj, [x, key], np.float64, known), _scan_dropout(x, key)):
        np.testing.assert_allclose(out, np.asarray(want), **FORWARD)
    assert interpreter.verify(cj, [x, key], known) == {}
    fn = lambda x: _scan_dropout(x, key)
    cj = jax.make_jaxpr(fn)(x)
    _check_gradients(fn, cj, [x], 0, known=interpreter.evaluate_constants(cj, {}), what="scan dropout")


# ---------------------------------------------------------------- negative controls
def _named(x, y):
    with jax.named_scope("encoder"):
        return jnp.sin(x) * y  # the line verify must name


def test_a_wrong_lowering_is_caught_naming_primitive_line_and_module(monkeypatch):
    args = [np.random.default_rng(0).standard_normal(4), np.ones(4)]
    cj = jax.make_jaxpr(_named)(*args)
    monkeypatch.setitem(primitives.LOWERINGS, "sin", lambda ctx, x, **_: ops.cos(x))
    problems = interpreter.verify(cj, args)
    (key,) = problems
    line = inspect.getsourcelines(_named)[1] + 2
    assert "sin" in key
    assert re.search(rf"test_jax_primitives\.py:{line}\b", problems[key]), problems[key]
    assert "encoder" in problems[key] and "disagrees with jax" in problems[key]


def test_a_wrong_lowering_inside_a_scan_is_named_with_its_step(monkeypatch):
    args = _draw(next(r for r in ROWS if r.fn is _gru_like), 0)
    cj = jax.make_jaxpr(_gru_like)(*args)
    monkeypatch.setitem(primitives.LOWERINGS, "tanh", lambda ctx, x, **_: ops.mul(ops.tanh(x), 1.0 + 1e-6))
    (key, why), = interpreter.verify(cj, args).items()
    assert key.endswith(":tanh") and ":scan/" in key
    assert "step 0 of the scan" in why and "_gru_like" in why


def test_a_lowering_that_raises_is_reported_as_a_bug(monkeypatch):
    args = [np.ones(3)]
    cj = jax.make_jaxpr(jnp.exp)(*args)
    monkeypatch.setitem(primitives.LOWERINGS, "exp", lambda ctx, x, **_: 1 / 0)
    (why,) = interpreter.verify(cj, args).values()
    assert "raised ZeroDivisionError" in why and "bug in gradcheck/frontends/jax/primitives.py" in why


def _make_primitive(name):
    from jax.interpreters import ad

    prim = jcore.Primitive(name)
    prim.def_impl(lambda x: x * x * x)
    prim.def_abstract_eval(lambda x: x)
    ad.defjvp(prim, lambda g, x: 3.0 * x * x * g)
    return prim


def test_an_unknown_primitive_names_itself_its_line_and_the_decorator(monkeypatch):
    cube = _make_primitive("gc_test_cube")
    fn = lambda x: cube.bind(x) + 1.0  # the line the error must name
    line = inspect.getsourcelines(test_an_unknown_primitive_names_itself_its_line_and_the_decorator)[1] + 2
    x = np.array([0.5, -1.5, 2.0])
    cj = jax.make_jaxpr(fn)(x)
    with pytest.raises(primitives.LoweringError) as info:
        interpreter.run(cj, [x], np.float64)
    message = str(info.value)
    assert "'gc_test_cube'" in message and "@gradcheck.frontends.jax.lowering('gc_test_cube')" in message
    assert re.search(rf"test_jax_primitives\.py:{line}\b", message), message
    assert "gc_test_cube" in next(iter(interpreter.verify(cj, [x]).values()))
    # The decorator lowers it: run, verify and the gradients then agree with jax.
    monkeypatch.setitem(primitives.LOWERINGS, "gc_test_cube", None)  # taken out again after the test

    @primitives.lowering("gc_test_cube")
    def _cube(x):
        return ops.mul(ops.mul(x, x), x)

    assert interpreter.verify(cj, [x]) == {}
    _check_gradients(fn, cj, [x], 0, what="a lowering registered with the decorator")


def test_a_random_draw_without_its_constants_says_how_to_give_them():
    x, key = np.ones((2, 3)), _key(0)
    cj = jax.make_jaxpr(_dropout)(x, key)
    with pytest.raises(primitives.LoweringError, match=r"random_bits .*evaluate_constants"):
        interpreter.run(cj, [x, key], np.float64)


def test_a_collective_over_a_named_axis_is_refused_by_name():
    ctx = primitives.Context(np.float64)
    with pytest.raises(primitives.LoweringError, match=r"psum with the named axes \['i'\]"):
        primitives.LOWERINGS["psum"](ctx, np.ones(3), axes=("i",))


# ---------------------------------------------------------------- real losses
# The models of flax.linen, flax.nnx and equinox are checked end to end, through from_jax, in test_from_jax.py;
# here, optax's losses, as a model's last equations.
def _optax_cases():
    optax = pytest.importorskip("optax")
    rng = np.random.default_rng(3)
    labels = np.array([0, 2, 1])
    return {
        "optax softmax_cross_entropy": (lambda z, y: optax.softmax_cross_entropy(z, y),
                                        [rng.standard_normal((3, 4)), np.eye(4)[labels] * 0.9 + 0.025]),
        "optax with integer labels": (lambda z, y: optax.softmax_cross_entropy_with_integer_labels(z, y),
                                      [rng.standard_normal((3, 4)), labels.astype(np.int32)]),
        "optax l2_loss": (lambda a, b: optax.l2_loss(a, b), [rng.standard_normal(5), rng.standard_normal(5)]),
        "optax sigmoid_binary_cross_entropy": (lambda z, y: optax.sigmoid_binary_cross_entropy(z, y),
                                               [rng.standard_normal(5), rng.uniform(size=5)]),
    }


MODELS = ["optax softmax_cross_entropy", "optax with integer labels", "optax l2_loss",
          "optax sigmoid_binary_cross_entropy"]


@pytest.fixture(scope="module")
def model_cases():
    return _optax_cases()


@pytest.mark.parametrize("name", MODELS)
def test_real_losses_agree_on_every_backend(model_cases, name):
    """A loss as optax writes it: every equation lowered and verified, the outputs jax's, and the gradients of
    every float leaf the tape's and torch's as jax's."""
    pytest.importorskip("torch")
    fn, args = model_cases[name]
    cj = jax.make_jaxpr(fn)(*args)
    const_invars = {v: a for v, a in zip(cj.jaxpr.invars, args) if not _is_float(a)}
    known = interpreter.evaluate_constants(cj, const_invars)
    assert interpreter.verify(cj, args, known) == {}
    want = _outputs(fn, args)
    got = interpreter.run(cj, args, np.float64, known)
    for w, g in zip(want, got):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-10, atol=1e-12, err_msg=name)
    fixed = {k: a for k, a in enumerate(args) if not _is_float(a)}
    floats = _float_args(args)

    def with_fixed(*xs):
        full = [None] * len(args)
        for k, a in fixed.items():
            full[k] = a
        for k, x in zip(floats, xs):
            full[k] = x
        return fn(*full)

    cj_floats = jax.make_jaxpr(with_fixed)(*[args[k] for k in floats])
    _check_gradients(with_fixed, cj_floats, [args[k] for k in floats], 0,
                     known=interpreter.evaluate_constants(cj_floats, {}), what=name)

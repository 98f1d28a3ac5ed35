"""Models as JAX users write them, in each framework's own idiom: a user's package, importing nothing of gradcheck.

Each ``make_*()`` returns ``(target, args, kwargs)``, the arguments of the ``from_jax`` call that checks it,
``from_jax(target, *args, **kwargs)``:

* flax.linen: ``(module, (variables, *inputs), apply_kwargs)``;
* flax.nnx: ``(module, inputs, {})``;
* equinox: ``(module, inputs, {"state": state, "call": call})``;
* plain jax: ``(fn, (params, *inputs), {"state": state})``.

Sizes are small. Everything is float32, as a user has it with jax's defaults (x64 off): flax's initialisers
make float32 parameters, equinox's are asked for float32 (it would follow x64), inputs are float32 as data is.
Initialisation is compiled, as users write it (``jax.jit(module.init)``, ``eqx.filter_jit``): one program per
model instead of one per initialiser and shape.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

F32 = jnp.float32


def _normal(seed: int, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), shape, dtype)


def _init(module, *args, **kwargs):
    """``module.init(key(0), *args, **kwargs)``, compiled (the keywords are the module's static flags)."""
    return jax.jit(module.init, static_argnames=tuple(kwargs))(jax.random.key(0), *args, **kwargs)


# --- flax.linen ---------------------------------------------------------------------------------------------


class LinenMLP(nn.Module):
    hidden: int = 16
    out: int = 3
    rate: float = 0.2

    @nn.compact
    def __call__(self, x, *, train: bool):
        x = nn.relu(nn.Dense(self.hidden)(x))
        x = nn.Dropout(self.rate, deterministic=not train)(x)
        return nn.Dense(self.out)(x)


def make_linen_mlp():
    module, x = LinenMLP(), _normal(1, (4, 5))
    variables = _init(module, x, train=False)
    return module, (variables, x), {"train": True, "rngs": {"dropout": jax.random.key(7)}}


class LinenCNN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.Conv(4, (3, 3))(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
        x = nn.relu(x)
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.tanh(nn.Conv(6, (3, 3), padding="VALID")(x))
        x = nn.avg_pool(x, (2, 2), strides=(1, 1))
        return nn.Dense(3)(x.reshape((x.shape[0], -1)))


def make_linen_cnn():
    module, x = LinenCNN(), _normal(2, (3, 8, 8, 2))
    variables = _init(module, x, train=False)
    return module, (variables, x), {"train": True, "mutable": ["batch_stats"]}


class ResNetBlock(nn.Module):
    filters: int
    strides: tuple[int, int] = (1, 1)

    @nn.compact
    def __call__(self, x, train: bool = True):
        norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5)
        residual = x
        y = nn.Conv(self.filters, (3, 3), self.strides, use_bias=False)(x)
        y = nn.relu(norm()(y))
        y = nn.Conv(self.filters, (3, 3), use_bias=False)(y)
        y = norm()(y)
        if residual.shape != y.shape:
            residual = nn.Conv(self.filters, (1, 1), self.strides, use_bias=False, name="conv_proj")(residual)
            residual = norm(name="norm_proj")(residual)
        return nn.relu(residual + y)


def make_linen_resnet_block():
    module, x = ResNetBlock(filters=6, strides=(2, 2)), _normal(3, (2, 8, 8, 4))
    variables = _init(module, x, train=False)
    return module, (variables, x), {"train": True, "mutable": ["batch_stats"]}


class EncoderBlock(nn.Module):
    heads: int = 2
    mlp: int = 16
    rate: float = 0.1

    @nn.compact
    def __call__(self, x, mask, *, train: bool):
        h = nn.LayerNorm()(x)
        h = nn.MultiHeadDotProductAttention(num_heads=self.heads, dropout_rate=self.rate,
                                            deterministic=not train)(h, h, mask=mask)
        x = x + nn.Dropout(self.rate, deterministic=not train)(h)
        h = nn.LayerNorm()(x)
        h = nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(self.mlp)(h)))
        return x + nn.Dropout(self.rate, deterministic=not train)(h)


def make_linen_encoder_block():
    module, x = EncoderBlock(), _normal(4, (2, 5, 8))
    valid = jnp.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]) > 0  # the first sequence is padded
    mask = nn.make_attention_mask(valid, valid, dtype=jnp.bool_)
    variables = _init(module, x, mask, train=False)
    return module, (variables, x, mask), {"train": True, "rngs": {"dropout": jax.random.key(11)}}


class LSTMTagger(nn.Module):
    hidden: int = 6
    classes: int = 3
    param_dtype: Any = jnp.float32  # the cell makes its carry in it (initialize_carry)

    @nn.compact
    def __call__(self, xs):  # (batch, time, features)
        scan = nn.scan(nn.OptimizedLSTMCell, variable_broadcast="params", split_rngs={"params": False},
                       in_axes=1, out_axes=1)
        cell = scan(self.hidden, param_dtype=self.param_dtype)
        carry = cell.initialize_carry(jax.random.key(0), xs[:, 0].shape)
        _, ys = cell(carry, xs)
        return nn.Dense(self.classes, param_dtype=self.param_dtype)(ys)


def make_linen_lstm():
    module, xs = LSTMTagger(), _normal(5, (2, 4, 3))
    variables = _init(module, xs)
    return module, (variables, xs), {}


class TiedLM(nn.Module):
    vocab: int = 11
    features: int = 8

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(self.vocab, self.features)
        h = embed(tokens)
        h = nn.LayerNorm()(h + nn.tanh(nn.Dense(self.features)(h)))
        return embed.attend(h)  # the head is the embedding's own table, transposed


def make_linen_tied_lm():
    module, tokens = TiedLM(), jnp.array([[1, 4, 7, 2], [0, 10, 3, 3]], dtype=jnp.int32)
    variables = _init(module, tokens)
    return module, (variables, tokens), {}


# --- flax.nnx -----------------------------------------------------------------------------------------------


class NnxMLP(nnx.Module):
    def __init__(self, din, dhidden, dout, *, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(din, dhidden, rngs=rngs)
        self.linear2 = nnx.Linear(dhidden, dout, rngs=rngs)

    def __call__(self, x):
        return self.linear2(nnx.gelu(self.linear1(x)))


def make_nnx_mlp():
    return NnxMLP(5, 16, 3, rngs=nnx.Rngs(0)), (_normal(1, (4, 5)),), {}


class NnxCNN(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(2, 4, kernel_size=(3, 3), rngs=rngs)
        self.bn1 = nnx.BatchNorm(4, momentum=0.9, rngs=rngs)
        self.dropout = nnx.Dropout(0.25, rngs=rngs)
        self.conv2 = nnx.Conv(4, 6, kernel_size=(3, 3), padding="VALID", rngs=rngs)
        self.linear = nnx.Linear(6, 3, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.bn1(self.conv1(x)))
        x = nnx.max_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = self.dropout(x)
        x = nnx.avg_pool(nnx.tanh(self.conv2(x)), window_shape=(2, 2), strides=(1, 1))
        return self.linear(x.reshape(x.shape[0], -1))


def make_nnx_cnn():
    model = NnxCNN(rngs=nnx.Rngs(0, dropout=1))
    model.train()
    return model, (_normal(2, (3, 8, 8, 2)),), {}


class NnxTransformerBlock(nnx.Module):
    def __init__(self, d, heads, mlp, *, rate=0.1, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=d, dropout_rate=rate, decode=False,
                                           rngs=rngs)
        self.norm2 = nnx.LayerNorm(d, rngs=rngs)
        self.mlp_in = nnx.Linear(d, mlp, rngs=rngs)
        self.mlp_out = nnx.Linear(mlp, d, rngs=rngs)
        self.dropout = nnx.Dropout(rate, rngs=rngs)

    def __call__(self, x, mask):
        x = x + self.dropout(self.attn(self.norm1(x), mask=mask))
        return x + self.dropout(self.mlp_out(nnx.gelu(self.mlp_in(self.norm2(x)))))


def make_nnx_transformer_block():
    model = NnxTransformerBlock(8, 2, 16, rngs=nnx.Rngs(0, dropout=3))
    model.train()
    x = _normal(4, (2, 5, 8))
    mask = nnx.make_causal_mask(jnp.ones((2, 5)), dtype=jnp.bool_)
    return model, (x, mask), {}


# --- equinox ------------------------------------------------------------------------------------------------


def make_equinox_mlp():
    model = eqx.filter_jit(lambda key: eqx.nn.MLP(5, 3, width_size=16, depth=2, activation=jax.nn.tanh, dtype=F32,
                                                  key=key))(jax.random.key(0))
    return model, (_normal(1, (5,)),), {}


class EqxCNN(eqx.Module):
    conv1: eqx.nn.Conv2d
    bn1: eqx.nn.BatchNorm
    pool: eqx.nn.MaxPool2d
    conv2: eqx.nn.Conv2d
    linear: eqx.nn.Linear

    def __init__(self, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv1 = eqx.nn.Conv2d(2, 4, 3, padding=1, dtype=F32, key=k1)
        self.bn1 = eqx.nn.BatchNorm(4, axis_name="batch", momentum=0.9, mode="ema", dtype=F32)
        self.pool = eqx.nn.MaxPool2d(2, 2)
        self.conv2 = eqx.nn.Conv2d(4, 6, 3, dtype=F32, key=k2)
        self.linear = eqx.nn.Linear(6 * 2 * 2, 3, dtype=F32, key=k3)

    def __call__(self, x, state):  # one example, (channels, height, width)
        x, state = self.bn1(self.conv1(x), state)
        x = self.pool(jax.nn.relu(x))
        x = jnp.tanh(self.conv2(x))
        return self.linear(x.reshape(-1)), state


def eqx_batch_call(model, state, x):
    """The batch through the per-example model, BatchNorm's statistics over the vmapped axis."""
    return jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(x, state)


def make_equinox_cnn():
    model, state = eqx.filter_jit(eqx.nn.make_with_state(EqxCNN))(jax.random.key(0))
    return model, (_normal(2, (3, 2, 8, 8)),), {"state": state, "call": eqx_batch_call}


class EqxAttentionBlock(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    mlp_in: eqx.nn.Linear
    mlp_out: eqx.nn.Linear
    dropout: eqx.nn.Dropout

    def __init__(self, d, heads, mlp, *, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.norm1 = eqx.nn.LayerNorm(d, dtype=F32)
        self.attn = eqx.nn.MultiheadAttention(heads, d, dropout_p=0.1, dtype=F32, key=k1)
        self.norm2 = eqx.nn.LayerNorm(d, dtype=F32)
        self.mlp_in = eqx.nn.Linear(d, mlp, dtype=F32, key=k2)
        self.mlp_out = eqx.nn.Linear(mlp, d, dtype=F32, key=k3)
        self.dropout = eqx.nn.Dropout(0.1)

    def __call__(self, x, *, key):  # one sequence, (length, features)
        k_attn, k_drop = jax.random.split(key)
        h = jax.vmap(self.norm1)(x)
        x = x + self.attn(h, h, h, key=k_attn)
        h = jax.vmap(self.mlp_out)(jax.nn.gelu(jax.vmap(self.mlp_in)(jax.vmap(self.norm2)(x))))
        return x + self.dropout(h, key=k_drop)


def eqx_attention_call(model, state, x, *, key):
    return jax.vmap(lambda xi, ki: model(xi, key=ki))(x, jax.random.split(key, x.shape[0]))


def make_equinox_attention_block():
    model = eqx.filter_jit(lambda key: EqxAttentionBlock(8, 2, 16, key=key))(jax.random.key(0))
    return model, (_normal(3, (2, 5, 8)),), {"call": eqx_attention_call}


class EqxGRU(eqx.Module):
    cell: eqx.nn.GRUCell
    head: eqx.nn.Linear

    def __init__(self, features, hidden, classes, *, key):
        k1, k2 = jax.random.split(key)
        self.cell = eqx.nn.GRUCell(features, hidden, dtype=F32, key=k1)
        self.head = eqx.nn.Linear(hidden, classes, dtype=F32, key=k2)

    def __call__(self, xs):  # one sequence, (time, features)
        def step(h, x):
            h = self.cell(x, h)
            return h, h

        _, hs = lax.scan(step, jnp.zeros(self.cell.hidden_size, xs.dtype), xs)
        return jax.vmap(self.head)(hs)


def make_equinox_gru():
    return eqx.filter_jit(lambda key: EqxGRU(3, 5, 2, key=key))(jax.random.key(0)), (_normal(5, (4, 3)),), {}


# --- plain jax ----------------------------------------------------------------------------------------------


def _scaled_tanh(factor):
    """``a * tanh(x)`` as a custom_vjp; its backward multiplies ``a``'s gradient by ``factor`` (1: correct)."""

    @jax.custom_vjp
    def scaled_tanh(x, a):
        return a * jnp.tanh(x)

    def fwd(x, a):
        t = jnp.tanh(x)
        return a * t, (t, a)

    def bwd(res, g):
        t, a = res
        return g * a * (1 - t * t), factor * jnp.sum(g * t, axis=tuple(range(g.ndim - a.ndim)))

    scaled_tanh.defvjp(fwd, bwd)
    return scaled_tanh


scaled_tanh = _scaled_tanh(1.0)
scaled_tanh_wrong = _scaled_tanh(1.0 + 1e-3)  # the negative control: a's gradient is 0.1% too large


def _plain_init(seed: int = 0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    return {"encoder": {"w": 0.5 * jax.random.normal(k1, (5, 6), jnp.float32), "b": jnp.zeros(6, jnp.float32)},
            "head": {"w": 0.5 * jax.random.normal(k2, (6, 3), jnp.float32),
                     "a": 1.0 + 0.1 * jax.random.normal(k3, (3,), jnp.float32)}}


def _plain_forward(params, x, act):
    encode = jax.checkpoint(lambda p, x: jnp.tanh(x @ p["w"] + p["b"]))
    h = encode(params["encoder"], x)
    h = lax.cond(jnp.sum(h) > 0, lambda h: 2.0 * h, jnp.sin, h)
    return act(h @ params["head"]["w"], params["head"]["a"])


def plain_model(params, x):
    return _plain_forward(params, x, scaled_tanh)


def plain_model_wrong_vjp(params, x):
    return _plain_forward(params, x, scaled_tanh_wrong)


def make_jax_function():
    return plain_model, (_plain_init(), _normal(1, (4, 5))), {}


def make_jax_wrong_vjp():
    return plain_model_wrong_vjp, (_plain_init(), _normal(1, (4, 5))), {}


def stateful_model(params, state, x):
    """A normalisation with a running mean, written as a function: ``(output, new_state)``."""
    mean = jnp.mean(x, axis=0)
    y = jnp.tanh((x - mean) @ params["w"])
    return y, {"mean": 0.9 * state["mean"] + 0.1 * mean, "steps": state["steps"] + 1}


def make_jax_stateful():
    params = {"w": _normal(6, (5, 3))}
    state = {"mean": jnp.zeros(5, jnp.float32), "steps": jnp.zeros((), jnp.int32)}
    return stateful_model, (params, _normal(1, (4, 5))), {"state": state}

# --- one model three ways: a tanh with a learnt scale between two dense layers (the origin tests' model) ---------


class LinenSquash(nn.Module):
    @nn.compact
    def __call__(self, x):
        a = self.param("a", lambda key, shape: jnp.linspace(0.5, 1.5, shape[0], dtype=F32), (x.shape[-1],))
        return a * jnp.tanh(x)


class LinenSquashNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3, name="outer")(LinenSquash(name="squash")(nn.Dense(6, name="inner")(x)))


def make_linen_squash_net():
    module, x = LinenSquashNet(), _normal(3, (4, 5))
    return module, (_init(module, x), x), {}


class NnxSquash(nnx.Module):
    def __init__(self, n):
        self.a = nnx.Param(jnp.linspace(0.5, 1.5, n, dtype=F32))

    def __call__(self, x):
        return self.a[...] * jnp.tanh(x)


class NnxSquashNet(nnx.Module):
    def __init__(self, rngs):
        self.inner = nnx.Linear(5, 6, rngs=rngs)
        self.squash = NnxSquash(6)
        self.outer = nnx.Linear(6, 3, rngs=rngs)

    def __call__(self, x):
        return self.outer(self.squash(self.inner(x)))


def make_nnx_squash_net():
    return NnxSquashNet(nnx.Rngs(0)), (_normal(3, (4, 5)),), {}


class EqxSquash(eqx.Module):
    a: jax.Array

    def __call__(self, x):
        return self.a * jnp.tanh(x)


class EqxSquashNet(eqx.Module):
    inner: eqx.nn.Linear
    squash: EqxSquash
    outer: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.inner = eqx.nn.Linear(5, 6, dtype=F32, key=k1)
        self.squash = EqxSquash(jnp.linspace(0.5, 1.5, 6, dtype=F32))
        self.outer = eqx.nn.Linear(6, 3, dtype=F32, key=k2)

    def __call__(self, x):
        return self.outer(self.squash(self.inner(x)))


def make_equinox_squash_net():
    return EqxSquashNet(jax.random.key(0)), (_normal(3, (5,)),), {}


LINEN = {"mlp": make_linen_mlp, "cnn": make_linen_cnn, "resnet_block": make_linen_resnet_block,
         "encoder_block": make_linen_encoder_block, "lstm": make_linen_lstm, "tied_lm": make_linen_tied_lm,
         "squash_net": make_linen_squash_net}
NNX = {"mlp": make_nnx_mlp, "cnn": make_nnx_cnn, "transformer_block": make_nnx_transformer_block,
       "squash_net": make_nnx_squash_net}
EQUINOX = {"mlp": make_equinox_mlp, "cnn": make_equinox_cnn, "attention_block": make_equinox_attention_block,
           "gru": make_equinox_gru, "squash_net": make_equinox_squash_net}
JAX = {"function": make_jax_function, "wrong_vjp": make_jax_wrong_vjp, "stateful": make_jax_stateful}
ALL = {f"{kind}_{name}": make for kind, table in (("linen", LINEN), ("nnx", NNX), ("equinox", EQUINOX), ("jax", JAX))
       for name, make in table.items()}

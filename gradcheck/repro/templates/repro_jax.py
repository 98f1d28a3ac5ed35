#!/usr/bin/env python3
"""Reproducer written by gradcheck: one layer (meta.json names it), rebuilt with jax and numpy alone.

It loads the inputs, parameters and output cotangent stored next to it
(layer.npz, meta.json), computes the layer's float64 VJP with jax (jax.vjp)
and prints each leaf next to the float64 reference stored there.
Exit status: 0 agrees, 1 disagrees, 2 cannot rebuild the layer.  It
does not import gradcheck.
"""
import jax
import numpy as np

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from _common import Reproducer  # noqa: E402  (written in its place: templates/_common.py)
from jax import lax  # noqa: E402

HIGHEST = lax.Precision.HIGHEST
REPRO = Reproducer(__file__, framework="jax", backend="jax")
CONFIG, STATIC = REPRO.config, REPRO.static


def _tup(v, n):
    return (v,) * n if isinstance(v, int) else tuple(v)


def _pads(padding, kernel, dilation, nd):
    if padding == "valid":
        return [(0, 0)] * nd
    if padding == "same":  # torch's: the odd pixel on the right
        totals = [d * (k - 1) for d, k in zip(_tup(dilation, nd), kernel)]
        return [(t // 2, t - t // 2) for t in totals]
    return [(p, p) for p in _tup(padding, nd)]


def _attention(q, k, v, mask=None, bias=None, causal=False, scale=None):
    """flax.linen.dot_product_attention's composition (what gradcheck's jax backend runs in float64)."""
    q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype) if scale is None else q * jnp.asarray(scale, q.dtype)
    w = jnp.einsum("...qd,...kd->...qk", q, k, precision=HIGHEST)
    if bias is not None:
        w = w + bias
    if causal:
        mask = jnp.tril(jnp.ones((q.shape[-2], k.shape[-2]), dtype=bool))
    if mask is not None:
        w = jnp.where(mask, w, jnp.finfo(w.dtype).min)
    w = jax.nn.softmax(w, axis=-1)
    return jnp.einsum("...qk,...kd->...qd", w, v, precision=HIGHEST)


def _act(y):
    a = CONFIG.get("activation")
    return y if a is None else {"relu": jax.nn.relu, "tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid}[a](y)


def forward(P, X, K):
    t = CONFIG["type"]
    x = X[0]
    if t == "conv":
        nd = CONFIG["nd"]
        w = P["weight"]
        dims = ("NCH", "OIH", "NCH") if nd == 1 else ("NCHW", "OIHW", "NCHW")
        y = lax.conv_general_dilated(x, w, window_strides=_tup(CONFIG["stride"], nd),
                                     padding=_pads(CONFIG["padding"], w.shape[2:], CONFIG["dilation"], nd),
                                     rhs_dilation=_tup(CONFIG["dilation"], nd), dimension_numbers=dims,
                                     feature_group_count=CONFIG["groups"], precision=HIGHEST)
        return y if "bias" not in P else y + jnp.reshape(P["bias"], (1, -1) + (1,) * nd)
    if t == "linear":  # flax.linen.Dense's dot_general, torch's (out, in) weight
        w = P["weight"]
        y = lax.dot_general(x, w, (((x.ndim - 1,), (w.ndim - 1,)), ((), ())), precision=HIGHEST)
        return _act(y if "bias" not in P else y + P["bias"])
    if t == "batch_norm":  # flax.linen.BatchNorm's formulation on (N, C, ...)
        axes = (0,) + tuple(range(2, x.ndim))
        fs = (1, -1) + (1,) * (x.ndim - 2)
        if CONFIG["batch_stats"]:
            mean = jnp.mean(x, axis=axes, keepdims=True)
            var = jnp.mean(lax.square(x - mean), axis=axes, keepdims=True)
        else:
            mean, var = jnp.reshape(P["running_mean"], fs), jnp.reshape(P["running_var"], fs)
        mul = lax.rsqrt(var + CONFIG["eps"])
        if "weight" in P:
            mul = mul * jnp.reshape(P["weight"], fs)
        y = (x - mean) * mul
        return y if "bias" not in P else y + jnp.reshape(P["bias"], fs)
    if t == "layer_norm":  # equinox.nn.LayerNorm
        axes = tuple(range(x.ndim - len(CONFIG["normalized_shape"]), x.ndim))
        out = (x - jnp.mean(x, axis=axes, keepdims=True)) * lax.rsqrt(jnp.var(x, axis=axes, keepdims=True)
                                                                       + CONFIG["eps"])
        if "weight" in P:
            out = P["weight"] * out
        return out if "bias" not in P else out + P["bias"]
    if t == "group_norm":  # equinox.nn.GroupNorm, batched
        g = CONFIG["num_groups"]
        y = jnp.reshape(x, (x.shape[0], g, x.shape[1] // g) + x.shape[2:])
        axes = tuple(range(2, y.ndim))
        out = jnp.reshape((y - jnp.mean(y, axis=axes, keepdims=True))
                          * lax.rsqrt(jnp.var(y, axis=axes, keepdims=True) + CONFIG["eps"]), x.shape)
        fs = (1, -1) + (1,) * (x.ndim - 2)
        if "weight" in P:
            out = jnp.reshape(P["weight"], fs) * out
        return out if "bias" not in P else out + jnp.reshape(P["bias"], fs)
    if t == "embedding":  # flax.linen.Embed's take
        out = jnp.take(P["weight"], x, axis=0)
        pad = CONFIG["padding_idx"]
        return out if pad is None else jnp.where(jnp.expand_dims(x == pad, -1), 0.0, out)
    if t == "sdpa":
        mask = bias = None
        if CONFIG["mask"]:
            m = jnp.asarray(STATIC["attn_mask"])
            mask, bias = (m, None) if m.dtype == jnp.bool_ else (None, m.astype(X[0].dtype))
        return _attention(X[0], X[1], X[2], mask=mask, bias=bias, causal=CONFIG["is_causal"], scale=CONFIG["scale"])
    if t == "mha":
        E, H = CONFIG["embed_dim"], CONFIG["num_heads"]
        q_in = X[0]
        k_in = X[1] if len(X) > 1 and X[1] is not None else q_in
        v_in = X[2] if len(X) > 2 and X[2] is not None else k_in
        if not CONFIG["batch_first"]:
            q_in, k_in, v_in = (jnp.swapaxes(a, 0, 1) for a in (q_in, k_in, v_in))
        n, L = q_in.shape[0], q_in.shape[1]

        def project(a, i):
            w = P["in_proj_weight"][i * E:(i + 1) * E] if "in_proj_weight" in P else \
                P[("q_proj_weight", "k_proj_weight", "v_proj_weight")[i]]
            y = lax.dot_general(a, w, (((a.ndim - 1,), (1,)), ((), ())), precision=HIGHEST)
            if "in_proj_bias" in P:
                y = y + P["in_proj_bias"][i * E:(i + 1) * E]
            return jnp.transpose(jnp.reshape(y, (y.shape[0], y.shape[1], H, -1)), (0, 2, 1, 3))

        q, k, v = (project(a, i) for i, a in enumerate((q_in, k_in, v_in)))
        out = jnp.reshape(jnp.transpose(_attention(q, k, v, causal=CONFIG["causal"]), (0, 2, 1, 3)), (n, L, E))
        w = P["out_proj.weight"]
        out = lax.dot_general(out, w, (((2,), (1,)), ((), ())), precision=HIGHEST)
        if "out_proj.bias" in P:
            out = out + P["out_proj.bias"]
        return out if CONFIG["batch_first"] else jnp.swapaxes(out, 0, 1)
    raise SystemExit(f"unknown layer type {t}")


def main():
    REPRO.header()
    if REPRO.unsupported:
        REPRO.print_stored()
    meta = REPRO.meta
    P = {n: jnp.asarray(a) for n, a in REPRO.params.items()}
    X = [jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in REPRO.inputs]
    K = {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in REPRO.kwargs.items()}
    names = list(meta["trainable"])
    slots = [i for i, x in enumerate(X) if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating)]

    def f(train, floats):
        params = dict(P)
        params.update(zip(names, train))
        inputs = list(X)
        for i, x in zip(slots, floats):
            inputs[i] = x
        out = forward(params, inputs, K)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return tuple(o for o in outs if jnp.issubdtype(o.dtype, jnp.floating))

    outs, vjp = jax.vjp(f, tuple(P[n] for n in names), tuple(X[i] for i in slots))
    g_train, g_inputs = vjp(tuple(jnp.asarray(r) for r in REPRO.cotangents))
    got = {n: np.asarray(g) for n, g in zip(names, g_train)}
    got.update({f"input.{i}": np.asarray(g) for i, g in zip(slots, g_inputs)})
    for k, o in enumerate(outs):
        got["output" if len(outs) == 1 else f"output.{k}"] = np.asarray(o)
    print(f"jax {jax.__version__}")
    ok = all([REPRO.compare(leaf, got.get(leaf["name"])) for leaf in meta["leaves"]
              if not leaf["name"].startswith("kwargs.")])
    REPRO.finish(ok)


if __name__ == "__main__":
    main()

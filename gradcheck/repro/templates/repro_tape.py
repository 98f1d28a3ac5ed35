#!/usr/bin/env python3
"""Reproducer written by gradcheck: one layer (meta.json names it), rebuilt with numpy alone.

gradcheck's own tape cannot run without gradcheck: this script loads the
inputs, parameters and output cotangent stored next to it (layer.npz,
meta.json), and holds the tape's stored gradients and the float64 reference
stored there to float64 central finite differences of the layer rebuilt in
numpy.  Exit status: 0 agrees, 1 disagrees, 2 cannot rebuild the layer.  It
does not import gradcheck.
"""
import sys

import numpy as np
from _common import Reproducer  # written in its place: the shared part, templates/_common.py

REPRO = Reproducer(__file__, framework="numpy", backend="tape")
CONFIG, STATIC = REPRO.config, REPRO.static
PARAMS, INPUTS, KWARGS, COTANGENTS = REPRO.params, REPRO.inputs, REPRO.kwargs, REPRO.cotangents
EPS = float(np.finfo(np.float64).eps)


def _tup(v, n):
    return (v,) * n if isinstance(v, int) else tuple(v)


def _pads(padding, kernel, dilation, nd):
    if padding == "valid":
        return [(0, 0)] * nd
    if padding == "same":
        totals = [d * (k - 1) for d, k in zip(_tup(dilation, nd), kernel)]
        return [(t // 2, t - t // 2) for t in totals]
    return [(p, p) for p in _tup(padding, nd)]


def _conv(x, w, b, stride, padding, dilation, groups):
    nd = x.ndim - 2
    kernel = w.shape[2:]
    stride, dilation = _tup(stride, nd), _tup(dilation, nd)
    x = np.pad(x, [(0, 0), (0, 0)] + _pads(padding, kernel, dilation, nd))
    span = [d * (k - 1) + 1 for d, k in zip(dilation, kernel)]
    win = np.lib.stride_tricks.sliding_window_view(x, span, axis=tuple(range(2, 2 + nd)))
    win = win[(Ellipsis,) + tuple(slice(None, None, d) for d in dilation)]
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)]
    n, c = x.shape[:2]
    o = w.shape[0]
    win = win.reshape((n, groups, c // groups) + win.shape[2:])
    wg = w.reshape((groups, o // groups, c // groups) + kernel)
    spec = "ngcph,goch->ngop" if nd == 1 else "ngcpqhw,gochw->ngopq"
    y = np.einsum(spec, win, wg)
    y = y.reshape((n, o) + y.shape[3:])
    return y if b is None else y + b.reshape((1, -1) + (1,) * nd)


def _softmax(s):
    m = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    return e / np.sum(e, axis=-1, keepdims=True)


def _attention(q, k, v, mask=None, bias=None, causal=False, scale=None):
    s = q @ np.swapaxes(k, -1, -2) * (1.0 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if bias is not None:
        s = s + bias
    if causal:
        mask = np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool))
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    return _softmax(s) @ v


def _normalise(x, axes, eps):
    mean = np.mean(x, axis=axes, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


def forward(P, X, K):
    t = CONFIG["type"]
    x = X[0]
    if t == "conv":
        return _conv(x, P["weight"], P.get("bias"), CONFIG["stride"], CONFIG["padding"], CONFIG["dilation"],
                     CONFIG["groups"])
    if t == "linear":
        y = x @ P["weight"].T
        y = y if "bias" not in P else y + P["bias"]
        a = CONFIG.get("activation")
        return y if a is None else {"relu": lambda z: np.maximum(z, 0.0), "tanh": np.tanh,
                                    "sigmoid": lambda z: 1 / (1 + np.exp(-z))}[a](y)
    if t == "batch_norm":
        axes = (0,) + tuple(range(2, x.ndim))
        fs = (1, -1) + (1,) * (x.ndim - 2)
        if CONFIG["batch_stats"]:
            y = _normalise(x, axes, CONFIG["eps"])
        else:
            y = (x - P["running_mean"].reshape(fs)) / np.sqrt(P["running_var"].reshape(fs) + CONFIG["eps"])
        if "weight" in P:
            y = y * P["weight"].reshape(fs)
        return y if "bias" not in P else y + P["bias"].reshape(fs)
    if t == "layer_norm":
        y = _normalise(x, tuple(range(x.ndim - len(CONFIG["normalized_shape"]), x.ndim)), CONFIG["eps"])
        if "weight" in P:
            y = y * P["weight"]
        return y if "bias" not in P else y + P["bias"]
    if t == "group_norm":
        g = CONFIG["num_groups"]
        y = _normalise(x.reshape((x.shape[0], g, -1)), (2,), CONFIG["eps"]).reshape(x.shape)
        fs = (1, -1) + (1,) * (x.ndim - 2)
        if "weight" in P:
            y = y * P["weight"].reshape(fs)
        return y if "bias" not in P else y + P["bias"].reshape(fs)
    if t == "embedding":
        out = P["weight"][x]
        pad = CONFIG["padding_idx"]
        return out if pad is None else np.where((x == pad)[..., None], 0.0, out)
    if t == "sdpa":
        mask = bias = None
        if CONFIG["mask"]:
            m = STATIC["attn_mask"]
            mask, bias = (m, None) if m.dtype == np.bool_ else (None, m)
        return _attention(X[0], X[1], X[2], mask=mask, bias=bias, causal=CONFIG["is_causal"], scale=CONFIG["scale"])
    if t == "mha":
        E, H = CONFIG["embed_dim"], CONFIG["num_heads"]
        q_in = X[0]
        k_in = X[1] if len(X) > 1 and X[1] is not None else q_in
        v_in = X[2] if len(X) > 2 and X[2] is not None else k_in
        if not CONFIG["batch_first"]:
            q_in, k_in, v_in = (np.swapaxes(a, 0, 1) for a in (q_in, k_in, v_in))
        n, L = q_in.shape[0], q_in.shape[1]

        def project(a, i):
            w = P["in_proj_weight"][i * E:(i + 1) * E] if "in_proj_weight" in P else \
                P[("q_proj_weight", "k_proj_weight", "v_proj_weight")[i]]
            y = a @ w.T
            if "in_proj_bias" in P:
                y = y + P["in_proj_bias"][i * E:(i + 1) * E]
            return y.reshape(y.shape[0], y.shape[1], H, -1).transpose(0, 2, 1, 3)

        q, k, v = (project(a, i) for i, a in enumerate((q_in, k_in, v_in)))
        out = _attention(q, k, v, causal=CONFIG["causal"]).transpose(0, 2, 1, 3).reshape(n, L, E)
        out = out @ P["out_proj.weight"].T
        if "out_proj.bias" in P:
            out = out + P["out_proj.bias"]
        return out if CONFIG["batch_first"] else np.swapaxes(out, 0, 1)
    raise SystemExit(f"unknown layer type {t}")


def outputs(out):
    return [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if np.asarray(o).dtype.kind == "f"]


def loss(P, X):
    outs = outputs(forward(P, X, KWARGS))
    return (sum(float(np.sum(o * r)) for o, r in zip(outs, COTANGENTS)),
            sum(float(np.sum(np.abs(o * r))) for o, r in zip(outs, COTANGENTS)))


def moved(name, delta):
    P, X = dict(PARAMS), list(INPUTS)
    if name.startswith("input."):
        i = int(name.split(".")[1])
        X[i] = X[i] + delta
    else:
        P[name] = P[name] + delta
    return P, X


def value_of(name):
    return INPUTS[int(name.split(".")[1])] if name.startswith("input.") else PARAMS[name]


def check(leaf, seed):
    """<g, v> of the reference and of the stored tape gradient against central differences along v."""
    name = leaf["name"]
    ref = np.asarray(REPRO.data[f"reference.{name}"], np.float64)
    saw = REPRO.stored(name)
    theta = np.asarray(value_of(name), np.float64)
    v = np.random.default_rng(seed).standard_normal(theta.shape)
    h = 1e-6 * max(1.0, float(np.max(np.abs(theta))) if theta.size else 1.0)

    def central(step):
        return (loss(*moved(name, step * v))[0] - loss(*moved(name, -step * v))[0]) / (2 * step)

    d1, d2 = central(h), central(2 * h)
    loss_abs = loss(PARAMS, INPUTS)[1]
    resolution = 4.0 * max(abs(d1 - d2), 16 * EPS * loss_abs / h) + 1e-7 * (abs(d1) + 0.1 * np.linalg.norm(ref))
    parts, ok = [], True
    for who, g in (("reference", ref), (f"{REPRO.backend}_gradcheck_saw", saw)):
        if g is None:
            continue
        dd = float(np.vdot(np.asarray(g, np.float64), v))
        agrees = abs(dd - d1) <= resolution
        parts.append(f"{who}={dd:.17g} ({'agrees' if agrees else 'MISSES'})")
        if who != "reference":
            ok = agrees
    print(f"RESULT {name} {'agree' if ok else 'disagree'} finite_difference={d1:.17g} resolution={resolution:.3g} "
          + " ".join(parts))
    if not ok or leaf["verdict"] != "agree":
        REPRO.rows(name, None, ref, saw, "")
    return ok


def main():
    REPRO.header()
    if REPRO.unsupported:
        REPRO.print_stored()
    print(f"numpy {np.__version__}: float64 central differences of the layer rebuilt in numpy, along one random "
          f"direction per leaf, against the reference and the {REPRO.backend}'s stored gradient")
    results = []
    for k, leaf in enumerate(REPRO.meta["leaves"]):
        name = leaf["name"]
        if name.startswith("output"):
            outs = outputs(forward(PARAMS, INPUTS, KWARGS))
            j = int(name.split(".")[1]) if "." in name else 0
            results.append(REPRO.compare(leaf, outs[j] if j < len(outs) else None))
        elif name.startswith("kwargs."):
            continue
        elif leaf["verdict"] == "vacuous":
            results.append(REPRO.compare(leaf, None))
        else:
            results.append(check(leaf, k))
    ok = all(results)
    print(f"SUMMARY the {REPRO.backend}'s stored values {'agree with' if ok else 'DISAGREE with'} float64 finite "
          f"differences of the layer rebuilt in numpy")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

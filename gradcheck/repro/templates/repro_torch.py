#!/usr/bin/env python3
"""Reproducer written by gradcheck: one layer (meta.json names it), rebuilt with torch and numpy alone.

It loads the inputs, parameters and output cotangent stored next to it
(layer.npz, meta.json), computes the layer's float64 VJP with torch
and prints each leaf next to the float64 reference stored there.
Exit status: 0 agrees, 1 disagrees, 2 cannot rebuild the layer.  It
does not import gradcheck.
"""
import numpy as np
import torch
import torch.nn.functional as F
from _common import Reproducer  # written in its place: the shared part, templates/_common.py

REPRO = Reproducer(__file__, framework="torch", backend="torch")
CONFIG, STATIC = REPRO.config, REPRO.static


def _act(y):
    a = CONFIG.get("activation")
    return y if a is None else {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}[a](y)


def forward(P, X, K):
    t = CONFIG["type"]
    x = X[0]
    if t == "conv":
        conv = F.conv1d if CONFIG["nd"] == 1 else F.conv2d
        return conv(x, P["weight"], P.get("bias"), stride=CONFIG["stride"], padding=CONFIG["padding"],
                    dilation=CONFIG["dilation"], groups=CONFIG["groups"])
    if t == "linear":
        return _act(F.linear(x, P["weight"], P.get("bias")))
    if t == "batch_norm":  # as gradcheck's torch backend calls it (running statistics on copies)
        if CONFIG["batch_stats"]:
            rm = P["running_mean"].clone() if CONFIG["tracking"] else None
            rv = P["running_var"].clone() if CONFIG["tracking"] else None
            return F.batch_norm(x, rm, rv, P.get("weight"), P.get("bias"), training=True, momentum=0.1,
                                eps=CONFIG["eps"])
        return F.batch_norm(x, P["running_mean"], P["running_var"], P.get("weight"), P.get("bias"),
                            training=False, eps=CONFIG["eps"])
    if t == "layer_norm":
        return F.layer_norm(x, CONFIG["normalized_shape"], P.get("weight"), P.get("bias"), eps=CONFIG["eps"])
    if t == "group_norm":
        return F.group_norm(x, CONFIG["num_groups"], P.get("weight"), P.get("bias"), eps=CONFIG["eps"])
    if t == "embedding":
        pad = CONFIG["padding_idx"]
        out = F.embedding(x, P["weight"], padding_idx=pad)
        return out if pad is None else out.masked_fill((x == pad).unsqueeze(-1), 0.0)
    if t == "sdpa":
        mask = None
        if CONFIG["mask"]:
            m = torch.from_numpy(np.array(STATIC["attn_mask"]))
            mask = m if m.dtype == torch.bool else m.to(x.dtype)
        return F.scaled_dot_product_attention(X[0], X[1], X[2], attn_mask=mask, is_causal=CONFIG["is_causal"],
                                              scale=CONFIG["scale"])
    if t == "mha":  # gradcheck's MultiheadAttention: F.linear projections, F.scaled_dot_product_attention
        E, H = CONFIG["embed_dim"], CONFIG["num_heads"]
        q_in = X[0]
        k_in = X[1] if len(X) > 1 and X[1] is not None else q_in
        v_in = X[2] if len(X) > 2 and X[2] is not None else k_in
        if not CONFIG["batch_first"]:
            q_in, k_in, v_in = (a.transpose(0, 1) for a in (q_in, k_in, v_in))
        n, L = q_in.shape[0], q_in.shape[1]

        def project(a, i):
            if "in_proj_weight" in P:
                w = P["in_proj_weight"][i * E:(i + 1) * E]
            else:
                w = P[("q_proj_weight", "k_proj_weight", "v_proj_weight")[i]]
            b = P["in_proj_bias"][i * E:(i + 1) * E] if "in_proj_bias" in P else None
            y = F.linear(a, w, b)
            return y.reshape(y.shape[0], y.shape[1], H, -1).transpose(1, 2)

        q, k, v = (project(a, i) for i, a in enumerate((q_in, k_in, v_in)))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=CONFIG["causal"])
        out = F.linear(out.transpose(1, 2).reshape(n, L, E), P["out_proj.weight"], P.get("out_proj.bias"))
        return out if CONFIG["batch_first"] else out.transpose(0, 1)
    raise SystemExit(f"unknown layer type {t}")


def outputs(out):
    return [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if o.is_floating_point()]


def main():
    REPRO.header()
    if REPRO.unsupported:
        REPRO.print_stored()
    meta = REPRO.meta
    P = {n: torch.from_numpy(np.array(a)) for n, a in REPRO.params.items()}
    for n in meta["trainable"]:
        P[n].requires_grad_(True)
    X = [torch.from_numpy(np.array(a)) if isinstance(a, np.ndarray) else a for a in REPRO.inputs]
    for x in X:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x.requires_grad_(True)
    K = {k: torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v for k, v in REPRO.kwargs.items()}
    outs = outputs(forward(P, X, K))
    loss = sum((o * torch.from_numpy(REPRO.cotangents[k])).sum() for k, o in enumerate(outs))
    wrt = [(n, P[n]) for n in meta["trainable"]]
    wrt += [(f"input.{i}", x) for i, x in enumerate(X) if isinstance(x, torch.Tensor) and x.requires_grad]
    grads = torch.autograd.grad(loss, [t for _, t in wrt], allow_unused=True)
    got = {n: (torch.zeros_like(t) if g is None else g).detach().numpy() for (n, t), g in zip(wrt, grads)}
    for k, o in enumerate(outs):
        got["output" if len(outs) == 1 else f"output.{k}"] = o.detach().numpy()
    print(f"torch {torch.__version__}")
    ok = all([REPRO.compare(leaf, got.get(leaf["name"])) for leaf in meta["leaves"]
              if not leaf["name"].startswith("kwargs.")])
    REPRO.finish(ok)


if __name__ == "__main__":
    main()

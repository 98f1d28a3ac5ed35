"""Standalone reproducers: the origin layer, its data, and one script per backend that needs no gradcheck.

``write_repro(folder, cr, res)`` writes, for a case whose per-layer replay
(``gradcheck.check.localise``) found an origin, a folder::

    <folder>/<case>/<layer path>/
        layer.npz        the layer's inputs, parameters and buffers, the output cotangent, the float64
                         reference for every gradient (and output), and what each backend gave gradcheck
        meta.json        the layer's type, configuration, which leaves disagree, tolerances, blame
        repro_torch.py   the layer rebuilt with torch.nn.functional alone; its float64 VJP
        repro_jax.py     the layer rebuilt with jax.numpy / jax.lax alone; its float64 VJP (jax.vjp)
        repro_tape.py    gradcheck's own tape cannot run without gradcheck: float64 central finite
                         differences of the layer rebuilt in numpy check the tape's stored gradients
        README.md

Each script loads the data next to it, computes the layer's VJP (or, for
the tape, finite differences) with only its framework and numpy, and prints,
leaf by leaf, ``RESULT <leaf> agree|disagree ...`` and, for the elements
where this framework or the backend as gradcheck saw it is furthest from the
reference, ``index (i, j, ...): <framework> now <v>, reference <v>,
gradcheck saw <backend> <v>``.  Exit status 0: this framework agrees with
the reference now; 1: it disagrees; 2: the layer type cannot be rebuilt
with this framework alone (the stored numbers are printed anyway).

The layer types rebuilt: Conv1d/Conv2d, Dense/Linear (no activation, or
relu/tanh/sigmoid), BatchNorm1d/2d (train and eval), LayerNorm, GroupNorm,
Embedding, MultiheadAttention (no masks, no attention dropout) and
``Lambda(scaled_dot_product_attention)``.  Each script calls the kernels
gradcheck's backend for that framework calls (``F.batch_norm``,
``lax.conv_general_dilated``, flax's attention composition), so what it
prints is what an upstream bug report needs.
"""

from __future__ import annotations

import json
import pprint
import re
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from gradcheck import ops
from gradcheck.check.compare import order
from gradcheck.tree import leaves_with_paths

SCRIPTS = {"torch": "repro_torch.py", "jax": "repro_jax.py", "tape": "repro_tape.py"}


class Unsupported(Exception):
    """A layer the scripts cannot rebuild with one framework alone (the message says why)."""


# ---------------------------------------------------------------- the folder
def write_repro(folder, cr, res, calls=None) -> list[Path]:
    """Write a reproducer folder for the case's origin layer (and for ``calls``, paths of other replayed
    layers, or ``"all"``); returns the folders written (none when the replay found no origin)."""
    loc = getattr(cr, "localisation", None)
    if loc is None:
        return []
    chosen = []
    if loc.origin_call is not None and res.origin is not None:
        chosen.append(loc.origin_call)
    if calls is not None:
        wanted = None if calls == "all" else set(calls)
        # A call that agreed keeps its arrays only when the replay was asked to (options.keep_replays).
        chosen += [c for c in loc.calls if c.replayed and not c.dropped and c not in chosen
                   and (wanted is None or c.path in wanted or c.name in wanted)]
    out = []
    for c in chosen:
        kind = res.origin.kind if (res.origin is not None and c is loc.origin_call) else "vjp"
        out.append(_write_one(Path(folder) / _safe(res.name) / _safe(c.name), c, loc, res, kind))
    return out


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("_") or "model"


def _rel(c, path: str) -> str:
    """A replay leaf's name relative to its layer: ``weight``, ``out_proj.weight``, ``input.0``, ``kwargs.mask``."""
    for prefix, name in ((c.input_prefix, "input"), (c.kwargs_prefix, "kwargs")):
        if path == prefix or path.startswith(prefix + "."):
            return name + path[len(prefix):]
    return path[len(c.path) + 1:] if c.path and path.startswith(c.path + ".") else path


def _reference(leaf, names) -> str:
    """The backend whose value stands for the float64 truth: the referee's choice, else an unblamed one."""
    agreeing = {r.backend for r in leaf.referee if r.stable and r.agrees}
    for n in names:
        if n in agreeing:
            return n
    for n in names:
        if n not in leaf.blame:
            return n
    return names[0]


def _write_one(where: Path, c, loc, res, kind: str) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    names = sorted(c.evaluations, key=order)
    arrays: dict[str, np.ndarray] = {}
    params, trainable = [], []
    for leaf in leaves_with_paths(c.module, ""):
        arrays[f"param.{leaf.path}"] = np.asarray(ops.to_numpy(leaf.value))
        params.append(leaf.path)
        if leaf.trainable:
            trainable.append(leaf.path)
    inputs = []
    for i, a in enumerate(c.args):
        if a is None:
            inputs.append(None)
        elif hasattr(a, "shape"):
            arrays[f"input.{i}"] = np.asarray(a)
            inputs.append(f"input.{i}")
        else:
            inputs.append({"value": a} if isinstance(a, (bool, int, float, str)) else {"unsupported": type(a).__name__})
    kwargs, kwarrays = {}, []
    for k, v in c.kwargs.items():
        if hasattr(v, "shape"):
            arrays[f"kwargs.{k}"] = np.asarray(v)
            kwarrays.append(k)
        elif v is None or isinstance(v, (bool, int, float, str)):
            kwargs[k] = v
        else:
            kwargs[k] = {"unsupported": type(v).__name__}
    for k, r in enumerate(c.cotangent):
        arrays[f"cotangent.{k}"] = np.asarray(r)
    leaves = []
    for leaf in c.grads + [x for x in c.forward if x.role == "output"]:
        name = _rel(c, leaf.path)
        if leaf.role == "output":
            name = "output" + leaf.path.rsplit(":output", 1)[1]
        reference = _reference(leaf, names)
        values = {b: (ev.grads.get(leaf.path) if leaf.role != "output" else _nth(ev.value[1], name))
                  for b, ev in c.evaluations.items()}
        if values.get(reference) is None:
            continue
        arrays[f"reference.{name}"] = np.asarray(values[reference], np.float64)
        for b, v in values.items():
            if v is not None:
                arrays[f"{b}.{name}"] = np.asarray(v)
        tol = leaf.tolerance
        leaves.append({"name": name, "role": leaf.role, "verdict": leaf.verdict, "blame": list(leaf.blame),
                       "reference": reference, "message": leaf.message,
                       "rtol": tol.rtol if tol else 1e-7, "atol": tol.atol if tol else 0.0})
    unit = getattr(c.module, "_unit", None)
    if isinstance(unit, WritesItsReplay):  # a frontend's call (a torch submodule): it writes its own replay
        return _write_frontend(where, c, loc, res, kind, names, arrays, leaves, unit)
    try:
        config, statics = _config(c)
        reason = ""
    except Unsupported as exc:
        config, statics, reason = {}, {}, str(exc)
    for k, v in statics.items():
        arrays[f"static.{k}"] = np.asarray(v)
    np.savez(where / "layer.npz", **arrays)
    origin = res.origin
    meta = {
        "case": res.name, "seed": res.seed, "path": c.path, "call": c.call, "name": c.name, "layer": c.layer,
        "kind": kind, "blame": sorted({b for x in leaves for b in x["blame"]}, key=order),
        "op": origin.op if origin is not None and c is loc.origin_call else "",
        "message": origin.message if origin is not None and c is loc.origin_call else "",
        "backends": names, "params": params, "trainable": trainable, "inputs": inputs,
        "kwargs": kwargs, "kwarg_arrays": kwarrays, "outputs": len(c.cotangent), "leaves": leaves,
        "unsupported": reason,
    }
    (where / "meta.json").write_text(json.dumps(meta, indent=1, default=_json) + "\n", encoding="utf-8")
    for b in names:
        if b in SCRIPTS:
            (where / SCRIPTS[b]).write_text(_script(b, c, config, reason), encoding="utf-8")
    (where / "README.md").write_text(_readme(c, meta, names), encoding="utf-8")
    return where


@runtime_checkable
class WritesItsReplay(Protocol):
    """A frontend's recorded call that writes its own replay (``export.units.UnitCall``: torch runs the
    user's submodule, loaded by its import path)."""

    def write_replay(self, where: Path, call) -> dict: ...


def _write_frontend(where, c, loc, res, kind, names, arrays, leaves, unit) -> Path:
    np.savez(where / "layer.npz", **arrays)
    origin = res.origin
    meta = {
        "case": res.name, "seed": res.seed, "path": c.path, "call": c.call, "name": c.name, "layer": c.layer,
        "kind": kind, "blame": sorted({b for x in leaves for b in x["blame"]}, key=order),
        "op": origin.op if origin is not None and c is loc.origin_call else "",
        "message": origin.message if origin is not None and c is loc.origin_call else "",
        "backends": names, "outputs": len(c.cotangent), "leaves": leaves,
    }
    meta.update(unit.write_replay(where, c))
    (where / "meta.json").write_text(json.dumps(meta, indent=1, default=_json) + "\n", encoding="utf-8")
    off = [x["name"] for x in leaves if x["verdict"] != "agree"]
    lines = [f"# {c.name} ({c.layer}) from gradcheck case `{res.name}`", "", meta["message"] or "", "",
             f"Disagreeing leaves: {', '.join(off) or 'none'}; blamed: {', '.join(meta['blame']) or 'nobody'}.", "",
             f"`python repro_torch.py` loads `{meta['import_path']}` from `module.pt` (its package must be "
             "importable), replays this call in float64 with torch alone, with the case's dropout masks and random "
             "draws, and prints each gradient next to the float64 reference in `layer.npz` (the value of the "
             "backend the referee or the majority sided with), then a finite difference along a random direction."]
    if meta.get("unsupported"):
        lines += ["", f"Note: {meta['unsupported']}."]
    (where / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return where


def _nth(value, name):
    from gradcheck.check.localise import _float_arrays

    arrays = _float_arrays(value)
    k = int(name.split(".")[1]) if "." in name else 0
    return arrays[k] if k < len(arrays) else None


def _json(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return repr(o)


def _readme(c, meta, names) -> str:
    off = [x["name"] for x in meta["leaves"] if x["verdict"] != "agree"]
    lines = [
        f"# {c.name} ({c.layer}) from gradcheck case `{meta['case']}`", "",
        meta["message"] or f"Per-layer replay of {c.name}.", "",
        f"Disagreeing leaves: {', '.join(off) or 'none'}; blamed: {', '.join(meta['blame']) or 'nobody'}.", "",
        "Everything is float64.  `layer.npz` holds the layer's inputs (`input.*`), parameters and buffers "
        "(`param.*`), the output cotangent (`cotangent.*`), the reference (`reference.*`: the value of a "
        "backend the float64 referee or the majority sided with) and each backend's value as gradcheck saw "
        "it (`torch.*`, `jax.*`, `tape.*`).  The scripts need only their framework and numpy:", "",
    ]
    for b in names:
        if b in SCRIPTS:
            what = ("float64 finite differences of the layer rebuilt in numpy, against the tape's stored "
                    "gradients" if b == "tape" else f"the layer rebuilt with {b} alone, its VJP against the reference")
            lines.append(f"- `python {SCRIPTS[b]}`: {what}")
    if meta["unsupported"]:
        lines += ["", f"Note: {meta['unsupported']}; the scripts print the stored numbers only."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the layer's configuration
def _config(c) -> tuple[dict, dict]:
    """The layer's type and static configuration as plain Python literals (and static arrays to store)."""
    m, t = c.module, c.layer
    mro = [k.__name__ for k in type(m).__mro__]
    if c.kwargs and t not in ("MultiheadAttention",):
        raise Unsupported(f"{t} called with keyword arguments {sorted(c.kwargs)}")
    if t in ("Conv1d", "Conv2d"):
        return {"type": "conv", "nd": 1 if t == "Conv1d" else 2, "stride": m.stride, "padding": m.padding,
                "dilation": m.dilation, "groups": m.groups}, {}
    if "Dense" in mro:
        act = m.activation
        name = None if act is None else getattr(act, "__name__", "")
        if name not in (None, "relu", "tanh", "sigmoid"):
            raise Unsupported(f"Dense with activation {name or act!r} (only none, relu, tanh, sigmoid are rebuilt)")
        return {"type": "linear", "activation": name}, {}
    if "_BatchNorm" in mro:
        tracking = m.running_mean is not None
        return {"type": "batch_norm", "batch_stats": bool(m.training or not tracking), "tracking": tracking,
                "eps": float(m.eps)}, {}
    if t == "LayerNorm":
        return {"type": "layer_norm", "normalized_shape": tuple(m.normalized_shape), "eps": float(m.eps)}, {}
    if t == "GroupNorm":
        return {"type": "group_norm", "num_groups": int(m.num_groups), "eps": float(m.eps)}, {}
    if t == "Embedding":
        return {"type": "embedding", "padding_idx": m.padding_idx}, {}
    if t == "MultiheadAttention":
        kw = dict(c.kwargs)
        if any(kw.get(k) is not None for k in ("attn_mask", "key_padding_mask")) or kw.get("need_weights"):
            raise Unsupported("MultiheadAttention called with masks or need_weights=True")
        if m.dropout > 0 and m.training:
            raise Unsupported("MultiheadAttention with attention dropout (its mask comes from gradcheck's seed)")
        return {"type": "mha", "embed_dim": int(m.embed_dim), "num_heads": int(m.num_heads),
                "batch_first": bool(m.batch_first), "causal": bool(m.causal or kw.get("is_causal", False))}, {}
    if t == "Lambda" and getattr(m.fn, "__name__", "") == "scaled_dot_product_attention":
        kw = dict(m.kwargs)
        unknown = set(kw) - {"attn_mask", "is_causal", "scale", "dropout_p"}
        if unknown or kw.get("dropout_p", 0.0) or kw.get("return_weights"):
            raise Unsupported(f"scaled_dot_product_attention with {sorted(unknown) or 'dropout'}")
        statics = {} if kw.get("attn_mask") is None else {"attn_mask": np.asarray(ops.to_numpy(kw["attn_mask"]))}
        return {"type": "sdpa", "is_causal": bool(kw.get("is_causal", False)), "scale": kw.get("scale"),
                "mask": "attn_mask" in statics}, statics
    raise Unsupported(f"no standalone rebuild of layer type {t} (rebuilt: Conv1d/2d, Dense/Linear, BatchNorm1d/2d, "
                      "LayerNorm, GroupNorm, Embedding, MultiheadAttention, scaled_dot_product_attention)")


# ---------------------------------------------------------------- the scripts
def _script(backend: str, c, config: dict, reason: str) -> str:
    framework = {"torch": "torch", "jax": "jax", "tape": "numpy"}[backend]
    head = _HEAD.replace("@FRAMEWORK@", framework).replace("@BACKEND@", backend).replace("@NAME@", c.name) \
        .replace("@LAYER@", c.layer).replace("@IMPORTS@", _IMPORTS[framework])
    body = [head, "CONFIG = " + pprint.pformat(config, width=100, sort_dicts=False), "UNSUPPORTED = " + repr(reason),
            "", _COMMON]
    if not reason:
        body.append(_FORWARD[framework])
    body.append({"torch": _TORCH_MAIN, "jax": _JAX_MAIN, "numpy": _FD_MAIN}[framework])
    return "\n".join(body) + "\n"


_HEAD = '''#!/usr/bin/env python3
"""Reproducer written by gradcheck: @NAME@ (@LAYER@), rebuilt with @FRAMEWORK@ and numpy alone.

It loads the inputs, parameters and output cotangent stored next to it
(layer.npz, meta.json), computes the layer's float64 VJP with @FRAMEWORK@
(for the tape: float64 central finite differences in numpy, against the
tape's stored gradients) and prints each leaf next to the float64 reference
stored there.  Exit status: 0 agrees, 1 disagrees, 2 cannot rebuild the layer.
It does not import gradcheck.
"""
import json
import pathlib
import sys

import numpy as np
@IMPORTS@
HERE = pathlib.Path(__file__).resolve().parent
DATA = np.load(HERE / "layer.npz")
META = json.loads((HERE / "meta.json").read_text(encoding="utf-8"))
FRAMEWORK = "@FRAMEWORK@"  # what computes here
BACKEND = "@BACKEND@"  # the gradcheck backend whose stored values are shown beside
'''

_IMPORTS = {
    "torch": "import torch\nimport torch.nn.functional as F\n",
    "jax": "import jax\n\njax.config.update(\"jax_enable_x64\", True)\nimport jax.numpy as jnp  # noqa: E402\n"
           "from jax import lax  # noqa: E402\n\nHIGHEST = lax.Precision.HIGHEST\n",
    "numpy": "",
}

_COMMON = r'''

def group(prefix):
    return {k[len(prefix) + 1:]: DATA[k] for k in DATA.files if k.startswith(prefix + ".")}


PARAMS = group("param")
STATIC = group("static")
COTANGENTS = [DATA[f"cotangent.{k}"] for k in range(META["outputs"])]
INPUTS = [DATA[spec] if isinstance(spec, str) else (None if spec is None else spec.get("value"))
          for spec in META["inputs"]]
KWARGS = dict(META["kwargs"])
KWARGS.update({k: DATA[f"kwargs.{k}"] for k in META["kwarg_arrays"]})
WORST = 5
SAW_OFF = []  # leaves where the stored value of BACKEND is off the reference


def fmt(v):
    return f"{float(v):.17g}"


def rows(name, now, ref, saw, extra):
    """The elements furthest from the reference, this framework's and the stored backend's."""
    picks = []
    for other in (now, saw):
        if other is None or np.shape(other) != np.shape(ref):
            continue
        d = np.abs(np.asarray(other, np.float64) - ref).ravel()
        for flat in np.argsort(d)[::-1][:WORST]:
            if d[flat] > 0 and flat not in picks:
                picks.append(int(flat))
    for flat in picks:
        idx = tuple(int(i) for i in np.unravel_index(flat, np.shape(ref)))
        parts = []
        if now is not None and np.shape(now) == np.shape(ref):
            parts.append(f"{FRAMEWORK} now {fmt(np.asarray(now).ravel()[flat])}")
        parts.append(f"reference {fmt(ref.ravel()[flat])}")
        if saw is not None and np.shape(saw) == np.shape(ref):
            parts.append(f"gradcheck saw {BACKEND} {fmt(np.asarray(saw).ravel()[flat])}")
        print(f"  index {idx}: " + ", ".join(parts) + extra)


def compare(leaf, now):
    """Elementwise, as gradcheck compares in float64: |now - ref| <= atol + rtol |ref|."""
    name = leaf["name"]
    ref = np.asarray(DATA[f"reference.{name}"], np.float64)
    saw = DATA[f"{BACKEND}.{name}"] if f"{BACKEND}.{name}" in DATA.files else None
    if leaf["verdict"] == "vacuous":
        size = "" if now is None else f"; max |{FRAMEWORK}| {float(np.max(np.abs(np.asarray(now, np.float64)), initial=0.0)):.3g}"
        print(f"RESULT {name} vacuous: ~0 on every backend when gradcheck ran (rounding around an exact zero), "
              f"not compared{size}")
        return True
    if now is None:
        print(f"RESULT {name} missing: {FRAMEWORK} gives no value here")
        rows(name, None, ref, saw, "")
        return False
    now = np.asarray(now, np.float64)
    if now.shape != ref.shape:
        print(f"RESULT {name} disagree: {FRAMEWORK} gives shape {now.shape}, the reference {ref.shape}")
        return False
    diff = np.abs(now - ref)
    bad = diff > leaf["atol"] + leaf["rtol"] * np.abs(ref)
    n = int(np.count_nonzero(bad))
    max_abs = float(diff.max()) if diff.size else 0.0
    verdict = "disagree" if n else "agree"
    seen = ""
    if saw is not None and np.shape(saw) == ref.shape:
        off = np.abs(np.asarray(saw, np.float64) - ref)
        seen = f" max_abs_gradcheck_saw={float(np.max(off, initial=0.0)):.3g}"
        if np.any(off > leaf["atol"] + leaf["rtol"] * np.abs(ref)):
            SAW_OFF.append(name)
    print(f"RESULT {name} {verdict} max_abs={max_abs:.3g} mismatched={n}/{ref.size}{seen} "
          f"(reference: {leaf['reference']}, rtol {leaf['rtol']:.3g}, atol {leaf['atol']:.3g})")
    if n or leaf["verdict"] != "agree":  # the numbers that disagree, now or when gradcheck ran
        rows(name, now, ref, saw, "")
    return not n


def print_stored():
    """The layer cannot be rebuilt: the numbers gradcheck stored, reference against this backend."""
    print(f"cannot rebuild this layer with {FRAMEWORK} alone: {UNSUPPORTED}")
    for leaf in META["leaves"]:
        if leaf["verdict"] == "agree":
            continue
        name = leaf["name"]
        saw = DATA[f"{BACKEND}.{name}"] if f"{BACKEND}.{name}" in DATA.files else None
        print(f"STORED {name} {leaf['verdict']} blame={','.join(leaf['blame']) or '-'}: {leaf['message']}")
        rows(name, None, np.asarray(DATA[f"reference.{name}"], np.float64), saw, "")
    sys.exit(2)


def header():
    print(f"gradcheck reproducer: {META['name']} ({META['layer']}) of case {META['case']}, float64, "
          f"computed with {FRAMEWORK}; origin kind {META['kind']}, blamed: {', '.join(META['blame']) or 'nobody'}")
    if META["message"]:
        print(f"gradcheck said: {META['message']}")


def finish(ok):
    if ok:
        print(f"SUMMARY {FRAMEWORK} agrees with the float64 reference on every leaf" + (
            f"; gradcheck saw {BACKEND} disagree on {', '.join(SAW_OFF)}, which does not reproduce with this "
            f"{FRAMEWORK} (another version, device or setting; or gradcheck's own use of it)" if SAW_OFF else ""))
    else:
        print(f"SUMMARY {FRAMEWORK} DISAGREES with the float64 reference")
    sys.exit(0 if ok else 1)
'''

# -- forward functions, one per framework: forward(P, X, K) -> output (an array or a tuple)
_FORWARD = {"torch": r'''

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
''', "jax": r'''

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
''', "numpy": r'''

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
'''}

_TORCH_MAIN = r'''

def outputs(out):
    return [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if o.is_floating_point()]


def main():
    header()
    if UNSUPPORTED:
        print_stored()
    P = {n: torch.from_numpy(np.array(a)) for n, a in PARAMS.items()}
    for n in META["trainable"]:
        P[n].requires_grad_(True)
    X = [torch.from_numpy(np.array(a)) if isinstance(a, np.ndarray) else a for a in INPUTS]
    for x in X:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x.requires_grad_(True)
    K = {k: torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v for k, v in KWARGS.items()}
    outs = outputs(forward(P, X, K))
    loss = sum((o * torch.from_numpy(COTANGENTS[k])).sum() for k, o in enumerate(outs))
    wrt = [(n, P[n]) for n in META["trainable"]]
    wrt += [(f"input.{i}", x) for i, x in enumerate(X) if isinstance(x, torch.Tensor) and x.requires_grad]
    grads = torch.autograd.grad(loss, [t for _, t in wrt], allow_unused=True)
    got = {n: (torch.zeros_like(t) if g is None else g).detach().numpy() for (n, t), g in zip(wrt, grads)}
    for k, o in enumerate(outs):
        got["output" if len(outs) == 1 else f"output.{k}"] = o.detach().numpy()
    print(f"torch {torch.__version__}")
    ok = all([compare(leaf, got.get(leaf["name"])) for leaf in META["leaves"] if not leaf["name"].startswith("kwargs.")])
    finish(ok)


if __name__ == "__main__":
    main()
'''

_JAX_MAIN = r'''

def main():
    header()
    if UNSUPPORTED:
        print_stored()
    P = {n: jnp.asarray(a) for n, a in PARAMS.items()}
    X = [jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in INPUTS]
    K = {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in KWARGS.items()}
    names = list(META["trainable"])
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
    g_train, g_inputs = vjp(tuple(jnp.asarray(r) for r in COTANGENTS))
    got = {n: np.asarray(g) for n, g in zip(names, g_train)}
    got.update({f"input.{i}": np.asarray(g) for i, g in zip(slots, g_inputs)})
    for k, o in enumerate(outs):
        got["output" if len(outs) == 1 else f"output.{k}"] = np.asarray(o)
    print(f"jax {jax.__version__}")
    ok = all([compare(leaf, got.get(leaf["name"])) for leaf in META["leaves"] if not leaf["name"].startswith("kwargs.")])
    finish(ok)


if __name__ == "__main__":
    main()
'''

_FD_MAIN = r'''
EPS = float(np.finfo(np.float64).eps)


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
    ref = np.asarray(DATA[f"reference.{name}"], np.float64)
    saw = DATA[f"{BACKEND}.{name}"] if f"{BACKEND}.{name}" in DATA.files else None
    theta = np.asarray(value_of(name), np.float64)
    v = np.random.default_rng(seed).standard_normal(theta.shape)
    h = 1e-6 * max(1.0, float(np.max(np.abs(theta))) if theta.size else 1.0)

    def central(step):
        return (loss(*moved(name, step * v))[0] - loss(*moved(name, -step * v))[0]) / (2 * step)

    d1, d2 = central(h), central(2 * h)
    loss_abs = loss(PARAMS, INPUTS)[1]
    resolution = 4.0 * max(abs(d1 - d2), 16 * EPS * loss_abs / h) + 1e-7 * (abs(d1) + 0.1 * np.linalg.norm(ref))
    parts, ok = [], True
    for who, g in (("reference", ref), (f"{BACKEND}_gradcheck_saw", saw)):
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
        rows(name, None, ref, saw, "")
    return ok


def main():
    header()
    if UNSUPPORTED:
        print_stored()
    print(f"numpy {np.__version__}: float64 central differences of the layer rebuilt in numpy, along one random "
          f"direction per leaf, against the reference and the {BACKEND}'s stored gradient")
    results = []
    for k, leaf in enumerate(META["leaves"]):
        name = leaf["name"]
        if name.startswith("output"):
            outs = outputs(forward(PARAMS, INPUTS, KWARGS))
            j = int(name.split(".")[1]) if "." in name else 0
            results.append(compare(leaf, outs[j] if j < len(outs) else None))
        elif name.startswith("kwargs."):
            continue
        elif leaf["verdict"] == "vacuous":
            results.append(compare(leaf, None))
        else:
            results.append(check(leaf, k))
    ok = all(results)
    print(f"SUMMARY the {BACKEND}'s stored values {'agree with' if ok else 'DISAGREE with'} float64 finite differences"
          f" of the layer rebuilt in numpy")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
'''

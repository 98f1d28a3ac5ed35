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

The scripts are real Python files, ``gradcheck/repro/templates/`` (read as
package resources, linted like any code), written as they are: each reads
the layer's configuration and data from the files next to it, and the part
the three share (``templates/_common.py``) is written into each in place of
its ``from _common import Reproducer`` line, so that each stands alone.

A frontend's unit writes its own folder (``WritesItsReplay``): a torch
submodule call gets ``repro_torch.py``, which loads the submodule by its
import path (``frontends/torch/units.py``); a call of a jax model's custom
rule gets ``repro_jax.py`` (``templates/replay_jax_rule.py``), which imports
the ``custom_vjp``/``custom_jvp`` by its import path and replays the call
with jax alone (``frontends/jax/replay.py``).  Both keep ``layer.npz`` and
``meta.json`` as above.

``check(cr, runs, options, res)`` is the ``repro`` check
(``gradcheck.check.checks``): with ``options.repro`` a folder, it writes the
origin's reproducer there after the per-layer replay.
"""

from __future__ import annotations

import importlib.resources
import json
import re
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from gradcheck import ops
from gradcheck.backends import reference_rank, repro_scripts
from gradcheck.check.localise import float_arrays
from gradcheck.tree import leaves_with_paths

SCRIPTS = repro_scripts()  # backend -> its script: the template's name in templates/, and the file written
TEMPLATES = "gradcheck.repro.templates"
SHARED_LINE = "from _common import Reproducer"  # a script's line the shared part is written in place of
SHARED_FROM = "# -- written into each script from here"  # the shared part starts after this line of _common.py


class Unsupported(Exception):
    """A layer the scripts cannot rebuild with one framework alone (the message says why)."""


# ---------------------------------------------------------------- the check
def check(cr, runs: dict, options, res) -> None:
    """The check's entry point (``gradcheck.check.checks``): the origin layer's reproducer in
    ``options.repro``, each folder named in a note; nothing when the replay found no origin layer."""
    if res.origin is not None and res.origin.path:
        folders = write_repro(options.repro, cr, res)
        res.notes += [f"reproducer for {res.origin.path}: {f}" for f in folders]


# ---------------------------------------------------------------- the folder
def write_repro(folder, cr, res, calls=None) -> list[Path]:
    """Write a reproducer folder for the case's origin layer (and for ``calls``, paths of other replayed
    layers, or ``"all"``), from the replay the localise check kept on ``cr.localisation``; returns the
    folders written (none when the replay did not run or found no origin)."""
    loc = cr.localisation
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
    names = sorted(c.evaluations, key=reference_rank)
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
        "kind": kind, "blame": sorted({b for x in leaves for b in x["blame"]}, key=reference_rank),
        "op": origin.op if origin is not None and c is loc.origin_call else "",
        "message": origin.message if origin is not None and c is loc.origin_call else "",
        "backends": names, "params": params, "trainable": trainable, "inputs": inputs,
        "kwargs": kwargs, "kwarg_arrays": kwarrays, "outputs": len(c.cotangent), "leaves": leaves,
        "unsupported": reason, "config": config,
    }
    (where / "meta.json").write_text(json.dumps(meta, indent=1, default=_json) + "\n", encoding="utf-8")
    for b in names:
        if b in SCRIPTS:
            (where / SCRIPTS[b]).write_text(script(b), encoding="utf-8")
    (where / "README.md").write_text(_readme(c, meta, names), encoding="utf-8")
    return where


@runtime_checkable
class WritesItsReplay(Protocol):
    """A frontend's recorded call that writes its own replay: ``export.units.UnitCall`` (torch runs the user's
    submodule, loaded by its import path), ``frontends.jax.units.Unit`` (jax runs the user's custom rule, loaded
    by its import path).

    ``write_replay(where, call)`` writes its script (and any file it needs) into ``where`` and returns what
    ``meta.json`` adds; two keys of it are taken out first: ``arrays`` (name -> array, added to ``layer.npz``)
    and ``readme`` (lines of the README that say how to run the script; torch's text when absent).
    """

    def write_replay(self, where: Path, call) -> dict: ...


def _write_frontend(where, c, loc, res, kind, names, arrays, leaves, unit) -> Path:
    origin = res.origin
    meta = {
        "case": res.name, "seed": res.seed, "path": c.path, "call": c.call, "name": c.name, "layer": c.layer,
        "kind": kind, "blame": sorted({b for x in leaves for b in x["blame"]}, key=reference_rank),
        "op": origin.op if origin is not None and c is loc.origin_call else "",
        "message": origin.message if origin is not None and c is loc.origin_call else "",
        "backends": names, "outputs": len(c.cotangent), "leaves": leaves,
    }
    meta.update(unit.write_replay(where, c))
    arrays.update(meta.pop("arrays", None) or {})
    how = meta.pop("readme", None)
    np.savez(where / "layer.npz", **arrays)
    (where / "meta.json").write_text(json.dumps(meta, indent=1, default=_json) + "\n", encoding="utf-8")
    off = [x["name"] for x in leaves if x["verdict"] != "agree"]
    if how is None:
        how = [f"`python repro_torch.py` loads `{meta['import_path']}` from `module.pt` (its package must be "
               "importable), replays this call in float64 with torch alone, with the case's dropout masks and random "
               "draws, and prints each gradient next to the float64 reference in `layer.npz` (the value of the "
               "backend the referee or the majority sided with), then a finite difference along a random direction."]
    lines = [f"# {c.name} ({c.layer}) from gradcheck case `{res.name}`", "", meta["message"] or "", "",
             f"Disagreeing leaves: {', '.join(off) or 'none'}; blamed: {', '.join(meta['blame']) or 'nobody'}.", "",
             *how]
    if meta.get("unsupported"):
        lines += ["", f"Note: {meta['unsupported']}."]
    (where / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return where


def _nth(value, name):
    arrays = float_arrays(value)
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
def script(backend: str) -> str:
    """The text of ``backend``'s script: its template, with the shared part written in place of its
    ``from _common import Reproducer`` line (see the module doc)."""
    templates = importlib.resources.files(TEMPLATES)
    text = (templates / SCRIPTS[backend]).read_text(encoding="utf-8")
    shared = (templates / "_common.py").read_text(encoding="utf-8").split(SHARED_FROM + "\n", 1)[1]
    lines = text.splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if line.startswith(SHARED_LINE)]
    if len(at) != 1:
        raise RuntimeError(f"templates/{SCRIPTS[backend]} has {len(at)} lines starting {SHARED_LINE!r}; a "
                           "reproducer template needs exactly one, where the shared part is written")
    return "".join(lines[:at[0]]) + "\n" + shared.strip("\n") + "\n\n" + "".join(lines[at[0] + 1:])

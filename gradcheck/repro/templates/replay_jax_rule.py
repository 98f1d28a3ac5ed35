#!/usr/bin/env python3
"""Reproducer written by gradcheck: one call of a jax custom rule (custom_vjp or custom_jvp), replayed with jax
and numpy alone.

gradcheck found that this rule's own backward disagrees: jax, which runs the rule, gave a gradient that the
tape and torch (which differentiate the rule's primal body) and a float64 finite-difference referee did not.
This script needs jax, numpy and the package that defines the rule; it does not import gradcheck.

What it does:

1. It imports the rule by the import path in ``meta.json`` (``import_path``, ``module:qualname``: the
   ``jax.custom_vjp`` / ``jax.custom_jvp`` object the model calls).  gradcheck checked, when it wrote this
   folder, that this object called on the operands below gives the recorded call's output and VJP.
2. It rebuilds the call's arguments from ``layer.npz``: the float operands (``input.*``) and the others
   (``held.*``: integer indices, masks), in the structure in ``meta.json`` (``args``), all as gradcheck's
   float64 reference reached this call.  Operands the rule closes over (``num_consts``) are no argument of
   it: their gradients are not recomputed.
3. With ``jax_enable_x64`` on, it takes ``jax.vjp`` of the rule there, pulling back the recorded output
   cotangent (``cotangent.*``): that runs the rule's own backward, as the model's training would.
4. It prints, per gradient, how far jax's gradient now is from the float64 reference (``reference.*``: the
   value of the backend the referee or the majority sided with) and from each backend's recorded gradient
   (``tape.*``, ``torch.*``, and ``jax.*``, jax's as gradcheck saw it), the elements furthest off, and then a
   float64 central finite difference of the rule's primal along a random direction next to what jax's VJP
   gives along it.

Exit status: 0 jax agrees with the reference now; 1 it does not (the rule's backward is wrong, as gradcheck
found); 2 the rule cannot be loaded here (the stored numbers are printed instead).
"""
import importlib
import json
import pathlib
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
DATA = np.load(HERE / "layer.npz")
META = json.loads((HERE / "meta.json").read_text(encoding="utf-8"))
WORST = 5  # elements shown per gradient, the furthest from the reference
STEP = 1e-6  # the finite difference's step, relative to the operands' scale


def fmt(v):
    return f"{float(v):.17g}"


def recorded(name):
    """Each backend's recorded value of a leaf, as gradcheck saw it: {backend: array}."""
    return {b: np.asarray(DATA[f"{b}.{name}"], np.float64) for b in META["backends"] if f"{b}.{name}" in DATA.files}


def print_stored(why):
    """The rule cannot be rebuilt here: the numbers gradcheck stored, reference against each backend."""
    print(f"cannot replay {META['function']} with jax here: {why}")
    for leaf in META["leaves"]:
        if leaf["verdict"] == "agree":
            continue
        name = leaf["name"]
        ref = np.asarray(DATA[f"reference.{name}"], np.float64)
        print(f"STORED {name} {leaf['verdict']} blame={','.join(leaf['blame']) or '-'}: {leaf['message']}")
        distances(ref, recorded(name), "reference")
        rows(ref, None, recorded(name))
    return 2


def load():
    """The rule object, or None (and why) when it cannot be imported."""
    path = META["import_path"]
    if not path:
        return None, META["unsupported"]
    module, _, qualname = path.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # the package is not importable here, or no longer has that name
        return None, (f"cannot import {path} ({type(exc).__name__}: {exc}); install the package that defines "
                      f"it, or put it on PYTHONPATH")
    return obj, ""


def skeleton(spec):
    """The arguments' structure from meta.json: leaf k is the integer k."""
    if spec is None:
        return None
    if "leaf" in spec:
        return spec["leaf"]
    if "tuple" in spec:
        return tuple(skeleton(v) for v in spec["tuple"])
    if "list" in spec:
        return [skeleton(v) for v in spec["list"]]
    return {k: skeleton(v) for k, v in spec["dict"]}


def replay(rule):
    """jax's output and VJP of the rule at the recorded operands and cotangent.

    Returns ``(now, xs, loss)``: ``now`` maps ``input.k`` (each float argument's gradient) and the output names
    to arrays; ``xs`` are the float arguments; ``loss(at)`` is the rule's float64 primal paired with the
    cotangent, at the float arguments ``at``.
    """
    import jax

    names = META["operands"]
    operands = [np.asarray(DATA[n]) for n in names]
    first = META["num_consts"]
    tree = jax.tree_util.tree_structure(skeleton(META["args"]))
    wrt = [i for i in range(first, len(names)) if names[i].startswith("input.")]

    def call(*xs):
        flat = list(operands)
        for i, x in zip(wrt, xs):
            flat[i] = x
        return rule(*jax.tree_util.tree_unflatten(tree, flat[first:]))

    def pullback_of(out):
        leaves, out_tree = jax.tree_util.tree_flatten(out)
        cts, floats, k = [], [], 0
        for o in leaves:
            if np.issubdtype(o.dtype, np.inexact):
                cts.append(np.asarray(DATA[f"cotangent.{k}"], o.dtype))
                floats.append(o)
                k += 1
            else:
                cts.append(np.zeros(o.shape, jax.dtypes.float0))
        return floats, jax.tree_util.tree_unflatten(out_tree, cts)

    xs = [operands[i] for i in wrt]
    out, pull = jax.vjp(call, *xs)
    floats, cts = pullback_of(out)
    grads = pull(cts)
    now = {names[i]: np.asarray(g, np.float64) for i, g in zip(wrt, grads)}
    outputs = [leaf["name"] for leaf in META["leaves"] if leaf["role"] == "output"]
    now.update({n: np.asarray(o, np.float64) for n, o in zip(outputs, floats)})

    def loss(at):
        floats_at, _ = pullback_of(call(*at))
        return sum(float(np.vdot(np.asarray(o, np.float64), DATA[f"cotangent.{k}"])) for k, o in enumerate(floats_at))

    return now, xs, loss


def distances(now, saw, label):
    """How far ``now`` is from each backend's recorded value: max abs and max relative difference."""
    parts = []
    for b, v in saw.items():
        if v.shape != now.shape:
            parts.append(f"{b} shape {v.shape}")
            continue
        d = np.abs(now - v)
        scale = np.maximum(np.abs(v), 1e-300)
        parts.append(f"{b} max_abs={float(d.max(initial=0.0)):.3g} max_rel={float((d / scale).max(initial=0.0)):.3g}")
    print(f"  {label} vs each backend's recorded value: " + "; ".join(parts))


def rows(ref, now, saw):
    """The elements furthest from the reference: jax's now, the reference, each backend's recorded value."""
    picks = []
    for other in [now] + list(saw.values()):
        if other is None or other.shape != ref.shape:
            continue
        d = np.abs(other - ref).ravel()
        picks += [int(i) for i in np.argsort(d)[::-1][:WORST] if d[i] > 0 and int(i) not in picks]
    for flat in picks[:WORST]:
        index = tuple(int(i) for i in np.unravel_index(flat, ref.shape))
        parts = ([] if now is None else [f"jax now {fmt(now.ravel()[flat])}"]) + [f"reference {fmt(ref.ravel()[flat])}"]
        parts += [f"{b} {fmt(v.ravel()[flat])}" for b, v in saw.items() if v.shape == ref.shape]
        print(f"  index {index}: " + ", ".join(parts))


def compare(leaf, now):
    """As gradcheck compares in float64, elementwise: |now - reference| <= atol + rtol |reference|."""
    name = leaf["name"]
    ref = np.asarray(DATA[f"reference.{name}"], np.float64)
    saw = recorded(name)
    if now is None:
        print(f"RESULT {name} not recomputed: a value the rule closes over, no argument of it "
              f"(gradcheck said {leaf['verdict']})")
        distances(ref, saw, "reference")
        return True
    if now.shape != ref.shape:
        print(f"RESULT {name} disagree: jax gives shape {now.shape}, the reference {ref.shape}")
        return False
    if leaf["verdict"] == "vacuous":
        print(f"RESULT {name} vacuous: ~0 on every backend when gradcheck ran, not compared; "
              f"max |jax| {float(np.max(np.abs(now), initial=0.0)):.3g}")
        return True
    diff = np.abs(now - ref)
    off = int(np.count_nonzero(diff > leaf["atol"] + leaf["rtol"] * np.abs(ref)))
    print(f"RESULT {name} {'disagree' if off else 'agree'} max_abs={float(diff.max(initial=0.0)):.3g} "
          f"mismatched={off}/{ref.size} (reference: {leaf['reference']}, rtol {leaf['rtol']:.3g}, "
          f"atol {leaf['atol']:.3g})")
    distances(now, saw, "jax now")
    if off or leaf["verdict"] != "agree":
        rows(ref, now, saw)
    return not off


def finite_difference(now, xs, loss):
    """The rule's primal, float64, at +-h along a random direction, against jax's VJP along it."""
    grads = [now[n] for n in META["operands"][META["num_consts"]:] if n.startswith("input.")]
    if not xs:
        return
    rng = np.random.default_rng(0)
    direction = [rng.standard_normal(np.shape(x)) for x in xs]
    scale = max(1.0, max(float(np.max(np.abs(x), initial=0.0)) for x in xs))
    h = STEP * scale
    numeric = (loss([x + h * d for x, d in zip(xs, direction)])
               - loss([x - h * d for x, d in zip(xs, direction)])) / (2 * h)
    names = [n for n in META["operands"][META["num_consts"]:] if n.startswith("input.")]

    def along(gs):
        value = sum(float(np.vdot(g, d)) for g, d in zip(gs, direction))
        return f"{value:.12g} (relative difference {abs(numeric - value) / max(abs(numeric), 1e-300):.3g})"

    print(f"finite difference of the rule's primal along a random direction: {numeric:.12g}; jax's VJP now "
          f"gives {along(grads)}")
    for b in META["backends"]:
        if all(f"{b}.{n}" in DATA.files for n in names):
            print(f"  {b}'s recorded gradient gives {along([DATA[f'{b}.{n}'] for n in names])}")


def main():
    import jax

    jax.config.update("jax_enable_x64", True)
    print(f"gradcheck reproducer: {META['rule']} {META['function']} ({META['name']}) of case {META['case']}, "
          f"float64; jax {jax.__version__} here, {META['jax_version']} when gradcheck ran; gradcheck blamed "
          f"{', '.join(META['blame']) or 'nobody'}")
    if META["defined"]:
        print(f"rule defined at {META['defined']}" + (f"; called at {META['called']}" if META["called"] else ""))
    if META["message"]:
        print(f"gradcheck said: {META['message']}")
    rule, why = load()
    if rule is None:
        return print_stored(why)
    print(f"replaying {META['import_path']} with jax.vjp")
    now, xs, loss = replay(rule)
    ok = all([compare(leaf, now.get(leaf["name"])) for leaf in META["leaves"]])
    finite_difference(now, xs, loss)
    if ok:
        print("SUMMARY jax agrees with the float64 reference on every leaf")
    else:
        print("SUMMARY jax DISAGREES with the float64 reference: the rule's backward gives another gradient than "
              "its primal's")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

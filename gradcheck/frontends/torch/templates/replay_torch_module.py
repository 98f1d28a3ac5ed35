#!/usr/bin/env python3
"""Reproducer written by gradcheck: one call of a torch submodule, replayed with torch and numpy alone.

It loads, from the files next to it, the submodule as the model defines it
(``module.pt``: pickled by its import path, so the package that defines it
must be importable), the call's arguments and parameter values at the point
gradcheck checked (``call.pt``, float64), the output cotangent and each
backend's float64 gradients (``layer.npz``, ``meta.json``).  It replays the
call under torch autograd, with the dropout masks and random draws the case
gave it, and prints each gradient next to the float64 reference gradcheck
stored (the backend the float64 referee or the majority sided with), then a
float64 central finite difference of the call along a random direction.
Exit status: 0 torch agrees with the reference now, 1 it does not, 2 the
submodule cannot be loaded.  It does not import gradcheck.
"""
import json
import pathlib
import sys

import numpy as np
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

HERE = pathlib.Path(__file__).resolve().parent
DATA = np.load(HERE / "layer.npz")
META = json.loads((HERE / "meta.json").read_text(encoding="utf-8"))
WORST = 5


class CaseDraws(TorchDispatchMode):
    """The case's random draws (dropout's bernoulli_, torch.rand, ...), in call order, as gradcheck gave them."""

    def __init__(self, values):
        super().__init__()
        self.values = list(values)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) == "aten.native_dropout.default" and (args[2] if len(args) > 2 else kwargs.get("train")):
            factors = self.values.pop(0).to(args[0].dtype)  # a dropout's keep-and-scale factors
            return args[0] * factors, factors != 0
        if str(func) in META["random_ops"]:
            value = self.values.pop(0)
            if str(func).split(".")[1].endswith("_"):  # in place: fill the tensor
                args[0].copy_(value.to(args[0].dtype))
                return args[0]
            return value
        return func(*args, **(kwargs or {}))


def load():
    try:
        module = torch.load(HERE / "module.pt", weights_only=False)
    except Exception as exc:  # the defining package is not importable here, or the module could not be pickled
        print(f"cannot load {META['class']} from module.pt ({type(exc).__name__}: {exc}); install or put on "
              f"PYTHONPATH the package that defines it ({META['import_path']})")
        sys.exit(2)
    return module.double()


def call(module, state, inputs):
    saved = torch.load(HERE / "call.pt", weights_only=False)
    flat = [inputs[v] if kind == "input" else v for kind, v in saved["slots"]]
    args, kwargs = pytree.tree_unflatten(flat, saved["spec"])
    module.train(saved["training"])
    with CaseDraws(saved["random_values"]):
        out = torch.func.functional_call(module, state, tuple(args), kwargs, tie_weights=True, strict=False)
    leaves = pytree.tree_leaves(out)
    return [leaves[i] for i in saved["picks"]]


def loss_of(module, state, inputs):
    outs = call(module, state, inputs)
    cotangents = [torch.from_numpy(DATA[f"cotangent.{k}"]) for k in range(META["outputs"])]
    floats = [o for o in outs if o.is_floating_point()]
    return sum((o * r).sum() for o, r in zip(floats, cotangents))


def main():
    module = load()
    saved = torch.load(HERE / "call.pt", weights_only=False)
    state = {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in saved["state"].items()}
    inputs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in saved["inputs"]]
    loss = loss_of(module, state, inputs)
    wrt = {name: state[name] for name in state if state[name].requires_grad}
    wrt.update({f"input.{j}": x for j, x in enumerate(inputs) if x.requires_grad})
    grads = torch.autograd.grad(loss, list(wrt.values()), allow_unused=True)
    now = {n: (np.zeros(tuple(t.shape)) if g is None else g.detach().numpy()) for (n, t), g in zip(wrt.items(), grads)}
    bad = 0
    print(f"{META['name']} ({META['class']}): torch {torch.__version__}, float64; "
          f"gradcheck blamed {', '.join(META['blame']) or 'nobody'}")
    for leaf in META["leaves"]:
        name = leaf["name"]
        if name not in now or f"reference.{name}" not in DATA.files:
            continue
        ref = DATA[f"reference.{name}"]
        got = now[name]
        err = np.abs(got - ref)
        allowed = leaf["atol"] + leaf["rtol"] * np.abs(ref)
        off = int(np.count_nonzero(err > allowed))
        bad += off > 0
        print(f"RESULT {name} {'disagree' if off else 'agree'}: {off}/{ref.size} elements off "
              f"(max |torch - reference| {float(err.max(initial=0.0)):.3g}; reference from {leaf['reference']})")
        for flat in np.argsort(err.ravel())[::-1][:WORST if off else 0]:
            index = tuple(int(i) for i in np.unravel_index(int(flat), ref.shape))
            print(f"  index {index}: torch now {got.ravel()[flat]:.17g}, reference {ref.ravel()[flat]:.17g}")
    # The finite difference needs no autograd: the call's float64 forward at +-h along a random direction.
    rng = np.random.default_rng(0)
    direction = {n: torch.from_numpy(rng.standard_normal(tuple(t.shape))) for n, t in wrt.items()}
    h = 1e-6
    with torch.no_grad():
        def shifted(sign):
            s = {k: (v + sign * h * direction[k] if k in direction else v) for k, v in state.items()}
            xs = [x + sign * h * direction[f"input.{j}"] if f"input.{j}" in direction else x
                  for j, x in enumerate(inputs)]
            return float(loss_of(module, s, xs))
        numeric = (shifted(1) - shifted(-1)) / (2 * h)
    analytic = float(sum(np.vdot(now[n], direction[n].numpy()) for n in wrt))
    print(f"finite difference along a random direction: {numeric:.10g}; torch's gradient gives {analytic:.10g}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

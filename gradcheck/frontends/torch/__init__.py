"""Check a ``torch.nn.Module`` as it is: ``from_torch(module, *example_inputs) -> Case``.

torch autograd runs the module itself; the tape and jax run its
``torch.export`` graph (Core ATen, with the functions a model library calls
kept whole), each ATen op lowered to ``gradcheck.ops``; the float64
referee runs that graph on numpy.  Leaves are the module's own parameters
and buffers under torch's names, and the float inputs.

* ``capture``: ``torch.export``, the decomposition table, the graph signature;
* ``aten``: the ATen -> ``gradcheck.ops`` table;
* ``interpreter``: runs a graph, and checks each lowering against torch's op;
* ``model``: the gradcheck Module that stands for the torch module.

Importing this package imports torch; ``import gradcheck`` does not import it.
"""

from __future__ import annotations

import sys

import numpy as np

from gradcheck.case import Case


def is_torch_module(obj) -> bool:
    """Whether ``obj`` is a ``torch.nn.Module`` (without importing torch when nothing has)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def from_torch(module, *example_inputs, name: str | None = None, mode: str = "train", seed: int = 0,
               forward=None, dtype: str | None = None, decompose: str = "fused", references: dict | None = None) -> Case:
    """A Case that checks ``module`` at ``example_inputs`` on torch, the tape and jax.

    * ``module``: a ``torch.nn.Module``; its current parameter and buffer
      values are the point checked (they are copied when the case is built;
      the module is never modified: its mode is restored after each call).
    * ``example_inputs``: tensors (torch or numpy).  Float inputs are
      differentiated and compared; integer inputs (token ids) are constants.
    * ``forward(module, *inputs)``: what is differentiated; default
      ``module(*inputs)``.  Every float tensor of what it returns (a tensor,
      tuple, list, dict or registered dataclass) enters the loss, in pytree
      order; the case's notes name them.
    * ``mode``: ``train`` (BatchNorm batch statistics and running-statistic
      updates, dropout with the case's masks) or ``eval``.
    * ``seed``: the loss cotangent, dropout masks, referee directions.
    * ``dtype``: the case's dtype (default: float64 when every float
      parameter is float64, else float32).
    * ``decompose``: ``fused`` (default: Core ATen with the library functions
      listed in ``capture.PRESERVED`` kept whole) or ``core`` (all of Core ATen).
    * ``references``: ``{"mylib::fused_gelu": fn}``, a reference function per
      custom op of the module (its math in ordinary torch ops): torch runs the
      op itself, the tape and jax run ``fn`` (``gradcheck.frontends.torch.references``).

    Raises ``CaptureError`` with torch's reason and the ways out when
    ``torch.export`` cannot capture the module.
    """
    try:
        import torch
    except ImportError as exc:
        raise ImportError(f"from_torch needs torch ({exc}); install the CPU build with `pip install torch "
                          "--index-url https://download.pytorch.org/whl/cpu`") from None

    from gradcheck.frontends.torch import capture
    from gradcheck.frontends.torch.model import Program

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"from_torch: module is a {type(module).__name__}; pass a torch.nn.Module "
                        "(a gradcheck Module goes straight to assert_gradients_agree or a Case)")
    if not example_inputs:
        raise TypeError("from_torch: no example inputs; call it as from_torch(module, x, ...)")
    if mode not in ("train", "eval"):
        raise ValueError(f"from_torch: mode={mode!r}; expected 'train' or 'eval'")
    capture.decomposition_table(decompose)  # checks the name before the (slower) capture
    from gradcheck.frontends.torch.references import normalise

    refs = normalise(references)
    # The module is exported where it lives (a CUDA module on CUDA inputs); the case holds numpy copies.
    device = next(iter(list(module.parameters()) + list(module.buffers())), torch.empty(0)).device
    tensors, arrays = [], []
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor):
            t = x.detach()
        elif isinstance(x, np.ndarray):
            t = torch.from_numpy(np.array(x, copy=True)).to(device)
        else:
            raise TypeError(f"from_torch: example input {i} is a {type(x).__name__}; inputs must be tensors "
                            "(torch or numpy); pass other arguments through forward=lambda m, x: m(x, ...)")
        tensors.append(t)
        arrays.append(t.cpu().numpy().copy())
    label = name or type(module).__name__
    program = Program(capture._Forward(module, forward), tuple(tensors), decompose, label, device, refs)
    graph = program.graph(mode == "train")  # a module torch.export cannot capture fails here, with torch's reason
    floats = [p.dtype for p in module.parameters() if p.is_floating_point()]
    case_dtype = dtype or ("float64" if floats and all(d == torch.float64 for d in floats) else "float32")
    arrays_t = tuple(arrays)

    def build(rng):
        return program.tree(seed=int(rng.integers(2**31 - 1)))

    def inputs(rng):
        return arrays_t

    notes = []
    outputs = program.output_names(mode == "train")
    if len(outputs) > 1:
        notes.append("outputs: " + ", ".join(f"output.{k} = {n}" for k, n in enumerate(outputs)))
    from gradcheck.frontends.torch import facts, randomness

    if graph.refused:
        notes.append(graph.refused)
    for path, kind in program.wrapper.dropped.items():
        notes.append(f"output {path} ({kind}) is not a tensor: the module's state, not compared")
    notes += facts.describe(graph, program.wrapper.held)
    if program.wrapper.__dict__.get("draws_on_host"):
        notes.append("the module draws from numpy's or Python's global random generator, which torch does not see: "
                     f"every forward of it starts that generator at one state (seed {randomness.HOST_SEED}), so the "
                     "graph's constants are the values torch's own forward draws, and the caller's state is restored")
    for why in graph.problems.values():
        notes.append(f"tape and jax cannot run this graph: {why}")
    return Case(name=label, build=build, inputs=inputs, dtype=case_dtype, mode=mode, seed=seed,
                model=type(module).__name__, notes=notes)


def as_cases(made, name: str = "") -> list[Case] | None:
    """A target's result as Cases: a Case, a ``(module, inputs)`` pair, or a list of either; None if neither.

    A module that cannot be captured becomes a case whose build raises the
    capture error, so it is that case's recorded error and the others run.
    """
    items = made if isinstance(made, list) or (isinstance(made, tuple) and not _is_pair(made)) else [made]
    out: list[Case] = []
    for i, item in enumerate(items):
        if isinstance(item, Case):
            out.append(item)
        elif _is_pair(item):
            module, inputs = item
            inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
            label = name if len(items) == 1 else f"{name}[{i}]" if name else ""
            out.append(_case_or_error(module, inputs, label or type(module).__name__))
        else:
            return None
    return out


def _is_pair(item) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and is_torch_module(item[0])


def _case_or_error(module, inputs, name):
    from gradcheck.frontends.torch.capture import CaptureError

    try:
        return from_torch(module, *inputs, name=name)
    except CaptureError as exc:
        message = str(exc)

        def build(rng):
            raise CaptureError(message)

        return Case(name=name, build=build, inputs=lambda rng: (), model=type(module).__name__)


def lowering(op):
    """Lower ``op`` (``"mylib::fused_gelu"``) in ``gradcheck.ops`` for every graph (``export.references.lowering``)."""
    from gradcheck.frontends.torch.references import lowering as _lowering

    return _lowering(op)


def __getattr__(name):
    # The heavy parts import torch; they load when first named.
    if name in ("CaptureError",):
        from gradcheck.frontends.torch import capture

        return capture.CaptureError
    if name in ("UnsupportedOp", "GraphRunError"):
        from gradcheck.frontends.torch import interpreter

        return getattr(interpreter, name)
    raise AttributeError(f"module 'gradcheck.frontends.torch' has no attribute {name!r}")


__all__ = ["CaptureError", "GraphRunError", "UnsupportedOp", "as_cases", "from_torch", "is_torch_module", "lowering"]

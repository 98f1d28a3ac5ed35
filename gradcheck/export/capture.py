"""Capture: ``torch.export`` a module, decompose it, and read its graph signature.

The graph is decomposed to Core ATen with one change to torch's default
table: the ops in ``PRESERVED`` stay whole.  They are the functions a model
library calls (``F.linear``, ``F.layer_norm``, ``F.scaled_dot_product_attention``,
the convolutions ...) and each has a ``gradcheck.ops`` counterpart, so the
tape and jax run their own kernels for them (jax: ``jax.nn.dot_product_attention``,
flax's LayerNorm formulation, ``lax.conv_general_dilated``), not torch's
decomposition of them into smaller ATen ops.  What is decomposed, torch
decomposes; ``decompose="core"`` decomposes everything (docs/from_torch.md).

The signature maps every graph input to what it is: a parameter (by its
canonical torch name: the first of the names a tied tensor has, as
``named_parameters`` gives it), a buffer, a constant, or a user input; and
every output to a user output or a buffer mutation (BatchNorm's running
statistics, ``num_batches_tracked``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from gradcheck.export.aten import LOWERINGS

ROOT = "module"  # the child name the wrapper gives the user's module; stripped from every name

_aten = torch.ops.aten
PRESERVED = (
    _aten.linear.default,
    _aten.matmul.default,
    _aten.conv1d.default, _aten.conv2d.default, _aten.conv1d.padding, _aten.conv2d.padding,
    _aten.conv_transpose1d.default, _aten.conv_transpose2d.input,
    _aten.layer_norm.default, _aten.group_norm.default, _aten.rms_norm.default,
    _aten.scaled_dot_product_attention.default,
    _aten.hardswish.default, _aten.hardsigmoid.default, _aten.silu.default,
    _aten.upsample_nearest2d.vec, _aten.upsample_bilinear2d.vec,
)
DECOMPOSE = ("fused", "core")


class CaptureError(RuntimeError):
    """``torch.export`` could not capture the module; the message has torch's reason and the ways out."""


WAYS_OUT = (
    "ways out: (1) make the branch depend on Python values (a config flag, a shape), not on tensor "
    "values; (2) write a data-dependent branch with torch.cond, which torch.export captures whole; "
    "(3) pass forward=lambda module, *inputs: ... to from_torch to check the path you want; (4) check "
    "the submodules that can be captured one by one (from_torch(model.encoder, x)). See docs/from_torch.md"
)


class _Forward(nn.Module):
    """The user's module under one name (``module``), called as ``forward(module, *inputs)``."""

    def __init__(self, module: nn.Module, forward=None):
        super().__init__()
        self.module = module
        self._forward = forward

    def forward(self, *inputs):
        if self._forward is None:
            return self.module(*inputs)
        return self._forward(self.module, *inputs)


def strip(name: str) -> str:
    """A name in the wrapper as the user's module names it (``module.layer1.0`` -> ``layer1.0``)."""
    if name == ROOT:
        return ""
    return name[len(ROOT) + 1 :] if name.startswith(ROOT + ".") else name


@dataclass
class Binding:
    """What one graph input is: ``param``/``buffer`` (``target`` the leaf path), ``constant``, ``input``."""

    kind: str
    target: str = ""
    index: int = -1
    value: object = None


@dataclass
class Graph:
    """One exported, decomposed graph of the module in one mode (train or eval)."""

    training: bool
    program: object  # torch.export.ExportedProgram
    nodes: list
    inputs: dict[str, Binding]  # placeholder name -> what it is
    outputs: list[tuple[str, object]]  # ("output", k) | ("buffer", path) | ("ignore", why) per graph output
    user_outputs: int
    dropout_nodes: dict[str, int]  # node name -> dropout index (call order)
    dropout_shapes: list[tuple[tuple[int, ...], float]]
    problems: dict[str, str] = field(default_factory=dict)  # node name -> why the tape and jax cannot run it
    # Why the graph as a whole does not compute what the module does in float64 although each node's lowering
    # matches torch's op ("" when it does): a decomposition that fixed a value at the capture's dtype.
    unfaithful: str = ""
    # Nodes computed from constants alone (causal masks from arange): no parameter or input reaches them, so
    # their comparisons are not kinks of the function being checked.
    constants: set[str] = field(default_factory=set)
    verified: bool = False
    export_s: float = 0.0


def decomposition_table(decompose: str):
    if decompose not in DECOMPOSE:
        raise ValueError(f"from_torch: decompose={decompose!r}; expected one of {', '.join(DECOMPOSE)}")
    table = torch.export.default_decompositions()
    if decompose == "fused":
        for op in PRESERVED:
            table.pop(op, None)
    return table


def export(wrapper: _Forward, example_inputs: tuple, training: bool, decompose: str, name: str):
    """The decomposed ExportedProgram of ``wrapper`` in the given mode; CaptureError with torch's reason."""
    import warnings

    table = decomposition_table(decompose)
    was = [m.training for m in wrapper.modules()]
    wrapper.train(training)
    try:
        with warnings.catch_warnings():
            # torch's own deprecation inside export, and nn.LSTM's weight cache being set while tracing:
            # neither says anything about the module being checked.
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            warnings.filterwarnings("ignore", message=".*_flat_weights.*were assigned during export.*")
            ep = torch.export.export(wrapper, tuple(example_inputs), strict=False)
            return ep.run_decompositions(table)
    except CaptureError:
        raise
    except Exception as exc:
        raise CaptureError(f"torch.export could not capture {name} ({'train' if training else 'eval'} mode): "
                           f"{type(exc).__name__}: {torch_reason(exc)}\n{WAYS_OUT}") from exc
    finally:
        for m, flag in zip(wrapper.modules(), was):
            m.training = flag


def torch_reason(exc: BaseException) -> str:
    """torch's message, without its generic debugging advice: the first paragraph and the user's line."""
    text = str(exc).strip()
    first = text.split("\n\n")[0].strip()
    call = re.search(r"The following call raised this error:\n(.*?)(?:\n\n|$)", text, re.S)
    if call and call.group(1).strip() not in first:
        first += "\n  raised at:\n" + call.group(1).rstrip()
    return first


def read_graph(ep, wrapper: _Forward, n_inputs: int, training: bool) -> Graph:
    from torch.export.graph_signature import InputKind, OutputKind

    canonical_params = {id(p): strip(n) for n, p in wrapper.named_parameters()}
    canonical_buffers = {id(b): strip(n) for n, b in wrapper.named_buffers()}
    inputs: dict[str, Binding] = {}
    user = 0
    for spec in ep.graph_signature.input_specs:
        arg = getattr(spec.arg, "name", None)
        if spec.kind == InputKind.PARAMETER:
            tensor = wrapper.get_parameter(spec.target)
            inputs[arg] = Binding("param", canonical_params.get(id(tensor), strip(spec.target)))
        elif spec.kind == InputKind.BUFFER:
            tensor = wrapper.get_buffer(spec.target)
            inputs[arg] = Binding("buffer", canonical_buffers.get(id(tensor), strip(spec.target)))
        elif spec.kind in (InputKind.CONSTANT_TENSOR,):
            value = ep.constants[spec.target]
            inputs[arg] = Binding("constant", strip(spec.target), value=value.detach().cpu().numpy().copy())
        elif spec.kind == InputKind.USER_INPUT:
            if arg is None:  # a non-tensor input, baked into the graph
                user += 1
                continue
            inputs[arg] = Binding("input", index=user)
            user += 1
        else:
            raise CaptureError(f"the exported graph has an input of kind {spec.kind.name} ({spec.target}); "
                               "gradcheck reads parameters, buffers, tensor constants and tensor inputs only")
    if user != n_inputs:
        raise CaptureError(f"the exported graph has {user} user inputs for {n_inputs} example inputs")
    outputs: list[tuple[str, object]] = []
    n_user = 0
    for spec in ep.graph_signature.output_specs:
        if spec.kind == OutputKind.USER_OUTPUT:
            outputs.append(("output", n_user))
            n_user += 1
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            tensor = wrapper.get_buffer(spec.target)
            outputs.append(("buffer", canonical_buffers.get(id(tensor), strip(spec.target))))
        else:  # a user input mutated in place: the check compares outputs and gradients, not that
            outputs.append(("ignore", spec.kind.name))
    nodes = list(ep.graph.nodes)
    dropout_nodes, shapes = {}, []
    for node in nodes:
        p = _dropout_p(node)
        if p:
            dropout_nodes[node.name] = len(shapes)
            shapes.append((_dropout_shape(node), p))
    graph = Graph(training=training, program=ep, nodes=nodes, inputs=inputs, outputs=outputs, user_outputs=n_user,
                  dropout_nodes=dropout_nodes, dropout_shapes=shapes)
    for node in nodes:
        why = unsupported(node)
        if why:
            graph.problems[node.name] = why
        if node.op == "placeholder" and inputs.get(node.name, Binding("")).kind == "constant" or (
                node.op == "call_function" and all(a.name in graph.constants for a in node.all_input_nodes)):
            graph.constants.add(node.name)
    return graph


def _dropout_p(node) -> float:
    """The drop probability of a dropout the forward applies (0 for none, or one that is off)."""
    if node.op != "call_function":
        return 0.0
    target = str(node.target)
    args = list(node.args) + [None] * 8
    if target in ("aten.native_dropout.default", "aten.dropout.default"):
        p, train = args[1], args[2] if args[2] is not None else node.kwargs.get("train", True)
        return float(p) if train and p else 0.0
    if target == "aten.bernoulli.p":  # keep units with probability p (DropPath's mask): a drop probability 1 - p
        p = float(args[1] if args[1] is not None else node.kwargs.get("p", 0.5))
        return 1.0 - p if 0.0 < p < 1.0 else 0.0
    if target in ("aten.scaled_dot_product_attention.default",
                  "aten._scaled_dot_product_flash_attention_for_cpu.default"):
        pos = 4 if target.startswith("aten.scaled") else 3
        p = args[pos] if args[pos] is not None else node.kwargs.get("dropout_p", 0.0)
        return float(p or 0.0)
    return 0.0


def _dropout_shape(node) -> tuple[int, ...]:
    """The shape of a dropout's mask: its input's, or the attention weights' (..., L, S)."""
    target = str(node.target)
    if "dropout" in target or "bernoulli" in target:
        return tuple(int(d) for d in node.args[0].meta["val"].shape)
    q, k = (tuple(int(d) for d in a.meta["val"].shape) for a in node.args[:2])
    return tuple(np.broadcast_shapes(q[:-2], k[:-2])) + (q[-2], k[-2])


def op_name(node) -> str:
    return str(node.target)


def unsupported(node) -> str | None:
    """Why the tape and jax cannot run ``node`` (no lowering), or None."""
    if node.op != "call_function":
        return None
    import operator

    if node.target is operator.getitem:
        return None
    name = op_name(node)
    if name in LOWERINGS:
        return None
    kind = ("a random op (only dropout has a mask the case can give every backend)"
            if re.search(r"\b(rand|randn|randint|bernoulli|normal|uniform|multinomial)", name) else
            "a higher-order op (control flow or a wrapped region)" if "higher_order" in name else
            "an op without a lowering")
    return (f"{name} is {kind}: {where(node)}; add a lowering to gradcheck/export/aten.py "
            f"(@lower({name!r})), or give from_torch a forward= that avoids it"
            + (", or decompose=\"core\" to have torch decompose it" if _preserved(name) else ""))


def _preserved(name: str) -> bool:
    return any(str(op) == name for op in PRESERVED)


def module_of(node) -> tuple[str, str]:
    """(dotted module path, class name) of the innermost module the node was traced in."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, kind = list(stack.values())[-1]
    kind = kind if isinstance(kind, str) else getattr(kind, "__qualname__", str(kind))
    return strip(path), kind.rsplit(".", 1)[-1]


_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.abspath(__file__))


def source_line(node) -> str:
    """``file:line in fn: code`` of the innermost frame of user code that made the node."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    user = [f for f in frames if not os.path.abspath(f[0]).startswith((_TORCH_DIR, _OWN_DIR))]
    chosen = (user or frames)[-1] if frames else None
    if chosen is None:
        return "source line unknown"
    path, line, fn, code = chosen
    inner = ""
    if frames and chosen is not frames[-1]:
        f = frames[-1]
        inner = f" (inside {os.path.relpath(f[0], os.path.dirname(_TORCH_DIR))}:{f[1]}: {f[3].strip()})"
    return f"{path}:{line} in {fn}: {code.strip()}{inner}"


def where(node) -> str:
    """Where a node comes from: the module path and class, and the source line."""
    path, kind = module_of(node)
    owner = f"module {path} ({kind})" if path else f"the root module ({kind})" if kind else "the root module"
    return f"node {node.name}, from {owner}, at {source_line(node)}"


def example_outputs(wrapper: _Forward, example_inputs: tuple, training: bool):
    """The eager output's leaves (pytree order), their names, and which are float tensors."""
    from torch.utils import _pytree as pytree

    was = [m.training for m in wrapper.modules()]
    wrapper.train(training)
    try:
        with torch.no_grad():
            out = wrapper(*example_inputs)
    finally:
        for m, flag in zip(wrapper.modules(), was):
            m.training = flag
    pairs, _ = pytree.tree_flatten_with_path(out)
    names = [_keyname(path) for path, _ in pairs]
    floats = [isinstance(v, torch.Tensor) and v.is_floating_point() for _, v in pairs]
    return names, floats


def _keyname(path) -> str:
    parts = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return ".".join(parts)

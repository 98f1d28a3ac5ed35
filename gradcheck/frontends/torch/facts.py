"""The facts of a torch module's case: what every backend is handed alike, and what the report says was held.

A gradient check compares backends on one function.  What the module draws
at random (dropout masks, ``torch.rand``) and what torch declares by
convention (a ``padding_idx`` row with no gradient, ``scale_grad_by_freq``,
``max_norm``'s renormalisation, a ``detach``) are part of that function, not
behaviour of one backend: every backend gets the same draws, the lowerings
follow torch's conventions, and the referee holds fixed what the model holds
fixed (``gradcheck.check.kinks``' held values).  ``CaseFacts`` hands the draws out
by graph node; ``describe`` writes the case's notes that say what was held.
"""

from __future__ import annotations

import numpy as np

from gradcheck.frontends.torch import randomness


class CaseFacts:
    """What the case hands every backend alike, by graph node: the random draws (dropout masks among them).

    ``facts.draw(node, kind, shape)`` is a random node's base draw
    (``gradcheck.frontends.torch.randomness``), from the case seed and the node's
    number among the graph's draws, so a submodule replayed alone gets the
    values the whole forward gave it.
    """

    def __init__(self, seed: int, graph):
        self.seed = int(seed)
        self.graph = graph

    def draw(self, node_name, kind, shape) -> np.ndarray:
        draws = self.graph.draws
        return randomness.case_draw(self.seed, draws.index[node_name], kind, shape, draws.pinned)


# Ops a value passes through unchanged on its way from a parameter to the op that uses it.
_VIEWS = frozenset({"aten.alias.default", "aten.clone.default", "aten.detach.default", "aten.view.default",
                    "aten._to_copy.default", "aten.lift_fresh_copy.default"})


def _leaf(graph, node) -> str:
    """The parameter (or buffer) path a node's value is, through views; "" when it is computed."""
    while node is not None and getattr(node, "op", None) == "call_function" and (
            str(node.target) in _VIEWS or str(node.target) == "aten.embedding_renorm.default"):
        node = node.args[0]
    if getattr(node, "op", None) == "placeholder":
        binding = graph.inputs.get(node.name)
        if binding is not None and binding.kind in ("param", "buffer"):
            return binding.target
    return ""


def _arg(node, i, name, default):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


_DRAW_NAMES = {"aten.native_dropout.default": "dropout", "aten.dropout.default": "dropout",
               "aten.scaled_dot_product_attention.default": "attention dropout",
               "aten._scaled_dot_product_flash_attention_for_cpu.default": "attention dropout"}


def _draw_name(op: str) -> str:
    """A draw's name in the notes: ``dropout``, ``attention dropout``, else the op's (``rand``)."""
    return _DRAW_NAMES.get(op, op.split(".")[1])


def _held_input(graph, node, held: dict) -> int | None:
    """The index of the held input (``capture.hold_undifferentiable``) a detach node detaches, or None."""
    arg = node.args[0] if node.args else None
    binding = graph.inputs.get(arg.name) if getattr(arg, "op", None) == "placeholder" else None
    return binding.index if binding is not None and binding.kind == "input" and binding.index in held else None


def describe(graph, held: dict | None = None) -> list[str]:
    """One note per fact the case holds: conventions by leaf, then the random draws and detached values.

    ``held``: the inputs torch cannot differentiate the module by, by index, and why
    (``capture.hold_undifferentiable``); each is named, not counted among the
    detached values."""
    held = held or {}
    notes = [f"input {i} is {why}: it is held as the case's constant on every backend (no gradient), and the "
             "referee holds it fixed" for i, why in sorted(held.items())]
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        target = str(node.target)
        if target == "aten.embedding.default":
            leaf = _leaf(graph, node.args[0]) or "an embedding table"
            pad = _arg(node, 2, "padding_idx", -1)
            if pad is not None and pad >= 0:
                notes.append(f"row {pad} of {leaf} is torch's padding_idx: its gradient is held at zero by "
                             "convention, on every backend; the referee holds the row fixed too, so it does not "
                             "referee it")
            if _arg(node, 3, "scale_grad_by_freq", False):
                notes.append(f"{leaf}: scale_grad_by_freq divides each row's gradient by how often the batch "
                             "looks it up, torch's convention; every backend follows it, and the referee measures "
                             "the same scaled derivative")
        elif target == "aten.embedding_renorm.default":
            leaf = _leaf(graph, node.args[0]) or "an embedding table"
            notes.append(f"{leaf}: max_norm={node.args[2]} renormalises the rows the batch looks up, in place "
                         "(torch's embedding_renorm_), and the gradient treats the renormalised table as the "
                         "parameter, torch's convention; every backend follows it and the referee holds the "
                         "renormalisation fixed")
    detached = [n for n in graph.nodes if n.op == "call_function" and str(n.target) == "aten.detach.default"
                and n.name not in graph.constants and n.users and _held_input(graph, n, held) is None]
    if detached:
        notes.append(f"the forward detaches {len(detached)} value{'s' if len(detached) > 1 else ''} (.detach(), "
                     "no_grad): every backend gives them no gradient, and the referee holds them fixed at the "
                     "case point")
    if graph.draws is not None and len(graph.draws):
        kinds: dict[str, int] = {}
        for name, _, _ in graph.draws.expected:
            op = _draw_name(name)
            kinds[op] = kinds.get(op, 0) + 1
        listed = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in kinds.items())
        but = " (but the one below)" if len(graph.draws.pinned) == 1 else (
            " (but those below)" if graph.draws.pinned else "")
        notes.append(f"{len(graph.draws)} random draw{'s' if len(graph.draws) > 1 else ''} ({listed}) come from "
                     f"the case seed{but}: every backend, torch's own run included, gets the same values")
        if graph.draws.pinned:
            which = ", ".join(f"#{k + 1} ({_draw_name(graph.draws.expected[k][0])})" for k in sorted(graph.draws.pinned))
            notes.append(f"random draw {which} decides a branch of the graph traced at the example inputs (LayerDrop's "
                         "coin): the graph is the path the capture's draw took, so that draw is the capture's on every "
                         "backend and for every seed, not the case seed's")
    return list(dict.fromkeys(notes))  # a table used twice (tied embeddings) is one fact

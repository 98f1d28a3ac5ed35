"""The model as a tree of layers, built from dotted leaf paths, for the HTML report.

``layer1.0.conv1.weight`` becomes layer1 > 0 > conv1 > weight.  Each layer row
takes the worst verdict beneath it, so a disagreement deep inside ResNet's
layer3 colours layer3 and is visible with everything else collapsed.
Native ``<details>`` elements do the collapsing: no script needed, and a
disagreement's branch is rendered ``open``.

Layers appear in forward order and each layer's parameters before its
buffers: the comparison lists forward outputs and updated buffers before the
gradients, so the tree is built from the gradient leaves first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html import escape as e

from gradcheck.results import LeafResult, worst_verdict

from ._common import GRADIENT_ROLES, SYMBOL, LeafNumbers, f32_flagged, fmt

# Float32Result verdicts as badges: "ok" looks like agreement, "unmeasured" like a skip.
_F32_CLASS = {"ok": "agree", "unmeasured": "skipped", "imprecise": "imprecise", "structural": "structural",
              "nonfinite": "nonfinite"}
_F32_SYMBOL = {"ok": "✓", "unmeasured": "–"}


@dataclass
class Node:
    name: str
    path: str
    children: dict[str, Node] = field(default_factory=dict)
    leaves: list[LeafResult] = field(default_factory=list)  # leaves whose path ends at this node

    def all_leaves(self) -> list[LeafResult]:
        out = list(self.leaves)
        for child in self.children.values():
            out += child.all_leaves()
        return out

    @property
    def verdict(self) -> str:
        # A skipped buffer under an agreeing layer does not make the layer "skipped".
        verdicts = [leaf.verdict for leaf in self.all_leaves()]
        compared = [v for v in verdicts if v != "skipped"]
        return worst_verdict(compared or verdicts)

    @property
    def layer(self) -> str:
        """The layer type when every leaf directly under this node agrees on one."""
        direct = {c.leaves[0].layer for c in self.children.values() if c.leaves and not c.children}
        return direct.pop() if len(direct) == 1 else ""


def _insert(node: Node, part: str, path: str) -> Node:
    """The child ``part`` of ``node``, created in place: a numbered layer that first appears late (one with
    buffers only) goes before the first sibling with a larger number, so ``2`` still sits between ``1`` and ``3``."""
    if part in node.children:
        return node.children[part]
    child = Node(part, path)
    if part.isdigit():
        items = list(node.children.items())
        at = next((k for k, (name, _) in enumerate(items) if name.isdigit() and int(name) > int(part)), None)
        if at is not None:
            items.insert(at, (part, child))
            node.children = dict(items)
            return child
    node.children[part] = child
    return child


def build_tree(leaves: list[LeafResult]) -> Node:
    """Nodes in forward order of the gradient leaves, then the rest; an empty path segment is kept, shown as ""."""
    root = Node("", "")
    ordered = [x for x in leaves if x.role in GRADIENT_ROLES] + [x for x in leaves if x.role not in GRADIENT_ROLES]
    for leaf in ordered:
        node = root
        for part, prefix in segments(leaf.path):
            node = _insert(node, part, prefix)
        node.leaves.append(leaf)
    return root


# One segment of a pytree path: ['key'] or ["key"], [index], or a name between "." and "/" separators.
_SEGMENT = re.compile(r"\['([^']*)'\]|\[\"([^\"]*)\"\]|\[(\d+)\]|([^./\[\]]+)")


def segments(path: str) -> list[tuple[str, str]]:
    """``(name, the path up to and including it)`` per level of a leaf's path: torch's and gradcheck's dotted
    paths (``layer1.0.conv1.weight``), flax's ``params/Dense_0/kernel`` and ``jax.tree_util.keystr``'s
    ``.layers[0].weight`` or ``['encoder']['w']``, so the tree follows the model's own structure."""
    if "/" not in path and "[" not in path:  # a dotted path, empty segments kept
        parts = path.split(".")
        return [(part, ".".join(parts[: i + 1])) for i, part in enumerate(parts)]
    found = [(next(g for g in m.groups() if g is not None), path[: m.end()]) for m in _SEGMENT.finditer(path)]
    return found or [(path, path)]


def vclass(verdict: str) -> str:
    """The CSS class for a verdict; a verdict this version does not know gets the "unknown" style."""
    return f"v-{verdict}" if verdict in SYMBOL or verdict in ("interrupted", "empty") else "v-unknown"


def badge(verdict: str) -> str:
    return f'<span class="badge {vclass(verdict)}">{SYMBOL.get(verdict, "?")} {e(verdict)}</span>'


def f32badge(verdict: str) -> str:
    """A badge for a Float32Result verdict (``ok``, ``imprecise``, ``unmeasured`` …)."""
    cls = vclass(_F32_CLASS.get(verdict, verdict))
    sym = _F32_SYMBOL.get(verdict, SYMBOL.get(verdict, "?"))
    return f'<span class="badge f32 {cls}">{sym} {e(verdict)}</span>'


def _shape(shape) -> str:
    return "×".join(str(s) for s in shape) if shape else "scalar"


def _leaf_row(name: str, leaf: LeafResult, anchors: dict[int, str]) -> str:
    n = LeafNumbers.of(leaf)
    label = e(name)
    anchor = anchors.get(id(leaf))
    if anchor:
        label = f'<a href="#{anchor}">{label}</a>'
    blame = f'<span class="blame">blamed: {e(", ".join(leaf.blame))}</span>' if leaf.blame else ""
    f32 = ""
    if f32_flagged(leaf):
        f32 = f'<span class="f32flag" title="float32: {e(", ".join(leaf.float32.imprecise))}">≈ float32</span>'
    # A leaf that only inherits a wrong layer's error (gradcheck.check.localise) is greyed: look at the origin.
    inherited = " inherited" if getattr(leaf, "inherited", False) else ""
    if inherited:
        blame += '<span class="tmeta" title="disagrees only because a layer after it is wrong">inherited</span>'
    return (f'<div class="trow leaf {vclass(leaf.verdict)}{inherited}" '
            f'data-path="{e(leaf.path)}"><span class="tname">{label}</span>'
            f'<span class="tmeta">{e(leaf.role)} · {e(_shape(leaf.shape))}</span>{badge(leaf.verdict)}{f32}'
            f'<span class="num" title="headroom: float64 error ÷ tolerance, worst pair; above 1 fails">{e(fmt(n.headroom))}</span>{blame}</div>')


def _count(leaves: list[LeafResult]) -> str:
    bad = sum(1 for leaf in leaves if leaf.failing)
    vacuous = sum(1 for leaf in leaves if leaf.verdict == "vacuous")
    text = f"{bad} of {len(leaves)} failing" if bad else ("1 leaf" if len(leaves) == 1 else f"{len(leaves)} leaves")
    return text + (f" · {vacuous} vacuous" if vacuous else "")


def _node(node: Node, anchors: dict[int, str], origin: str = "") -> str:
    inner = []
    for leaf in node.leaves:
        # A path that is both a leaf and a prefix of others (rare) shows the leaf first.
        inner.append(_leaf_row("(self)", leaf, anchors))
    for child in node.children.values():
        if child.children:
            inner.append(_node(child, anchors, origin))
        else:
            inner += [_leaf_row(child.name, leaf, anchors) for leaf in child.leaves]
    leaves = node.all_leaves()
    bad = any(leaf.failing for leaf in leaves)
    layer = f'<span class="tmeta">{e(node.layer)}</span>' if node.layer else ""
    if origin and node.path == origin:  # the layer whose own VJP (or forward) the replay found wrong
        layer += '<span class="origin" title="the per-layer replay found the disagreement starts here">◆ origin</span>'
    opened = " open" if bad or (origin and origin.startswith(node.path)) else ""
    return (f'<details class="tnode"{opened}><summary class="trow {vclass(node.verdict)}"><span class="tname">'
            f'{e(node.name)}</span>{layer}{badge(node.verdict)}<span class="tcount">{e(_count(leaves))}</span></summary>'
            f'<div class="tkids">{"".join(inner)}</div></details>')


def tree_html(leaves: list[LeafResult], anchors: dict[int, str], origin: str = "") -> str:
    """The tree; ``origin`` (a module path, ``CaseResult.origin.path``) is marked where it is."""
    root = build_tree(leaves)
    rows = []
    for child in root.children.values():
        if child.children:
            rows.append(_node(child, anchors, origin))
        else:
            rows += [_leaf_row(child.name, leaf, anchors) for leaf in child.leaves]
    return f'<div class="tree">{"".join(rows)}</div>'

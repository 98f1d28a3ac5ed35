"""The model as a tree of layers, built from dotted leaf paths, for the HTML report.

``layer1.0.conv1.weight`` becomes layer1 > 0 > conv1 > weight.  Each layer row
takes the worst verdict beneath it, so a disagreement deep inside ResNet's
layer3 colours layer3 and is visible with everything else collapsed.
Native ``<details>`` elements do the collapsing: no script needed, and a
disagreement's branch is rendered ``open``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape as e

from gradcheck.results import LeafResult, worst_verdict

from ._common import SYMBOL, LeafNumbers, fmt, is_failing


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


def build_tree(leaves: list[LeafResult]) -> Node:
    """Nodes in first-seen (forward) order; an empty path segment is kept, shown as ""."""
    root = Node("", "")
    for leaf in leaves:
        node = root
        parts = leaf.path.split(".")
        for i, part in enumerate(parts):
            node = node.children.setdefault(part, Node(part, ".".join(parts[: i + 1])))
        node.leaves.append(leaf)
    return root


def vclass(verdict: str) -> str:
    """The CSS class for a verdict; a verdict this version does not know gets the "unknown" style."""
    return f"v-{verdict}" if verdict in SYMBOL else "v-unknown"


def badge(verdict: str) -> str:
    return f'<span class="badge {vclass(verdict)}">{SYMBOL.get(verdict, "?")} {e(verdict)}</span>'


def _shape(shape) -> str:
    return "×".join(str(s) for s in shape) if shape else "scalar"


def _leaf_row(name: str, leaf: LeafResult, anchors: dict[int, str]) -> str:
    n = LeafNumbers.of(leaf)
    label = e(name)
    anchor = anchors.get(id(leaf))
    if anchor:
        label = f'<a href="#{anchor}">{label}</a>'
    blame = f'<span class="blame">blamed: {e(", ".join(leaf.blame))}</span>' if leaf.blame else ""
    return (f'<div class="trow leaf {vclass(leaf.verdict)}" '
            f'data-path="{e(leaf.path)}"><span class="tname">{label}</span>'
            f'<span class="tmeta">{e(leaf.role)} · {e(_shape(leaf.shape))}</span>{badge(leaf.verdict)}'
            f'<span class="num" title="headroom: max error ÷ tolerance">{e(fmt(n.headroom))}</span>{blame}</div>')


def _node(node: Node, anchors: dict[int, str]) -> str:
    inner = []
    for leaf in node.leaves:
        # A path that is both a leaf and a prefix of others (rare) shows the leaf first.
        inner.append(_leaf_row("(self)", leaf, anchors))
    for child in node.children.values():
        if child.children:
            inner.append(_node(child, anchors))
        else:
            inner += [_leaf_row(child.name, leaf, anchors) for leaf in child.leaves]
    leaves = node.all_leaves()
    bad = sum(1 for leaf in leaves if is_failing(leaf.verdict))
    verdict = node.verdict
    count = f"{bad} of {len(leaves)} failing" if bad else f"{len(leaves)} leaf" + ("" if len(leaves) == 1 else "s")
    layer = f'<span class="tmeta">{e(node.layer)}</span>' if node.layer else ""
    opened = " open" if bad else ""
    return (f'<details class="tnode"{opened}><summary class="trow {vclass(verdict)}"><span class="tname">{e(node.name)}</span>'
            f'{layer}{badge(verdict)}<span class="tcount">{e(count)}</span></summary>'
            f'<div class="tkids">{"".join(inner)}</div></details>')


def tree_html(leaves: list[LeafResult], anchors: dict[int, str]) -> str:
    root = build_tree(leaves)
    rows = []
    for child in root.children.values():
        if child.children:
            rows.append(_node(child, anchors))
        else:
            rows += [_leaf_row(child.name, leaf, anchors) for leaf in child.leaves]
    return f'<div class="tree">{"".join(rows)}</div>'

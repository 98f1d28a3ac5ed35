"""A float64 pass that moves a few leaves recomputes only the nodes downstream of them.

The per-leaf referee moves one leaf at a time (four float64 passes per
leaf), and most of a graph does not depend on most leaves: a transformer's
last block is not upstream of its first block's weights' effect, nor is the
embedding of anything but everything.  A pass made under a float64 reference
forward's recording (``kinks.recording(hold=reference)``: the whole model's
passes, ``runner.CaseRun.loss64``, which the referee and the loss-noise probe
take) gets, for every node none of whose inputs moved, the value the
reference forward computed, without running it.  A submodule replayed alone
(``units``) runs its nodes whole.

What makes that exact rather than close:

- a node is reused only if every placeholder upstream of it holds the
  reference's value, element for element (``np.array_equal``; not identity,
  as the referee's arguments are copies), and the random draws are the same
  case seed's; every op is a function of its inputs and the case draw, so a
  full pass would compute the same arrays;
- the kink decisions a reused node took in the reference are appended to
  the pass's recording in their place, and its held values (``stop_gradient``)
  are skipped in theirs, so the pass's recording is call for call the one a
  full pass makes (``kinks.differing`` counts the same crossings);
- the values are the reference forward's own, kept only for the recording
  that made them (a pass holding another recording recomputes everything).

Values (the placeholders' and the nodes') are kept up to ``LIMIT_BYTES`` per
graph and recording, for as long as the recording lives (the case's run); a
larger forward keeps none and its passes run whole.  Such a model's referee
mostly checks along joint directions, where every leaf moves and nothing could
be reused.
"""

from __future__ import annotations

import numpy as np

LIMIT_BYTES = 256 * 2**20


class Kept:
    """The node values, kink-call spans and held-value counts of one float64 reference forward of one graph."""

    def __init__(self, graph, seed: int, placeholders: dict):
        self.graph = graph  # the graph object these are values of (a graph recaptured is another object)
        self.seed = seed
        self.placeholders = placeholders  # placeholder name -> the value the reference ran at
        self.values: dict[str, object] = {}  # call_function node name -> its value
        self.branches: dict[str, list] = {}  # node name -> the kink branches it recorded
        self.held: dict[str, int] = {}  # node name -> how many held values it recorded
        self.bytes = sum(_nbytes(v) for v in placeholders.values())
        self.whole = True  # every node's value is kept (False once past LIMIT_BYTES: the record is not used)
        if self.bytes > LIMIT_BYTES:
            self._drop()

    def _drop(self) -> None:
        """Past the bound: keep nothing (the placeholders too, which are the reference forward's own copies)."""
        self.whole = False
        self.values.clear()
        self.branches.clear()
        self.held.clear()
        self.placeholders = {}

    def keep(self, node, value, branches: list, held: int) -> None:
        if not self.whole:
            return
        self.bytes += _nbytes(value)
        if self.bytes > LIMIT_BYTES:
            self._drop()
            return
        self.values[node.name] = value
        self.branches[node.name] = branches
        self.held[node.name] = held

    def reusable(self, values: dict) -> set[str]:
        """The call_function nodes none of whose upstream placeholders moved from the reference's values."""
        moved = {name for name, v in values.items() if not _same(self.placeholders.get(name), v)}
        out = set()
        for node in self.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "call_function" and node.name in self.values and not any(
                    n.name in moved for n in node.all_input_nodes):
                out.add(node.name)
            else:
                moved.add(node.name)
        return out


def _same(kept, value) -> bool:
    if kept is value:
        return True
    if kept is None or np.shape(kept) != np.shape(value) or np.asarray(kept).dtype != np.asarray(value).dtype:
        return False
    return bool(np.array_equal(kept, value))


def _nbytes(v) -> int:
    if isinstance(v, np.ndarray):
        return v.nbytes
    if isinstance(v, (tuple, list)):
        return sum(_nbytes(x) for x in v)
    return 0

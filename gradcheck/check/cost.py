"""What a float64 forward pass costs, counted rather than timed.

The referee's ``auto`` mode checks every leaf when that fits a budget in
seconds (two float64 forward passes per leaf).  Timing a pass to decide made
the choice depend on the machine's load, and on whether the pass was the
process's first: the same suite checked a different number of leaves from
run to run, and ResNet-18 sat a few seconds either side of the budget.
Instead the numpy forward counts its work while it runs -- the
multiply-adds of the contractions (conv, conv_transpose, matmul, einsum)
and the elements every op writes -- and the seconds are estimated at fixed
nominal rates.  Which referee mode a case gets is then a property of the
case, the same on every machine and every run.

The counter is the ``cost`` slot's interceptor of ``gradcheck.ops.dispatch``
while a ``counting()`` block runs: it sees every numpy kernel's output.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from gradcheck.ops import dispatch

# Nominal float64 rates of a two-core machine, fixed so that the estimate is.  Measured on
# one: BLAS contractions reach ~1e10 multiply-adds/s, an elementwise op writes ~3e8
# elements/s, and each op costs ~10 us of Python; the zoo's models' forward passes then come
# out between 0.35x and 1.7x their measured time (ResNet-18: 0.21 s estimated, 0.14 s taken).
MACS_PER_S = 1e10
ELEMENTS_PER_S = 3e8
SECONDS_PER_OP = 1e-5


@dataclass
class Work:
    macs: int = 0  # multiply-adds in contractions
    elements: int = 0  # elements written, by every op
    ops: int = 0

    def seconds(self) -> float:
        """The estimated time of the counted work at the nominal rates."""
        return self.macs / MACS_PER_S + self.elements / ELEMENTS_PER_S + self.ops * SECONDS_PER_OP

    def __str__(self) -> str:
        return f"{self.macs / 1e9:.3g} G multiply-adds, {self.elements / 1e6:.3g} M elements in {self.ops} ops"


SLOT = "cost"  # this module's slot among the op interceptors (gradcheck.ops.dispatch)


class _Counter(dispatch.Interceptor):
    """Adds each numpy kernel's work to ``work`` (other backends' kernels are not the float64 forward's)."""

    def __init__(self, work: Work):
        self.work = work

    def kernel(self, op: str, backend: str, args: tuple, out) -> None:
        if backend == "numpy":
            note(self.work, op, args, out)


@contextmanager
def counting() -> Iterator[Work]:
    """Count the work of the numpy ops run inside the block (apart from any outer block's count)."""
    with dispatch.intercepting(SLOT, _Counter(Work())) as counter:
        yield counter.work


def current() -> Work | None:
    """The work being counted, or None outside ``counting()``."""
    counter = dispatch.innermost(SLOT)
    return counter.work if counter is not None else None


def note(work: Work, op: str, args: tuple, out) -> None:
    """Add one numpy op's work to ``work``."""
    work.ops += 1
    for o in out if isinstance(out, tuple) else (out,):
        work.elements += int(np.size(o))
    work.macs += _contraction_macs(op, args, out)


def _contraction_macs(op: str, args: tuple, out) -> int:
    if op == "conv":  # each output element: in_channels/groups x kernel multiply-adds
        return int(np.size(out)) * math.prod(np.shape(args[1])[1:])
    if op == "conv_transpose":  # the adjoint: each input element spreads over out/groups x kernel
        return int(np.size(args[0])) * math.prod(np.shape(args[1])[1:])
    if op == "matmul":
        return int(np.size(out)) * int(np.shape(args[0])[-1])
    if op == "einsum":
        return _einsum_macs(args[0], args[1:])
    return 0


def _einsum_macs(subscripts: str, operands) -> int:
    """The product of every index's size: the multiply-adds of the contraction done naively."""
    inputs = subscripts.split("->")[0].replace(" ", "").split(",")
    if "..." in subscripts or len(inputs) != len(operands):
        return 0
    sizes: dict[str, int] = {}
    for letters, operand in zip(inputs, operands, strict=True):
        for letter, size in zip(letters, np.shape(operand), strict=False):
            sizes[letter] = int(size)
    return math.prod(sizes.values())

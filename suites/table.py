"""The row type suites are written in, and how rows become cases.

A ``Row`` is one layer configuration: the layer's name (what ``gradcheck run
Conv2d`` selects), a short parameter label, how to build it and how to draw
its inputs.  ``cases`` turns rows into one ``Case`` each, named
``Layer[params]`` (``Conv2d[k3,s2,p1,g2]``).  Each case is checked in
float64 and measured in float32 (``dtype="float32"``, the default), or
checked in float64 alone (``dtype="float64"``): see ``gradcheck.check.verdict``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradcheck.case import Case
from gradcheck.suites.inputs import kink_free


@dataclass(frozen=True)
class Row:
    layer: str
    params: str
    build: Callable[[np.random.Generator], Any]
    inputs: Callable[[np.random.Generator], tuple]
    mode: str = "train"
    forward: Callable | None = None
    notes: tuple = ()

    @property
    def label(self) -> str:
        return f"{self.layer}[{self.params}]" if self.params else self.layer


def cases(rows, seed: int = 0, dtype: str | None = None) -> list[Case]:
    """One case per row: float64 and float32 (``dtype="float64"``: float64 only)."""
    return [
        Case(
            name=row.label,
            build=row.build,
            inputs=row.inputs,
            dtype=dtype or "float32",
            mode=row.mode,
            seed=seed,
            forward=row.forward,
            model=row.layer,
            notes=list(row.notes),
        )
        for row in rows
    ]


# -- builders and input makers that keep the tables one line per row ---------------------------
def make(cls, *args, **kwargs):
    """``build(rng)`` for ``cls(*args, rng=rng, **kwargs)``."""
    return lambda rng: cls(*args, rng=rng, **kwargs)


def normal(*shape, scale: float = 1.0):
    return lambda rng: (rng.standard_normal(shape) * scale,)


def smooth_free(*shape, scale: float = 1.0, shift: float = 0.0):
    """Distinct values clear of ``shift`` (kinks of relu, max-pool ties; see suites/inputs.py)."""
    return lambda rng: (kink_free(rng, shape, scale) + shift,)


def several(*makers):
    """Inputs from several makers, concatenated into one tuple."""
    return lambda rng: tuple(x for m in makers for x in m(rng))


def constant(*arrays):
    return lambda rng: tuple(np.asarray(a) for a in arrays)


def token_ids(*shape, high: int):
    return lambda rng: (rng.integers(0, high, size=shape, dtype=np.int64),)


NOTE_KINK_FREE = "inputs drawn kink-free: distinct values at least 1e-3 from 0 (no relu-at-0, no max-pool ties)"

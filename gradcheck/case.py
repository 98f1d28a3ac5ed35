"""A case: one model, its inputs and how to check it.

Everything random about a case (parameters, inputs, the loss cotangent,
dropout masks) is drawn from ``seed`` in numpy, once, and handed bit-identical
to every backend.  Suites are lists of cases; ``gradcheck run pkg.mod:fn``
accepts a function returning a case or a list of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradcheck.module import Module


@dataclass
class Case:
    """What to check.

    * ``build(rng)`` returns the model (a ``Module``; parameters drawn from ``rng``).
    * ``inputs(rng)`` returns a tuple of numpy arrays (float inputs are cast
      to ``dtype`` and their gradients compared; integer inputs such as token
      ids are constants).
    * ``forward(model, *inputs)`` is what gets differentiated; by default
      ``model(*inputs)``.  It may return an array or a tuple of arrays; the
      cross-check loss is the random projection ``<r, output>`` over all of them.
    """

    name: str
    build: Callable[[np.random.Generator], Module]
    inputs: Callable[[np.random.Generator], tuple]
    dtype: str = "float32"
    mode: str = "train"  # "train" or "eval"
    seed: int = 0
    forward: Callable[..., Any] | None = None
    model: str = ""  # the model or layer name, for grouping in reports
    notes: list[str] = field(default_factory=list)
    # The narrowest float the float64 run still computes in: a cast the model makes itself, which every backend
    # follows (from_jax keeps ``x.astype(jnp.float32)``), so float64's reach is held at that float's rounding.
    float64_computes_in: str = "float64"

    def __post_init__(self):
        from gradcheck.check.conditioning import unit_roundoff

        if self.mode not in ("train", "eval"):
            raise ValueError(f"case {self.name!r}: mode={self.mode!r}; expected 'train' or 'eval'")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"case {self.name!r}: dtype={self.dtype!r}; expected 'float32' or 'float64'")
        try:
            unit_roundoff(self.float64_computes_in)
        except ValueError as exc:
            raise ValueError(f"case {self.name!r}: float64_computes_in={self.float64_computes_in!r}: {exc}") from None

    def with_(self, **changes) -> Case:
        """A copy with some fields changed (dtype, seed, mode, name...)."""
        from dataclasses import replace

        return replace(self, **changes)


def cast_floats(tree, dtype):
    """Cast every float array leaf (params, buffers, inputs) of a structure to ``dtype``."""
    from gradcheck.tree import is_float_array, map_leaves

    return map_leaves(tree, lambda path, v, kind: np.asarray(v, dtype=dtype) if is_float_array(v) else v)


def materialise(case: Case):
    """Build the model and inputs of a case from its seed: ``(model, inputs)`` in the case dtype.

    Parameters and inputs come from separate streams of the seed, so changing
    an input shape does not change the parameters.
    """
    param_rng, input_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(case.seed).spawn(2))
    model = case.build(param_rng)
    if not isinstance(model, Module):
        raise TypeError(
            f"case {case.name!r}: build() returned a {type(model).__name__}; it must return a "
            "gradcheck Module (layers from gradcheck.layers or your own Module subclass)"
        )
    model.train(case.mode == "train")
    inputs = case.inputs(input_rng)
    if not isinstance(inputs, tuple):
        inputs = (inputs,)
    return cast_floats(model, case.dtype), cast_floats(inputs, case.dtype)

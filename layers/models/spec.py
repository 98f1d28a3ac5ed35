"""What a named model is: a factory, its options, its default input and a small size for suites."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gradcheck.module import Module


@dataclass(frozen=True)
class ModelSpec:
    """A named model the CLI and the suites can build by name.

    * ``factory(rng=None, **options)`` builds the model;
    * ``make_inputs(rng, batch, input_shape, **options)`` draws a tuple of
      numpy inputs (float images/features, or int64 token ids);
    * ``input_shape`` is the per-example default (no batch dim), or a
      function of the options giving it (an MLP's input follows
      ``in_features``); ``batch`` is the default batch size; both are
      documented in ``description``;
    * ``options`` are the factory's keyword defaults (what ``--option`` may
      change), ``small`` the overrides (options, ``batch``, ``input_shape``)
      that make the model fast enough for the ``models`` suite.
    """

    name: str
    factory: Callable[..., Module]
    make_inputs: Callable[..., tuple]
    input_shape: tuple | Callable[..., tuple]
    batch: int
    description: str
    options: dict = field(default_factory=dict)
    small: dict = field(default_factory=dict)
    input_kind: str = "float"  # "float" or "int" (token ids: constants, not differentiated)

    def _split(self, kw: dict) -> dict:
        unknown = sorted(set(kw) - set(self.options) - {"batch", "input_shape"})
        if unknown:
            raise ValueError(
                f"model {self.name!r} has no option {', '.join(map(repr, unknown))}; "
                f"its options are {sorted(self.options) + ['batch', 'input_shape']}"
            )
        return {**self.options, **{k: v for k, v in kw.items() if k in self.options}}

    def build(self, rng=None, **kw) -> Module:
        """The model; ``batch``/``input_shape`` may be passed too and are ignored here."""
        return self.factory(rng=rng, **self._split(kw))

    def inputs(self, rng, batch: int | None = None, input_shape=None, **kw) -> tuple:
        """A tuple of numpy inputs: ``batch`` examples of ``input_shape`` (defaults: the spec's)."""
        shape = tuple(input_shape) if input_shape is not None else self.default_input_shape(**kw)
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        return tuple(self.make_inputs(rng, batch or self.batch, shape, **self._split(kw)))

    def default_input_shape(self, **kw) -> tuple:
        """The per-example input shape for these options (no batch dim)."""
        shape = self.input_shape
        return tuple(shape(**self._split(kw)) if callable(shape) else shape)

    def case(self, seed: int = 0, dtype: str = "float32", mode: str = "train", batch: int | None = None,
             input_shape=None, size: str = "default", name: str | None = None, **kw):
        """A ``gradcheck.case.Case`` for this model; ``size="small"`` applies ``small`` first."""
        from gradcheck.case import Case

        if size not in ("default", "small"):
            raise ValueError(f"size={size!r}; expected 'default' or 'small'")
        settings = {**(self.small if size == "small" else {}), **kw}
        batch = batch or settings.pop("batch", None) or self.batch
        input_shape = input_shape or settings.pop("input_shape", None)
        settings.pop("batch", None)
        settings.pop("input_shape", None)
        input_shape = tuple(input_shape) if input_shape else self.default_input_shape(**settings)
        shape_txt = "x".join(map(str, input_shape))
        return Case(
            name=name or f"{self.name}[{shape_txt},b{batch}]",
            build=lambda rng: self.build(rng, **settings),
            inputs=lambda rng: self.inputs(rng, batch, input_shape, **settings),
            dtype=dtype,
            mode=mode,
            seed=seed,
            model=self.name,
        )

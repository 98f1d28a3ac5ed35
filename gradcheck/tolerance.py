"""Tolerance rules: defaults per dtype, overridable by leaf glob, layer type, backend pair and dtype.

Two arrays agree elementwise when ``|a - b| <= atol + rtol * |b|`` (the
``torch.testing`` / ``numpy.isclose`` form).  A gradient's scale varies by
orders of magnitude between leaves, so the absolute part is relative to the
leaf: ``atol = atol_scale * max|b|`` — an element that is 1e-4 of the largest
gradient entry in float32 is noise, whatever its own magnitude.  A rule may
also give a fixed ``atol``, which is added to that.

Defaults and their sources:

* float32: ``rtol = 2e-3`` — jax's default gradient tolerance for float32
  (``jax._src.public_test_util``); ``atol_scale = 1e-4``.  torch.testing's
  float32 ``rtol = 1.3e-6`` is for single ops: gradients summed over 10^5
  terms in different orders by different libraries drift far more than that.
* float64: ``rtol = 1e-7``, ``atol_scale = 1e-9`` — torch.testing's float64
  ``rtol``; float64 backends agree to 1e-12 on well-conditioned models.
* The referee (float64 central differences against one backend's directional
  derivative) uses ``referee_rtol``: 2e-3 for float32 gradients, 1e-5 for
  float64 (jax's float64 gradient tolerance; the truncation error of a central
  difference in float64 is about 1e-10 relative).

Rules come from ``[tool.gradcheck]`` in ``pyproject.toml`` or a TOML file::

    [tool.gradcheck.tolerance]
    float32 = { rtol = 5e-3 }

    [[tool.gradcheck.tolerance.rules]]
    leaf = "layer4.*"          # glob on the dotted leaf path
    layer = "BatchNorm2d"      # the owning layer's type
    backends = ["tape", "jax"] # this pair only (order does not matter)
    dtype = "float32"
    rtol = 1e-2
    atol_scale = 1e-3

Every matching rule applies in order, later ones overriding earlier ones
field by field; the verdict records which rules decided.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace

from gradcheck.results import Tolerance

DEFAULTS = {
    "float32": {"rtol": 2e-3, "atol": 0.0, "atol_scale": 1e-4, "referee_rtol": 2e-3},
    "float64": {"rtol": 1e-7, "atol": 0.0, "atol_scale": 1e-9, "referee_rtol": 1e-5},
}
_FIELDS = ("rtol", "atol", "atol_scale", "referee_rtol")


@dataclass(frozen=True)
class Rule:
    rtol: float | None = None
    atol: float | None = None
    atol_scale: float | None = None
    referee_rtol: float | None = None
    leaf: str | None = None
    layer: str | None = None
    backends: tuple[str, ...] | None = None
    dtype: str | None = None
    name: str = ""

    def matches(self, path: str, layer: str, pair: tuple[str, str] | None, dtype: str) -> bool:
        if self.leaf is not None and not fnmatch.fnmatchcase(path, self.leaf):
            return False
        if self.layer is not None and self.layer != layer:
            return False
        if self.dtype is not None and self.dtype != dtype:
            return False
        if self.backends is not None and (pair is None or set(pair) != set(self.backends)):
            return False
        return True

    def describe(self) -> str:
        if self.name:
            return self.name
        where = [f"{k}={v}" for k, v in (("leaf", self.leaf), ("layer", self.layer),
                                          ("backends", "/".join(self.backends) if self.backends else None),
                                          ("dtype", self.dtype)) if v is not None]
        return "rule " + (", ".join(where) if where else "(all leaves)")


@dataclass
class ResolvedTolerance:
    rtol: float
    atol: float
    atol_scale: float
    referee_rtol: float
    rules: list[str] = field(default_factory=list)

    def absolute(self, scale: float) -> float:
        """The absolute tolerance for a leaf whose reference has ``max|b| = scale``."""
        return self.atol + self.atol_scale * scale

    def record(self, scale: float) -> Tolerance:
        return Tolerance(rtol=self.rtol, atol=self.absolute(scale), rule="; ".join(self.rules))


@dataclass
class ToleranceRules:
    """Defaults per dtype plus ordered override rules."""

    defaults: dict[str, dict[str, float]] = field(default_factory=lambda: {k: dict(v) for k, v in DEFAULTS.items()})
    rules: list[Rule] = field(default_factory=list)

    def resolve(self, path: str, dtype: str, layer: str = "", pair: tuple[str, str] | None = None) -> ResolvedTolerance:
        if dtype not in self.defaults:
            raise ValueError(f"no default tolerance for dtype {dtype!r}; known: {', '.join(self.defaults)}")
        base = self.defaults[dtype]
        source = "torch.testing/jax defaults" if base == DEFAULTS.get(dtype) else "configured defaults"
        tol = ResolvedTolerance(**{k: base[k] for k in _FIELDS}, rules=[f"default {dtype} ({source})"])
        for rule in self.rules:
            if rule.matches(path, layer, pair, dtype):
                for k in _FIELDS:
                    value = getattr(rule, k)
                    if value is not None:
                        setattr(tol, k, float(value))
                tol.rules.append(rule.describe())
        return tol

    def with_overrides(self, rtol: float | None = None, atol: float | None = None, name: str = "command line"):
        """A copy with one rule appended that applies everywhere (``--rtol``, ``--atol``)."""
        if rtol is None and atol is None:
            return self
        return replace(self, rules=self.rules + [Rule(rtol=rtol, atol=atol, name=name)])

    @classmethod
    def from_config(cls, config: dict, source: str = "config") -> ToleranceRules:
        """From the ``tolerance`` table of ``[tool.gradcheck]`` (see the module docstring)."""
        out = cls()
        if not config:
            return out
        if not isinstance(config, dict):
            raise ValueError(f"{source}: 'tolerance' must be a table, got {type(config).__name__}")
        for key, value in config.items():
            if key == "rules":
                continue
            if key not in out.defaults:
                raise ValueError(
                    f"{source}: tolerance.{key} is not a dtype; use float32/float64 for defaults "
                    "and [[tool.gradcheck.tolerance.rules]] for overrides"
                )
            out.defaults[key].update(_numbers(value, f"{source}: tolerance.{key}"))
        for i, raw in enumerate(config.get("rules", [])):
            where = f"{source}: tolerance.rules[{i}]"
            if not isinstance(raw, dict):
                raise ValueError(f"{where} must be a table")
            unknown = set(raw) - set(_FIELDS) - {"leaf", "layer", "backends", "dtype", "name"}
            if unknown:
                raise ValueError(
                    f"{where}: unknown key(s) {sorted(unknown)}; allowed: leaf, layer, backends, dtype, "
                    f"name, {', '.join(_FIELDS)}"
                )
            backends = raw.get("backends")
            if backends is not None:
                if isinstance(backends, str):
                    backends = [b.strip() for b in backends.split(",")]
                if len(backends) != 2:
                    raise ValueError(f"{where}: backends={backends!r} must name exactly two backends")
                backends = tuple(backends)
            nums = _numbers({k: raw[k] for k in _FIELDS if k in raw}, where)
            out.rules.append(Rule(leaf=raw.get("leaf"), layer=raw.get("layer"), backends=backends,
                                  dtype=raw.get("dtype"), name=raw.get("name", ""), **nums))
        return out


def _numbers(table, where) -> dict[str, float]:
    if not isinstance(table, dict):
        raise ValueError(f"{where} must be a table like {{ rtol = 1e-3 }}")
    out = {}
    for k, v in table.items():
        if k not in _FIELDS:
            raise ValueError(f"{where}: unknown key {k!r}; allowed: {', '.join(_FIELDS)}")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{where}.{k} = {v!r}: expected a non-negative number")
        out[k] = float(v)
    return out

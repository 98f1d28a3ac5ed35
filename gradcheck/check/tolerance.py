"""Tolerance rules: defaults per dtype, overridable by leaf glob, layer type, backend pair and dtype.

Backends are compared in float64 (``gradcheck.check.verdict``: float64 decides,
float32 is measured against it).  Two criteria, chosen per dtype (a rule may
switch them with ``criterion``):

* ``elementwise`` — every element within ``|a - b| <= atol + rtol * |b|``
  (the ``torch.testing`` / ``numpy.isclose`` form), with an absolute part
  relative to the leaf: ``atol = atol_scale * max|b|`` plus any fixed
  ``atol``.  A gradient's scale varies by orders of magnitude between leaves,
  so a fixed absolute tolerance would be meaningless.
* ``norm`` — ``||a - b|| / ||b|| <= norm_rtol``.

Defaults and their sources:

* float64: elementwise, ``rtol = 1e-7`` (torch.testing's float64 rtol),
  ``atol_scale = 1e-9``.  Backends agree to about 1e-12 in float64 on every
  model here, ResNet-18 at 224x224 included, so this is tight and still far
  from flaking; a 1e-6 relative error in one leaf is caught.  The referee's
  tolerance is not a setting: it is derived from its own truncation and
  rounding error, per check (``gradcheck.check.referee``); ``referee_rtol`` only
  bounds it from below, as a relative floor.
* float32 (the precision measurement, ``gradcheck.check.verdict.float32_part``): a
  backend is imprecise on a leaf when its float32 error against its own
  float64 result, ``||x32 - x64|| / ||x64||``, exceeds ``imprecise_factor``
  times the best backend's plus ``imprecise_floor``; ``imprecise_floor`` also
  bounds how far two float32 calls may differ (of the leaf's largest value)
  before a backend is nondeterministic.  The harness never compares float32 arrays across
  backends, so float32's ``criterion``/``rtol``/``atol_scale``/``norm_rtol``
  apply only to a caller that does (``compare_leaf(..., dtype="float32")``).

Rules come from ``[tool.gradcheck]`` in ``pyproject.toml`` or a TOML file::

    [tool.gradcheck.tolerance]
    float32 = { imprecise_factor = 20 }

    [[tool.gradcheck.tolerance.rules]]
    leaf = "layer4.*"          # glob on the dotted leaf path
    layer = "BatchNorm2d"      # the owning layer's type
    backends = ["tape", "jax"] # this pair only (order does not matter)
    dtype = "float64"
    criterion = "elementwise"
    rtol = 1e-6
    atol_scale = 1e-8

Every matching rule applies in order, later ones overriding earlier ones
field by field; the verdict records which rules decided.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace

from gradcheck.results import Tolerance

# float32 precision (see gradcheck.check.verdict): imprecise beyond this multiple of the best backend's float32
# error against float64, plus this floor.  Measured and explained in docs/decisions.md.
IMPRECISE_FACTOR = 10.0
IMPRECISE_FLOOR = 1e-4

DEFAULTS = {
    "float32": {"criterion": "norm", "rtol": 2e-3, "atol": 0.0, "atol_scale": 1e-4, "norm_rtol": 1e-3,
                "referee_rtol": 2e-3, "imprecise_factor": IMPRECISE_FACTOR, "imprecise_floor": IMPRECISE_FLOOR},
    "float64": {"criterion": "elementwise", "rtol": 1e-7, "atol": 0.0, "atol_scale": 1e-9, "norm_rtol": 1e-9,
                "referee_rtol": 1e-10, "imprecise_factor": IMPRECISE_FACTOR, "imprecise_floor": IMPRECISE_FLOOR},
}
_FIELDS = ("rtol", "atol", "atol_scale", "norm_rtol", "referee_rtol", "imprecise_factor", "imprecise_floor")
CRITERIA = ("elementwise", "norm")


@dataclass(frozen=True)
class Rule:
    rtol: float | None = None
    atol: float | None = None
    atol_scale: float | None = None
    norm_rtol: float | None = None
    referee_rtol: float | None = None
    imprecise_factor: float | None = None
    imprecise_floor: float | None = None
    criterion: str | None = None
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
    criterion: str
    rtol: float
    atol: float
    atol_scale: float
    norm_rtol: float
    referee_rtol: float
    imprecise_factor: float
    imprecise_floor: float
    rules: list[str] = field(default_factory=list)

    def absolute(self, scale: float) -> float:
        """The absolute tolerance for a leaf whose reference has ``max|b| = scale``."""
        return self.atol + self.atol_scale * scale

    def record(self, scale: float) -> Tolerance:
        rule = "; ".join(self.rules)
        if self.criterion == "norm":
            how = f"norm: ||a-b||/||b|| <= {self.norm_rtol:.3g}"
        else:
            how = f"elementwise: |a-b| <= {self.absolute(scale):.3g} + {self.rtol:.3g}|b|"
        return Tolerance(rtol=self.rtol, atol=self.absolute(scale), rule=f"{how} [{rule}]",
                         criterion=self.criterion, norm_rtol=self.norm_rtol)


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
        tol = ResolvedTolerance(criterion=base["criterion"], **{k: base[k] for k in _FIELDS},
                                rules=[f"default {dtype} ({source})"])
        for rule in self.rules:
            if rule.matches(path, layer, pair, dtype):
                for k in _FIELDS:
                    value = getattr(rule, k)
                    if value is not None:
                        setattr(tol, k, float(value))
                if rule.criterion is not None:
                    tol.criterion = rule.criterion
                tol.rules.append(rule.describe())
        return tol

    def with_overrides(self, rtol: float | None = None, atol: float | None = None, name: str = "command line"):
        """A copy with one rule appended that applies everywhere (``--rtol``, ``--atol``).

        ``rtol`` sets both the elementwise and the normwise relative tolerance,
        whichever criterion the dtype uses.
        """
        if rtol is None and atol is None:
            return self
        rule = Rule(rtol=rtol, norm_rtol=rtol, atol=atol, name=name)
        return replace(self, rules=self.rules + [rule])

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
            value = dict(value) if isinstance(value, dict) else value
            criterion = _criterion(value.pop("criterion", None) if isinstance(value, dict) else None,
                                   f"{source}: tolerance.{key}")
            out.defaults[key].update(_numbers(value, f"{source}: tolerance.{key}"))
            if criterion:
                out.defaults[key]["criterion"] = criterion
        for i, raw in enumerate(config.get("rules", [])):
            where = f"{source}: tolerance.rules[{i}]"
            if not isinstance(raw, dict):
                raise ValueError(f"{where} must be a table")
            unknown = set(raw) - set(_FIELDS) - {"leaf", "layer", "backends", "dtype", "name", "criterion"}
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
                                  dtype=raw.get("dtype"), name=raw.get("name", ""),
                                  criterion=_criterion(raw.get("criterion"), where), **nums))
        return out


def _criterion(value, where):
    if value is not None and value not in CRITERIA:
        raise ValueError(f"{where}: criterion = {value!r}; expected one of {', '.join(CRITERIA)}")
    return value


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

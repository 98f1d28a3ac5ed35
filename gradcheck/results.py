"""The result model: what a run found, case by case and leaf by leaf.

These dataclasses are the one source for every report (terminal, HTML, JSON,
JUnit, Markdown) and for ``gradcheck diff``.  ``to_dict``/``from_dict`` give
the JSON form documented in ``docs/results-schema.md``; the ``schema`` string
is bumped when a field changes meaning or disappears (adding one is allowed).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

SCHEMA = "gradcheck.results/1"

# Verdicts, worst first: a case takes the worst verdict among its leaves.
VERDICTS = ("error", "structural", "nonfinite", "disagree", "vacuous", "skipped", "agree")
FAILING = ("error", "structural", "nonfinite", "disagree", "vacuous")


def worst_verdict(verdicts) -> str:
    verdicts = list(verdicts)
    for v in VERDICTS:
        if v in verdicts:
            return v
    return "agree"


@dataclass
class Tolerance:
    rtol: float  # elementwise: |a - b| <= atol + rtol * |b|
    atol: float
    rule: str  # the criterion with its numbers, then which rules decided
    criterion: str = "elementwise"  # or "norm": ||a - b|| / ||b|| <= norm_rtol
    norm_rtol: float = 0.0
    noise: float | None = None  # measured float32 rounding noise of this leaf (normwise), if probed


@dataclass
class PairResult:
    """One backend's gradient held against a reference (another backend)."""

    backend: str
    reference: str
    verdict: str
    mismatched: int = 0  # elements outside |a - b| <= atol + rtol * |b|
    total: int = 0
    max_abs: float = 0.0
    max_abs_index: list[int] = field(default_factory=list)
    max_rel: float = 0.0
    max_rel_index: list[int] = field(default_factory=list)
    rel_err_norm: float = 0.0  # ||a - b|| / ||b||
    cosine: float = 1.0
    headroom: float = 0.0  # max over elements of |a - b| / (atol + rtol * |b|); > 1 fails
    message: str = ""


@dataclass
class RefereeCheck:
    """A backend's directional derivative <g, v> against float64 central differences."""

    backend: str
    directional: float  # <g_backend, v>
    numeric: float  # (L(x + h v) - L(x - h v)) / 2h in float64
    error: float  # |directional - numeric| / (tolerance)
    agrees: bool
    stable: bool = True  # the finite difference held when the step was doubled; if not, it abstains


@dataclass
class LeafResult:
    path: str  # dotted, as torch names it: "layer1.0.conv1.weight", "input", "output"
    role: str  # "param", "input", "output" (forward value), "buffer" (updated state)
    layer: str = ""  # the owning layer's type, e.g. "Conv2d"
    shape: list[int] = field(default_factory=list)
    dtype: str = ""
    verdict: str = "agree"
    blame: list[str] = field(default_factory=list)  # backends judged wrong
    message: str = ""  # one line: "jax: torch, tape and referee agree"
    tolerance: Tolerance | None = None
    pairs: list[PairResult] = field(default_factory=list)
    referee: list[RefereeCheck] = field(default_factory=list)
    # The worst elements: index and each backend's value there.
    worst: list[dict[str, Any]] = field(default_factory=list)
    # log10 of |a - b| / tolerance over all elements of the worst pair: bin edges and counts.
    histogram: dict[str, list[float]] = field(default_factory=dict)
    norms: dict[str, float] = field(default_factory=dict)  # backend -> ||grad||
    tie: bool = False  # a max/relu tie (a kink) was involved

    @property
    def headroom(self) -> float:
        return max((p.headroom for p in self.pairs), default=0.0)


@dataclass
class Timing:
    first: float | None = None  # seconds, first call (includes compilation: time to first gradient)
    second: float | None = None  # seconds, a second call (backends that compile only; None for eager ones)


@dataclass
class CaseResult:
    name: str
    verdict: str = "agree"
    model: str = ""
    dtype: str = "float32"
    mode: str = "train"
    seed: int = 0
    backends: list[str] = field(default_factory=list)
    leaves: list[LeafResult] = field(default_factory=list)
    timings: dict[str, Timing] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # backend (or "case") -> error text
    unavailable: dict[str, str] = field(default_factory=dict)  # backend -> why / how to install
    first_disagreement: str | None = None  # the first leaf in forward order that disagrees
    leaves_compared: int = 0
    params: int = 0  # number of scalar parameters
    referee_passes: int = 0  # float64 forward passes the referee spent
    replay: str = ""  # a command that re-runs just this case
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING

    def count(self, verdict: str) -> int:
        return sum(1 for leaf in self.leaves if leaf.verdict == verdict)


@dataclass
class RunResult:
    schema: str = SCHEMA
    env: dict[str, Any] = field(default_factory=dict)  # versions, seed, machine, command, started
    cases: list[CaseResult] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return worst_verdict(c.verdict for c in self.cases) if self.cases else "error"

    @property
    def failed(self) -> bool:
        return any(c.failed for c in self.cases) or not self.cases


# ---------------------------------------------------------------- (de)serialisation
def to_dict(obj) -> dict:
    return dataclasses.asdict(obj)


def _build(cls, data):
    """Rebuild a dataclass from its dict form, ignoring unknown keys (newer writers)."""
    if data is None:
        return None
    kwargs = {}
    for name in (f.name for f in dataclasses.fields(cls)):
        if name not in data:
            continue
        value = data[name]
        sub = _NESTED.get((cls, name))
        if sub is not None:
            kind, target = sub
            if kind == "list":
                value = [_build(target, v) for v in value]
            elif kind == "dict":
                value = {k: _build(target, v) for k, v in value.items()}
            else:
                value = _build(target, value)
        kwargs[name] = value
    return cls(**kwargs)


_NESTED = {
    (LeafResult, "tolerance"): ("one", Tolerance),
    (LeafResult, "pairs"): ("list", PairResult),
    (LeafResult, "referee"): ("list", RefereeCheck),
    (CaseResult, "leaves"): ("list", LeafResult),
    (CaseResult, "timings"): ("dict", Timing),
    (RunResult, "cases"): ("list", CaseResult),
}


def case_from_dict(data: dict) -> CaseResult:
    return _build(CaseResult, data)


def run_from_dict(data: dict) -> RunResult:
    schema = data.get("schema", "")
    if not str(schema).startswith("gradcheck.results/"):
        raise ValueError(f"not a gradcheck results file (schema={schema!r}); expected {SCHEMA!r}")
    return _build(RunResult, data)


def dumps(run: RunResult) -> str:
    return json.dumps(to_dict(run), indent=1, default=json_default, allow_nan=True)


def json_default(o):
    """``json.dumps``'s fallback for what results may hold besides plain Python: numpy scalars and arrays."""
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"cannot serialise {type(o).__name__}")


def load(path) -> RunResult:
    """Read results written as one JSON document or as JSON lines (a header, then one case a line)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    stripped = text.lstrip()
    if not stripped:
        raise ValueError(f"{path}: empty results file")
    try:
        return run_from_dict(json.loads(text))
    except json.JSONDecodeError:
        pass
    run = RunResult()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            # A run killed mid-write leaves a partial last line; everything before it counts.
            if n == len(text.splitlines()):
                break
            raise ValueError(f"{path}:{n}: not JSON ({exc})") from exc
        if record.get("type") == "run":
            run.schema = record.get("schema", SCHEMA)
            run.env = record.get("env", {})
        elif record.get("type") == "case":
            run.cases.append(case_from_dict(record["case"]))
    return run

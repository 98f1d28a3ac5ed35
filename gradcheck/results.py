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

SCHEMA = "gradcheck.results/2"

# Verdicts, worst first: a case takes the worst verdict among its leaves.
# "imprecise" (float32 too far from float64, see Float32Result) decides a case only under
# RunOptions.imprecise == "fail"; by default it is a warning beside an agreeing verdict.
# "partial" is a case's alone (never a leaf's): a backend asked for was unavailable, so the case was checked
# on fewer backends than the cross-check it asked for; it decides only under RunOptions.unavailable == "fail".
VERDICTS = ("error", "structural", "nonfinite", "nondeterministic", "disagree", "imprecise", "partial", "vacuous",
            "skipped", "agree")
FAILING = ("error", "structural", "nonfinite", "nondeterministic", "disagree", "imprecise", "partial", "vacuous")
# A leaf fails on these; a vacuous leaf checks nothing but is no failure of its own (a case fails as
# vacuous only when every gradient leaf is).  Every renderer and assert_gradients_agree use this rule.
FAILING_LEAF = ("error", "structural", "nonfinite", "nondeterministic", "disagree", "imprecise")
PASSING = ("agree", "skipped")
PASSING_LEAF = ("agree", "skipped", "vacuous")
# Float32Result.verdict values, worst first.
FLOAT32_VERDICTS = ("structural", "nonfinite", "imprecise", "unmeasured", "ok")


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
    # elementwise: max over elements of |a - b| / (atol + rtol * |b|); norm: rel_err_norm / norm_rtol; > 1 fails
    headroom: float = 0.0
    message: str = ""


@dataclass
class RefereeCheck:
    """A backend's directional derivative <g, v> against float64 central differences."""

    backend: str
    directional: float  # <g_backend, v>
    numeric: float  # (L(x + h v) - L(x - h v)) / 2h in float64
    error: float  # |directional - numeric| / resolution
    agrees: bool
    stable: bool = True  # the finite difference held when the step was doubled; if not, it abstains
    resolution: float = 0.0  # the absolute error the referee allows itself here, from its own error estimate


@dataclass
class Float32Result:
    """A leaf's float32 precision: each backend's float32 result measured against float64.

    ``errors[b]`` is ``||x32_b - x64_b|| / ||x64_b||``, backend ``b``'s float32
    result against its own float64 one (a wrong VJP is wrong in both and is the
    float64 verdict's to find; what remains is what float32 costs).  A backend
    is ``imprecise`` when its error exceeds ``limit = factor * best + floor``,
    where ``best`` is the smallest error of any backend on this leaf (the
    ``fp64_ref`` rule of torch._dynamo's accuracy check).  Kinks (relu at 0,
    max-pool arg-maxes) take the float64 reference's branch in every float32
    run, so these errors measure rounding alone (see ``CaseResult.kinks``).
    """

    errors: dict[str, float] = field(default_factory=dict)
    best: str = ""  # the backend with the smallest error
    limit: float = 0.0
    verdict: str = "ok"  # see FLOAT32_VERDICTS
    imprecise: list[str] = field(default_factory=list)  # backends beyond the limit (or structurally off)
    message: str = ""


@dataclass
class KinkReport:
    """Kinks one op call met in the float64 reference forward (relu inputs near 0, max-pool near-ties).

    ``near`` counts the elements whose distance from the kink, relative to
    the input's scale, is below float32's reach (``FLOAT32_REACH``): a float32
    forward may land on either side of those.  Every float32 run takes the
    float64 branch there; ``crossed[b]`` counts the elements where backend
    ``b``'s own float32 forward would have taken the other one.
    ``below_float64`` counts kinks closer than float64 resolves.
    """

    op: str
    layer: str = ""  # the module path where the op was called ("layer3.1"), "" at the top
    call: int = 0  # the op call's index in forward order
    elements: int = 0
    near: int = 0
    min_distance: float = 0.0  # the smallest |distance| / scale met
    below_float64: int = 0
    crossed: dict[str, int] = field(default_factory=dict)


@dataclass
class Origin:
    """Where a model's disagreement starts (per-layer VJP replay, ``gradcheck.check.localise``).

    ``kind`` is ``vjp`` (that layer's own backward disagrees when it is
    replayed alone on identical inputs and cotangent) or ``forward`` (no
    layer's own VJP disagrees: the backends' forward values part first at
    ``path``, e.g. at a kink).
    """

    path: str  # the layer's module path, "layer3.1.bn2"
    layer: str = ""  # its type, "BatchNorm2d"
    kind: str = "vjp"  # "vjp" or "forward"
    blame: list[str] = field(default_factory=list)
    op: str = ""  # the op inside the layer, where knowable
    message: str = ""


@dataclass
class LeafResult:
    path: str  # dotted, as torch names it: "layer1.0.conv1.weight", "input", "output"
    role: str  # "param", "input", "output" (forward value), "buffer" (updated state), "hvp" (a Hessian-vector product, path "hvp:<param>")
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
    float32: Float32Result | None = None  # the float32 part (None: the case ran float64 only)
    inherited: bool = False  # disagrees only because a layer after it in forward order is wrong (see Origin)
    # backend -> max |a - b| / max |a| between two calls on the same inputs (float32; float64 for a float64-only
    # case), where they differ at all
    nondeterministic: dict[str, float] = field(default_factory=dict)
    # How far a unit roundoff at every input moves this float64 gradient, relative to its norm (the median over
    # backends), where it was measured: the backends disagreed, and float64's own reach decided (gradcheck.check.conditioning)
    rounding: float = 0.0
    # backend -> why it gave no value for this leaf although it ran (role "hvp": "tape: max_pool2d has no second
    # derivative"); such a backend is neither compared nor blamed on this leaf
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def headroom(self) -> float:
        return max((p.headroom for p in self.pairs), default=0.0)

    @property
    def compared(self) -> bool:
        """Held against something: another backend, or a referee check that did not abstain.

        A leaf that one backend alone gave and nothing checked (the forward
        output when only torch ran) stays ``agree`` but compared nothing, so it
        is not counted as agreeing either; a verdict the comparison reached
        without pairs (structural, nonfinite) counts, since it is a finding.
        """
        if self.verdict == "skipped":
            return False
        return bool(self.pairs) or any(c.stable for c in self.referee) or self.verdict != "agree"

    @property
    def failing(self) -> bool:
        # A verdict this version does not know (a newer writer's) fails: nothing unknown passes.
        return self.verdict not in PASSING_LEAF


@dataclass
class Timing:
    first: float | None = None  # seconds, first float32 call (includes compilation: time to first gradient)
    second: float | None = None  # seconds, a second float32 call (backends that compile only; None for eager ones)
    float64: float | None = None  # seconds, the float64 call (compilation included)
    # seconds tracing and lowering ahead of the eager backends, whose runs then overlap the compilation
    # (runner._prepare_compiled); the calls above then include only the wait for it
    prepare: float | None = None


@dataclass
class SecondOrder:
    """How a case's second order was checked (``gradcheck.check.second_order``); its leaves are ``role == "hvp"``.

    Each backend's Hessian-vector product ``H v`` (the gradient of ``<grad f, v>``) for one random
    direction ``v`` over every trainable leaf, compared leaf by leaf like first order; the referee is
    float64 central differences of each backend's own float64 gradient along ``v``.
    """

    backends: list[str] = field(default_factory=list)  # the backends that gave a Hessian-vector product
    # backend -> why it cannot differentiate twice here ("tape: max_pool2d has no second derivative")
    unavailable: dict[str, str] = field(default_factory=dict)
    referee: str = ""  # how the second-order leaves were refereed ("" when the referee was off)
    referee_passes: int = 0  # float64 gradient evaluations the referee spent, over all backends
    timings: dict[str, Timing] = field(default_factory=dict)  # per backend: float64 (and first: float32) HVP call


@dataclass
class Trajectory:
    """N optimiser steps per backend from the same start on the same batches (``gradcheck.check.trajectory``)."""

    steps: int = 0
    optimizer: str = "sgd"  # "sgd" or "adam"
    lr: float = 0.0
    # backend -> the loss at its parameters after k steps, k = 0 .. steps (k = 0: the start), on batch k + 1
    losses: dict[str, list[float]] = field(default_factory=dict)
    # per step k = 1 .. steps: the largest headroom of any parameter, buffer or loss compared across backends
    headroom: list[float] = field(default_factory=list)
    parted: int | None = None  # the first step after which the backends part beyond tolerance (None: never)
    verdict: str = "agree"  # "agree", "disagree" (parted), "error"
    blame: list[str] = field(default_factory=list)  # the backends that left the others (by majority)
    message: str = ""
    leaves: list[LeafResult] = field(default_factory=list)  # parameters and buffers after the last step, float64
    errors: dict[str, str] = field(default_factory=dict)  # backend -> what raised (and at which step)
    seconds: dict[str, float] = field(default_factory=dict)  # backend -> seconds for all its steps


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
    # The float32 part: the worst leaf Float32Result.verdict ("" when float32 was not run), the policy
    # that says whether "imprecise" fails the case, and the kinks the float32 runs were pinned at.
    float32: str = ""
    imprecise: str = "warn"  # "warn" or "fail"
    kinks: list[KinkReport] = field(default_factory=list)
    unpinned: list[str] = field(default_factory=list)  # backends whose float32 run could not take those branches
    origin: Origin | None = None  # where the disagreement starts, when a per-layer replay ran
    second_order: SecondOrder | None = None  # how second order was checked (--order 2); its leaves are role "hvp"
    trajectory: Trajectory | None = None  # training-step trajectories (--steps N)
    # Whether a backend in ``unavailable`` fails the case ("fail": verdict "partial") or is reported beside a
    # passing verdict ("warn").
    unavailable_policy: str = "warn"

    @property
    def failed(self) -> bool:
        return self.verdict not in PASSING

    @property
    def partial(self) -> bool:
        """Checked on fewer backends than asked for: one or more was unavailable (not installed, or unable to
        run this case); never to be read as the cross-check that was asked for."""
        return bool(self.unavailable)

    @property
    def checked_on(self) -> list[str]:
        """The backends asked for that were available (in the order asked); an errored one stays (its error
        is the case's failure)."""
        return [b for b in self.backends if b not in self.unavailable]

    @property
    def compared(self) -> int:
        """Leaves held against something (``LeafResult.compared``), derived from the leaves themselves so that
        it and :attr:`agreeing` count the same leaves, in old files too."""
        return sum(1 for leaf in self.leaves if leaf.compared)

    @property
    def agreeing(self) -> int:
        """Compared leaves that agree: never more than :attr:`compared`."""
        return sum(1 for leaf in self.leaves if leaf.compared and leaf.verdict == "agree")

    def failing_leaves(self) -> list[LeafResult]:
        return [leaf for leaf in self.leaves if leaf.failing]

    def count(self, verdict: str) -> int:
        return sum(1 for leaf in self.leaves if leaf.verdict == verdict)


@dataclass
class RunResult:
    schema: str = SCHEMA
    env: dict[str, Any] = field(default_factory=dict)  # versions, seed, machine, command, started
    cases: list[CaseResult] = field(default_factory=list)
    planned: int | None = None  # how many cases the run set out to check
    interrupted: bool = False  # stopped (Ctrl-C) before every planned case ran

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
    (LeafResult, "float32"): ("one", Float32Result),
    (CaseResult, "kinks"): ("list", KinkReport),
    (CaseResult, "origin"): ("one", Origin),
    (CaseResult, "leaves"): ("list", LeafResult),
    (CaseResult, "timings"): ("dict", Timing),
    (CaseResult, "second_order"): ("one", SecondOrder),
    (CaseResult, "trajectory"): ("one", Trajectory),
    (SecondOrder, "timings"): ("dict", Timing),
    (Trajectory, "leaves"): ("list", LeafResult),
    (RunResult, "cases"): ("list", CaseResult),
}


def case_from_dict(data: dict) -> CaseResult:
    return _build(CaseResult, data)


def run_from_dict(data: dict) -> RunResult:
    if not isinstance(data, dict):
        raise ValueError(f"not a gradcheck results file (a JSON {type(data).__name__}, not an object with "
                         f"schema {SCHEMA!r})")
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
            if n == len(text.splitlines()) and n > 1:
                break
            raise ValueError(f"{path}:{n}: not JSON ({exc}); not a gradcheck results file") from exc
        if not isinstance(record, dict) or record.get("type") not in ("run", "case"):
            raise ValueError(f"{path}:{n}: not a gradcheck results record (expected a JSON object with type "
                             "'run' or 'case')")
        if record.get("type") == "run":
            run.schema = record.get("schema", SCHEMA)
            run.env = record.get("env", {})
            run.planned = record.get("planned")
        else:
            run.cases.append(case_from_dict(record["case"]))
    if run.planned is not None and len(run.cases) < run.planned:
        run.interrupted = True  # the run stopped (killed or interrupted) before every planned case was written
    return run

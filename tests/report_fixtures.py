"""Sample RunResults for the report tests, built from the result dataclasses alone (schema 2).

The shapes of ``worst`` and ``histogram`` follow what the comparison writes
(``{"index", "ratio", "values": {backend: value}}`` and
``{"edges", "counts", "pair"}``), so the renderers are tested on the real form.

Every case has the two-part verdict: float64 decides (the pairs, blame,
referee), float32 is measured against float64 (``LeafResult.float32``, the
case's ``float32`` / ``imprecise`` / ``kinks``).  The imprecise limit here is
``10 × best + 1e-7``.
"""

from __future__ import annotations

import dataclasses

from gradcheck.results import (
    CaseResult,
    Float32Result,
    KinkReport,
    LeafResult,
    Origin,
    PairResult,
    RefereeCheck,
    RunResult,
    Timing,
    Tolerance,
)

BACKENDS = ["tape", "torch", "jax"]
HOSTILE = "<script>alert(1)</script>"
EDGES = [float(e) for e in range(-8, 5)]

ENV = {
    "gradcheck": "0.1.0",
    "python": "3.11.9",
    "numpy": "1.26.4",
    "torch": "2.3.0",
    "jax": "0.4.30",
    "platform": "Linux-6.1-x86_64",
    "machine": "x86_64",
    "cpus": 2,
    "seed": 0,
    "command": "gradcheck run convnet --backends tape,torch,jax --seed 0",
    "started": "2024-05-01T12:00:00+0000",
}

# A small conv net, in forward order, with each parameter's owning layer type and shape.
CONVNET = [
    ("features.0.weight", "Conv2d", [8, 3, 3, 3]),
    ("features.0.bias", "Conv2d", [8]),
    ("features.1.weight", "BatchNorm2d", [8]),
    ("features.1.bias", "BatchNorm2d", [8]),
    ("features.3.weight", "Conv2d", [16, 8, 3, 3]),
    ("features.3.bias", "Conv2d", [16]),
    ("classifier.weight", "Linear", [10, 256]),
    ("classifier.bias", "Linear", [10]),
]

DEFAULT_TOL = Tolerance(rtol=1e-7, atol=1e-9, rule="default float64")
# float32 errors against float64 per backend (||g32 - g64|| / ||g64||), scaled per leaf.
F32_BASE = {"tape": 4e-7, "torch": 6e-7, "jax": 9e-7}
FACTOR, FLOOR = 10.0, 1e-7


def size(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def agree_pairs(shape, headroom=0.02, backends=BACKENDS) -> list[PairResult]:
    ref = [b for b in ("torch", "jax", "tape") if b in backends]
    pairs = []
    for i, r in enumerate(ref):
        for b in ref[i + 1:]:
            pairs.append(PairResult(backend=b, reference=r, verdict="agree", total=size(shape),
                                    max_abs=headroom * 1e-6, max_abs_index=[0] * len(shape),
                                    max_rel=headroom * 1e-3, max_rel_index=[0] * len(shape),
                                    rel_err_norm=headroom * 1e-4, cosine=1.0, headroom=headroom))
            headroom *= 0.7
    return pairs


def float32_part(errors: dict[str, float]) -> Float32Result:
    """The float32 part as the rule makes it: best backend, limit ``FACTOR × best + FLOOR``, who is beyond it."""
    best = min(errors, key=errors.get)
    limit = FACTOR * errors[best] + FLOOR
    imprecise = [b for b, v in errors.items() if v > limit]
    message = ""
    if imprecise and errors[best] > 0:
        b = imprecise[0]
        message = f"{b} float32 is {errors[b] / errors[best]:.2g}× further from float64 than {best}"
    return Float32Result(errors=dict(errors), best=best, limit=limit, verdict="imprecise" if imprecise else "ok",
                         imprecise=imprecise, message=message)


def agree_leaf(path, layer="", shape=(4,), headroom=0.02, backends=BACKENDS, role="param", scale=1.0,
               float32=True) -> LeafResult:
    shape = list(shape)
    f32 = float32_part({b: F32_BASE.get(b, 5e-7) * scale for b in backends}) if float32 else None
    return LeafResult(path=path, role=role, layer=layer, shape=shape, dtype="float64", verdict="agree",
                      tolerance=DEFAULT_TOL, pairs=agree_pairs(shape, headroom, backends),
                      norms={b: 1.5 for b in backends}, float32=f32)


def timings(first=1.2, second=0.05, backends=BACKENDS) -> dict[str, Timing]:
    """float32 first call; a second call only for jax (the backend that compiles); float64 at half the first."""
    scale = {"tape": 1.0, "torch": 0.6, "jax": 3.0}
    return {b: Timing(first=first * scale.get(b, 1.0), second=second * scale.get(b, 1.0) if b == "jax" else None,
                      float64=first * scale.get(b, 1.0) / 2) for b in backends}


# The kink every float32 run met in the convnet: one relu input 3.2e-6 from zero, crossed by jax's float32
# forward and pinned to the float64 branch; and a max-pool near-tie that nobody crossed, one of its
# elements closer than float64 resolves.  ``features.2`` and ``features.4`` are parameterless layers.
def relu_kink() -> KinkReport:
    return KinkReport(op="relu", layer="features.2", call=2, elements=4096, near=1, min_distance=3.2e-6,
                      below_float64=0, crossed={"tape": 0, "torch": 0, "jax": 1})


def pool_kink() -> KinkReport:
    return KinkReport(op="max_pool2d", layer="features.4", call=5, elements=2048, near=3, min_distance=4e-17,
                      below_float64=1, crossed={})


def convnet_case(name="convnet", **kw) -> CaseResult:
    """A passing convnet, both parts: float64 agrees, float32 ok; a relu kink crossed by jax (pinned).

    As the comparison writes them: the updated buffer before the gradient leaves.
    """
    leaves = [LeafResult(path="features.1.running_mean", role="buffer", layer="BatchNorm2d",
                         shape=[8], dtype="float64", verdict="skipped")]
    leaves += [agree_leaf(p, layer, shape, headroom=0.01 * (i + 1), scale=1 + 3 * i)
               for i, (p, layer, shape) in enumerate(CONVNET)]
    leaves.append(agree_leaf("input", "", [2, 3, 16, 16], role="input", scale=20))
    case = CaseResult(name=name, verdict="agree", model="convnet", dtype="float32", mode="train", seed=0,
                      backends=list(BACKENDS), leaves=leaves, timings=timings(),
                      leaves_compared=len(leaves) - 1, params=sum(size(s) for _, _, s in CONVNET),
                      referee_passes=18, replay=f"gradcheck run convnet -k {name} --seed 0",
                      float32="ok", imprecise="warn", kinks=[relu_kink(), pool_kink()])
    for k, v in kw.items():
        setattr(case, k, v)
    return case


def broken_leaf(path="features.3.weight", layer="Conv2d", shape=(16, 8, 3, 3), blamed="jax",
                headroom=2400.0) -> LeafResult:
    """A leaf where one backend (``blamed``) is off and the others and the referee agree."""
    shape = list(shape)
    n = size(shape)
    bad = min(37, n // 2)
    at = [min(k, s - 1) for k, s in zip((3, 1, 2, 2), shape, strict=False)]
    at_rel = [min(k, s - 1) for k, s in zip((7, 0, 1, 1), shape, strict=False)]
    pairs = []
    for i, ref in enumerate(BACKENDS):
        for b in BACKENDS[i + 1:]:
            if blamed not in (b, ref):
                pairs.append(PairResult(backend=b, reference=ref, verdict="agree", total=n, max_abs=3e-8,
                                        max_abs_index=at, max_rel=4e-6, max_rel_index=at,
                                        rel_err_norm=2e-7, cosine=1.0, headroom=0.04))
                continue
            other = ref if b == blamed else b
            h = headroom if not pairs or pairs[-1].verdict == "agree" else headroom * 0.98
            pairs.append(PairResult(
                backend=blamed, reference=other, verdict="disagree", mismatched=bad, total=n,
                max_abs=0.0241, max_abs_index=at, max_rel=0.93, max_rel_index=at_rel,
                rel_err_norm=0.031, cosine=0.9995, headroom=h,
                message=f"{blamed} vs {other}: {bad}/{n} elements off, max abs 0.0241 at {at}, "
                        f"max rel 0.93, headroom {h:.3g}"))
    worst_pair = max(pairs, key=lambda p: p.headroom)
    others = [b for b in BACKENDS if b != blamed]
    values = {b: (0.03712 if b == blamed else 0.01302) for b in BACKENDS}
    values2 = {b: (-0.00176 if b == blamed else -0.00091) for b in BACKENDS}
    return LeafResult(
        path=path, role="param", layer=layer, shape=shape, dtype="float64", verdict="disagree",
        blame=[blamed], message=f"{blamed}: {' and '.join(others)} agree — {worst_pair.message}",
        tolerance=Tolerance(rtol=1e-7, atol=1.3e-9, rule="default float64; config: features.3.*"),
        pairs=pairs,
        referee=[RefereeCheck(backend=b, directional=0.45501 if b == blamed else 0.41233, numeric=0.41234,
                              error=51.7 if b == blamed else 0.02, agrees=b != blamed, resolution=8.3e-4)
                 for b in BACKENDS],
        worst=[{"index": at, "ratio": headroom, "values": values},
               {"index": at_rel, "ratio": headroom / 3, "values": values2}],
        histogram={"edges": EDGES, "counts": histogram_counts(n, bad),
                   "pair": [worst_pair.backend, worst_pair.reference]},
        norms={b: (0.839 if b == blamed else 0.812) for b in BACKENDS},
        # A wrong VJP is wrong in float32 and float64 alike: its float32 error against its own float64 is small.
        float32=float32_part({b: F32_BASE[b] * 7 for b in BACKENDS}),
    )


def histogram_counts(n: int, bad: int) -> list[int]:
    """n elements over the 12 bins of EDGES, ``bad`` of them beyond the tolerance (bins >= 0)."""
    good = n - bad
    shares = [0.6, 0.15, 0.1, 0.06, 0.04, 0.03, 0.015, 0.005]
    counts = [int(good * s) for s in shares]
    counts[0] += good - sum(counts)
    tail = [bad // 7, (bad * 4) // 7]
    tail.append(bad - sum(tail))
    return counts + [0] + tail


def disagree_case(blamed="jax") -> CaseResult:
    """The convnet with one broken conv weight (float64 disagreement, blamed); the disagreement starts there."""
    case = convnet_case(name="convnet-broken", kinks=[])
    i = next(k for k, leaf in enumerate(case.leaves) if leaf.path == "features.3.weight")
    case.leaves[i] = broken_leaf(blamed=blamed)
    case.verdict = "disagree"
    case.first_disagreement = "features.3.weight"
    case.origin = Origin(path="features.3", layer="Conv2d", kind="vjp", blame=[blamed], op="conv2d")
    return case


IMPRECISE_LEAF = "features.3.weight"


def imprecise_case(policy="warn") -> CaseResult:
    """float64 agrees everywhere; jax's float32 conv weight gradient is 800× further from float64 than torch's.

    Under ``warn`` that is a warning beside a passing case; under ``fail`` the
    leaf's verdict and the case's become ``imprecise``.
    """
    case = convnet_case(name=f"convnet-imprecise-{policy}", kinks=[], imprecise=policy, float32="imprecise")
    leaf = next(x for x in case.leaves if x.path == IMPRECISE_LEAF)
    leaf.float32 = float32_part({"tape": 9e-7, "torch": 6e-7, "jax": 4.8e-4})
    if policy == "fail":
        leaf.verdict = "imprecise"
        case.verdict = "imprecise"
    return case


def vacuous_case() -> CaseResult:
    """A passing conv-bias-before-BatchNorm case: the conv biases are ≈0 on every backend (vacuous).

    Their headroom (2.25e9, rounding noise around zero) must not be the case's worst headroom.
    """
    case = convnet_case(name="conv-bn-vacuous", kinks=[])
    for leaf in case.leaves:
        if leaf.path in ("features.0.bias", "features.3.bias"):
            leaf.verdict = "vacuous"
            leaf.message = "≈0 on every backend (below 1e-11 of the largest gradient entry)"
            for p in leaf.pairs:
                p.headroom = 2.25e9
    return case


def structural_case() -> CaseResult:
    leaves = [
        agree_leaf("weight", "Linear", [4, 3]),
        LeafResult(path="bias", role="param", layer="Linear", shape=[4], dtype="float32", verdict="structural",
                   blame=["torch"], message="torch has shape (1, 4), others (4,)"),
        LeafResult(path="scale", role="param", layer="Linear", shape=[4], dtype="float32", verdict="nonfinite",
                   blame=["tape"], message="tape: 2 NaN/Inf"),
    ]
    return CaseResult(name="linear-structural", verdict="structural", model="Linear", backends=list(BACKENDS),
                      leaves=leaves, timings=timings(0.01, 0.001), leaves_compared=3, first_disagreement="bias")


ERROR_MESSAGE = "matmul: shapes (8, 3, 224, 224) and (32, 64) do not match; give Dense in_features=150528"


def error_case() -> CaseResult:
    """jax raised (Python's traceback form); the case itself raised too (the runner's form: message, then frames)."""
    return CaseResult(
        name="gelu-error", verdict="error", model="GELU", backends=list(BACKENDS),
        leaves=[agree_leaf("input", "", [2, 5], backends=["tape", "torch"], role="input", float32=False)],
        timings={"tape": Timing(0.002, None, 0.001), "torch": Timing(0.004, None, 0.002), "jax": Timing(None, None)},
        errors={"jax": "Traceback (most recent call last):\n  File \"ops.py\", line 12\n"
                       "NotImplementedError: op 'erf' has no jax kernel; add it to backends/jax_ops.py",
                "tape": f"ValueError: {ERROR_MESSAGE}\n  gradcheck/kernels.py:210 in matmul\n"
                        "  gradcheck/backends/numpy_ops.py:96 in check_matmul"},
        leaves_compared=1,
    )


def unavailable_case(name="relu-two-backends") -> CaseResult:
    backends = ["tape", "torch"]
    return CaseResult(
        name=name, verdict="agree", model="ReLU", backends=backends,
        leaves=[agree_leaf("input", "", [3, 3], backends=backends, role="input")],
        timings=timings(0.003, 0.001, backends),
        unavailable={"jax": "jax is not installed: pip install 'gradcheck[jax]'"},
        leaves_compared=1, float32="ok",
    )


def hostile_case() -> CaseResult:
    """User text that would break a renderer that forgets to escape."""
    path = f"{HOSTILE}.weight"
    leaf = broken_leaf(path=path, layer="<b>Evil</b>", shape=(2, 2), blamed="torch", headroom=12.0)
    leaf.message = f"torch: tape and jax agree — {HOSTILE} \x1b[31mred\x1b[0m | pipe `tick` ** ::error::\nline2"
    leaf.tolerance.rule = f"config: {HOSTILE}"
    return CaseResult(
        name=f'hostile "case" & {HOSTILE}', verdict="disagree", model=HOSTILE, backends=list(BACKENDS),
        leaves=[agree_leaf(f"{HOSTILE}.bias", "<b>Evil</b>", [2]), leaf],
        timings=timings(0.01, 0.002), leaves_compared=2, first_disagreement=path,
        errors={}, notes=[f"note with {HOSTILE}"], replay=f"gradcheck run '{HOSTILE}'",
        float32="ok", kinks=[KinkReport(op="relu", layer=HOSTILE, near=1, min_distance=1e-6, crossed={"jax": 1})],
    )


# Case names a user (or an attacker with a pull request) could write, each trying to break out of its line
# in a terminal or a CI log: a newline that starts a workflow command, a bare command, escape sequences,
# a carriage return that overwrites the line, a Unicode line separator, Azure's command syntax.
INJECTIONS = [
    "ok\n::error file=x.py,line=1::forged failure",
    "::warning::forged warning",
    "  ::add-mask::secret",
    "red \x1b[31mRED\x1b[0m \x1b]8;;http://x\x07link\x1b]8;;\x07",
    "spinner\rPASS all gradients agree",
    "sep\u2028::error::after a line separator",
    "##[error]azure style",
    "nul\x00bell\x07",
]


def injection_run() -> RunResult:
    """One case per injection attempt, each failing (so its name reaches every failure line) and with a
    float32 warning, a kink, an error and an unavailable backend (so it reaches the notices too)."""
    cases = []
    for name in INJECTIONS:
        case = disagree_case()
        case.name = name
        case.float32 = "imprecise"
        leaf = case.leaves[1]
        leaf.path = f"{name}.weight"
        leaf.float32 = float32_part({"tape": 6e-7, "torch": 6e-7, "jax": 4.8e-4})
        case.kinks = [KinkReport(op="relu", layer=name, near=1, min_distance=1e-6, crossed={"jax": 1})]
        case.errors = {"jax": f"RuntimeError: {name}\n  {name}.py:1 in {name}"}
        case.unavailable = {f"{name}-backend": f"not installed: {name}"}
        case.first_disagreement = name
        cases.append(case)
    return RunResult(env=dict(ENV, command=f"gradcheck run '{INJECTIONS[0]}'"), cases=cases)


def agree_run() -> RunResult:
    return RunResult(env=dict(ENV), cases=[convnet_case(), unavailable_case()])


def disagree_run(blamed="jax") -> RunResult:
    return RunResult(env=dict(ENV), cases=[convnet_case(), disagree_case(blamed)])


def mixed_run() -> RunResult:
    """Every kind of case at once: what a bad day looks like."""
    return RunResult(env=dict(ENV), cases=[disagree_case(), convnet_case(), structural_case(), error_case(),
                                           unavailable_case()])


def two_part_run() -> RunResult:
    """The new model's cases: float32 parts and a crossed, pinned kink; an imprecise backend under warn and
    under fail; a float64 disagreement with blame; a vacuous leaf in a passing case."""
    return RunResult(env=dict(ENV), cases=[convnet_case(), imprecise_case("warn"), imprecise_case("fail"),
                                           disagree_case(), vacuous_case()], planned=5)


def interrupted_run(ran=39, planned=200) -> RunResult:
    """Ctrl-C after ``ran`` of ``planned`` cases; every case that finished passed."""
    cases = [convnet_case(name=f"convnet-{k}", kinks=[]) for k in range(ran)]
    return RunResult(env=dict(ENV), cases=cases, planned=planned, interrupted=True)


def unavailable_run(cases=50) -> RunResult:
    """Fifty cases that each note jax missing, and one disagreement: the failure must come first."""
    out = [unavailable_case(name=f"relu-{k}") for k in range(cases)]
    out.insert(cases // 2, disagree_case())
    return RunResult(env=dict(ENV), cases=out)


def hostile_run() -> RunResult:
    env = dict(ENV, command=f"gradcheck run '{HOSTILE}' </script><script>alert(2)</script>",
               machine=HOSTILE)
    return RunResult(env=env, cases=[hostile_case(), convnet_case()])


def many_failures_run(cases=40, leaves=60) -> RunResult:
    """Large enough to overflow a small Markdown budget."""
    template = broken_leaf()
    out = []
    for c in range(cases):
        # Shallow copies: thousands of leaves share one set of numbers, which keeps this fast.
        ls = [dataclasses.replace(template, path=f"block{k}.conv.weight") for k in range(leaves)]
        out.append(CaseResult(name=f"case-{c}", verdict="disagree", backends=list(BACKENDS), leaves=ls,
                              timings=timings(), leaves_compared=leaves, first_disagreement=ls[-1].path))
    return RunResult(env=dict(ENV), cases=out)

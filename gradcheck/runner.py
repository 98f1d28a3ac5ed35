"""The runner: each case through every backend and the referee, compared, streamed to disk.

Per case: build model, inputs and the loss cotangent from the case seed (numpy,
identical bits for every backend); run each backend, and a backend that
compiles (jax) twice: its first call's time includes compilation (time to
first gradient), the second is the computation alone; compare forward outputs,
updated buffers and every gradient leaf; ask the float64 referee; record a
verdict and blame per leaf.  One case that raises, or one backend that fails
on it, is a recorded error: the run goes on.  Each finished case is appended
to the JSON-lines results file at once, so an interrupted run loses nothing.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gradcheck import cost, ops
from gradcheck import referee as ref
from gradcheck.backends import get_backend
from gradcheck.backends.base import all_leaves
from gradcheck.case import Case, cast_floats, materialise
from gradcheck.compare import MISSING, case_verdict, first_in_backward_order, judge_leaf
from gradcheck.results import (
    SCHEMA,
    CaseResult,
    LeafResult,
    RunResult,
    Timing,
    json_default,
    to_dict,
)
from gradcheck.tolerance import ToleranceRules
from gradcheck.tree import leaf_owner_types, replace_leaves

DEFAULT_BACKENDS = ("tape", "torch", "jax")


@dataclass
class RunOptions:
    backends: tuple[str, ...] = DEFAULT_BACKENDS
    rules: ToleranceRules = field(default_factory=ToleranceRules)
    referee: str = "auto"  # "leaves" (every leaf), "auto", "joint", "off"
    # auto: check every leaf when that is estimated to cost less than this (gradcheck.cost: counted, not timed)
    referee_budget_s: float = 20.0
    repeat: bool = True  # time a second call of each backend that compiles (its first call includes compiling)
    noise_probe: tuple[str, ...] | None = None  # backends whose float32 noise is measured; None: see probed()
    replay: Callable[[Case], str] | None = None  # command line that re-runs one case


def input_prefixes(n: int) -> tuple[str, ...]:
    return ("input",) if n == 1 else tuple(f"input.{i}" for i in range(n))


def _as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _short_error(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    where = "".join(f"  {f.filename.split('site-packages/')[-1]}:{f.lineno} in {f.name}\n" for f in frames)
    return f"{type(exc).__name__}: {exc}\n{where}".rstrip()


class CaseRun:
    """Everything one case needs, built once from its seed."""

    def __init__(self, case: Case):
        self.case = case
        self.model, self.inputs = materialise(case)
        self.forward = case.forward or (lambda m, *xs: m(*xs))
        self.prefixes = ("",) + input_prefixes(len(self.inputs))
        self.args = (self.model,) + tuple(self.inputs)
        self.args64 = cast_floats(self.args, np.float64)
        self.leaves64 = {leaf.path: leaf.value for leaf in all_leaves(self.args64, self.prefixes)}
        t0 = time.perf_counter()
        with cost.counting() as self.forward64_work:
            outs = _as_list(self.forward(*self.args64))
        self.forward64_s = time.perf_counter() - t0
        rng = np.random.default_rng(np.random.SeedSequence(case.seed).spawn(3)[2])
        # The cross-check loss is <r, output> with r random: sum/mean would make
        # the input gradients of BatchNorm and LayerNorm identically zero.
        self.cotangents64 = [rng.standard_normal(np.shape(o)) for o in outs]
        self.cotangents = [c.astype(case.dtype) for c in self.cotangents64]

    def loss_fn(self, cotangents):
        forward = self.forward

        def f(*args):
            outs = _as_list(forward(*args))
            loss = None
            for o, r in zip(outs, cotangents):
                term = ops.sum(o * ops.asarray(r, like=o))
                loss = term if loss is None else loss + term
            return (loss, *outs)

        return f

    def loss64(self, replaced: dict) -> float:
        args = [replace_leaves(a, replaced, p) for a, p in zip(self.args64, self.prefixes)]
        return float(self.loss_fn(self.cotangents64)(*args)[0])


def run_case(case: Case, options: RunOptions | None = None) -> CaseResult:
    options = options or RunOptions()
    res = CaseResult(name=case.name, model=case.model or case.name, dtype=case.dtype, mode=case.mode,
                     seed=case.seed, backends=list(options.backends), notes=list(case.notes))
    if options.replay is not None:
        res.replay = options.replay(case)
    try:
        cr = CaseRun(case)
    except Exception as exc:  # a broken case is a result, not a crash
        res.errors["case"] = _short_error(exc)
        res.verdict = "error"
        return res
    res.params = int(sum(np.size(v) for _, v in cr.model.named_parameters()))
    evaluations = _run_backends(cr, options, res)
    try:
        if evaluations:
            _compare(cr, evaluations, options, res)
    except Exception as exc:  # gradcheck's own bug: this case's error, and the run goes on
        res.errors["case"] = ("internal error while comparing (a bug in gradcheck; please report it): "
                              + _short_error(exc))
        res.verdict = "error"
        return res
    res.verdict = case_verdict(res.leaves, res.errors)
    if res.leaves_compared == 0 and not res.errors:
        res.errors["case"] = "no leaf was compared (no backend ran, or the model has no trainable leaf)"
        res.verdict = "error"
    res.first_disagreement = first_in_backward_order(res.leaves)
    return res


def _run_backends(cr: CaseRun, options: RunOptions, res: CaseResult) -> dict:
    f = cr.loss_fn(cr.cotangents)
    evaluations = {}
    for name in options.backends:
        driver = get_backend(name)
        ok, why = driver.available()
        if not ok:
            res.unavailable[name] = why
            continue
        timing = res.timings[name] = Timing()
        try:
            t0 = time.perf_counter()
            evaluations[name] = driver.evaluate(f, cr.args, cr.prefixes)
            timing.first = time.perf_counter() - t0
            if options.repeat and driver.compiles:
                t0 = time.perf_counter()
                driver.evaluate(f, cr.args, cr.prefixes)
                timing.second = time.perf_counter() - t0
        except Exception as exc:
            res.errors[name] = _short_error(exc)
            evaluations.pop(name, None)
    return evaluations


def _compare(cr: CaseRun, evaluations: dict, options: RunOptions, res: CaseResult) -> None:
    dtype, rules = cr.case.dtype, options.rules
    leaves = all_leaves(cr.args, cr.prefixes)
    owners = {}
    for a, p in zip(cr.args, cr.prefixes):
        owners.update(leaf_owner_types(a, p))
    names = list(evaluations)

    noise = _noise_probe(cr, evaluations, res, options.noise_probe)

    # Forward outputs first: a forward disagreement explains any gradient one.
    n_out = len(cr.cotangents)
    for k in range(n_out):
        path = "output" if n_out == 1 else f"output.{k}"
        arrays = {b: _nth_output(ev.value, k) for b, ev in evaluations.items()}
        res.leaves.append(judge_leaf(path, "output", arrays, dtype=dtype, rules=rules, noise=noise.get(path)))
    for leaf in leaves:
        if leaf.kind == "buffer" and np.asarray(leaf.value).dtype.kind == "f":
            arrays = {b: ev.buffers.get(leaf.path, MISSING) for b, ev in evaluations.items()}
            res.leaves.append(judge_leaf(leaf.path, "buffer", arrays, dtype=dtype, rules=rules,
                                         layer=owners.get(leaf.path, ""), noise=noise.get(leaf.path)))

    grad_leaves = []
    known = set()
    for leaf in leaves:
        known.add(leaf.path)
        role = "input" if leaf.path.startswith("input") else "param"
        arrays = {b: ev.grads.get(leaf.path, MISSING) for b, ev in evaluations.items()}
        if leaf.trainable:
            grad_leaves.append((leaf, role, arrays))
        elif any(v is not MISSING for v in arrays.values()):
            kind_role = {"buffer": "buffer", "frozen": "frozen"}.get(leaf.kind, role)
            res.leaves.append(judge_leaf(leaf.path, kind_role, arrays, dtype=dtype, rules=rules,
                                         layer=owners.get(leaf.path, ""), expect_array=False))
    for b, ev in evaluations.items():
        for path in ev.grads:
            if path not in known:
                res.leaves.append(judge_leaf(path, "param", {n: (ev.grads[path] if n == b else MISSING) for n in names},
                                             dtype=dtype, rules=rules, expect_array=False))

    scale = _case_scale(grad_leaves)

    def judge(leaf, role, arrays, checks=None):
        return judge_leaf(leaf.path, role, arrays, dtype=dtype, rules=rules, layer=owners.get(leaf.path, ""),
                          referee=checks, case_scale=scale, noise=noise.get("grad:" + leaf.path))

    judged = [(leaf, role, arrays, judge(leaf, role, arrays)) for leaf, role, arrays in grad_leaves]
    checks = _referee(cr, evaluations, [j for j in judged if j[3].verdict != "vacuous"], options, res, noise, owners)
    for leaf, role, arrays, verdict in judged:
        res.leaves.append(judge(leaf, role, arrays, checks[leaf.path]) if leaf.path in checks else verdict)
    res.leaves_compared = sum(1 for leaf in res.leaves if leaf.verdict != "skipped")
    if not grad_leaves:
        res.notes.append("no trainable leaf: only forward values were compared")


def _rel(a, b) -> float | None:
    if a is None or b is None or a is MISSING or b is MISSING:
        return None
    a, b = np.asarray(a), np.asarray(b)  # float32 against float64: the difference is taken in float64
    if a.shape != b.shape or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    nb = float(np.linalg.norm(b.astype(np.float64, copy=False).ravel()))
    return float(np.linalg.norm(np.subtract(a, b, dtype=np.float64).ravel())) / nb if nb > 0 else None


def probed(evaluations, requested: tuple[str, ...] | None) -> list[str]:
    """The backends whose float32 noise the probe measures.

    ``requested`` (``--noise-probe``) names them; the tape, cheap to run, is
    probed even when it is not compared, the others only when they ran.  By
    default: the tape, and torch when it ran, whose noise stands for jax's
    too (both compose BatchNorm from ops; a float64 jax run would compile the
    model a second time); jax itself when torch did not run, because on
    ResNet-18 jax's float32 gradients sit up to 1e-2 from float64 while the
    tape's sit 1e-5, and the tape's noise alone flagged 21 correct jax leaves.
    """
    if requested is None:
        requested = ("tape", "torch") if "torch" in evaluations else ("tape", "jax")
    return [name for name in dict.fromkeys(requested) if name in evaluations or name == "tape"]


def _noise_probe(cr: CaseRun, evaluations: dict, res: CaseResult, requested: tuple[str, ...] | None = None) -> dict:
    """Float32 rounding noise per leaf: each probed backend in float32 against itself in float64.

    A wrong VJP is wrong in both precisions and cancels here, so this measures
    what float32 costs this leaf in this model, not bugs.  The noise of a leaf
    is the largest over the probed backends (see ``probed``): on ResNet-18 at
    224x224 torch's and jax's float32 input gradients sit up to 1e-2 from
    float64 while the tape's sit 1e-5, so probing the tape alone would
    understate what a correct framework does.  Keys are ``grad:<path>`` for
    gradients and the leaf path for outputs and buffers.  Only float32 cases
    are probed.
    """
    if cr.case.dtype != "float32":
        return {}
    noise: dict[str, float] = {}
    per_backend = {}
    for name in probed(evaluations, requested):
        driver = get_backend(name)
        try:
            t0 = time.perf_counter()
            low = evaluations.get(name) or driver.evaluate(cr.loss_fn(cr.cotangents), cr.args, cr.prefixes)
            high = driver.evaluate(cr.loss_fn(cr.cotangents64), cr.args64, cr.prefixes)
            spent = time.perf_counter() - t0
        except Exception as exc:
            res.notes.append(f"float32 noise probe on {name} skipped: {type(exc).__name__}: {exc}")
            continue
        mine = {"grad:" + p: _rel(low.grads.get(p), g) for p, g in high.grads.items()}
        mine.update({p: _rel(low.buffers.get(p), v) for p, v in high.buffers.items()})
        n_out = len(cr.cotangents)
        for k in range(n_out):
            mine["output" if n_out == 1 else f"output.{k}"] = _rel(_nth_output(low.value, k), _nth_output(high.value, k))
        mine = {k: v for k, v in mine.items() if v is not None}
        for k, v in mine.items():
            noise[k] = max(noise.get(k, 0.0), v)
        grads = [v for k, v in mine.items() if k.startswith("grad:")]
        if grads:
            per_backend[name] = f"{name} median {np.median(grads):.1e}, max {max(grads):.1e} ({spent:.1f}s)"
    if per_backend:
        res.notes.append("float32 noise probe (float32 against float64, normwise, per gradient leaf): "
                         + "; ".join(per_backend.values()))
    else:
        res.notes.append("float32 noise probe: no backend could run it; tolerances stay at their floor")
    return noise


def _case_scale(grad_leaves) -> float:
    """The largest finite gradient entry over every trainable leaf and backend."""
    best = 0.0
    for _, _, arrays in grad_leaves:
        for v in arrays.values():
            if v is not MISSING and v is not None and np.size(v):
                a = np.abs(np.asarray(v))
                best = max(best, float(np.max(a, where=np.isfinite(a), initial=0.0)))
    return best


def _nth_output(value, k):
    outs = value[1:] if isinstance(value, tuple) else [value]
    return outs[k] if k < len(outs) else MISSING


def _referee(cr: CaseRun, evaluations, judged, options: RunOptions, res: CaseResult, noise: dict,
             owners: dict) -> dict:
    """Referee checks per leaf path; which leaves get one depends on the mode and its cost."""
    mode = options.referee
    if mode == "off" or not judged:
        return {}
    point = {leaf.path: np.asarray(cr.leaves64[leaf.path], np.float64) for leaf, _, _, _ in judged}
    dirs = ref.directions(point, cr.case.seed)
    grads = {b: ev.grads for b, ev in evaluations.items()}
    rules, dtype = options.rules, cr.case.dtype

    def rtol(path):
        return rules.resolve(path, dtype, owners.get(path, "")).referee_rtol

    leaf_noise = {p: noise["grad:" + p] for p in point if "grad:" + p in noise}

    # The estimate comes from the float64 forward's counted work, not its time: the mode must not
    # change with the machine's load (see gradcheck.cost).
    every_leaf_s = 2 * cr.forward64_work.seconds() * len(judged)
    if mode == "leaves" or (mode == "auto" and every_leaf_s <= options.referee_budget_s):
        chosen = [leaf.path for leaf, _, _, _ in judged]
    else:
        chosen = [leaf.path for leaf, _, _, v in judged if v.verdict != "agree"]
        if mode == "auto":
            res.notes.append(
                f"referee: checking each of {len(judged)} leaves was estimated at {every_leaf_s:.0f} s "
                f"({2 * len(judged)} float64 passes; one pass: {cr.forward64_work}), over the budget of "
                f"{options.referee_budget_s:g} s (referee_budget_s), so all leaves were checked along one joint "
                f"direction and each leaf the backends disagree on apart; --referee leaves checks every leaf")
        _joint_referee(cr, point, dirs, grads, max(rtol(p) for p in point), res, leaf_noise)
    out = {}
    for path in chosen:
        out[path], passes = ref.check(cr.loss64, point, {path: dirs[path]}, grads, rtol(path), leaf_noise)
        res.referee_passes += passes
    return out


def _joint_referee(cr, point, dirs, grads, rtol, res: CaseResult, noise: dict) -> None:
    """Every trainable leaf at once along one direction: two passes for the whole model."""
    checks, passes = ref.check(cr.loss64, point, dirs, grads, rtol, noise)
    res.referee_passes += passes
    if not checks:
        return
    stable = all(c.stable for c in checks)
    summary = ", ".join(f"{c.backend} {'agrees' if c.agrees else 'misses'} (error/tol {c.error:.2g})" for c in checks)
    if not stable:
        res.notes.append(f"referee, joint direction over {len(dirs)} leaves: abstained, the finite difference "
                         f"is unstable at this point ({summary})")
        return
    res.notes.append(f"referee, joint direction over {len(dirs)} leaves: {summary}")
    wrong = [c.backend for c in checks if not c.agrees]
    if wrong:
        res.leaves.append(LeafResult(
            path="(all leaves, joint direction)", role="referee", verdict="disagree", blame=wrong, referee=checks,
            message=f"{', '.join(wrong)}: the whole gradient along one random direction misses the float64 "
                    f"finite difference {checks[0].numeric:.6g}",
        ))


# ---------------------------------------------------------------- whole runs
def environment(seed: int | None = None, command: str = "") -> dict:
    import importlib.metadata as md

    def version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    return {
        "gradcheck": version("gradcheck"),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "torch": version("torch"),
        "jax": version("jax"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "seed": seed,
        "command": command,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


class ResultsWriter:
    """JSON lines: a header, then one line per finished case, flushed as each case ends."""

    def __init__(self, path, env: dict):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._fh = open(path, "w", encoding="utf-8")
        self._write({"type": "run", "schema": SCHEMA, "env": env})

    def _write(self, record):
        self._fh.write(json.dumps(record, default=json_default) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def case(self, result: CaseResult):
        self._write({"type": "case", "case": to_dict(result)})

    def close(self):
        self._fh.close()


def run(cases: list[Case], options: RunOptions | None = None, results_path=None, env: dict | None = None,
        on_case: Callable[[int, int, CaseResult], None] | None = None,
        on_start: Callable[[int, int, Case], None] | None = None) -> RunResult:
    """Run every case; stream each result to ``results_path`` (JSON lines) as it ends."""
    options = options or RunOptions()
    result = RunResult(env=env or environment())
    writer = ResultsWriter(results_path, result.env) if results_path else None
    try:
        for i, case in enumerate(cases):
            if on_start:
                on_start(i, len(cases), case)
            case_result = run_case(case, options)
            result.cases.append(case_result)
            if writer:
                writer.case(case_result)
            if on_case:
                on_case(i, len(cases), case_result)
    finally:
        if writer:
            writer.close()
    return result

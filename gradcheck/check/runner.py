"""The runner: each case through every backend in float64 and float32, compared, refereed, streamed to disk.

``run_case`` is a straight line per case:

1. ``CaseRun``: the model, inputs and loss cotangent from the case seed
   (numpy, identical bits for every backend), widened exactly to float64;
   the float64 reference forward on numpy, which records every kink's branch
   (``gradcheck.check.kinks``) and counts its work (``gradcheck.check.cost``).
2. ``_run_backends``: each backend in float64, then in float32 pinned to the
   reference's kinks, called twice (``repeat``: the second call tells
   nondeterminism apart and times jax's computation without its
   compilation; it is reduced to its spreads at once, ``_spreads``).  Each
   backend's float32 gradients are measured against its float64 ones as
   they return, and only the measurement is kept (``_measured32``).  The
   tape runs first, while jax compiles beside it, and torch after jax (``_turn``).  One backend that fails is that
   backend's recorded error; the others go on.  A backend that writes into
   the arrays it was handed is reported, and the next one gets the case's
   values again (``CaseRun.restore_changed``).
3. ``_compare``: every leaf (forward outputs, updated buffers, gradients)
   compared across backends in float64, once (``gradcheck.check.compare``),
   and its float32 part: each backend's float32 result against its own
   float64 one (``verdict.float32_part``).
4. ``_referee``: float64 central differences where blame is needed, or for
   every leaf when that is cheap (``gradcheck.check.referee``).
5. ``gradcheck.check.verdict``: blame from the referee or a majority.
6. ``_within_reach``: what still disagrees is held to float64's own reach
   at this point (every float leaf moved by a unit roundoff, one more float64
   call per backend, ``gradcheck.check.conditioning``) before anyone is
   blamed for it; then the case's verdict.
7. ``_run_checks``: the registered checks (``gradcheck.check.checks``), in
   order, each where its options ask for it: the per-layer replay that finds
   where a disagreement starts (``gradcheck.check.localise``), the origin
   layer's standalone reproducer (``gradcheck.repro``), Hessian-vector
   products (``gradcheck.check.second_order``) and training-step
   trajectories (``gradcheck.check.trajectory``).

A broken case, a backend that fails and a bug in gradcheck's own code are
each recorded on the case (``gradcheck.check.errors``), and the run goes on.
Each finished case is appended to the JSON-lines results file at once, so an
interrupted run loses nothing.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gradcheck import module, ops
from gradcheck.backends import default_backends, get_backend, reference_rank
from gradcheck.backends.base import BackendUnavailable, Evaluation, all_leaves
from gradcheck.case import Case, cast_floats, materialise
from gradcheck.check import checks, conditioning, cores, cost, kinks, localise, memory, verdict
from gradcheck.check import referee as ref
from gradcheck.check.compare import MISSING, compare_leaf, first_in_backward_order, statistic_scales
from gradcheck.check.errors import internal_error, short_error
from gradcheck.check.tolerance import ToleranceRules
from gradcheck.results import (
    SCHEMA,
    CaseResult,
    LeafResult,
    RunResult,
    Timing,
    json_default,
    to_dict,
)
from gradcheck.tree import leaf_owner_types, module_paths, replace_leaves

DEFAULT_BACKENDS = default_backends()  # the registry's rows marked default (gradcheck.backends)
# Who changed the case's arrays, where the float64 reference forward (``CaseRun``) did: named so in the case's errors.
REFERENCE_FORWARD = "numpy reference forward"


@dataclass
class RunOptions:
    backends: tuple[str, ...] = DEFAULT_BACKENDS
    rules: ToleranceRules = field(default_factory=ToleranceRules)
    referee: str = "auto"  # "leaves" (every leaf), "auto", "joint", "off"
    # auto: check every leaf when that is estimated to cost less than this (gradcheck.check.cost: counted, not timed)
    referee_budget_s: float = 20.0
    # Call each backend a second time on the same inputs, in float32 (float64 for a float64-only case):
    # results that differ are nondeterministic; for a backend that compiles, the second call is also its
    # steady-state time (its first includes compiling).
    repeat: bool = True
    imprecise: str = "warn"  # whether a float32 result too far from float64 fails the case ("fail") or warns
    # whether a backend asked for but unavailable (not installed, or unable to run the case) fails the case
    # ("fail": verdict "partial") or is said beside its verdict ("warn"): a partial check is not the cross-check
    unavailable: str = "warn"
    replay: Callable[[Case], str] | None = None  # command line that re-runs one case
    # The options of the checks after the cross-check (gradcheck.check.checks), each read by its check alone.
    per_layer: bool = False  # replay every layer alone even when the model agrees (gradcheck.check.localise)
    # keep every replayed layer call's arrays, not only the disagreeing ones' (for gradcheck.repro's calls="all")
    keep_replays: bool = False
    repro: str | None = None  # a folder: write a standalone reproducer of each disagreement's origin layer
    order: int = 1  # 2: Hessian-vector products per leaf too (gradcheck.check.second_order)
    steps: int = 0  # N > 0: N optimiser steps per backend from the same start (gradcheck.check.trajectory)
    optimizer: str = "sgd"  # "sgd" or "adam", written once in float64 (gradcheck.check.trajectory.OPTIMIZERS)
    lr: float | None = None  # None: the optimizer's default (gradcheck.check.trajectory.DEFAULT_LR)
    # The most a case may be estimated to peak at, in GiB: None measures what the machine can give, inf never
    # refuses (gradcheck.check.memory: a case that would not fit is an error result, not the OOM killer's)
    memory_limit: float | None = None

    def __post_init__(self):
        if self.imprecise not in verdict.IMPRECISE_POLICIES:
            raise ValueError(f"imprecise={self.imprecise!r}; expected one of {', '.join(verdict.IMPRECISE_POLICIES)}")
        if self.unavailable not in verdict.UNAVAILABLE_POLICIES:
            raise ValueError(f"unavailable={self.unavailable!r}; expected one of "
                             f"{', '.join(verdict.UNAVAILABLE_POLICIES)}")
        checks.validate(self)


def input_prefixes(n: int) -> tuple[str, ...]:
    return ("input",) if n == 1 else tuple(f"input.{i}" for i in range(n))


def _as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _loss(outs, cotangents):
    """The cross-check loss ``sum_k <r_k, output_k>``, in the outputs' backend."""
    loss = None
    for o, r in zip(outs, cotangents):
        term = ops.sum(o * ops.asarray(r, like=o))
        loss = term if loss is None else loss + term
    return loss


def _loss_function(forward, cotangents):
    """``f(*args) -> (loss, *outputs)``, the loss being the cross-check loss of ``forward``'s outputs."""

    def f(*args):
        outs = _as_list(forward(*args))
        return (_loss(outs, cotangents), *outs)

    # A compiling backend takes the cotangents as inputs of its program (``backends.base.program_data``): one
    # program then serves every seed of a model, and jax's persistent cache finds it for each.  (Rebuilt from
    # the forward alone: f must not hold the case's run, which a backend's cache of compiled programs keeps.)
    f.program_data = (list(cotangents), functools.partial(_loss_function, forward))
    return f


class CaseRun:
    """Everything one case needs, built once from its seed."""

    def __init__(self, case: Case):
        self.case = case
        model, inputs = materialise(case)
        self.forward = case.forward or (lambda m, *xs: m(*xs))
        self.prefixes = ("",) + input_prefixes(len(inputs))
        args = (model,) + tuple(inputs)
        # The float32 arguments, and the same values widened exactly: both runs are at one point.
        self.args32 = args if case.dtype == "float32" else None
        self.args64 = cast_floats(args, np.float64)
        self.model = self.args64[0]
        self.leaves64 = {leaf.path: leaf.value for leaf in all_leaves(self.args64, self.prefixes)}
        # The reference forward runs on modules of its own: layers update buffers (running statistics) by
        # assigning them, and the backends must start from the case's values.  The arrays are args64's (cast_floats
        # of a float64 array is that array), as in localisation's reference forwards: a second float64 copy of
        # the model costs its conversion and a first touch of its memory (about 0.2 s for ResNet-18).  A model
        # that writes into its arrays instead is reported before any backend runs (``_run_backends``), against
        # the case's values: the float32 ones, or for a float64 case a snapshot taken here, before the forward.
        self._before64 = localise.snapshot(self.args64, self.prefixes) if self.args32 is None else None
        reference = cast_floats(self.args64, np.float64)
        paths = module_paths(reference[0])
        t0 = time.perf_counter()
        with cost.counting() as self.forward64_work, module.calls() as stack, \
                kinks.recording(lambda: paths.get(id(stack[-1]), "") if stack else "") as self.kinks:
            outs = _as_list(self.forward(*reference))
        self.forward64_s = time.perf_counter() - t0
        rng = np.random.default_rng(np.random.SeedSequence(case.seed).spawn(3)[2])
        # The cross-check loss is <r, output> with r random: sum/mean would make
        # the input gradients of BatchNorm and LayerNorm identically zero.
        self.cotangents64 = [rng.standard_normal(np.shape(o)) for o in outs]
        self.cotangents32 = [c.astype(np.float32) for c in self.cotangents64]
        # What rounding in the loss works on: the referee's resolution floor.
        self.loss_abs = float(sum(np.sum(np.abs(np.asarray(o, np.float64) * r)) for o, r in zip(outs, self.cotangents64)))
        # The float64 loss at the point, as ``loss64({})`` computes it (the same ops on the same values): the
        # probe of float64's reach measures how far it moves (``loss_noise``) without a forward pass of its own.
        self.loss_at_point = float(_loss(outs, self.cotangents64)) if outs else None
        self.n_out = len(outs)
        # The cross-check losses, made once: jax keys what it compiled by the function object, so every later
        # float64 call at a moved point (float64's reach, the referee's slope) reuses the program already built.
        self.f64 = self.loss_fn(self.cotangents64)
        self.f32 = self.loss_fn(self.cotangents32)
        self._loss_noise: float | None = None
        # What the localise check found (gradcheck.check.localise), for the checks after it (gradcheck.repro).
        self.localisation: localise.Localisation | None = None
        # The per-leaf referee, when some leaves wait for localisation (runner._referee_deferred).
        self.referee: _LeafReferee | None = None

    @property
    def pin64(self) -> bool:
        """Whether float64 runs are pinned to the reference's kinks, as float32 runs always are: where the float64
        run computes partly in a narrower float (``Case.float64_computes_in``: a cast the model makes itself, which
        every backend follows), a relu or max after it lies within that float's rounding of its kink, and a
        backend that rounds to its other side would differ by a whole term, which no referee step resolves."""
        return self.case.float64_computes_in != "float64"

    @property
    def eps(self) -> float:
        """The machine epsilon of the narrowest float the float64 run computes in (``Case.float64_computes_in``):
        what the referee's step and rounding floor are taken at."""
        return 2 * conditioning.unit_roundoff(self.case.float64_computes_in)

    def loss_fn(self, cotangents):
        return _loss_function(self.forward, cotangents)

    def snapshot(self) -> dict:
        """The case's values, by float64 and float32 arguments, that what each backend is handed is checked against
        (``restore_changed``): a float32 case's float64 arguments are its float32 ones widened, so one snapshot
        serves both; a float64 case's was taken before the reference forward, which runs on the same arrays."""
        if self.args32 is None:
            before, self._before64 = self._before64, None
            return {"64": before if before is not None else localise.snapshot(self.args64, self.prefixes)}
        narrow = localise.snapshot(self.args32, self.prefixes)
        return {"32": narrow, "64": localise.Widened(narrow)}

    def restore_changed(self, backend: str, before: dict, res: CaseResult) -> None:
        """Report a backend that changed the arrays it was handed (``localise.check_unchanged`` against the
        ``localise.snapshot`` in ``before``), and give the case its values back."""
        for key, attr in (("64", "args64"), ("32", "args32")):
            if key not in before:
                continue
            changed = localise.check_unchanged(before[key], getattr(self, attr), self.prefixes)
            if changed:
                res.errors[f"{backend} (mutates its inputs)"] = (
                    f"{backend} changed what it was handed in its float{key} call (a backend or layer writing "
                    "into its inputs or parameters): " + "; ".join(changed[:5]))
                setattr(self, attr, localise.restored(getattr(self, attr), before[key], self.prefixes))
        self.model = self.args64[0]
        self.leaves64 = {leaf.path: leaf.value for leaf in all_leaves(self.args64, self.prefixes)}

    def loss_noise(self) -> float:
        """How far the float64 loss moves when every float leaf moves by a unit roundoff (measured once, two
        forward passes, against the reference forward's loss): the referee's floor for the rounding this point
        amplifies (gradcheck.check.conditioning), which the referee asks for only when a backend misses its
        resolution without it (``referee._NoiseFloor``)."""
        if self._loss_noise is None:
            self._loss_noise = conditioning.loss_noise(self.loss64, self.float_leaves(), self.case.seed,
                                                       base=self.loss_at_point)
        return self._loss_noise

    def float_leaves(self) -> dict[str, np.ndarray]:
        """Every float64 array leaf (parameters, buffers, float inputs) by path: what rounding touches."""
        return {p: v for p, v in self.leaves64.items() if np.asarray(v).dtype.kind == "f"}

    def loss64(self, replaced: dict) -> tuple[float, int]:
        """The float64 loss with some leaves replaced, and how many kink decisions differ from the reference's."""
        args = [replace_leaves(a, replaced, p) for a, p in zip(self.args64, self.prefixes)]
        with kinks.recording(stats=False, hold=self.kinks) as rec:
            loss = float(self.f64(*args)[0])
        return loss, kinks.differing(self.kinks, rec)


@dataclass
class BackendRun:
    """One backend's answers for a case: float64 (decides) and float32 (measured; None for float64-only cases)."""

    ev64: object
    # float32: its outputs and buffers, and its gradients already measured against ev64's (``_measured32``)
    ev32: object = None
    # How far a second call on the same inputs, in the case's precision, moved from the first, leaf by leaf
    # (``_spreads``: the first call's shape, a float per array); None when not repeated.  Only the spreads are
    # kept: holding the second call's results until the comparison would cost a copy of every gradient per backend.
    spread: object = None
    crossed: list[int] = field(default_factory=list)  # per recorded kink call: elements the float32 run crossed


def run_case(case: Case, options: RunOptions | None = None) -> CaseResult:
    """One case, through the steps of the module doc; a result always, never an exception of the case's."""
    options = options or RunOptions()
    res = CaseResult(name=case.name, model=case.model or case.name, dtype=case.dtype, mode=case.mode,
                     seed=case.seed, backends=list(options.backends), notes=list(case.notes),
                     imprecise=options.imprecise, unavailable_policy=options.unavailable)
    if options.replay is not None:
        res.replay = options.replay(case)
    try:
        cr = CaseRun(case)
    except Exception as exc:  # a broken case is a result, not a crash
        res.errors["case"] = short_error(exc)
        res.verdict = "error"
        return res
    res.params = int(sum(np.size(v) for _, v in cr.model.named_parameters()))
    # What a model's own checks found on the reference forward (a from_torch graph's wrong torch kernel).
    found = getattr(cr.model, "found_notes", None)
    res.notes.extend(found() if callable(found) else [])
    # Before any backend: a case that would not fit in memory is refused, not left to the OOM killer (whose
    # kill would lose every later case too).
    fits = memory.judge(cr, options)
    res.notes.extend(fits.notes)
    if fits.refusal:
        res.errors["case"] = fits.refusal
        res.verdict = "error"
        return res
    runs = _run_backends(cr, options, res)
    # What a model's own runs found that the case's notes must say (a from_torch recompute that drew anew, or
    # wrote a buffer again).
    late = getattr(cr.model, "run_notes", None)
    res.notes.extend(n for n in (late() if callable(late) else []) if n not in res.notes)
    try:
        if runs:
            _compare(cr, runs, options, res)
    except Exception as exc:  # gradcheck's own bug: this case's error, and the run goes on
        res.errors["case"] = internal_error("internal error while comparing", exc)
        res.verdict = "error"
        return res
    res.verdict = verdict.case_verdict(res.leaves, res.errors, res.unavailable, options.unavailable)
    if res.leaves_compared == 0 and not res.errors:
        res.errors["case"] = _nothing_compared([b for b in options.backends if b in res.timings], options.referee,
                                               res)
        res.verdict = "error"
    res.first_disagreement = first_in_backward_order(res.leaves)
    if runs:
        _run_checks(cr, runs, options, res)
        _referee_deferred(cr, runs, res)
    return res


def _run_checks(cr: CaseRun, runs: dict[str, BackendRun], options: RunOptions, res: CaseResult) -> None:
    """Every registered check the options ask for, in order (``gradcheck.check.checks``).  One that raises
    is a bug in gradcheck, recorded as that check declares, and the next one runs."""
    for check in checks.registered():
        if not check.wanted(options):
            continue
        try:
            check.run(cr, runs, options, res)
        except Exception as exc:
            check.record_failure(res, exc)


def _nothing_compared(ran: list[str], referee: str, res: CaseResult | None = None) -> str:
    if not ran:
        why = "no backend ran"
    elif len(ran) > 1:
        why = "the model has no trainable leaf and no output"
    elif referee != "off" and res is not None and any(leaf.role in ("param", "input") for leaf in res.leaves):
        # One backend has nothing but the referee to be held against, and the referee abstained wherever it looked.
        why = (f"only {ran[0]} ran, and the referee resolved none of its gradients: its finite difference was "
               "unstable (or crossed a kink it could not avoid) at every check it made, so it abstained (the "
               "notes say where); add a second backend")
    elif referee != "off":
        why = f"the model has no trainable leaf and only {ran[0]} ran"
    else:
        why = (f"only {ran[0]} ran and the referee is off; a check needs two backends, or one backend and the "
               "referee (install torch or jax, or leave --referee on)")
    return "nothing was compared: " + why


def _run_backends(cr: CaseRun, options: RunOptions, res: CaseResult) -> dict[str, BackendRun]:
    f64, f32 = cr.f64, cr.f32
    runs: dict[str, BackendRun] = {}
    # What every backend is handed must come back unchanged: one that writes into its inputs or parameters
    # is reported, and the next backend gets the case's values again.  So must the float64 arrays the reference
    # forward ran on (``CaseRun``): a model that writes into them is reported as the reference forward's.
    before = cr.snapshot()
    # Its float64 arrays only: the reference never sees a float32 case's float32 ones, whose snapshot was just taken.
    cr.restore_changed(REFERENCE_FORWARD, {"64": before["64"]}, res)
    _prepare_compiled(cr, options, res, f64, f32)
    # The eager backends that share the cores first, while the compiling ones compile beside them; then the
    # compiling ones; then the eager ones whose threads are not lowered, on every core (``Backend.shares_cores``).
    # Each backend is judged on its own, so the order changes nothing else.
    compiling = [get_backend(b) for b in options.backends if get_backend(b).compiles]
    for name in sorted(options.backends, key=_turn):
        _evaluate_backend(name, cr, options, res, runs, f64, f32, compiling)
        cr.restore_changed(name, before, res)
    return {name: runs[name] for name in options.backends if name in runs}


def _turn(name: str) -> int:
    """When backend ``name`` runs in a case (``_run_backends``)."""
    backend = get_backend(name)
    return 1 if backend.compiles else 0 if backend.shares_cores else 2


def _prepare_compiled(cr: CaseRun, options: RunOptions, res: CaseResult, f64, f32) -> None:
    """Start compiling a compiling backend's programs (float64, and float32 pinned) before any backend runs, so
    that the eager backends run while it compiles (``JaxBackend.prepare``); only when there is an eager backend to
    overlap.  The seconds spent here tracing are the backend's ``Timing.prepare``.  A call that cannot be prepared
    is left to the backend's own evaluation, which reports what goes wrong."""
    drivers = {name: get_backend(name) for name in options.backends}
    drivers = {name: d for name, d in drivers.items() if d.available()[0]}
    if all(d.compiles for d in drivers.values()):
        return
    for name, driver in drivers.items():
        if not driver.compiles or not hasattr(driver, "prepare"):
            continue
        t0 = time.perf_counter()
        try:
            with _pinned64(cr):
                started = driver.prepare(f64, cr.args64, cr.prefixes)
            if cr.args32 is not None:
                with kinks.pinned(cr.kinks):
                    started = driver.prepare(f32, cr.args32, cr.prefixes) or started
        except Exception:  # noqa: BLE001 - the evaluation that follows meets it again and records it
            started = False
        if started:
            res.timings[name] = Timing(prepare=time.perf_counter() - t0)


def _evaluate_backend(name, cr: CaseRun, options: RunOptions, res: CaseResult, runs: dict, f64, f32,
                      beside=()) -> None:
    """One backend: float64 (and a second call for a float64-only case), then float32 pinned, and again.
    ``beside``: the compiling backends, whose compilations an eager backend's calls share the cores with."""
    driver = get_backend(name)
    if beside and not driver.compiles:
        driver = _BesideCompilation(driver, beside)
    ok, why = driver.available()
    if not ok:
        res.unavailable[name] = why
        return
    timing = res.timings.setdefault(name, Timing())
    try:
        t0 = time.perf_counter()
        ev64, crossed64 = _pinned(driver, f64, cr.args64, cr, res, name, "float64") if cr.pin64 else \
            (driver.evaluate(f64, cr.args64, cr.prefixes), [])
        run = BackendRun(ev64)
        timing.float64 = time.perf_counter() - t0
    except BackendUnavailable as exc:  # this case needs what the backend lacks (an op without a lowering)
        res.unavailable[name] = str(exc)
        del res.timings[name]
        return
    except Exception as exc:
        res.errors[name] = short_error(exc)
        return
    runs[name] = run
    if sum(crossed64):
        res.notes.append(f"{name}: its float64 run took the other side at {sum(crossed64)} pinned kink decision"
                         f"{'s' if sum(crossed64) > 1 else ''} (the model computes part of its float64 run in "
                         f"{cr.case.float64_computes_in}, within whose rounding they lie): pinned, as float32 runs are")
    if cr.args32 is None:  # a float64-only case: its float64 calls are the ones timed
        timing.first = timing.float64
        if options.repeat:
            try:
                t0 = time.perf_counter()
                with _as_last_call(driver), _pinned64(cr):
                    again = driver.evaluate(f64, cr.args64, cr.prefixes)
                timing.second = time.perf_counter() - t0 if driver.compiles else None
                run.spread = _spreads(run.ev64, again)
            except Exception as exc:
                res.errors[name] = "a second call failed where the first did not: " + short_error(exc)
        return
    try:
        t0 = time.perf_counter()
        run.ev32, run.crossed = _pinned(driver, f32, cr.args32, cr, res, name)
        timing.first = time.perf_counter() - t0
        if options.repeat:
            t0 = time.perf_counter()
            with _as_last_call(driver):
                again = _pinned(driver, f32, cr.args32, cr, res, name)[0]
            timing.second = time.perf_counter() - t0 if driver.compiles else None
            run.spread = _spreads(run.ev32, again)
            again = None
    except Exception as exc:
        res.errors[f"{name} (float32)"] = short_error(exc)
    if run.ev32 is not None:
        run.ev32 = _measured32(name, run.ev32, run.ev64)


class _BesideCompilation:
    """An eager backend whose calls leave half the cores to a compilation running beside them
    (``gradcheck.check.cores``), decided at each call: a warm run's float32 program is loaded from jax's cache
    during the tape's float64 call, and the tape's float32 call then has every core again.  A repeat, compared
    with the call it repeats for nondeterminism, runs on that call's cores (``as_last_call``)."""

    def __init__(self, driver, compiling):
        self._driver, self._compiling = driver, compiling
        self._shared = False  # whether the last call left half the cores to a compilation
        self._repeating = False

    def __getattr__(self, attr):
        return getattr(self._driver, attr)

    def evaluate(self, *args, **kwargs):
        if not self._repeating:
            self._shared = any(d.busy() for d in self._compiling)
        with cores.shared() if self._shared else contextlib.nullcontext():
            return self._driver.evaluate(*args, **kwargs)

    @contextlib.contextmanager
    def as_last_call(self):
        """Calls inside the block run on the cores the last call ran on.  A reduction split over another number
        of threads rounds otherwise, and at an ill-conditioned point (a BatchNorm over two values) that rounding
        is amplified past any spread: the repeat would call a deterministic backend nondeterministic."""
        self._repeating = True
        try:
            yield
        finally:
            self._repeating = False


def _as_last_call(driver):
    """``driver``'s calls in the block on its last call's cores (``_BesideCompilation.as_last_call``)."""
    return driver.as_last_call() if isinstance(driver, _BesideCompilation) else contextlib.nullcontext()


def _measured32(name: str, ev32: Evaluation, ev64: Evaluation) -> Evaluation:
    """``ev32`` with each gradient measured against ``ev64``'s as it returns (``verdict.Measured32``), which is all
    the comparison reads of it: a float32 case then holds no backend's float32 gradients beside the next backend's
    run (half a float64 copy of the model per backend).  Outputs and buffers stay arrays: a running statistic is
    measured at a scale that takes every backend's float64 buffers (``compare.statistic_scales``)."""
    grads = {p: verdict.measure_float32(name, g, ev64.grads.get(p, MISSING)) for p, g in ev32.grads.items()}
    return Evaluation(value=ev32.value, grads=grads, buffers=ev32.buffers, leaves=ev32.leaves)


def _pinned(driver, f, args, cr: CaseRun, res: CaseResult, name: str, precision: str = "float32"):
    """An evaluation pinned to the float64 reference's kinks, and the crossings it met."""
    try:
        with kinks.pinned(cr.kinks) as pin:
            ev = driver.evaluate(f, args, cr.prefixes)
        return ev, [int(round(float(ops.to_numpy(c)))) if hasattr(c, "shape") else int(c) for c in pin.crossed]
    except kinks.KinkMismatch as exc:
        note = (f"{name}: {precision} not pinned to the float64 kinks ({exc}); its {precision} error may include "
                "kink crossings")
        if note not in res.notes:
            res.notes.append(note)
        if name not in res.unpinned:
            res.unpinned.append(name)
        return driver.evaluate(f, args, cr.prefixes), []


def _pinned64(cr: CaseRun):
    """Inside the block, calls are pinned to the reference's kinks where float64 runs are (``CaseRun.pin64``)."""
    return kinks.pinned(cr.kinks) if cr.pin64 else contextlib.nullcontext()


def _compare(cr: CaseRun, runs: dict[str, BackendRun], options: RunOptions, res: CaseResult) -> None:
    rules = options.rules
    leaves = all_leaves(cr.args64, cr.prefixes)
    owners = {}
    for a, p in zip(cr.args64, cr.prefixes):
        owners.update(leaf_owner_types(a, p))
    names = sorted(runs, key=reference_rank)
    measured = cr.args32 is not None

    def judge(path, role, get, layer="", expect_array=True, scale=0.0, value_scale=None):
        leaf = compare_leaf(path, role, {b: get(r.ev64) for b, r in runs.items()}, dtype="float64", rules=rules,
                            layer=layer, expect_array=expect_array, case_scale=scale, value_scale=value_scale)
        leaf.nondeterministic = {b: d for b, r in runs.items() if r.spread is not None
                                 and (d := get(r.spread)) is not MISSING and d}
        if measured and expect_array and leaf.verdict in ("agree", "disagree"):
            tol = rules.resolve(path, "float32", layer)
            leaf.float32 = verdict.float32_part({b: get(r.ev32) for b, r in runs.items() if r.ev32 is not None},
                                                {b: get(r.ev64) for b, r in runs.items()},
                                                tol.imprecise_factor, tol.imprecise_floor, value_scale)
        return leaf

    # Forward outputs first: a forward disagreement explains any gradient one.
    for k in range(cr.n_out):
        path = "output" if cr.n_out == 1 else f"output.{k}"
        res.leaves.append(judge(path, "output", lambda ev, k=k: _nth_output(ev.value, k)))
    buffers = [leaf for leaf in leaves if leaf.kind == "buffer" and np.asarray(leaf.value).dtype.kind == "f"]
    floor = _buffer_scale(runs, [leaf.path for leaf in buffers])
    # A running statistic is as precise as the values it summarises, at their scale (compare.statistic_scales).
    statistic = statistic_scales({leaf.path: leaf.value for leaf in buffers},
                                 {b: r.ev64.buffers for b, r in runs.items()})
    for leaf in buffers:
        res.leaves.append(judge(leaf.path, "buffer", lambda ev, p=leaf.path: ev.buffers.get(p, MISSING),
                                layer=owners.get(leaf.path, ""), scale=floor, value_scale=statistic.get(leaf.path)))

    grad_leaves = []
    known = set()
    for leaf in leaves:
        known.add(leaf.path)
        role = "input" if leaf.path.startswith("input") else "param"
        present = {b: r.ev64.grads.get(leaf.path, MISSING) for b, r in runs.items()}
        if leaf.trainable:
            grad_leaves.append((leaf, role, present))
        elif any(v is not MISSING for v in present.values()):
            kind_role = {"buffer": "buffer", "frozen": "frozen"}.get(leaf.kind, role)
            res.leaves.append(judge(leaf.path, kind_role, lambda ev, p=leaf.path: ev.grads.get(p, MISSING),
                                    layer=owners.get(leaf.path, ""), expect_array=False))
    for b, r in runs.items():
        for path in r.ev64.grads:
            if path not in known:
                res.leaves.append(compare_leaf(path, "param", {n: (r.ev64.grads[path] if n == b else MISSING)
                                                               for n in names}, dtype="float64", rules=rules,
                                               expect_array=False))

    scale = _case_scale(grad_leaves)
    judged = [judge(leaf.path, role, lambda ev, p=leaf.path: ev.grads.get(p, MISSING),
                    layer=owners.get(leaf.path, ""), scale=scale) for leaf, role, _ in grad_leaves]
    # Every leaf has been judged: the float32 results (outputs and buffers; the gradients were measured as they
    # returned) have given their part and nothing after reads them, so they are not held beside the referee's
    # direction and moved points, which come next.
    for r in runs.values():
        r.ev32 = None
    checks = _referee(cr, runs, [j for j in judged if j.verdict != "vacuous"], options, res, owners)
    res.leaves.extend(judged)
    for leaf in judged:
        verdict.decide(leaf, names, checks.get(leaf.path))
    decided = {id(j) for j in judged}
    for leaf in res.leaves:
        if leaf.role != "referee" and id(leaf) not in decided:
            verdict.decide(leaf, names, checks.get(leaf.path))
    # What still disagrees is held to float64's own reach at this point before anyone is blamed for it, and a
    # float32 result that seems imprecise to float32's.
    _within_reach(cr, runs, [leaf for leaf in res.leaves if leaf.verdict == "disagree" and leaf.role in _REACHED],
                  res, [leaf for leaf in res.leaves if leaf.float32 is not None
                        and leaf.float32.verdict == "imprecise" and leaf.role in _REACHED])
    for leaf in res.leaves:
        if leaf.role != "referee":
            # Two float32 calls may differ by a reordered reduction's rounding (an atomic add): what counts is
            # a spread float32's own precision measurement would notice.
            tol = rules.resolve(leaf.path, "float32" if measured else "float64", leaf.layer)
            verdict.nondeterminism(leaf, tol.imprecise_floor if measured else tol.rtol)
            verdict.apply_policy(leaf, options.imprecise)
    # Compared means held against something: another backend, or a referee check that did not abstain
    # (LeafResult.compared, the rule every report counts by).  One backend alone with the referee off compares
    # nothing, and nothing compared is never a pass; its forward output, which the referee does not check, is
    # compared against nothing and counted neither as compared nor as agreeing.
    res.leaves_compared = sum(1 for leaf in res.leaves if leaf.compared)
    if measured:
        res.float32 = verdict.worst_float32(leaf.float32 for leaf in res.leaves)
        res.kinks = cr.kinks.reports({b: r.crossed for b, r in runs.items()})
    if not grad_leaves:
        res.notes.append("no trainable leaf: only forward values were compared")


_REACHED = ("param", "input", "output", "buffer")  # the roles whose values the probe reads again


def _reached_value(ev, leaf: LeafResult):
    """The value a leaf compares, from one evaluation: a gradient, a forward output or an updated buffer."""
    if leaf.role == "output":
        k = int(leaf.path.split(".")[1]) if "." in leaf.path else 0
        return _nth_output(ev.value, k)
    if leaf.role == "buffer":
        return ev.buffers.get(leaf.path, MISSING)
    return ev.grads.get(leaf.path, MISSING)


def _within_reach(cr: CaseRun, runs: dict[str, BackendRun], leaves: list[LeafResult], res: CaseResult,
                  float32: list[LeafResult] = ()) -> None:
    """Leaves the backends disagree on, held to float64's reach at this point, and leaves whose float32 results
    seem imprecise, held to float32's: each backend's float64 gradient once more with every float leaf moved by
    a unit roundoff (gradcheck.check.conditioning).  One more float64 evaluation per backend, only when some
    leaf disagrees or seems imprecise."""
    if not (leaves or float32) or len(runs) < 2:
        return
    # A model that casts part of its float64 run to float32 is probed by float32's unit: one float64 ulp would
    # vanish in that rounding and measure nothing of it.
    narrow = cr.case.float64_computes_in
    unit = conditioning.unit_roundoff(narrow)
    moved = conditioning.perturbed(cr.float_leaves(), cr.case.seed, unit=unit)
    args = [replace_leaves(a, moved, p) for a, p in zip(cr.args64, cr.prefixes)]
    f64 = cr.f64
    probed = {id(leaf): leaf for leaf in [*leaves, *float32]}.values()
    spreads: dict[str, dict[str, float]] = {leaf.path: {} for leaf in probed}
    for name, run in runs.items():
        try:
            # Unpinned, also where the float64 runs are pinned (``CaseRun.pin64``): what rounding at this point can
            # move a gradient by includes the kinks it can cross, and jax, running a from_jax model's own code,
            # crosses them unpinned in its run too.
            ev = get_backend(name).evaluate(f64, args, cr.prefixes)
        except Exception as exc:  # the probe is a diagnosis: a failure leaves the verdicts as they are
            res.notes.append(f"float64's reach: {name} failed at the perturbed point ({short_error(exc)})")
            continue
        for leaf in probed:
            before, after = _reached_value(run.ev64, leaf), _reached_value(ev, leaf)
            if before is not MISSING and after is not MISSING and before is not None and after is not None:
                spreads[leaf.path][name] = conditioning.spread(before, after)
    held = []
    for leaf in leaves:
        if conditioning.within_reach(leaf, spreads[leaf.path], narrow):
            held.append(leaf.path)
        elif leaf.rounding:  # some pairs were within reach: who is outside it is decided again, with them agreeing
            verdict.decide(leaf, sorted(runs, key=reference_rank), leaf.referee)
    if held:
        cast = (f" of {narrow}, which the model's float64 run computes in where it casts to it"
                if unit > conditioning.UNIT else "")
        res.notes.append(f"float64's reach: {len(held)} of {len(leaves)} disagreeing leaves differ by no more "
                         f"than rounding moves them at this point ({conditioning.SPREAD_FACTOR:g}x a unit roundoff's "
                         f"effect{cast}); they agree within float64's reach ({', '.join(held[:5])}"
                         f"{', ...' if len(held) > 5 else ''})")
    rounded = [leaf.path for leaf in float32 if conditioning.float32_within_reach(leaf, spreads[leaf.path], unit)]
    if rounded:
        probe = ("float64's probe, scaled to float32's unit roundoff" if unit == conditioning.UNIT else
                 f"the probe, which moved the inputs by {narrow}'s unit roundoff")
        res.notes.append(f"float32's reach: {len(rounded)} of {len(float32)} leaves whose float32 results seemed "
                         "imprecise are off by no more than float32's rounding moves them at this point "
                         f"({probe}): not imprecise ({', '.join(rounded[:5])}"
                         f"{', ...' if len(rounded) > 5 else ''})")


def _spread(a, b) -> float:
    """``max |a - b| / max |a|`` of two calls' results (0 when identical or not comparable)."""
    if a is None or b is None or a is MISSING or b is MISSING:
        return 0.0
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype.kind not in "fc" or np.array_equal(a, b, equal_nan=True):
        return 0.0
    scale = float(np.max(np.abs(a), initial=0.0))
    diff = float(np.max(np.abs(a - b), initial=0.0))
    return diff / scale if scale > 0 else float("inf")


def _spreads(first: Evaluation, again: Evaluation) -> Evaluation:
    """``_spread`` of every output, gradient and buffer of two calls, in the first call's shape (a float where
    it had an array), so that the comparison reads a leaf's spread with the getter it reads the leaf with."""
    if isinstance(first.value, tuple) and isinstance(again.value, tuple):
        value = tuple(_spread(a, b) for a, b in zip(first.value, again.value))
    else:
        value = _spread(first.value, again.value)
    return Evaluation(value=value,
                      grads={p: _spread(v, again.grads.get(p, MISSING)) for p, v in first.grads.items()},
                      buffers={p: _spread(v, again.buffers.get(p, MISSING)) for p, v in first.buffers.items()})


def _case_scale(grad_leaves) -> float:
    """The largest finite float64 gradient entry over every trainable leaf and backend."""
    return max((_finite_max(v) for _, _, arrays in grad_leaves for v in arrays.values()), default=0.0)


def _finite_max(v) -> float:
    """The largest finite |entry| of a leaf's array (0 for a missing or empty one)."""
    if v is MISSING or v is None or not np.size(v):
        return 0.0
    a = np.abs(np.asarray(v, dtype=np.float64))
    return float(np.max(a, where=np.isfinite(a), initial=0.0))


def _buffer_scale(runs: dict[str, BackendRun], paths: list[str]) -> float:
    """The largest float64 entry over the case's updated buffers: each backend's, then the median of those.

    A running statistic that is zero in exact arithmetic (the batch mean of a
    channel a previous BatchNorm centred) comes out as rounding noise of its
    inputs' scale, ~1e-17, which its own values do not show; buffers are
    compared with an absolute floor at the scale of the case's statistics
    instead.  The median, so that one backend's wrong statistics cannot widen
    everyone's floor.
    """
    maxes = [max((_finite_max(r.ev64.buffers.get(p, MISSING)) for p in paths), default=0.0) for r in runs.values()]
    return float(np.median(maxes)) if maxes else 0.0


def _nth_output(value, k):
    outs = value[1:] if isinstance(value, tuple) else [value]
    return outs[k] if k < len(outs) else MISSING


def _referee(cr: CaseRun, runs, judged: list[LeafResult], options: RunOptions, res: CaseResult,
             owners: dict) -> dict:
    """Referee checks per leaf path; which leaves get one depends on the mode and its cost."""
    mode = options.referee
    if mode == "off" or not judged:
        return {}
    point = {leaf.path: np.asarray(cr.leaves64[leaf.path], np.float64) for leaf in judged}
    dirs = ref.directions(point, cr.case.seed)
    grads = {b: r.ev64.grads for b, r in runs.items()}
    rules = options.rules

    def rtol(path):
        return rules.resolve(path, "float64", owners.get(path, "")).referee_rtol

    # Leaves whose float64 pairs already agree: the referee confirms them (``referee.check``'s ``confirming``).
    agreed = {leaf.path for leaf in judged if leaf.verdict == "agree" and leaf.pairs}
    # The estimate comes from the float64 forward's counted work, not its time: the mode must not
    # change with the machine's load (see gradcheck.check.cost).  It counts four passes a leaf, what a leaf
    # costs when the referee does not confirm it, so the mode does not hang on the verdicts.
    every_leaf_s = ref.PASSES * cr.forward64_work.seconds() * len(judged)
    every = mode == "leaves" or (mode == "auto" and every_leaf_s <= options.referee_budget_s)
    if every:
        chosen = [leaf.path for leaf in judged]
    else:
        chosen = [leaf.path for leaf in judged if leaf.verdict != "agree"]
        if mode == "auto":
            res.notes.append(
                f"referee: checking each of {len(judged)} leaves was estimated at {every_leaf_s:.0f} s "
                f"({ref.PASSES * len(judged)} float64 passes; one pass: {cr.forward64_work}), over the budget of "
                f"{options.referee_budget_s:g} s (referee_budget_s), so all leaves were checked along one joint "
                f"direction and each leaf the backends disagree on apart; --referee leaves checks every leaf")
        _joint_referee(cr, runs, point, dirs, grads, max(rtol(p) for p in point), res,
                       confirming=all(p in agreed for p in point))
    gradients_at = _gradients_at(cr, runs)
    referee = _LeafReferee(point, dirs, rtol, ref.SlopeCheck(gradients_at) if gradients_at is not None else None,
                           agreed)
    if not every and len(runs) > 1 and len(chosen) > AHEAD_OF_LOCALISING:
        # A wrong backward in one layer puts every leaf before it off: localisation names that layer and which
        # leaves only inherit its error, so the per-leaf referee waits for it (``_referee_deferred``).
        chosen = _backward_order(judged, chosen)
        referee.deferred = chosen[AHEAD_OF_LOCALISING:]
        chosen = chosen[:AHEAD_OF_LOCALISING]
        cr.referee = referee
    out = {path: referee.check(cr, runs, path, res) for path in chosen}
    referee.note_slope(res)
    return out


# Disagreeing leaves the referee checks before localisation, nearest the output first (where a disagreement
# starts); the rest wait for the origin (``_referee_deferred``).
AHEAD_OF_LOCALISING = 2


@dataclass
class _LeafReferee:
    """The per-leaf referee of one case: its point, directions, tolerances and slope budget, kept for the leaves
    that wait for localisation (``deferred``)."""

    point: dict
    dirs: dict
    rtol: Callable[[str], float]
    slope: ref.SlopeCheck | None
    agreed: set[str] = field(default_factory=set)  # leaves whose float64 pairs agree: confirmed
    deferred: list[str] = field(default_factory=list)

    def check(self, cr: CaseRun, runs, path: str, res: CaseResult):
        grads = {b: r.ev64.grads for b, r in runs.items()}
        checks, passes = ref.check(cr.loss64, self.point, {path: self.dirs[path]}, grads, self.rtol(path),
                                   cr.loss_abs, cr.loss_noise, self.slope, confirming=path in self.agreed,
                                   eps=cr.eps)
        res.referee_passes += passes
        return checks

    def note_slope(self, res: CaseResult) -> None:
        slope = self.slope
        if slope is None or not slope.assumed:
            return
        note = (f"referee: the finite difference missed every backend on {slope.measured + slope.assumed} leaves; the "
                f"slope was measured on {slope.measured} of them (one backend's float64 gradient at each step's two "
                f"ends) and moved within the step on {slope.unsteady}, so on the other {slope.assumed} the difference "
                + ("was not trusted: the referee abstained there" if slope.unsteady else "stands as it is"))
        res.notes[:] = [n for n in res.notes if not n.startswith("referee: the finite difference missed every")]
        res.notes.append(note)


def _backward_order(judged: list[LeafResult], paths: list[str]) -> list[str]:
    """``paths`` nearest the output first: parameters last in forward order first (where a wrong backward shows
    first, ``compare.first_in_backward_order``), then the other roles in forward order."""
    wanted = set(paths)
    params = [leaf.path for leaf in judged if leaf.path in wanted and leaf.role == "param"]
    return params[::-1] + [leaf.path for leaf in judged if leaf.path in wanted and leaf.role != "param"]


def _referee_deferred(cr: CaseRun, runs: dict[str, BackendRun], res: CaseResult) -> None:
    """The per-leaf referee on the disagreeing leaves that waited for localisation.

    A leaf that only inherits the origin's error (``LeafResult.inherited``) is
    not refereed apart: the origin's own replay, refereed on the layer alone,
    is the evidence, and its blame is the origin's where the pairs alone did
    not decide.  Every other leaf still disagreeing (the origin's own, a
    second error, or all of them when no origin was found) is refereed as if
    it had not waited.
    """
    referee = cr.referee
    if referee is None or not referee.deferred:
        return
    names = sorted(runs, key=reference_rank)
    waiting = set(referee.deferred)
    leaves = [leaf for leaf in res.leaves if leaf.path in waiting and leaf.verdict == "disagree"]
    origin = res.origin
    explained = [leaf for leaf in leaves if leaf.inherited and origin is not None and origin.path]
    for leaf in leaves:
        if leaf in explained:
            continue
        verdict.decide(leaf, names, referee.check(cr, runs, leaf.path, res))
    referee.note_slope(res)
    if not explained:
        return
    where = f"{origin.path} ({origin.layer})"
    for leaf in explained:
        if not leaf.blame and origin.blame:
            leaf.blame = list(origin.blame)
            leaf.message = (f"{', '.join(origin.blame)}: inherits the error of {where}, where "
                            f"{verdict.joined(origin.blame)}'s own backward disagrees; {leaf.message}")
    res.notes.append(
        f"referee: {len(explained)} disagreeing leaves inherit the error of the origin {where} and were not refereed "
        f"apart (the origin's own replay was; {AHEAD_OF_LOCALISING} leaves nearest the output were refereed before "
        f"localising): {', '.join(leaf.path for leaf in explained[:5])}{', ...' if len(explained) > 5 else ''}")


def _gradients_at(cr: CaseRun, runs) -> ref.GradientsAt | None:
    """One backend's float64 gradients at a moved point, for the referee's slope check: a backend that does not
    compile first (a moved point is a new call), in the reference order."""
    names = sorted(runs, key=lambda b: (get_backend(b).compiles, reference_rank(b)))
    if not names:
        return None
    name = names[0]

    def gradients_at(replaced: dict) -> tuple[str, dict]:
        args = [replace_leaves(a, replaced, p) for a, p in zip(cr.args64, cr.prefixes)]
        return name, get_backend(name).evaluate(cr.f64, args, cr.prefixes).grads

    return gradients_at


JOINT = "(all leaves, joint direction)"  # the path of the joint direction's own leaf (role "referee")


def _joint_referee(cr, runs, point, dirs, grads, rtol, res: CaseResult, confirming: bool = False) -> None:
    """Every trainable leaf at once along one direction: four passes for the whole model (two where it confirms
    backends that agree on every leaf, ``referee.check``).

    Its word becomes a leaf of its own (path ``JOINT``, role ``referee``),
    decided like any leaf (``verdict.decide``, without pairs), when it says
    something the pairs cannot: it misses a backend, or it is all the
    gradients were held against (one backend ran).  Otherwise the pairs
    compared every leaf, and a note records that the joint direction agrees.
    """
    gradients_at = _gradients_at(cr, runs)
    checks, passes = ref.check(cr.loss64, point, dirs, grads, rtol, cr.loss_abs, cr.loss_noise,
                               ref.SlopeCheck(gradients_at) if gradients_at is not None else None, confirming,
                               eps=cr.eps)
    res.referee_passes += passes
    if not checks:
        return
    summary = ", ".join(f"{c.backend} {'agrees' if c.agrees else 'misses'} (error/resolution {c.error:.2g})"
                        for c in checks)
    where = (f"referee, joint direction over {len(dirs)} leaves (finite difference {checks[0].numeric:.10g} "
             f"± {checks[0].resolution:.2g})")
    if not checks[0].stable:
        res.notes.append(f"{where}: abstained, the finite difference is unstable at this point ({summary})")
        return
    res.notes.append(f"{where}: {summary}")
    names = sorted((c.backend for c in checks), key=reference_rank)
    leaf = verdict.decide(LeafResult(path=JOINT, role="referee", dtype="float64"), names, checks)
    if leaf.verdict == "agree" and len(names) > 1:
        return
    if leaf.message:
        leaf.message += f"; checked as the whole gradient along one random direction over all {len(dirs)} leaves"
    res.leaves.append(leaf)


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

    def __init__(self, path, env: dict, planned: int | None = None):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._fh = open(path, "w", encoding="utf-8")
        # planned: a reader of a run killed outright can still tell how many cases never ran.
        self._write({"type": "run", "schema": SCHEMA, "env": env, "planned": planned})

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
    result = RunResult(env=env or environment(), planned=len(cases))
    writer = ResultsWriter(results_path, result.env, planned=len(cases)) if results_path else None
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

"""jax compiles ahead, while the eager backends run, and a case compiles each of its programs once.

``JaxBackend.prepare`` traces and lowers a call on the calling thread and
compiles it on a background thread; the ``evaluate`` of the same call uses
that program.  The runner prepares jax's float64 and pinned float32 calls
before any backend runs (``runner._prepare_compiled``).  What is checked here:
the prepared program computes exactly what an unprepared one does (float64 and
pinned float32), a prepared case gives the same verdicts and values, a wrong
jax gradient is still caught through a prepared program (the negative
control), a call that fails to trace is reported by the evaluation as before,
and the case's later float64 calls at a moved point (float64's reach) reuse
the compiled program instead of tracing again.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("torch")

import faults  # noqa: E402

import gradcheck.layers as L  # noqa: E402
from gradcheck import ops  # noqa: E402
from gradcheck.backends import get_backend  # noqa: E402
from gradcheck.backends.jax.driver import JaxBackend  # noqa: E402
from gradcheck.case import Case  # noqa: E402
from gradcheck.check import kinks, runner  # noqa: E402
from gradcheck.check.runner import CaseRun, RunOptions, run_case  # noqa: E402

ALL = ("tape", "torch", "jax")


def dense_relu(rng):
    return L.Chain(L.Dense(6, 8, activation=ops.relu, rng=rng), L.Dense(8, 3, rng=rng))


CASE = Case("dense_relu", dense_relu, lambda rng: (rng.standard_normal((5, 6)),))


def _evaluations(prepare: bool, seed: int):
    """jax's float64 and pinned float32 evaluations of the case, prepared ahead or not, from a fresh driver."""
    cr = CaseRun(CASE.with_(seed=seed))
    driver = JaxBackend()
    if prepare:
        assert driver.prepare(cr.f64, cr.args64, cr.prefixes)
        with kinks.pinned(cr.kinks):
            assert driver.prepare(cr.f32, cr.args32, cr.prefixes)
        assert driver.traces == 2
    ev64 = driver.evaluate(cr.f64, cr.args64, cr.prefixes)
    with kinks.pinned(cr.kinks) as pin:
        ev32 = driver.evaluate(cr.f32, cr.args32, cr.prefixes)
        crossed = [np.asarray(c) for c in pin.crossed]
    assert driver.traces == 2  # each program traced once, ahead or at its first call
    return ev64, ev32, crossed


@pytest.mark.parametrize("seed", range(3))
def test_a_prepared_program_computes_exactly_what_the_unprepared_one_does(seed):
    ahead, now = _evaluations(True, seed), _evaluations(False, seed)
    for got, want in zip(ahead[:2], now[:2]):
        assert got.grads.keys() == want.grads.keys()
        for path in want.grads:
            np.testing.assert_array_equal(got.grads[path], want.grads[path], err_msg=path)
        np.testing.assert_array_equal(got.value[1], want.value[1])
    assert len(ahead[2]) == len(now[2]) and all(np.array_equal(a, b) for a, b in zip(ahead[2], now[2]))


def test_a_case_is_prepared_and_agrees_as_unprepared(monkeypatch):
    prepared = run_case(CASE, RunOptions(backends=ALL))
    assert prepared.timings["jax"].prepare is not None and prepared.verdict == "agree"
    monkeypatch.setattr(runner, "_prepare_compiled", lambda *a: None)
    plain = run_case(CASE, RunOptions(backends=ALL))
    assert plain.timings["jax"].prepare is None
    assert [(x.path, x.verdict) for x in prepared.leaves] == [(x.path, x.verdict) for x in plain.leaves]


def test_the_tape_runs_while_jax_compiles_and_torch_after_whatever_order_the_run_names(monkeypatch):
    # Named first, jax would wait for its compilation before the tape starts: the tape runs first, on the cores
    # the compilation leaves it; torch, whose threads are left as they are, after jax, on every core; and the
    # case is judged as in the default order.
    order = []
    evaluate = runner._evaluate_backend
    monkeypatch.setattr(runner, "_evaluate_backend", lambda name, *args: (order.append(name), evaluate(name, *args)))
    res = run_case(CASE.with_(seed=4), RunOptions(backends=("jax", "torch", "tape")))
    assert order == ["tape", "jax", "torch"]
    assert res.timings["jax"].prepare is not None and res.verdict == "agree"
    default = run_case(CASE.with_(seed=4), RunOptions(backends=ALL))
    assert [(x.path, x.verdict) for x in res.leaves] == [(x.path, x.verdict) for x in default.leaves]


def test_nothing_is_prepared_without_an_eager_backend_to_overlap():
    res = run_case(CASE, RunOptions(backends=("jax",)))
    assert "jax" in res.timings and res.timings["jax"].prepare is None


def test_a_wrong_jax_gradient_is_caught_through_a_prepared_program(monkeypatch):
    faults.wrong_bias_gradient(monkeypatch, "jax")
    res = run_case(CASE, RunOptions(backends=ALL))
    assert res.timings["jax"].prepare is not None
    wrong = [x for x in res.leaves if x.verdict == "disagree"]
    assert wrong and all(x.path.endswith("bias") for x in wrong)
    assert all(x.blame == ["jax"] for x in wrong)


def test_a_call_that_fails_to_trace_is_reported_by_its_evaluation(monkeypatch):
    from gradcheck.backends.jax import ops as jax_ops

    def broken(*args, **kwargs):
        raise RuntimeError("a lowering that cannot trace")

    monkeypatch.setattr(jax_ops, "relu", broken)
    res = run_case(CASE, RunOptions(backends=ALL))
    assert res.timings["jax"].prepare is None  # nothing started; the evaluation met the error itself
    assert "a lowering that cannot trace" in res.errors["jax"]
    assert res.verdict == "error"


def test_float64s_reach_reuses_the_compiled_program(monkeypatch):
    # A wrong gradient on torch makes leaves disagree, so float64's reach evaluates every backend once more at
    # a moved point: the same loss function at the same shapes, which jax must not trace again.
    faults.wrong_bias_gradient(monkeypatch, "torch")
    driver = get_backend("jax")
    reached = []
    within = runner._within_reach
    monkeypatch.setattr(runner, "_within_reach", lambda cr, runs, leaves, res, *rest: (
        reached.append((driver.traces, bool(leaves))), within(cr, runs, leaves, res, *rest),
        reached.append(driver.traces)))
    res = run_case(CASE, RunOptions(backends=ALL, referee="off"))
    assert res.verdict == "disagree"
    (before, probed), after = reached
    assert probed and after == before


# ---------------------------------------------------------------- the cores an eager backend leaves a compilation
def _blas_threads() -> int:
    import threadpoolctl

    return max((lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"), default=1)


def _threads_per_call(monkeypatch, names) -> dict[str, list]:
    """(torch's threads, the BLAS libraries' threads) at each evaluate call of the named backends."""
    import torch

    calls: dict[str, list] = {}
    for name in names:
        driver = get_backend(name)
        original = driver.evaluate

        def spy(f, args, prefixes=None, _name=name, _original=original):
            calls.setdefault(_name, []).append((torch.get_num_threads(), _blas_threads()))
            return _original(f, args, prefixes)

        monkeypatch.setattr(driver, "evaluate", spy)
    return calls


def test_an_eager_backend_runs_on_half_the_cores_while_jax_compiles_and_gets_them_back(monkeypatch):
    """The BLAS libraries' threads (the tape's numpy) are halved while jax compiles; torch's are never touched:
    torch 2.13's oneDNN convolution backward corrupts the heap on one thread for some convolutions
    (``gradcheck.check.cores``), so a checker that lowered them crashed models torch runs fine."""
    import torch

    from gradcheck.check import cores

    calls = _threads_per_call(monkeypatch, ("tape", "torch"))
    monkeypatch.setattr(cores, "available", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    blas = _blas_threads()
    try:
        # jax reports a compilation in flight for the whole case: both eager backends' BLAS run on one core of two
        monkeypatch.setattr(JaxBackend, "busy", lambda self: True)
        shared = run_case(CASE, RunOptions(backends=ALL))
        seen = {name: set(threads) for name, threads in calls.items()}
        assert seen == {"tape": {(2, 1)}, "torch": {(2, 1)}}
        assert torch.get_num_threads() == 2 and _blas_threads() == blas  # given back
        # nothing in flight: every core, and the same verdicts
        calls.clear()
        monkeypatch.setattr(JaxBackend, "busy", lambda self: False)
        alone = run_case(CASE, RunOptions(backends=ALL))
        seen = {name: set(threads) for name, threads in calls.items()}
        assert seen == {"tape": {(2, blas)}, "torch": {(2, blas)}}
    finally:
        torch.set_num_threads(before)
    assert shared.verdict == alone.verdict == "agree"
    assert [(x.path, x.verdict) for x in shared.leaves] == [(x.path, x.verdict) for x in alone.leaves]


def test_the_cores_are_decided_at_each_call_so_a_finished_compilation_gives_them_back(monkeypatch):
    """A warm run's float32 program finishes loading during the tape's float64 call: the calls after it run on
    every core again, not on the half the backend started with."""
    import torch

    from gradcheck.check import cores

    per_call = _threads_per_call(monkeypatch, ("tape",))
    calls = per_call.setdefault("tape", [])
    monkeypatch.setattr(cores, "available", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    blas = _blas_threads()
    # jax's compilation is in flight until the tape's first call has been made
    monkeypatch.setattr(JaxBackend, "busy", lambda self: not calls)
    try:
        res = run_case(CASE, RunOptions(backends=ALL))
    finally:
        torch.set_num_threads(before)
    assert res.verdict == "agree"
    assert calls[0] == (2, 1) and set(calls[1:]) == {(2, blas)}, calls
    assert len(calls) == 3  # float64, then float32 twice


@pytest.mark.parametrize("amplified", [False, True], ids=["threads", "verdict"])
def test_a_repeat_runs_on_the_cores_of_the_call_it_repeats(monkeypatch, amplified):
    """The repeat is compared with the call it repeats for nondeterminism, so it runs on that call's threads even
    when the compilation beside them ended in between: a reduction split over another number of threads rounds
    otherwise, and at an ill-conditioned point (EfficientNet's last BatchNorms over two values each) that rounding
    grew to spreads of the leaves' own size, and torch was called nondeterministic.  ``amplified``: the tape's
    float32 gradients made to depend on its thread count, as such a point makes them."""
    import dataclasses

    import torch

    from gradcheck.check import cores

    per_call = _threads_per_call(monkeypatch, ("tape",))
    calls = per_call.setdefault("tape", [])
    if amplified:
        driver = get_backend("tape")
        counted = driver.evaluate

        def by_threads(f, args, prefixes=None):
            ev = counted(f, args, prefixes)
            if all(np.asarray(g).dtype != np.float32 for g in ev.grads.values()):
                return ev
            scale = 1 + 1e-2 * (_blas_threads() - 1)
            return dataclasses.replace(ev, grads={p: g * np.float32(scale) for p, g in ev.grads.items()})

        monkeypatch.setattr(driver, "evaluate", by_threads)
    monkeypatch.setattr(cores, "available", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    # jax's compilation ends between the tape's first float32 call and its repeat
    monkeypatch.setattr(JaxBackend, "busy", lambda self: len(calls) < 2)
    try:
        res = run_case(CASE, RunOptions(backends=ALL))
    finally:
        torch.set_num_threads(before)
    assert res.verdict == "agree", [(x.path, x.verdict, x.message) for x in res.leaves if x.verdict != "agree"]
    assert calls[0] == calls[1] == calls[2] == (2, 1), calls  # float64 and float32 shared, the repeat as its call


def test_a_prepared_compilation_is_busy_until_it_finishes():
    cr = CaseRun(CASE.with_(seed=7))
    driver = JaxBackend()
    assert not driver.busy()
    assert driver.prepare(cr.f64, cr.args64, cr.prefixes)
    driver.evaluate(cr.f64, cr.args64, cr.prefixes)  # waits for the compiled program
    for _ in range(100):  # the done-callback runs on the compiling thread just after the result is set
        if not driver.busy():
            break
        time.sleep(0.01)
    assert not driver.busy()

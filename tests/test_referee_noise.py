"""The referee's loss-noise floor is measured only when it could change what a check says.

``referee._NoiseFloor``: the floor ``loss_noise / h`` only widens the resolution, so a backend that agrees without
it agrees with it, and the probe (two float64 passes and a unit-roundoff move of every leaf) is asked for only
when some backend misses the resolution without it.  Checked here: on a loss whose rounding noise is set, a
backend inside the floor but outside the resolution without it agrees exactly as with the floor given up front
(the probe asked once); one outside both is still missed (the negative control); a check where everyone agrees
without the floor never asks; and end to end, a passing case never runs the probe while a case with a wrong
backward on each backend does, and blames that backend as before.
"""

from __future__ import annotations

import faults
import numpy as np
import pytest

import gradcheck.layers as L
from gradcheck import ops
from gradcheck.case import Case
from gradcheck.check import conditioning
from gradcheck.check import referee as ref
from gradcheck.check.runner import CaseRun, RunOptions, run_case

ALL = ("tape", "torch", "jax")
CASE = Case("dense_tanh", lambda rng: L.Chain(L.Dense(6, 8, activation=ops.tanh, rng=rng), L.Dense(8, 3, rng=rng)),
            lambda rng: (rng.standard_normal((5, 6)),), seed=3)

SLOPE = 2.0
H = ref.STEP  # the first step at a point of order one
NOISE = 1e-12  # the loss's rounding noise: a floor of NOISE / H = 1e-4 on the resolution, far above the rest


def linear(replaced):
    """``L(w) = SLOPE w``: exact differences, so the resolution without the floor is its rtol part alone."""
    return SLOPE * float(replaced["w"][0]), 0


def _check(answers: dict, noise):
    grads = {b: {"w": np.array([a])} for b, a in answers.items()}
    return ref.check(linear, {"w": np.array([1.0])}, {"w": np.array([1.0])}, grads, rtol=1e-9, loss_abs=SLOPE,
                     loss_noise=noise)


class Probe:
    def __init__(self, value=NOISE):
        self.value, self.calls = value, 0

    def __call__(self):
        self.calls += 1
        return self.value


def by_backend(checks):
    return {c.backend: (c.agrees, c.stable, c.resolution) for c in checks}


def test_a_backend_inside_the_floor_only_agrees_as_with_the_floor_given_up_front():
    answers = {"right": SLOPE, "rounded": SLOPE + 1e-5}  # 1e-5 off: within the floor (1e-4), far outside 1e-9
    probe = Probe()
    lazy, lazy_passes = _check(answers, probe)
    given, given_passes = _check(answers, NOISE)
    assert probe.calls == 1
    assert by_backend(lazy) == by_backend(given) and lazy_passes == given_passes
    assert all(c.agrees for c in lazy)
    # without the floor at all, the rounded backend would be missed: the floor is what decides it
    assert not {c.backend: c.agrees for c in _check(answers, 0.0)[0]}["rounded"]


def test_a_backend_outside_the_floor_is_still_missed():
    probe = Probe()
    checks, _ = _check({"right": SLOPE, "wrong": SLOPE * 1.01}, probe)
    assert probe.calls == 1
    assert {c.backend: c.agrees for c in checks} == {"right": True, "wrong": False}
    assert by_backend(checks) == by_backend(_check({"right": SLOPE, "wrong": SLOPE * 1.01}, NOISE)[0])


def test_a_check_everyone_passes_without_the_floor_never_asks_for_it():
    probe = Probe()
    checks, _ = _check({"a": SLOPE, "b": SLOPE}, probe)
    assert probe.calls == 0 and all(c.agrees for c in checks)
    # the resolution it records is the one it held the backends to, tighter than with the floor
    assert checks[0].resolution < _check({"a": SLOPE, "b": SLOPE}, NOISE)[0][0].resolution


def _probes(monkeypatch) -> list:
    """Every measurement of the loss noise in the cases that follow (the three backends are needed)."""
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    calls = []
    measure = conditioning.loss_noise

    def counted(*args, **kwargs):
        calls.append(1)
        return measure(*args, **kwargs)

    monkeypatch.setattr(conditioning, "loss_noise", counted)
    return calls


def test_a_passing_case_runs_no_probe(monkeypatch):
    calls = _probes(monkeypatch)
    res = run_case(CASE, RunOptions(backends=ALL, referee="leaves"))
    assert res.verdict == "agree" and res.referee_passes > 0
    assert calls == []


@pytest.mark.parametrize("backend", ALL)
def test_a_wrong_backward_asks_for_the_floor_and_is_still_blamed(monkeypatch, backend):
    calls = _probes(monkeypatch)
    faults.wrong_bias_gradient(monkeypatch, backend)
    res = run_case(CASE, RunOptions(backends=ALL, referee="leaves"))
    assert res.verdict == "disagree"
    assert len(calls) == 1  # measured once for the case, whichever check asked first
    blamed = {b for leaf in res.leaves for b in leaf.blame}
    assert blamed == {backend}, [(leaf.path, leaf.blame, leaf.message) for leaf in res.leaves if leaf.blame]


def test_the_case_measures_the_floor_once_and_keeps_it():
    cr = CaseRun(CASE)
    first = cr.loss_noise()
    assert cr.loss_noise() == first and cr._loss_noise == first

"""The referee's slope check: a finite difference averages the directional derivative over its step.

At an ill-conditioned point the derivative changes within the referee's
step, and a smooth-looking difference then misses every backend although all
of them are right (EfficientNet-B0 at 32x32, batch 2, at one initialisation:
the directional derivative changes sign within a step of 1e-8).  Only then
does the referee ask one backend for its gradient at the step's two ends;
where the slope bends there, the step is shrunk, and the referee abstains if
it never holds still.  The controls: a feature narrower than any step the
referee takes (abstains, where it used to fail everyone), a rule wrong on
every backend alike (still found: its slope holds still), a wrong gradient on
any one backend (blamed on it, with nothing extra run), and a clean run
(nothing extra run).
"""

from __future__ import annotations

import numpy as np
import pytest
from faults import wrong_sin_gradient
from test_conditioning import _available, _case

from gradcheck.check import referee, runner
from gradcheck.check.runner import RunOptions, run_case

BACKENDS = ("tape", "torch", "jax")
G, A, DELTA = 1.0, 1e-10, 1e-11  # a slope of 1 plus a tanh step of height 2e-10 and width 1e-11 at the point


def _narrow(t):
    return G * t + A * np.tanh(t / DELTA)


def _slope(t):
    return G + A / DELTA * (1 - np.tanh(t / DELTA) ** 2)


def _synthetic(factor=1.0):
    point, v = {"w": np.array(0.0)}, {"w": np.array(1.0)}

    def loss64(replaced):
        return float(_narrow(replaced.get("w", point["w"])))

    def gradients_at(moved):
        return "tape", {"w": np.asarray(_slope(moved["w"]) * factor)}

    grads = {"tape": {"w": np.asarray(_slope(0.0) * factor)}, "torch": {"w": np.asarray(_slope(0.0) * factor)}}
    return loss64, point, v, grads, gradients_at


def test_a_feature_narrower_than_every_step_makes_the_referee_abstain_not_fail_everyone():
    loss64, point, v, grads, gradients_at = _synthetic()
    before, _ = referee.check(loss64, point, v, grads, rtol=1e-10)
    assert all(c.stable and not c.agrees for c in before)  # the false verdict: right backends, all missed
    checks, passes = referee.check(loss64, point, v, grads, rtol=1e-10, slope=referee.SlopeCheck(gradients_at))
    assert all(not c.stable for c in checks)  # abstains: it cannot take this derivative
    assert passes == referee.PASSES * (referee.RETRIES + 1)  # it shrank as far as it goes


def test_a_slope_that_holds_still_is_not_asked_again_and_a_shared_wrong_rule_is_found():
    point, v = {"w": np.array([0.3, -1.2])}, {"w": np.array([1.0, 0.5])}
    asked = []

    def loss64(replaced):
        return float(np.sum(np.sin(replaced.get("w", point["w"]))))

    def gradients_at(moved):
        asked.append(moved)
        return "tape", {"w": np.cos(moved["w"]) * 1.01}

    wrong = {"tape": {"w": np.cos(point["w"]) * 1.01}}
    checks, passes = referee.check(loss64, point, v, wrong, rtol=1e-10, slope=referee.SlopeCheck(gradients_at))
    assert len(asked) == 2 and passes == referee.PASSES  # both ends asked once, no shrink
    assert checks[0].stable and not checks[0].agrees


def test_past_the_budget_what_the_measured_leaves_showed_stands_for_the_rest():
    loss64, point, v, grads, gradients_at = _synthetic()
    calls = []

    def counted(moved):
        calls.append(moved)
        return gradients_at(moved)

    slope = referee.SlopeCheck(counted, leaves=1)
    first, _ = referee.check(loss64, point, v, grads, rtol=1e-10, slope=slope)
    asked = len(calls)
    second, passes = referee.check(loss64, point, v, grads, rtol=1e-10, slope=slope)
    assert all(not c.stable for c in first + second)  # both abstain ...
    assert len(calls) == asked and passes == referee.PASSES  # ... the second without a gradient asked or a shrink
    assert (slope.measured, slope.unsteady, slope.assumed) == (1, 1, 1)
    # where the measured slope held still (a rule wrong everywhere alike), the difference stands past the budget
    wrong = {"tape": {"w": np.asarray(np.cos(0.3) * 1.01)}}
    smooth = referee.SlopeCheck(lambda moved: ("tape", {"w": np.cos(moved["w"]) * 1.01}), leaves=1)
    for _ in range(2):
        checks, _ = referee.check(lambda r: float(np.sin(r.get("w", 0.3))), {"w": np.array(0.3)},
                                  {"w": np.array(1.0)}, wrong, rtol=1e-10, slope=smooth)
        assert checks[0].stable and not checks[0].agrees
    assert (smooth.measured, smooth.unsteady, smooth.assumed) == (1, 0, 1)


def _run(seed, backends=BACKENDS):
    for b in backends:
        _available(b)
    return run_case(_case(seed, gain=1.0), RunOptions(backends=backends, referee="leaves"))


@pytest.fixture
def asked(monkeypatch):
    """Every call of the runner's gradients_at: (backend, moved paths, the gradients it returned)."""
    calls, original = [], runner._gradients_at

    def recording(cr, runs):
        inner = original(cr, runs)

        def gradients_at(moved):
            backend, grads = inner(moved)
            calls.append((backend, sorted(moved), grads))
            return backend, grads

        return gradients_at

    monkeypatch.setattr(runner, "_gradients_at", recording)
    return calls


@pytest.mark.parametrize("seed", range(3))
def test_a_clean_run_asks_for_nothing_more(asked, seed):
    res = _run(seed)
    assert res.verdict == "agree", [(x.path, x.verdict, x.message) for x in res.leaves]
    assert asked == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_wrong_gradient_on_one_backend_is_blamed_on_it_with_nothing_more_asked(monkeypatch, asked, backend):
    _available(backend)
    wrong_sin_gradient(monkeypatch, backend, 1 + 1e-6)
    res = _run(0)
    leaf = next(x for x in res.leaves if x.path == "weight")
    assert leaf.verdict == "disagree" and leaf.blame == [backend], (leaf.verdict, leaf.blame, leaf.message)
    assert asked == []


def test_one_rule_wrong_on_every_backend_alike_is_found_after_asking_for_the_slope(monkeypatch, asked):
    for backend in BACKENDS:
        _available(backend)
        wrong_sin_gradient(monkeypatch, backend, 1 + 1e-4)
    res = _run(0)
    leaf = next(x for x in res.leaves if x.path == "weight")
    assert leaf.verdict == "disagree" and "differs from all of them" in leaf.message, (leaf.verdict, leaf.message)
    assert all(c.stable and not c.agrees for c in leaf.referee), leaf.referee
    # the runner asked a backend that does not compile, at the leaf moved both ways, and got its gradient there
    weight_calls = [c for c in asked if c[1] == ["weight"]]
    assert len(weight_calls) == 2 and {c[0] for c in weight_calls} <= {"tape", "torch"}
    assert all(np.shape(c[2]["weight"]) == (64,) for c in weight_calls)

"""The referee's kink shrink: a step that crosses a kink is shrunk, up to three times, before it abstains.

docs/decisions.md: "A step that would move any kink decision (checked by recording the branches of its own
forwards) is shrunk 16x, up to three times (halved instead when only the doubled step crossed: the difference at
h, which crossed nothing, is then the doubled one of h/2); if it still crosses ... it abstains."  Checked on a
loss whose one kink sits at a chosen distance from the point (the steps the referee takes are recorded), and end
to end on a model whose relu input sits a few 1e-10 from zero, where only a shrunk step can blame a wrong
backward.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcheck.layers as L
from gradcheck import ops
from gradcheck.backends.tape import ops as tape_ops
from gradcheck.case import Case
from gradcheck.check import kinks
from gradcheck.check import referee as ref
from gradcheck.check.runner import RunOptions, run_case

H = ref.STEP  # the first step at a point of order one
SLOPE = 3.0


class Kinked:
    """``L(w) = SLOPE w + 100 relu(w - w0 - distance)``: one kink at ``distance`` from the point ``w0``, and the
    kink decision reported as the referee's loss functions report them (how many differ from the point's)."""

    def __init__(self, distance, w0=1.0):
        self.w0, self.distance, self.steps = w0, distance, []

    def __call__(self, replaced):
        w = float(replaced["w"][0])
        self.steps.append(abs(w - self.w0))
        beyond = w - self.w0 - self.distance
        return SLOPE * w + 100.0 * max(beyond, 0.0), int(beyond > 0)

    def check(self):
        # 10% off: a step shrunk 4096x has a rounding floor of about 1% of this slope.
        grads = {"right": {"w": np.array([SLOPE])}, "wrong": {"w": np.array([SLOPE * 1.1])}}
        return ref.check(self, {"w": np.array([self.w0])}, {"w": np.array([1.0])}, grads, rtol=1e-7,
                         loss_abs=SLOPE)

    def step_sizes(self):
        """The distinct steps taken, largest first, as multiples of the first."""
        return sorted({float(f"{s / H:.6g}") for s in self.steps}, reverse=True)


def by_backend(checks):
    return {c.backend: (c.agrees, c.stable) for c in checks}


# A step that crosses is shrunk without its other end (``referee._central``'s ``stop``: the kink sits on the plus
# side here): one pass for it, where both ends would be two.
@pytest.mark.parametrize("distance, steps, passes", [
    # h is clear (two passes) and 2h crosses (one), then two at h/2, whose doubled step is h, already taken
    (1.5 * H, [2, 1, 1 / 2], 5),
    # h itself crosses: one pass, its doubled step not taken, then four
    (0.5 * H, [1, 2 / 16, 1 / 16], 5),
    # h, h/16 and h/256 cross (one pass each): the third shrink, the last one allowed, is clear
    (0.5 * H / 16**2, [1, 1 / 16, 1 / 16**2, 2 / 16**3, 1 / 16**3], 7),
])
def test_a_step_across_a_kink_is_shrunk_16x_until_it_crosses_none(distance, steps, passes):
    loss = Kinked(distance)
    checks, n = loss.check()
    assert by_backend(checks) == {"right": (True, True), "wrong": (False, True)}
    assert checks[0].numeric == pytest.approx(SLOPE, rel=1e-3)  # the smooth side's derivative, not the kink's
    # (the steps are measured as moves of w = 1 + h v: rounded to w's ulp, 1e-5 of the smallest)
    assert loss.step_sizes() == pytest.approx(steps, rel=1e-4) and n == passes


def test_a_kink_closer_than_three_shrinks_reach_makes_the_referee_abstain():
    loss = Kinked(0.5 * H / 16**3)  # even h/4096 crosses it
    checks, n = loss.check()
    assert {c.backend for c in checks} == {"right", "wrong"}
    assert not any(c.stable for c in checks)  # no verdict from it: blame never rests on an unstable check
    # three crossing steps stopped at their first end, and the last retry's both ends: its difference is recorded
    assert loss.step_sizes() == pytest.approx([1.0, 16.0**-1, 16.0**-2, 16.0**-3], rel=1e-4) and n == 5


def test_a_smooth_point_takes_two_steps_and_no_shrink():  # the control for the three above
    loss = Kinked(1e3)
    checks, n = loss.check()
    assert by_backend(checks) == {"right": (True, True), "wrong": (False, True)}
    assert loss.step_sizes() == pytest.approx([2.0, 1.0]) and n == 4


# ---------------------------------------------------------------- end to end: blame needs the shrunk step
NEAR = 3e-10  # the relu input's distance from its kink: within the first step's reach, not a shrunk one's


def near_kink(rng):
    dense = L.Dense(3, 4, activation=ops.relu, rng=rng)
    x = INPUT
    z = x @ dense.weight.T + dense.bias
    # Every pre-activation away from 0 but one, a few 1e-10 above it: a step of 1e-8 moves it across.
    dense.bias = dense.bias - z[0] + np.where(np.arange(4) == 0, NEAR, np.sign(z[0]) * np.maximum(np.abs(z[0]), 0.5))
    return L.Chain(dense, L.Dense(4, 2, rng=rng))


INPUT = np.array([[0.7, -1.3, 0.4]])
CASE = Case("near_kink", near_kink, lambda rng: (INPUT.copy(),), dtype="float64")


def test_the_case_puts_a_relu_input_within_one_step_of_its_kink():
    from gradcheck.case import materialise

    model, (x,) = materialise(CASE)
    z = np.asarray(ops.linear(x, model.layers[0].weight, model.layers[0].bias))
    assert z[0, 0] == pytest.approx(NEAR, rel=1e-3) and np.min(np.abs(z[0, 1:])) >= 0.5


def wrong_bias_gradient(monkeypatch):
    """The tape's gradient of add's second argument (every Dense bias) 1% too large."""
    right = tape_ops.add.vjps[1]
    monkeypatch.setitem(tape_ops.add.vjps, 1, lambda g, ans, a, b: ops.mul(right(g, ans, a, b), 1.01))


def crossings(monkeypatch):
    """Record, for every loss the referee evaluates, how many kink decisions it moved."""
    from gradcheck.check import runner

    seen = []
    real = runner.CaseRun.loss64

    def loss64(self, replaced):
        try:
            value, crossed = real(self, replaced)
        except kinks.Crossed:  # a referee pass that stopped at its first crossing (referee._central's stop)
            seen.append(1)
            raise
        seen.append(crossed)
        return value, crossed

    monkeypatch.setattr(runner.CaseRun, "loss64", loss64)
    return seen


def test_the_shrunk_step_lets_the_referee_blame_one_backend_alone(monkeypatch):
    # The tape alone: nothing to compare with, so only the referee can find its wrong bias gradient, and on
    # the first layer's bias it can only by stepping across less than the relu input's distance from 0.
    seen = crossings(monkeypatch)
    clean = run_case(CASE, RunOptions(backends=("tape",), referee="leaves"))
    assert clean.verdict == "agree", [(x.path, x.message) for x in clean.leaves]
    assert any(seen) and not all(seen)  # some steps crossed the kink, the shrunk ones did not
    b = next(x for x in clean.leaves if x.path == "0.bias")
    assert [(c.backend, c.agrees, c.stable) for c in b.referee] == [("tape", True, True)]
    wrong_bias_gradient(monkeypatch)
    res = run_case(CASE, RunOptions(backends=("tape",), referee="leaves"))
    b = next(x for x in res.leaves if x.path == "0.bias")
    assert b.verdict == "disagree", b.message
    assert [(c.backend, c.agrees, c.stable) for c in b.referee] == [("tape", False, True)]

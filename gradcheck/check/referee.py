"""The float64 finite-difference referee, with a tolerance derived from its own error.

For a leaf θ and a random direction v (one standard normal per element, from
the case seed), central differences of the float64 loss give the directional
derivative ``D(h) = (L(θ + h v) - L(θ - h v)) / 2h``, whatever the size of θ.
Each backend's float64 gradient g answers with ``<g, v>``; a backend whose
answer misses the finite difference by more than the referee's resolution is
wrong about that leaf.  The forward runs on plain numpy (gradcheck's own ops
with no tape), so the referee depends on no framework.

**Resolution.**  The referee takes the difference at two steps, h and 2h.
Its truncation error is ``c h^2`` at h and ``4 c h^2`` at 2h, and its
rounding error about ``eps |L| / h``; ``|D(h) - D(2h)|`` therefore measures
both at this point (it is ``3 c h^2`` plus the rounding of two differences),
and a floor of ``ROUNDING * eps * sum|r o| / h`` (the loss's own terms)
covers the case where the two happen to agree by luck.  The resolution is
``SAFETY`` times the larger of the two, plus ``rtol`` of the answer's scale
(``|D(h)|`` plus a tenth of the backends' median ``||g||``); every check
records it.

**Kinks.**  A step that moves a relu input or a max-pool window across its
kink measures a derivative that is no one's.  The loss function may report,
with each value, how many kink decisions differ from the float64 reference
forward's (``gradcheck.check.kinks``); a step that crosses one is shrunk
until it crosses none (up to ``RETRIES`` times), and if it cannot, the
referee abstains (``stable=False``).  Where only the doubled step 2h
crossed, the step is halved: the difference at h, which crossed nothing, is
the doubled one of h/2.  Where h itself crossed, it is divided by
``SHRINK``.  The referee also abstains when the two steps differ by more
than ``UNSTABLE`` of the answer's scale (BatchNorm over a handful of
values): it never blames anyone on a derivative it could not take.

**A slope that changes within the step.**  A central difference is exactly
the mean of the directional derivative over its segment,
``(1/2h) ∫ <g(θ + t v), v> dt`` for t in [-h, h]; it measures the derivative
at θ only where that derivative holds still over the segment.  At an
ill-conditioned point it does not: EfficientNet-B0 at 32x32 with a batch of
two normalises two values per channel in its last BatchNorms, and there the
directional derivative changes sign within a step of 1e-8, while at 1e-12 it
holds to four digits.  Two smooth estimates at h and 2h can still agree with
each other there, and with no backend.  So when the finite difference misses
*every* backend (the one verdict it would hand down alone), the referee asks
one backend for its float64 gradient at the segment's two ends
(``gradients_at``): if the mean of the directional derivatives there differs
from the one at θ by more than the resolution's floors (a slope that changes
linearly averages out; one that bends does not), the step is shrunk as for a
kink, and the referee abstains if it never holds still.  The slope is measured
on at most ``SLOPE_LEAVES`` leaves of a case; a later leaf that misses every
backend takes what they showed (abstains where any slope moved), and the
runner says so in a note.  A shared wrong rule holds still
like a right one, so it is still found; where some backend agrees with the
finite difference nothing extra is run.

**Confirming.**  Where the backends already agree with each other (their
float64 pairs compared the leaf), the referee confirms them, and it takes
the doubled step only when it has to.  The resolution only grows with
``|D(h) - D(2h)|``, so a difference at h that crosses no kink and agrees
with every backend within the floors alone (the rounding floor, the loss
noise if measured, ``rtol``) agrees with each of them whatever D(2h) would
have been: the verdict is the one four passes give, in two, and the check
records the tighter resolution it held the backends to.  Where any backend
misses the floors, the doubled step is taken and everything above applies.

Cost: four float64 forward passes per leaf checked, two where the referee
confirms (ResNet-18: 63 leaves, 252 passes at most, against 11.7 M passes for
a full finite-difference Jacobian); a shrink adds two more (where h itself
crossed a kink, its doubled step is not taken; where only 2h did, the step
is halved and the difference at h kept).  A step that crosses a kink is only
ever shrunk, so its passes stop at the first kink decision that differs from
the reference's, and once one end crossed the other is not taken
(``kinks.stopping_at_crossing``); only the last retry's run whole, as its
difference is the one recorded.  A *joint* check perturbs every trainable
leaf at once along one direction: four passes (or two) for the whole model,
used when checking each leaf would be too slow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from gradcheck.check import kinks, sums
from gradcheck.results import RefereeCheck

# float64 step along a standard-normal direction.  A larger step crosses relu and max-pool kinks: on
# ResNet-18 at 224x224, h = 1e-6 moved enough pre-activations across 0 to put early leaves' differences
# 1-10% off, while at 1e-8 rounding (eps * |L| / h, about 1e-8 of the loss's terms) still leaves
# resolution to spare.
STEP = 1e-8
PASSES = 4  # float64 forward passes per check: +-h and +-2h
EPS = float(np.finfo(np.float64).eps)
ROUNDING = 16.0  # the rounding floor's multiple of eps * sum|r o| / h (a forward of depth ~50 loses a few bits)
SAFETY = 4.0
UNSTABLE = 1e-2
SHRINK = 16.0
RETRIES = 3

# One backend's float64 gradients with some leaves moved: (backend, {path: gradient}).
GradientsAt = Callable[[dict], tuple[str, dict[str, Any]]]
# Leaves of one case whose slope is measured (each up to 2 (RETRIES + 1) gradient evaluations of one backend); past
# them, what they showed stands for the rest: an ill-conditioned point would otherwise cost that per leaf.
SLOPE_LEAVES = 4


class SlopeCheck:
    """One case's slope checks (see "A slope that changes within the step"): ``gradients_at`` asked for at most
    ``leaves`` leaves; for a later leaf that misses every backend, the slope counts as moving when it moved on any
    leaf measured (the referee abstains there) and as still otherwise (the difference stands)."""

    def __init__(self, gradients_at: GradientsAt, leaves: int = SLOPE_LEAVES):
        self.gradients_at, self.leaves = gradients_at, leaves
        self.measured = 0  # leaves whose slope was measured
        self.unsteady = 0  # ... and found moving within the referee's first step
        self.assumed = 0  # leaves past the budget, decided by what the measured ones showed

    def varies(self, point, direction, h, answers, floor, first: bool) -> bool | None:
        if first:
            if self.measured >= self.leaves:
                self.assumed += 1
                return None  # past the budget: the caller decides from self.unsteady
            self.measured += 1
        moved = _slope_varies(self.gradients_at, point, direction, h, answers, floor)
        if first and moved:
            self.unsteady += 1
        return moved




def directions(leaves: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """One float64 standard-normal direction per leaf, from the case seed (order-independent)."""
    out = {}
    for path, value in leaves.items():
        digest = np.frombuffer(path.encode(), dtype=np.uint8).astype(np.uint64).sum()
        rng = np.random.default_rng([seed, int(digest), len(path)])
        out[path] = rng.standard_normal(np.shape(value))
    return out


def step_for(value: np.ndarray, eps: float = EPS) -> float:
    """The first step for a leaf of this size.  ``eps``: the machine epsilon of the narrowest float the loss
    computes in (a model that casts part of its float64 run to float32 itself): the step grows with its square
    root, so that the difference's rounding stays as far below the step as float64's is below 1e-8."""
    scale = float(np.max(np.abs(value))) if np.size(value) else 1.0
    return STEP * float(np.sqrt(eps / EPS)) * max(1.0, scale)


def _value(out) -> tuple[float, int]:
    """A loss function's answer: the loss, or ``(loss, kink decisions that differ from the reference's)``."""
    if isinstance(out, tuple):
        return float(out[0]), int(out[1])
    return float(out), 0


def numeric_directional(loss64: Callable[[dict], float], point: dict[str, np.ndarray],
                        direction: dict[str, np.ndarray], scale: float = 1.0) -> float:
    """Central difference of ``loss64`` at ``point`` along ``direction`` (which may cover several leaves)."""
    return _central(loss64, point, direction, scale * min(step_for(point[p]) for p in direction))[0]


def _central(loss64, point, direction, h, stop: bool = False) -> tuple[float, int, int]:
    """The central difference at step ``h``, how many kink decisions its two points crossed, and the passes taken.

    ``stop``: the caller shrinks a step that crosses a kink and does not use
    its difference, so a pass stops at its first crossing
    (``kinks.stopping_at_crossing``; it then counts one), the other end is not
    taken once one end crossed, and the difference is nan.
    """
    ends, total = [], 0
    for sign in (1.0, -1.0):
        with kinks.stopping_at_crossing() if stop else contextlib.nullcontext():
            try:
                value, crossed = _value(loss64({p: point[p] + sign * h * v for p, v in direction.items()}))
            except kinks.Crossed:
                value, crossed = float("nan"), 1
        ends.append(value)
        total += crossed
        if stop and crossed:
            break
    if len(ends) < 2:
        return float("nan"), total, 1
    return (ends[0] - ends[1]) / (2 * h), total, 2


def check(loss64: Callable[[dict], float], point: dict[str, np.ndarray], direction: dict[str, np.ndarray],
          grads: dict[str, dict[str, np.ndarray]], rtol: float, loss_abs: float = 0.0,
          loss_noise: float | Callable[[], float] = 0.0,
          slope: SlopeCheck | None = None, confirming: bool = False,
          eps: float = EPS) -> tuple[list[RefereeCheck], int]:
    """Referee checks along ``direction``, and the float64 forward passes they cost.

    ``loss_abs`` is ``sum |r o|`` of the loss at the point (the size of what
    rounding works on); ``loss_noise`` how far the loss moved when every input
    moved by a unit roundoff (``gradcheck.check.conditioning``: the rounding this
    point amplifies, which a finite difference's numerator carries), or a
    function that measures it, asked only when a backend misses the resolution
    without it (``_NoiseFloor``); ``rtol`` a relative floor on the resolution;
    ``slope`` the case's slope checks, asked only when the finite difference
    misses every backend (see "A slope that changes within the step");
    ``confirming``: the backends already agree with each other on the
    direction's leaves, and a difference that agrees with each of them within
    its floors alone stands without the doubled step (see "Confirming"); ``eps``: the machine epsilon of the
    narrowest float the loss computes in (``step_for``), which its rounding floor is taken at.
    """
    answers, norm = _answers(grads, direction)
    noise = _NoiseFloor(loss_noise, eps)
    h = min(step_for(point[p], eps) for p in direction)
    passes = 0
    varies, first = False, True
    clear = None  # (step, difference) taken already at this round's doubled step, and crossing nothing
    for attempt in range(RETRIES + 1):
        # A step that crosses a kink is shrunk, unless it is the last: there its difference is what the check
        # records, so only there are crossing passes run to the end.
        stop = attempt < RETRIES
        d1, crossed1, taken = _central(loss64, point, direction, h, stop)
        passes += taken
        d2, crossed2 = 0.0, 0
        if confirming and not crossed1 and answers:
            floors = _resolution(d1, d1, h, norm, rtol, loss_abs, noise.value, eps)
            if all(abs(a - d1) <= floors for a in answers.values()):
                d2, resolution, varies = d1, floors, False
                break
        if not crossed1:  # a step that already crossed a kink is shrunk without taking the doubled one
            if clear is not None and clear[0] == 2 * h:
                d2 = clear[1]
            else:
                d2, crossed2, taken = _central(loss64, point, direction, 2 * h, stop)
                passes += taken
        # A crossing step (shrunk below) resolves nothing, so it asks for no loss-noise probe.
        if not (stop and (crossed1 or crossed2)):
            resolution = noise.resolution(d1, d2, h, norm, rtol, loss_abs, answers)
        if not (crossed1 or crossed2):
            misses_all = bool(answers) and all(not abs(a - d1) <= resolution for a in answers.values())
            if slope is None or not misses_all:
                varies = False
                break
            floor = _resolution(d1, d1, h, norm, rtol, loss_abs, noise.value, eps)
            varies = slope.varies(point, direction, h, answers, floor, first)
            if varies is None:  # past the case's budget: what the measured leaves showed stands for this one
                varies = slope.unsteady > 0
                break
            if not varies:
                break
            first = False
        if crossed2 and not crossed1:
            # Only the doubled step crossed: the step is halved, and the difference at h, which crossed nothing,
            # is the doubled one of h/2 (two passes, and a rounding floor twice the first's, where a SHRINK would
            # take four and multiply it by SHRINK).
            clear, h = (h, d1), h / 2
        else:
            clear, h = None, h / SHRINK
    if not answers:
        return [], passes
    scale = abs(d1) + 0.1 * norm
    stable = abs(d1 - d2) <= UNSTABLE * scale and not (crossed1 or crossed2 or varies)
    checks = []
    for backend, value in answers.items():
        err = abs(value - d1) / resolution if np.isfinite(value) else float("inf")
        checks.append(RefereeCheck(backend=backend, directional=value, numeric=d1, error=float(err),
                                   agrees=bool(err <= 1.0), stable=stable, resolution=float(resolution)))
    return checks, passes


class _NoiseFloor:
    """The loss-noise floor of one check, measured only when it could change what the check says.

    The floor only widens the resolution, so a backend that agrees without it
    agrees with it: the probe (two float64 passes and a unit-roundoff move of
    every leaf, ``conditioning.loss_noise``) is asked for only when some
    backend misses the resolution without it, and the resolution is then taken
    again with it.  Every verdict is the one the floor measured up front would
    give; where it was not needed, the check records the tighter resolution it
    actually held the backends to.
    """

    def __init__(self, loss_noise: float | Callable[[], float], eps: float = EPS):
        self._measure = loss_noise if callable(loss_noise) else None
        self.value = 0.0 if callable(loss_noise) else float(loss_noise)
        self.eps = eps

    def resolution(self, d1, d2, h, norm, rtol, loss_abs, answers: dict) -> float:
        resolution = _resolution(d1, d2, h, norm, rtol, loss_abs, self.value, self.eps)
        if self._measure is not None and any(not abs(a - d1) <= resolution for a in answers.values()):
            self.value, self._measure = float(self._measure()), None
            resolution = _resolution(d1, d2, h, norm, rtol, loss_abs, self.value, self.eps)
        return resolution


def _resolution(d1, d2, h, norm, rtol, loss_abs, loss_noise, eps: float = EPS) -> float:
    """What the difference at step ``h`` resolves: its measured truncation and rounding, with the floors."""
    resolution = (SAFETY * max(abs(d1 - d2), ROUNDING * eps * loss_abs / h, loss_noise / h)
                  + rtol * (abs(d1) + 0.1 * norm))
    return resolution if resolution != 0 else EPS


def _slope_varies(gradients_at: GradientsAt, point, direction, h, answers, floor) -> bool:
    """Whether one backend's directional derivative moves within the segment ``point +- h v`` by more than the
    difference can resolve.  The even part, ``(s(+h) + s(-h)) / 2 - s(0)``, is what biases a central difference
    (a slope that changes linearly averages out over the segment); ``floor`` is the resolution without the two
    steps' spread, which an unsteady slope would inflate."""
    ends = []
    for sign in (1.0, -1.0):
        backend, moved = gradients_at({p: point[p] + sign * h * v for p, v in direction.items()})
        if backend not in answers or not all(moved.get(p) is not None for p in direction):
            return False  # nothing to measure the slope with: the difference stands as it is
        ends.append(sum(sums.inner(moved[p], v) for p, v in direction.items()))
    return not abs(0.5 * (ends[0] + ends[1]) - answers[backend]) <= floor


def _answers(grads: dict[str, dict[str, np.ndarray]], direction: dict[str, np.ndarray]) -> tuple[dict, float]:
    """Each backend's ``<g, v>`` over the direction's leaves, and the median ``||g||`` over backends."""
    answers, norms = {}, []
    for backend, by_path in grads.items():
        if not all(p in by_path and by_path[p] is not None for p in direction):
            continue
        answers[backend] = sum(sums.inner(by_path[p], v) for p, v in direction.items())
        norms.append(float(np.sqrt(sum(sums.inner(by_path[p], by_path[p]) for p in direction))))
    return answers, float(np.median(norms)) if norms else 0.0

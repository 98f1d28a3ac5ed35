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
(``SHRINK``, up to ``RETRIES`` times) until it crosses none, and if it
cannot, the referee abstains (``stable=False``).  It also abstains when the
two steps differ by more than ``UNSTABLE`` of the answer's scale (BatchNorm
over a handful of values): it never blames anyone on a derivative it could
not take.

Cost: four float64 forward passes per leaf checked; a shrink adds two more
when the step h itself crossed a kink (its doubled step is not taken) and
four when only 2h did (ResNet-18: 63 leaves, 252 passes, against 11.7 M
passes for a full finite-difference Jacobian).  A *joint* check perturbs
every trainable leaf at once along one direction: four passes for the whole
model, used when checking each leaf would be too slow.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

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


def directions(leaves: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """One float64 standard-normal direction per leaf, from the case seed (order-independent)."""
    out = {}
    for path, value in leaves.items():
        digest = np.frombuffer(path.encode(), dtype=np.uint8).astype(np.uint64).sum()
        rng = np.random.default_rng([seed, int(digest), len(path)])
        out[path] = rng.standard_normal(np.shape(value))
    return out


def step_for(value: np.ndarray) -> float:
    scale = float(np.max(np.abs(value))) if np.size(value) else 1.0
    return STEP * max(1.0, scale)


def _value(out) -> tuple[float, int]:
    """A loss function's answer: the loss, or ``(loss, kink decisions that differ from the reference's)``."""
    if isinstance(out, tuple):
        return float(out[0]), int(out[1])
    return float(out), 0


def numeric_directional(loss64: Callable[[dict], float], point: dict[str, np.ndarray],
                        direction: dict[str, np.ndarray], scale: float = 1.0) -> float:
    """Central difference of ``loss64`` at ``point`` along ``direction`` (which may cover several leaves)."""
    return _central(loss64, point, direction, scale * min(step_for(point[p]) for p in direction))[0]


def _central(loss64, point, direction, h) -> tuple[float, int]:
    """The central difference at step ``h``, and how many kink decisions its two points crossed."""
    plus, crossed_plus = _value(loss64({p: point[p] + h * v for p, v in direction.items()}))
    minus, crossed_minus = _value(loss64({p: point[p] - h * v for p, v in direction.items()}))
    return (plus - minus) / (2 * h), crossed_plus + crossed_minus


def check(loss64: Callable[[dict], float], point: dict[str, np.ndarray], direction: dict[str, np.ndarray],
          grads: dict[str, dict[str, np.ndarray]], rtol: float, loss_abs: float = 0.0,
          loss_noise: float = 0.0) -> tuple[list[RefereeCheck], int]:
    """Referee checks along ``direction``, and the float64 forward passes they cost.

    ``loss_abs`` is ``sum |r o|`` of the loss at the point (the size of what
    rounding works on); ``loss_noise`` how far the loss moved when every input
    moved by a unit roundoff (``gradcheck.check.conditioning``: the rounding this
    point amplifies, which a finite difference's numerator carries); ``rtol``
    a relative floor on the resolution.
    """
    h = min(step_for(point[p]) for p in direction)
    passes = 0
    for _ in range(RETRIES + 1):
        d1, crossed1 = _central(loss64, point, direction, h)
        passes += 2
        d2, crossed2 = 0.0, 0
        if not crossed1:  # a step that already crossed a kink is shrunk without taking the doubled one
            d2, crossed2 = _central(loss64, point, direction, 2 * h)
            passes += 2
        if not (crossed1 or crossed2):
            break
        h /= SHRINK
    answers, norm = _answers(grads, direction)
    if not answers:
        return [], passes
    scale = abs(d1) + 0.1 * norm
    spread = abs(d1 - d2)
    resolution = SAFETY * max(spread, ROUNDING * EPS * loss_abs / h, loss_noise / h) + rtol * scale
    if resolution == 0:
        resolution = EPS
    stable = spread <= UNSTABLE * scale and not (crossed1 or crossed2)
    checks = []
    for backend, value in answers.items():
        err = abs(value - d1) / resolution if np.isfinite(value) else float("inf")
        checks.append(RefereeCheck(backend=backend, directional=value, numeric=d1, error=float(err),
                                   agrees=bool(err <= 1.0), stable=stable, resolution=float(resolution)))
    return checks, passes


def _answers(grads: dict[str, dict[str, np.ndarray]], direction: dict[str, np.ndarray]) -> tuple[dict, float]:
    """Each backend's ``<g, v>`` over the direction's leaves, and the median ``||g||`` over backends."""
    answers, norms = {}, []
    for backend, by_path in grads.items():
        if not all(p in by_path and by_path[p] is not None for p in direction):
            continue
        answers[backend] = float(sum(np.vdot(np.asarray(by_path[p], np.float64), v) for p, v in direction.items()))
        norms.append(float(np.sqrt(sum(np.vdot(g, g) for g in (np.asarray(by_path[p], np.float64) for p in direction)))))
    return answers, float(np.median(norms)) if norms else 0.0

"""The float64 finite-difference referee.

For a leaf θ and a random direction v (one standard normal per element, from
the case seed), central differences of the float64 loss give the directional
derivative ``(L(θ + h v) - L(θ - h v)) / 2h`` in two forward passes, whatever
the size of θ.  Each backend's gradient g answers with ``<g, v>``; a backend
whose answer misses the finite difference is wrong about that leaf.  The
forward runs on plain numpy (gradcheck's own ops with no tape), so the referee
depends on no framework.

Cost: two float64 forward passes per leaf checked (ResNet-18: 63 leaves, 126
passes — against 11.7 M passes for a full finite-difference Jacobian).  A
*joint* check perturbs every trainable leaf at once along one direction: two
passes for the whole model, used when checking each leaf would be too slow.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gradcheck.results import RefereeCheck

# float64 step along a standard-normal direction.  Rounding costs about
# eps * sum|terms| / h, negligible in float64 even at 1e-8; a larger step
# crosses relu and max-pool kinks: on ResNet-18 at 224x224, h = 1e-6 moved
# enough pre-activations across 0 to put early leaves' differences 1-10% off
# (and unstable under doubling), while h = 1e-8 agrees on all 63 leaves.
STEP = 1e-8


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


def numeric_directional(loss64: Callable[[dict], float], point: dict[str, np.ndarray],
                        direction: dict[str, np.ndarray], scale: float = 1.0) -> float:
    """Central difference of ``loss64`` at ``point`` along ``direction`` (which may cover several leaves)."""
    h = scale * min(step_for(point[p]) for p in direction)
    plus = {p: point[p] + h * v for p, v in direction.items()}
    minus = {p: point[p] - h * v for p, v in direction.items()}
    return (float(loss64(plus)) - float(loss64(minus))) / (2 * h)


def check(loss64: Callable[[dict], float], point: dict[str, np.ndarray], direction: dict[str, np.ndarray],
          grads: dict[str, dict[str, np.ndarray]], rtol: float,
          noise: dict[str, float] | None = None) -> tuple[list[RefereeCheck], int]:
    """Referee checks along ``direction``, and the float64 forward passes they cost.

    When a backend misses the finite difference, the difference is taken again
    with twice the step.  If the two differ by more than half the tolerance,
    the loss is not smooth enough here for finite differences to judge (a
    kink crossed, BatchNorm over a handful of values): the referee abstains
    (``stable=False``) instead of blaming a backend.
    """
    numeric = numeric_directional(loss64, point, direction)
    checks, allowed = judge(numeric, grads, direction, rtol, noise)
    passes = 2
    if any(not c.agrees for c in checks):
        again = numeric_directional(loss64, point, direction, scale=2.0)
        passes += 2
        if abs(again - numeric) > 0.5 * allowed:
            for c in checks:
                c.stable = False
    return checks, passes


NOISE_SIGMAS = 4.0  # how many standard deviations of float32 noise a correct backend may be off


def judge(numeric: float, grads: dict[str, dict[str, np.ndarray]], direction: dict[str, np.ndarray],
          rtol: float, noise: dict[str, float] | None = None) -> tuple[list[RefereeCheck], float]:
    """Hold each backend's ``<g, v>`` against the finite difference; also return the allowed error.

    The allowed error is ``rtol * (|numeric| + 0.1 ||g||)`` — the second term
    keeps a direction nearly orthogonal to g (where ``<g, v>`` is tiny and all
    rounding is relative to ||g||) from failing a correct backend — plus, for
    float32, ``4 * sqrt(sum_leaf (noise_leaf * ||g_leaf||)^2)``: with v
    standard normal, a gradient error dg moves ``<g, v>`` by about ``||dg||``,
    and the noise probe measured ``||dg|| / ||g||`` per leaf.
    """
    noise = noise or {}
    norms, noise_sq, answers = [], [], {}
    for backend, by_path in grads.items():
        if not all(p in by_path and by_path[p] is not None for p in direction):
            continue
        answers[backend] = float(sum(np.vdot(np.asarray(by_path[p], np.float64), v) for p, v in direction.items()))
        leaf_norms = {p: float(np.linalg.norm(np.asarray(by_path[p], np.float64))) for p in direction}
        norms.append(float(np.sqrt(sum(n * n for n in leaf_norms.values()))))
        noise_sq.append(sum((noise.get(p, 0.0) * n) ** 2 for p, n in leaf_norms.items()))
    if not answers:
        return [], 0.0
    scale = abs(numeric) + 0.1 * float(np.median(norms))
    allowed = (rtol * scale if scale > 0 else rtol) + NOISE_SIGMAS * float(np.sqrt(np.median(noise_sq)))
    checks = []
    for backend, value in answers.items():
        err = abs(value - numeric) / allowed if np.isfinite(value) else float("inf")
        checks.append(RefereeCheck(backend=backend, directional=value, numeric=numeric, error=float(err),
                                   agrees=bool(err <= 1.0)))
    return checks, allowed

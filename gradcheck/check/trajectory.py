"""Training-step trajectories: N optimiser steps per backend from the same start (``--steps N``).

The bug of the original discussion was not in a gradient table but after one
optimiser step: two ADs gave the same loss before it (1.2527) and wildly
different ones after it (-4792.6 against -19.78).  So each backend trains its
own copy of the model: from the case's parameters, on the same batches (the
case's inputs first, then a new batch per step drawn from the case seed),
with its own float64 gradients of the case's loss ``<r, f(x)>``; BatchNorm's
running statistics evolve along, each backend's from its own forward (dropout
keeps the case's masks, which are fixed when a layer is built).  The loss is
unbounded below, so a large learning rate sends it to minus infinity: a
trajectory that turns non-finite alike on every backend has diverged, which is
said, not blamed.

The optimisers are written once, here, in a few lines of float64 numpy, and
every backend's gradients go through the same code: the optimiser is not what
is tested.  After every step the backends' parameters and buffers are
compared leaf by leaf in float64 (``compare.compare_leaf``, the float64
tolerances of first order), and the loss after each step too; the first step
after which any of them disagree is where the trajectories *part*
(``Trajectory.parted``), blamed by majority (``verdict.decide``: there is no
referee for a trajectory; the first-order check is its referee at the start).
The parameters and buffers after the last step are ``Trajectory.leaves``.

``losses[b][k]`` is backend ``b``'s loss at its parameters after ``k`` steps,
on batch ``k + 1`` (the one step ``k + 1`` trains on; one more batch is drawn
for the loss after the last step), so ``losses[b][0]`` is the loss of the
first-order check itself.
"""

from __future__ import annotations

import time

import numpy as np

from gradcheck.backends import get_backend, reference_rank
from gradcheck.backends.base import all_leaves
from gradcheck.case import cast_floats
from gradcheck.check import verdict
from gradcheck.check.compare import compare_leaf, pair_stats
from gradcheck.check.errors import short_error
from gradcheck.reports.text import trajectory_message
from gradcheck.results import LeafResult, Trajectory, worst_verdict
from gradcheck.tree import leaf_owner_types, replace_leaves

OPTIMIZERS = ("sgd", "adam")
DEFAULT_LR = {"sgd": 1e-2, "adam": 1e-3}


def check_options(steps: int, optimizer: str, lr: float | None) -> None:
    """``RunOptions``' trajectory fields, or a ValueError naming the one that is wrong."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps={steps!r}; expected a non-negative integer (0: no trajectory)")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r}; expected one of {', '.join(OPTIMIZERS)}")
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not np.isfinite(lr)
                           or lr <= 0):
        raise ValueError(f"lr={lr!r}; expected a finite number > 0 (or None: {DEFAULT_LR})")


# ---------------------------------------------------------------- the optimisers, once, in float64
class SGD:
    """``x <- x - lr g``."""

    def __init__(self, lr: float):
        self.lr = lr

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {p: x - self.lr * np.asarray(grads[p], np.float64) for p, x in params.items()}


class Adam:
    """Adam (Kingma & Ba, as ``torch.optim.Adam`` without weight decay): bias-corrected moments."""

    def __init__(self, lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.lr, (self.b1, self.b2), self.eps = lr, betas, eps
        self.t, self.m, self.v = 0, {}, {}

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.t += 1
        out = {}
        for p, x in params.items():
            g = np.asarray(grads[p], np.float64)
            m = self.m[p] = self.b1 * self.m.get(p, 0.0) + (1 - self.b1) * g
            v = self.v[p] = self.b2 * self.v.get(p, 0.0) + (1 - self.b2) * g * g
            m_hat, v_hat = m / (1 - self.b1 ** self.t), v / (1 - self.b2 ** self.t)
            out[p] = x - self.lr * m_hat / (np.sqrt(v_hat) + self.eps)
        return out


def optimizer(name: str, lr: float | None = None):
    return {"sgd": SGD, "adam": Adam}[name](lr if lr is not None else DEFAULT_LR[name])


# ---------------------------------------------------------------- the trajectories
def batch(cr, k: int) -> tuple:
    """The inputs step ``k`` (1-based) trains on: the case's own for step 1, then one draw per step."""
    if k == 1:
        return tuple(cr.args64[1:])
    # Streams 0..2 of the case seed are the parameters, the inputs and the loss cotangent.
    rng = np.random.default_rng(np.random.SeedSequence(cr.case.seed).spawn(k + 2)[k + 1])
    inputs = cr.case.inputs(rng)
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    return tuple(cast_floats(cast_floats(inputs, cr.case.dtype), np.float64))


def check(cr, runs: dict, options, res) -> None:
    """The check's entry point (``gradcheck.check.checks``): train every backend that ran for
    ``options.steps`` steps; ``res.trajectory``, folded into the verdict."""
    res.trajectory = run(cr, [b for b in options.backends if b in runs], options)  # in the order asked
    res.verdict = worst_verdict([res.verdict, res.trajectory.verdict])


def run(cr, names: list[str], options) -> Trajectory:
    """The trajectories of ``names`` (see the module doc); their verdict, and the message
    ``reports.text.trajectory_message`` writes from the numbers."""
    opt_name, steps = options.optimizer, options.steps
    lr = options.lr if options.lr is not None else DEFAULT_LR[opt_name]
    traj = Trajectory(steps=steps, optimizer=opt_name, lr=lr)
    model = cr.args64[0]
    leaves = all_leaves([model], [""])
    trainable = [leaf.path for leaf in leaves if leaf.trainable]
    buffers = [leaf.path for leaf in leaves if leaf.kind == "buffer" and np.asarray(leaf.value).dtype.kind == "f"]
    owners = leaf_owner_types(model, "")
    f = cr.f64
    state = {b: {"model": model, "opt": optimizer(opt_name, lr)} for b in names}
    alive = list(names)
    traj.losses = {b: [] for b in names}
    traj.seconds = {b: 0.0 for b in names}
    judged: dict[int, list[LeafResult]] = {}  # step k -> the state after it and the loss after it, compared
    for j in range(steps + 1):  # evaluate after j steps; then step j + 1
        inputs = batch(cr, j + 1)
        for b in list(alive):
            st = state[b]
            t0 = time.perf_counter()
            try:
                ev = get_backend(b).evaluate(f, (st["model"],) + inputs, cr.prefixes)
                loss = float(np.asarray(ev.value[0] if isinstance(ev.value, tuple) else ev.value))
            except Exception as exc:
                traj.errors[b] = f"step {j + 1}: " + short_error(exc)
                alive.remove(b)
                continue
            traj.losses[b].append(loss)
            if j < steps:
                params = {p: np.asarray(v, np.float64) for p, v in _values(st["model"], trainable).items()}
                new = st["opt"].step(params, {p: ev.grads[p] for p in trainable})
                new.update({p: ev.buffers[p] for p in buffers if p in ev.buffers})
                st["model"] = replace_leaves(st["model"], new, "")
            traj.seconds[b] += time.perf_counter() - t0
        if len(alive) < 2:
            continue
        # Step k's judgement: the state after step k (known here at j = k - 1) and the loss after k steps (j = k).
        if j > 0:
            judged.setdefault(j, []).append(
                _judge("loss", "output", {b: np.asarray(traj.losses[b][j]) for b in alive}, options, ""))
        if j < steps:
            values = {b: _values(state[b]["model"], trainable + buffers) for b in alive}
            judged.setdefault(j + 1, []).extend(
                _judge(p, "param" if p in trainable else "buffer", {b: values[b][p] for b in alive}, options,
                       owners.get(p, ""), full=j == steps - 1) for p in trainable + buffers)
    diverged = None
    parting: list[LeafResult] = []  # what disagrees at the step where the trajectories part
    for k in range(1, steps + 1):
        step = judged.get(k, [])
        traj.headroom.append(max((leaf.headroom for leaf in step), default=0.0))
        # Non-finite at the same elements on every backend: the training diverged alike everywhere (the loss
        # <r, f(x)> is unbounded below), which is no parting; what is still finite is compared.
        alike = [leaf for leaf in step if leaf.verdict == "nonfinite" and not leaf.blame]
        diverged = diverged or (k if alike else None)
        off = [leaf for leaf in step if leaf.verdict != "agree" and leaf not in alike]
        if off and traj.parted is None:
            traj.parted = k
            traj.blame = sorted({b for leaf in off for b in leaf.blame}, key=reference_rank)
            parting = off
    traj.leaves = [leaf for leaf in judged.get(steps, []) if leaf.role != "output"]
    traj.verdict = worst_verdict([*(["error"] if traj.errors else []), *(["disagree"] if traj.parted else [])])
    traj.message = trajectory_message(traj, parting, diverged)
    return traj


def _values(model, paths: list[str]) -> dict[str, np.ndarray]:
    by_path = {leaf.path: leaf.value for leaf in all_leaves([model], [""])}
    return {p: by_path[p] for p in paths}


def _judge(path: str, role: str, arrays: dict, options, layer: str, full: bool = True) -> LeafResult:
    """One leaf compared across backends in float64, decided by majority.

    Compared as a value (no vacuous check: a parameter is not a gradient).  Between the first and the
    last step (``full=False``) only the pairs are computed while they agree: the worst elements and
    their histogram, which no report shows for those steps, were 40% of a ResNet-18 trajectory.
    """
    if not full:
        pairs = _pairs(path, arrays, options, layer)
        if pairs is not None and all(p.verdict == "agree" for p in pairs):
            return LeafResult(path=path, role=role, layer=layer, dtype="float64", pairs=pairs)
    leaf = compare_leaf(path, "output", arrays, dtype="float64", rules=options.rules, layer=layer)
    leaf.role = role
    verdict.decide(leaf, sorted(arrays, key=reference_rank), None)
    leaf.message = leaf.message.replace("the referee did not check this leaf", "a trajectory has no referee")
    return leaf


def _pairs(path, arrays, options, layer):
    """Every pair's numbers as ``compare_leaf`` computes them, or None where it must look closer."""
    names = sorted(arrays, key=reference_rank)
    given = {n: np.asarray(arrays[n]) for n in names}
    if len({v.shape for v in given.values()}) > 1 or not all(np.isfinite(v).all() for v in given.values()):
        return None
    maxes = sorted(float(np.max(np.abs(v))) if v.size else 0.0 for v in given.values())
    scale = float(np.median(maxes))
    out = []
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            backend, reference = (y, x) if reference_rank(x) <= reference_rank(y) else (x, y)
            tol = options.rules.resolve(path, "float64", layer, (backend, reference))
            out.append(pair_stats(given[backend], given[reference], tol, scale, backend, reference))
    return out

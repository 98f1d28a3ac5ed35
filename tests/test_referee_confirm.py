"""The referee confirms backends that already agree in two passes, and its verdicts are the four passes' verdicts.

``referee.check(..., confirming=True)``: the resolution only grows with the two steps' spread ``|D(h) - D(2h)|``,
so a difference at h that crosses no kink and agrees with every backend within the floors alone agrees with each
of them whatever the doubled step would say, and the doubled step is not taken.  Checked here: on losses with and
without curvature, and answers from exact to far off, the verdict ``verdict.decide`` reaches from a confirming
check is the one from the full check, and a confirming check never costs more; end to end, a passing case's leaves
and joint direction cost two passes, one backend alone (nothing to confirm) four; and the negative controls: one
wrong gradient shared by all three backends (their pairs agree, so the referee confirms) is still found on every
leaf it touches, per leaf and along the joint direction, and one backend's wrong gradient is blamed on it.
"""

from __future__ import annotations

import itertools

import faults
import numpy as np
import pytest

import gradcheck.layers as L
from gradcheck import ops
from gradcheck.case import Case
from gradcheck.check import referee as ref
from gradcheck.check import verdict
from gradcheck.check.runner import JOINT, RunOptions, run_case
from gradcheck.results import LeafResult, PairResult

ALL = ("tape", "torch", "jax")
CASE = Case("dense_tanh", lambda rng: L.Chain(L.Dense(6, 8, activation=ops.tanh, rng=rng), L.Dense(8, 3, rng=rng)),
            lambda rng: (rng.standard_normal((5, 6)),), seed=3)


@pytest.fixture
def three_backends():
    """The end-to-end tests compare tape, torch and jax: without torch or jax (the numpy-only install) they skip."""
    pytest.importorskip("torch")
    pytest.importorskip("jax")


def _sine(k):
    """``L(w) = sum sin(k w)``: the larger k, the larger the truncation error the doubled step measures."""
    def loss(replaced):
        return float(np.sum(np.sin(k * replaced["w"]))), 0
    return loss


POINT = {"w": np.array([0.3, -0.7])}
DIRECTION = {"w": np.array([1.0, 0.5])}


def _exact(k):
    return float(np.vdot(k * np.cos(k * POINT["w"]), DIRECTION["w"]))


def _decided(checks) -> tuple:
    """The float64 verdict of a leaf whose backends agree with each other, as ``verdict.decide`` reaches it."""
    names = [c.backend for c in checks]
    leaf = LeafResult(path="w", role="param", dtype="float64")
    leaf.pairs = [PairResult(backend=b, reference=names[0], verdict="agree") for b in names[1:]]
    leaf = verdict.decide(leaf, names, checks)
    return leaf.verdict, leaf.blame


@pytest.mark.parametrize("k", [1.0, 1e4, 1e6])
@pytest.mark.parametrize("offsets", list(itertools.combinations([0.0, 1e-12, 1e-9, 1e-6, 1e-3, 1e-1], 2)))
def test_a_confirming_check_decides_as_the_full_check_and_costs_no_more(k, offsets):
    exact = _exact(k)
    answers = {f"b{i}": exact * (1 + off) for i, off in enumerate(offsets)}
    grads = {b: {"w": a * DIRECTION["w"] / np.vdot(DIRECTION["w"], DIRECTION["w"])} for b, a in answers.items()}
    args = (_sine(k), POINT, DIRECTION, grads, 1e-9, float(len(POINT["w"])))
    full, full_passes = ref.check(*args)
    confirmed, passes = ref.check(*args, confirming=True)
    assert _decided(confirmed) == _decided(full)
    assert passes <= full_passes
    agreeing = [c for c in full if c.stable and c.agrees]
    if passes < full_passes:  # it stopped at the first step: every backend within the floors, a tighter resolution
        assert passes == 2 and all(c.agrees and c.stable for c in confirmed)
        assert len(agreeing) == len(full) and all(
            c.resolution <= f.resolution for c, f in zip(confirmed, full, strict=True))
    else:  # someone missed the floors: the same checks as the full one, step for step
        assert [(c.agrees, c.stable, c.resolution) for c in confirmed] == [(f.agrees, f.stable, f.resolution)
                                                                            for f in full]


def test_confirming_stops_at_the_first_step_only_where_every_backend_is_within_the_floors():
    exact = _exact(1.0)
    grads = {b: {"w": a * DIRECTION["w"] / 1.25} for b, a in (("a", exact), ("b", exact * (1 + 1e-3)))}
    checks, passes = ref.check(_sine(1.0), POINT, DIRECTION, grads, 1e-9, 2.0, confirming=True)
    assert passes == ref.PASSES  # b is 1e-3 off: the doubled step is taken, and b is missed as before
    assert {c.backend: c.agrees for c in checks} == {"a": True, "b": False}
    grads["b"] = grads["a"]
    assert ref.check(_sine(1.0), POINT, DIRECTION, grads, 1e-9, 2.0, confirming=True)[1] == 2


@pytest.mark.parametrize("mode", ["leaves", "joint"])
def test_a_passing_case_is_confirmed_in_two_passes_and_one_backend_alone_takes_four(three_backends, mode):
    r = run_case(CASE, RunOptions(backends=ALL, referee=mode))
    assert r.verdict == "agree", (r.errors, [(x.path, x.message) for x in r.failing_leaves()])
    refereed = [x for x in r.leaves if x.referee]
    if mode == "leaves":
        assert len(refereed) == 5 and r.referee_passes == 2 * len(refereed)
        assert all(c.agrees and c.stable for x in refereed for c in x.referee)
    else:
        assert not refereed and r.referee_passes == 2
        assert any(n.startswith("referee, joint direction over 5 leaves") and "abstained" not in n for n in r.notes)
    alone = run_case(CASE, RunOptions(backends=("tape",), referee=mode))
    assert alone.verdict == "agree" and alone.referee_passes == ref.PASSES * (5 if mode == "leaves" else 1)


@pytest.mark.parametrize("mode", ["leaves", "joint"])
def test_a_wrong_gradient_every_backend_shares_is_still_found(three_backends, monkeypatch, mode):
    for backend in ALL:
        faults.wrong_bias_gradient(monkeypatch, backend)
    r = run_case(CASE, RunOptions(backends=ALL, referee=mode))
    assert r.verdict != "agree"
    if mode == "leaves":
        wrong = {x.path for x in r.leaves if x.verdict == "disagree"}
        assert wrong == {"0.bias", "1.bias"}, [(x.path, x.verdict, x.message) for x in r.leaves]
        for x in r.leaves:
            if x.path in wrong:
                assert x.blame == [] and "agree with each other, but the float64 finite difference differs from " \
                    "all of" in x.message
                assert all(c.stable and not c.agrees for c in x.referee)
    else:
        (joint,) = [x for x in r.leaves if x.role == "referee"]
        assert joint.path == JOINT and joint.verdict == "disagree"
        assert all(c.stable and not c.agrees for c in joint.referee)


@pytest.mark.parametrize("backend", ALL)
def test_one_backends_wrong_gradient_is_refereed_in_full_and_blamed(three_backends, monkeypatch, backend):
    faults.wrong_bias_gradient(monkeypatch, backend)
    checked = []
    check = ref.check

    def spied(loss64, point, direction, *args, confirming=False, **kwargs):
        checks, passes = check(loss64, point, direction, *args, confirming=confirming, **kwargs)
        checked.append((tuple(direction), confirming, passes))
        return checks, passes

    monkeypatch.setattr(ref, "check", spied)
    r = run_case(CASE, RunOptions(backends=ALL, referee="leaves"))
    wrong = [x for x in r.leaves if x.verdict == "disagree"]
    assert {x.path for x in wrong} == {"0.bias", "1.bias"}
    assert all(x.blame == [backend] for x in wrong), [(x.path, x.message) for x in wrong]
    # The case's own per-leaf checks (localisation's replay of the origin layer follows them): the disagreeing
    # leaves were not confirmed and took the doubled step, the agreeing ones were confirmed in two passes.
    assert checked[:5] == [(("0.weight",), True, 2), (("0.bias",), False, ref.PASSES), (("1.weight",), True, 2),
                           (("1.bias",), False, ref.PASSES), (("input",), True, 2)]

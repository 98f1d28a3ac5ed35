"""Counting a float64 forward's work, and the referee's auto mode deciding from it (not from a clock).

The counts are checked against hand-computed multiply-adds; the decision is
checked to follow the budget both ways and to ignore how long the forward
pass took (a forward slowed down by sleeping still gets every leaf checked).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from faults import wrong_bias_gradient

import gradcheck.layers as L
from gradcheck import ops
from gradcheck.case import Case
from gradcheck.check import cost, referee
from gradcheck.check.runner import JOINT, RunOptions, run_case

R = np.random.default_rng(5)


def counted(fn, *args) -> cost.Work:
    with cost.counting() as work:
        fn(*args)
    return work


def test_conv_counts_in_channels_times_kernel_per_output_element():
    x, w = R.standard_normal((2, 3, 8, 8)), R.standard_normal((4, 3, 3, 3))
    work = counted(lambda: ops.conv(x, w, stride=2, padding=1))
    assert work.macs == (2 * 4 * 4 * 4) * (3 * 3 * 3)
    assert work.elements == 2 * 4 * 4 * 4 and work.ops == 1


def test_grouped_conv_and_conv_transpose_count_their_own_contractions():
    x, w = R.standard_normal((1, 4, 5, 5)), R.standard_normal((6, 2, 3, 3))
    assert counted(lambda: ops.conv(x, w, groups=2)).macs == (6 * 3 * 3) * (2 * 3 * 3)
    xt, wt = R.standard_normal((1, 4, 3, 3)), R.standard_normal((4, 5, 2, 2))
    assert counted(lambda: ops.conv_transpose(xt, wt, stride=2)).macs == xt.size * 5 * 2 * 2


def test_matmul_and_einsum_count_multiply_adds():
    a, b = R.standard_normal((2, 3, 5)), R.standard_normal((5, 7))
    assert counted(lambda: ops.matmul(a, b)).macs == 2 * 3 * 7 * 5
    assert counted(lambda: ops.einsum("bij,jk->bik", a, b)).macs == 2 * 3 * 5 * 7


def test_derived_ops_count_the_ops_they_run_and_other_backends_count_nothing():
    x = R.standard_normal((3, 4))
    work = counted(lambda: ops.mean(x, axis=0))  # derived: sum, then div
    assert work.ops == 2 and work.macs == 0 and work.elements == 4 + 4
    torch = pytest.importorskip("torch")
    assert counted(lambda: ops.mean(torch.tensor(x), axis=0)).ops == 0
    assert cost.current() is None  # the counter is gone after the block


def test_the_estimate_is_the_work_at_the_nominal_rates():
    work = cost.Work(macs=2 * 10**10, elements=3 * 10**8, ops=100)
    assert work.seconds() == pytest.approx(2 + 1 + 100 * cost.SECONDS_PER_OP)


# ---------------------------------------------------------------- the referee's auto mode
def _case(sleep_s=0.0):
    def model(rng):
        return L.Chain(L.Dense(3, 4, activation=ops.tanh, rng=rng), L.Dense(4, 2, rng=rng))

    def forward(m, x):
        if isinstance(x, np.ndarray) and x.dtype == np.float64:
            time.sleep(sleep_s)  # only the referee's float64 numpy forward is slowed
        return m(x)

    return Case("slow" if sleep_s else "fast", model, lambda rng: (rng.standard_normal((5, 3)),), forward=forward)


def test_auto_checks_every_leaf_when_the_counted_work_fits_however_long_the_pass_took():
    # 0.1 s per pass would make every leaf (4 leaves + input, four passes each: 20 passes) cost 2 s: over
    # a 1 s budget if the clock decided.  The counted work is microseconds, so every leaf is checked.
    r = run_case(_case(sleep_s=0.1), RunOptions(backends=("tape",), referee="auto", referee_budget_s=1.0))
    checked = [x.path for x in r.leaves if x.referee]
    assert len(checked) == 5 and r.referee_passes == 5 * referee.PASSES, (checked, r.referee_passes)
    assert not any(n.startswith("referee: checking each") for n in r.notes)


@pytest.mark.parametrize("wrong", [False, True], ids=["clean", "wrong-bias-vjp"])
def test_auto_goes_joint_over_budget_says_why_and_the_joint_direction_decides(monkeypatch, wrong):
    # One backend, over budget: the joint direction is all its gradients are held against, so its word is the
    # case's (a leaf of its own), and a wrong VJP is blamed, not noted.
    if wrong:
        wrong_bias_gradient(monkeypatch, "tape")
    r = run_case(_case(), RunOptions(backends=("tape",), referee="auto", referee_budget_s=1e-9))
    assert r.referee_passes == referee.PASSES
    assert not any(x.referee for x in r.leaves if x.role != "referee")  # no leaf was checked apart
    note = next(n for n in r.notes if n.startswith("referee: checking each"))
    assert "5 leaves" in note and "budget of 1e-09 s" in note and "--referee leaves" in note
    assert any(n.startswith("referee, joint direction over 5 leaves") for n in r.notes)
    (joint,) = [x for x in r.leaves if x.role == "referee"]
    assert joint.path == JOINT and [c.backend for c in joint.referee] == ["tape"] and joint.referee[0].stable
    assert r.leaves_compared == 1 and not r.errors
    if not wrong:
        assert r.verdict == joint.verdict == "agree" and joint.referee[0].agrees
        return
    assert r.verdict == joint.verdict == "disagree" and joint.blame == ["tape"] and not joint.referee[0].agrees
    assert [x.path for x in r.leaves if x.failing] == [JOINT]

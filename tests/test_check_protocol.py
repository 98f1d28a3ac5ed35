"""The optional checks as a declared protocol (gradcheck.check.checks): a check registered from a test alone runs
through run_case, fills the results field it declares, lands in the JSON, and flags what it is meant to flag."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import gradcheck.layers as L
from gradcheck.case import Case
from gradcheck.check import checks
from gradcheck.check.runner import RunOptions, run, run_case
from gradcheck.results import CaseResult, json_default, load, to_dict

CASE = Case("dense", lambda rng: L.Dense(4, 3, rng=rng), lambda rng: (rng.standard_normal((5, 4)),))
# The same model with a forward no one should ship: every backend agrees on its gradients, all of them huge.
BROKEN = CASE.with_(name="dense_times_1e9", forward=lambda m, x: m(x) * 1e9)
TAPE = dict(backends=("tape",), referee="leaves")  # numpy alone: one backend and the float64 referee


def recorded_losses(cr, runs, options, res) -> None:
    """A toy check that records something per case: each backend's float64 loss, as a note."""
    losses = {b: float(np.asarray(r.ev64.value[0])) for b, r in runs.items()}
    res.notes.append("toy losses: " + ", ".join(f"{b} {v:.6g}" for b, v in losses.items()))


def bounded_outputs(cr, runs, options, res) -> None:
    """A toy check that can fail a case: a forward output beyond 1e6 in magnitude is the case's error."""
    for b, r in runs.items():
        outs = r.ev64.value[1:]
        worst = max(float(np.max(np.abs(np.asarray(o)), initial=0.0)) for o in outs)
        if worst > 1e6:
            res.errors["bounded outputs"] = f"{b}: a forward output reaches {worst:.3g}, beyond 1e6"
            res.verdict = "error"


@pytest.fixture
def registered():
    """Register checks for one test; every one is unregistered after it, whatever happens."""
    added: list[str] = []

    def add(check, before=None):
        checks.register(check, before=before)
        added.append(check.name)
        return check

    yield add
    for name in added:
        if name in [c.name for c in checks.registered()]:  # a test may unregister one itself
            checks.unregister(name)


def always(options) -> bool:
    return True


def test_the_built_in_checks_are_declared_and_registered_in_order():
    assert [c.name for c in checks.registered()] == ["localise", "repro", "second order", "trajectory"]
    options = {f.name for f in dataclasses.fields(RunOptions)}
    results = {f.name for f in dataclasses.fields(CaseResult)}
    for check in checks.registered():
        assert set(check.reads) <= options, check.name
        assert check.fills in results, check.name
    assert [c.fills for c in checks.registered()] == ["origin", "notes", "second_order", "trajectory"]
    # Each built-in check's own options are validated by it, through RunOptions, with the messages they always had.
    with pytest.raises(ValueError, match=r"order=3; expected 1 \(gradients\) or 2"):
        RunOptions(order=3)
    with pytest.raises(ValueError, match=r"steps=-1; expected a non-negative integer"):
        RunOptions(steps=-1)
    with pytest.raises(ValueError, match=r"optimizer='rmsprop'; expected one of sgd, adam"):
        RunOptions(optimizer="rmsprop")


def test_a_check_registered_from_a_test_runs_and_its_result_lands_in_its_field_and_the_json(registered, tmp_path):
    registered(checks.Check("toy losses", reads=(), fills="notes", wanted=always, run=recorded_losses))
    out = run([CASE], RunOptions(**TAPE), results_path=tmp_path / "r.jsonl")
    (res,) = out.cases
    assert res.verdict == "agree"
    (note,) = [n for n in res.notes if n.startswith("toy losses: ")]
    assert note.startswith("toy losses: tape ")
    assert note in to_dict(res)["notes"]
    assert note in json.loads(json.dumps(to_dict(res), default=json_default))["notes"]
    assert note in load(tmp_path / "r.jsonl").cases[0].notes  # and in the results file, as streamed


def test_a_toy_check_flags_a_broken_model_and_passes_a_clean_one(registered):
    registered(checks.Check("bounded outputs", reads=(), fills="errors", wanted=always, run=bounded_outputs))
    broken = run_case(BROKEN, RunOptions(**TAPE))
    # The cross-check cannot see it (every gradient is right); the check can, and it decides the verdict.
    assert not broken.failing_leaves() and broken.leaves_compared > 0
    assert broken.verdict == "error" and "beyond 1e6" in broken.errors["bounded outputs"]
    assert broken.errors["bounded outputs"] in json.dumps(to_dict(broken), default=json_default)
    clean = run_case(CASE, RunOptions(**TAPE))
    assert clean.verdict == "agree" and not clean.errors


def test_a_check_runs_only_where_its_options_ask_for_it(registered):
    registered(checks.Check("toy losses", reads=("per_layer",), fills="notes",
                            wanted=lambda options: options.per_layer, run=recorded_losses))
    assert not any(n.startswith("toy losses") for n in run_case(CASE, RunOptions(**TAPE)).notes)
    assert any(n.startswith("toy losses") for n in run_case(CASE, RunOptions(**TAPE, per_layer=True)).notes)


def test_a_check_that_raises_is_recorded_as_it_declares_and_the_next_check_still_runs(registered):
    def broken(cr, runs, options, res):
        raise ZeroDivisionError("the toy's own bug")

    registered(checks.Check("toy", reads=(), fills="notes", wanted=always, run=broken), before="localise")
    registered(checks.Check("toy losses", reads=(), fills="notes", wanted=always, run=recorded_losses))
    res = run_case(CASE, RunOptions(**TAPE))
    assert res.verdict == "error"
    assert res.errors["toy"].startswith("internal error in the toy check (a bug in gradcheck; please report it): "
                                        "ZeroDivisionError: the toy's own bug")
    assert any(n.startswith("toy losses") for n in res.notes)
    checks.unregister("toy")
    registered(checks.Check("toy diagnosis", reads=(), fills="notes", wanted=always, run=broken,
                            on_failure="note", failed="the toy diagnosis failed"))
    res = run_case(CASE, RunOptions(**TAPE))  # a diagnosis that fails leaves the verdict as it was
    assert res.verdict == "agree" and not res.errors
    assert any(n.startswith("the toy diagnosis failed (a bug in gradcheck; please report it): ZeroDivisionError")
               for n in res.notes)


def test_a_check_validates_its_own_options_through_run_options(registered):
    def validate(options):
        if options.steps > 5:
            raise ValueError(f"steps={options.steps}; the toy check allows at most 5")

    registered(checks.Check("toy", reads=("steps",), fills="notes", wanted=always, run=recorded_losses,
                            validate=validate))
    with pytest.raises(ValueError, match="the toy check allows at most 5"):
        RunOptions(steps=6)
    RunOptions(steps=5)


def test_registering_says_what_is_wrong():
    with pytest.raises(ValueError, match="fills='verdicts' is not a CaseResult field"):
        checks.Check("toy", reads=(), fills="verdicts", wanted=always, run=recorded_losses)
    with pytest.raises(ValueError, match="on_failure='ignore'; expected one of error, note"):
        checks.Check("toy", reads=(), fills="notes", wanted=always, run=recorded_losses, on_failure="ignore")
    with pytest.raises(ValueError, match="a check named 'trajectory' is already registered"):
        checks.register(checks.Check("trajectory", reads=(), fills="notes", wanted=always, run=recorded_losses))
    with pytest.raises(ValueError, match="register\\(before='nothing'\\): no check of that name"):
        checks.register(checks.Check("toy", reads=(), fills="notes", wanted=always, run=recorded_losses),
                        before="nothing")
    with pytest.raises(ValueError, match="no check named 'toy'"):
        checks.unregister("toy")
    assert [c.name for c in checks.registered()] == ["localise", "repro", "second order", "trajectory"]

"""The two-part verdict: float64 decides (blame from the referee or a majority), float32 is measured
against float64, and kinks are pinned to the float64 branch so that rounding alone is measured."""

from __future__ import annotations

import contextlib

import faults
import numpy as np
import pytest

import gradcheck
import gradcheck.layers as L
from gradcheck import ops
from gradcheck.case import Case
from gradcheck.check import kinks, verdict
from gradcheck.check.runner import RunOptions, run_case
from gradcheck.results import LeafResult, PairResult, RefereeCheck

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

ALL = ("tape", "torch", "jax")


def leaf(result, path):
    return next(x for x in result.leaves if x.path == path)


# ---------------------------------------------------------------- blame from evidence
def _leaf(pairs, referee=()):
    out = LeafResult(path="w", role="param", verdict="disagree" if any(v == "disagree" for *_, v in pairs) else "agree")
    out.pairs = [PairResult(backend=b, reference=r, verdict=v, headroom=2.0 if v == "disagree" else 0.1,
                            message=f"{b} vs {r}") for b, r, v in pairs]
    return verdict.decide(out, ["torch", "jax", "tape"], list(referee))


def _check(backend, agrees, stable=True):
    return RefereeCheck(backend=backend, directional=1.0, numeric=1.0, error=0.5 if agrees else 3.0, agrees=agrees,
                        stable=stable, resolution=1e-9)


ODD_TORCH = [("jax", "torch", "disagree"), ("tape", "torch", "disagree"), ("tape", "jax", "agree")]


def test_a_clear_majority_blames_the_odd_one_out_when_the_referee_cannot_resolve():
    x = _leaf(ODD_TORCH, [_check(b, True) for b in ALL])
    assert x.verdict == "disagree" and x.blame == ["torch"]
    assert "by majority" in x.message and "resolution" in x.message


def test_the_referee_decides_where_it_separates_the_backends():
    x = _leaf(ODD_TORCH, [_check("torch", False), _check("jax", True), _check("tape", True)])
    assert x.blame == ["torch"] and "float64 referee and jax and tape agree" in x.message


def test_blame_never_contradicts_an_unstable_referee_and_says_why():
    x = _leaf(ODD_TORCH, [_check(b, b != "torch", stable=False) for b in ALL])
    assert x.blame == ["torch"] and "abstained" in x.message


def test_no_majority_and_no_referee_blame_nobody():
    pairs = [("jax", "torch", "disagree"), ("tape", "torch", "disagree"), ("tape", "jax", "disagree")]
    x = _leaf(pairs)
    assert x.verdict == "disagree" and x.blame == [] and "neither a majority nor the referee decides" in x.message


def test_backends_that_agree_are_never_blamed_on_the_referee_alone_and_the_message_names_whom_it_misses():
    agreeing = [("jax", "torch", "agree"), ("tape", "torch", "agree"), ("tape", "jax", "agree")]
    split = _leaf(agreeing, [_check("torch", False), _check("jax", True), _check("tape", True)])
    assert split.verdict == "disagree" and split.blame == []
    assert "differs from torch (" in split.message
    everyone = _leaf(agreeing, [_check(b, False) for b in ALL])
    assert everyone.blame == [] and "differs from all of them" in everyone.message
    assert _leaf(agreeing, [_check(b, True) for b in ALL]).verdict == "agree"  # the control: nothing missed


# ---------------------------------------------------------------- one backend, two, and no pairs
def _decide(names, pairs=(), referee=()):
    out = LeafResult(path="w", role="param", verdict="disagree" if any(v == "disagree" for *_, v in pairs) else "agree")
    out.pairs = [PairResult(backend=b, reference=r, verdict=v, headroom=2.0 if v == "disagree" else 0.1)
                 for b, r, v in pairs]
    return verdict.decide(out, list(names), list(referee))


@pytest.mark.parametrize("backend", ALL)
def test_one_backend_is_blamed_when_the_stable_referee_resolves_it_outside_its_resolution(backend):
    x = _decide([backend], referee=[_check(backend, False)])
    assert x.verdict == "disagree" and x.blame == [backend]
    assert x.message == (f"{backend}: the float64 finite difference differs from its gradient (finite difference 1 "
                         f"± 1e-09; {backend} 1); only {backend} and the referee were compared")
    # The controls: within the resolution it agrees; an abstaining referee blames nobody and compared nothing.
    assert _decide([backend], referee=[_check(backend, True)]).verdict == "agree"
    abstained = _decide([backend], referee=[_check(backend, False, stable=False)])
    assert abstained.verdict == "agree" and abstained.blame == [] and not abstained.compared


def test_two_backends_are_spoken_of_as_two():
    off = _decide(["torch", "tape"], [("tape", "torch", "disagree")], [_check("torch", False), _check("tape", False)])
    assert off.blame == [] and off.message.startswith(
        "torch and tape disagree in float64 and the referee does not decide between them (the referee finds both "
        "backends off (")
    covered = _decide(["torch", "tape"], [("tape", "torch", "disagree")], [_check("torch", True), _check("tape", True)])
    assert covered.blame == [] and "covers both backends)" in covered.message
    shared = _decide(["torch", "tape"], [("tape", "torch", "agree")], [_check("torch", False), _check("tape", False)])
    assert shared.blame == [] and shared.message.startswith(
        "torch and tape agree with each other, but the float64 finite difference differs from both of them (")
    split = _decide(["torch", "tape"], [("tape", "torch", "disagree")], [_check("torch", True), _check("tape", False)])
    assert split.blame == ["tape"] and split.message.startswith("tape: the float64 referee and torch agree (")


def test_without_pairs_the_referees_split_decides():
    # The referee's joint direction over every leaf: no pair says whether the backends agree with each other.
    names = ["torch", "jax", "tape"]
    for culprit in names:
        x = _decide(names, referee=[_check(b, b != culprit) for b in names])
        held = " and ".join(b for b in names if b != culprit)
        assert x.blame == [culprit] and x.message.startswith(f"{culprit}: the float64 referee and {held} agree (")
    everyone = _decide(names, referee=[_check(b, False) for b in names])
    assert everyone.blame == [] and everyone.message.startswith(
        "the float64 finite difference differs from all of torch, jax and tape (")
    two = _decide(["torch", "tape"], referee=[_check(b, False) for b in ("torch", "tape")])
    assert two.blame == [] and two.message.startswith("the float64 finite difference differs from both torch and tape (")
    assert _decide(names, referee=[_check(b, True) for b in names]).verdict == "agree"  # the control


def test_a_leafs_headline_numbers_come_from_one_pair():
    from reports.text import leaf_numbers

    x = LeafResult(path="w", role="param", verdict="disagree")
    x.pairs = [PairResult(backend="jax", reference="torch", verdict="disagree", headroom=5.0, max_abs=0.1,
                          max_rel=0.2, max_abs_index=[1]),
               PairResult(backend="tape", reference="torch", verdict="agree", headroom=0.5, max_abs=0.3,
                          max_rel=0.01, max_abs_index=[2])]
    # The larger absolute difference (0.3, tape's) is not the worst pair's: its index would be misattributed.
    assert leaf_numbers(x) == "max rel diff 0.2, max abs diff 0.1 at [1] (jax vs torch), headroom 5"


# ---------------------------------------------------------------- float32 measured against float64
def test_float32_part_names_the_imprecise_backend_with_both_numbers():
    g64 = np.linspace(1.0, 2.0, 50)
    arrays64 = {b: g64 for b in ALL}
    arrays32 = {"torch": (g64 * (1 + 1e-7)).astype(np.float32), "tape": (g64 * (1 + 2e-7)).astype(np.float32),
                "jax": (g64 * (1 + 3e-3)).astype(np.float32)}
    part = verdict.float32_part(arrays32, arrays64, factor=10.0, floor=1e-4)
    assert part.verdict == "imprecise" and part.imprecise == ["jax"]
    assert "jax float32 is" in part.message and "further from float64 than torch" in part.message


def test_float32_computed_in_float64_is_structural():
    g = np.ones(3)
    part = verdict.float32_part({"tape": g, "torch": g.astype(np.float32)}, {"tape": g, "torch": g}, 10.0, 1e-4)
    assert part.verdict == "structural" and part.imprecise == ["tape"] and "in float64" in part.message


def test_a_leaf_with_nothing_to_measure_decides_the_case_only_when_nothing_was_measured():
    """A constant zero buffer's float32 is unmeasured (its float64 value is 0); with every gradient measured the
    case's float32 is theirs.  It once made the whole case "unmeasured" (timm's BEiT, EVA-02, ConViT)."""
    g = np.linspace(1.0, 2.0, 5)
    ok = verdict.float32_part({b: g.astype(np.float32) for b in ALL}, {b: g for b in ALL}, 10.0, 1e-4)
    nothing = verdict.float32_part({b: np.zeros(3, np.float32) for b in ALL}, {b: np.zeros(3) for b in ALL},
                                   10.0, 1e-4)
    off = verdict.float32_part({"tape": g.astype(np.float32), "torch": g.astype(np.float32),
                                "jax": (g * (1 + 3e-3)).astype(np.float32)}, {b: g for b in ALL}, 10.0, 1e-4)
    assert (ok.verdict, nothing.verdict, off.verdict) == ("ok", "unmeasured", "imprecise")
    assert verdict.worst_float32([ok, nothing]) == "ok"
    assert verdict.worst_float32([nothing, None]) == "unmeasured"
    assert verdict.worst_float32([ok, nothing, off]) == "imprecise"
    assert verdict.worst_float32([None]) == ""


def conv_relu_bn(rng):
    return L.Chain(L.Conv2d(3, 4, 3, padding=1, rng=rng), L.BatchNorm2d(4), L.ReLU(),
                   L.Conv2d(4, 2, 3, rng=rng), L.Flatten(), L.Dense(2 * 6 * 6, 3, rng=rng))


CONV_CASE = Case("conv_relu_bn", conv_relu_bn, lambda rng: (rng.standard_normal((2, 3, 8, 8)),))


@contextlib.contextmanager
def torch_conv_through_bfloat16():
    """A float32-only defect: torch's float32 convolutions (forward and backward) run in bfloat16."""
    from gradcheck.backends.torch import ops as torch_ops

    original = torch_ops.conv

    def conv(x, w, bias=None, *args, **kwargs):
        if x.dtype == torch.float32:
            b = None if bias is None else bias.bfloat16()
            return original(x.bfloat16(), w.bfloat16(), b, *args, **kwargs).float()
        return original(x, w, bias, *args, **kwargs)

    torch_ops.conv = conv
    try:
        yield
    finally:
        torch_ops.conv = original


def test_a_float32_only_defect_is_imprecise_on_that_backend_and_warns_by_default():
    with torch_conv_through_bfloat16():
        r = run_case(CONV_CASE, RunOptions(backends=ALL))
    assert r.verdict == "agree", [(x.path, x.message) for x in r.failing_leaves()]  # float64 is untouched
    assert r.float32 == "imprecise"
    w = leaf(r, "0.weight").float32
    assert w.verdict == "imprecise" and w.imprecise == ["torch"], w
    assert w.errors["torch"] > 100 * max(w.errors["tape"], w.errors["jax"])


def test_imprecise_fails_the_case_when_asked():
    with torch_conv_through_bfloat16():
        r = run_case(CONV_CASE, RunOptions(backends=ALL, imprecise="fail"))
    assert r.verdict == "imprecise" and r.failed
    assert leaf(r, "0.weight").verdict == "imprecise" and leaf(r, "0.weight").blame == ["torch"]


# ---------------------------------------------------------------- float32 measured as it returns
# Each fault is made where only the float32 measurement can see it: ``imprecise`` (off by 3e-3 of itself),
# ``float64`` (the right values, typed float64) or ``missing``.
FLOAT32_FAULTS = {"imprecise": lambda g: g * np.float32(1 + 3e-3), "float64": lambda g: g.astype(np.float64),
                  "missing": lambda g: None}


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("fault,expected", [("imprecise", "imprecise"), ("float64", "structural"),
                                            ("missing", "structural")])
def test_a_float32_gradient_fault_is_found_on_each_backend(monkeypatch, backend, fault, expected):
    """The runner measures each backend's float32 gradients against its float64 ones as they return
    (runner._measured32) and holds only the measurement: that is enough to find each fault, on the backend it is
    on, and float64's verdict stays untouched."""
    faults.float32_gradient(monkeypatch, backend, "0.weight", FLOAT32_FAULTS[fault])
    r = run_case(CONV_CASE, RunOptions(backends=ALL))
    w = leaf(r, "0.weight")
    assert w.float32.verdict == expected and w.float32.imprecise == [backend], w.float32
    if fault == "imprecise":
        assert w.float32.errors[backend] > 100 * max(e for b, e in w.float32.errors.items() if b != backend)
    else:
        assert {"float64": "in float64", "missing": "gives no float32 result"}[fault] in w.float32.message
    assert all(x.float32 is None or x.float32.verdict == "ok" for x in r.leaves if x.path != "0.weight"), \
        [(x.path, x.float32) for x in r.leaves if x.float32 is not None and x.float32.verdict != "ok"]


def test_without_a_fault_no_float32_gradient_is_flagged():
    r = run_case(CONV_CASE, RunOptions(backends=ALL))
    parts = [x.float32 for x in r.leaves if x.float32 is not None]
    assert parts and all(p.verdict == "ok" and set(p.errors) == set(ALL) for p in parts), parts


def test_correct_backends_are_not_imprecise():
    r = run_case(CONV_CASE, RunOptions(backends=ALL))
    assert r.verdict == "agree" and r.float32 == "ok"


# ---------------------------------------------------------------- kinks
def kinked(rng):
    """Relu inputs (1 + 2**-30) - 1, which is 2**-30 in float64 and exactly 0 in float32, 1, and 2**-30."""
    dense = L.Dense(2, 3, activation=ops.relu, rng=rng)
    dense.weight = np.array([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]], np.float32)
    dense.bias = np.array([-1.0, 0.0, 0.0], np.float32)
    return L.Chain(dense, L.Dense(3, 2, rng=rng))


KINK_CASE = Case("kinked", kinked, lambda rng: (np.array([[1.0, 2.0**-30]], np.float32),))


def test_a_kink_crossing_is_pinned_reported_and_not_imprecise():
    r = run_case(KINK_CASE, RunOptions(backends=ALL))
    assert r.verdict == "agree" and r.float32 == "ok", [(x.path, x.float32) for x in r.leaves]
    [kink] = [k for k in r.kinks if k.op == "relu"]
    assert kink.layer == "0" and kink.near == 2 and kink.min_distance < 1e-8  # the first and the last input
    assert kink.crossed == {b: 1 for b in ALL}  # every float32 forward puts the first on 0, float64 above it
    assert max(leaf(r, "0.weight").float32.errors.values()) < 1e-6


def _torch_takes_another_path(x):
    """relu everywhere, and on torch's float32 run one abs more: its kink calls no longer line up."""
    y = ops.relu(x)
    if type(x).__module__.startswith("torch") and ops.dtype_of(x) == np.float32:
        y = ops.abs(y)
    return y


def test_a_run_that_cannot_be_pinned_is_named_and_no_sentence_claims_it_was():
    from reports.html import render_html
    from reports.text import pinning_sentence

    def model(rng):
        chain = kinked(rng)
        chain.layers[0].activation = _torch_takes_another_path
        return chain

    case = Case("unpinnable", model, KINK_CASE.inputs)
    r = run_case(case, RunOptions(backends=ALL))
    assert r.unpinned == ["torch"] and any("torch: float32 not pinned" in n for n in r.notes)
    assert pinning_sentence(r).startswith("every float32 run but torch's took the float64 branch")
    page = render_html(gradcheck.results.RunResult(cases=[r]))
    assert "every float32 run took the float64 branch" not in page and "but torch&#x27;s" in page
    pinned = run_case(KINK_CASE, RunOptions(backends=ALL))  # the control: every run pinned, the sentence says so
    assert pinned.unpinned == [] and pinning_sentence(pinned).startswith("every float32 run took")


def test_without_pinning_the_same_crossing_moves_float32_by_order_one(monkeypatch):
    # Negative control: the pinning is what keeps the crossing out of the float32 errors.
    monkeypatch.setattr(kinks, "pinned", lambda rec: contextlib.nullcontext(kinks._State("pin", rec, str)))
    monkeypatch.setattr(kinks, "call", lambda state, name, run, args, kwargs: run(*args, **kwargs))
    r = run_case(KINK_CASE, RunOptions(backends=ALL))
    assert min(leaf(r, "0.weight").float32.errors.values()) > 0.5


def test_pinned_float32_takes_the_float64_branch_on_every_backend():
    x64 = np.array([1e-9, -2.0, 3.0, -1e-9])

    def f(x):
        y = ops.relu(x)
        pooled = ops.max_pool2d(ops.reshape(ops.concatenate([y, x]), (1, 1, 2, 4)), 2)
        return ops.sum(pooled) + ops.max(x) + ops.sum(ops.where(ops.greater(x, 0.0), x, 0.0))

    with kinks.recording() as rec:
        f(x64)
    crossed32 = np.array([-1e-9, -2.0, 3.0, 1e-9], np.float32)  # the first and last elements cross
    expected = gradcheck.withgradient(f, x64, backend="tape")[1][0]
    for backend in ALL:
        with kinks.pinned(rec):
            _, (g,) = gradcheck.withgradient(f, crossed32, backend=backend)
        np.testing.assert_allclose(g, expected, err_msg=backend)
        _, (unpinned,) = gradcheck.withgradient(f, crossed32, backend=backend)
        assert not np.allclose(unpinned, expected), backend  # the crossing is real without the pin


def test_a_pinned_run_that_calls_other_ops_is_a_mismatch():
    with kinks.recording() as rec:
        ops.relu(np.ones(3))
    with kinks.pinned(rec), pytest.raises(kinks.KinkMismatch, match="max_pool2d|abs"):
        ops.abs(np.ones(3, np.float32))


# ---------------------------------------------------------------- jax's compile cache
def test_jax_gives_each_closure_its_own_gradient():
    x = np.ones(3)

    def make(k):
        return lambda v: ops.mul(v, k)

    for k in (1.0, 5.0):
        s = make(k)
        _, (g,) = gradcheck.withgradient(lambda v: ops.sum(s(v)), x, backend="jax")  # noqa: B023
        np.testing.assert_array_equal(g, [k] * 3)


def test_jax_gives_each_default_argument_its_own_gradient():
    x = np.ones(3)
    for k in (1.0, 5.0):
        def scale(v, k=k):
            return ops.mul(v, k)

        _, (g,) = gradcheck.withgradient(lambda v: ops.sum(scale(v)), x, backend="jax")  # noqa: B023
        np.testing.assert_array_equal(g, [k] * 3)


def test_a_max_pool_tie_in_float32_only_takes_the_float64_maximum():
    # Window [1, 1 + 2**-30]: the second is the maximum in float64; in float32 the two tie, and a kernel gives
    # the gradient to the first.  Pinned, every backend's float32 gradient goes to the second.
    def build(rng):
        dense = L.Dense(2, 2, rng=rng)
        dense.weight = np.array([[1.0, 0.0], [1.0, 1.0]], np.float32)
        dense.bias = np.zeros(2, np.float32)
        return dense

    case = Case("pool_tie", build, lambda rng: (np.array([[1.0, 2.0**-30]], np.float32),),
                forward=lambda m, x: ops.max_pool2d(ops.reshape(m(x), (1, 1, 1, 2)), (1, 2)))
    r = run_case(case, RunOptions(backends=ALL))
    assert r.verdict == "agree" and r.float32 == "ok", [(x.path, x.float32) for x in r.leaves]
    assert max(leaf(r, "weight").float32.errors.values()) < 1e-6
    [kink] = [k for k in r.kinks if k.op == "max_pool2d"]
    assert kink.near == 1


# ---------------------------------------------------------------- nondeterminism
def test_a_nondeterministic_backend_is_reported_as_such_and_nobody_else_is_blamed(monkeypatch):
    from gradcheck.backends import get_backend

    driver = get_backend("torch")
    original = driver.evaluate
    calls = []

    def jittery(f, args, prefixes=None):  # a test double: each call's bias gradient is off by another 1e-3
        ev = original(f, args, prefixes)
        calls.append(1)
        ev.grads["0.bias"] = ev.grads["0.bias"] * (1 + 1e-3 * len(calls))
        return ev

    monkeypatch.setattr(driver, "evaluate", jittery)
    r = run_case(CONV_CASE, RunOptions(backends=ALL))
    bias = leaf(r, "0.bias")
    assert bias.verdict == "nondeterministic" and bias.blame == ["torch"], (bias.verdict, bias.blame, bias.message)
    assert set(bias.nondeterministic) == {"torch"} and 5e-4 < bias.nondeterministic["torch"] < 5e-3
    assert "two calls with the same inputs" in bias.message
    assert all(x.blame in ([], ["torch"]) for x in r.leaves)


def test_deterministic_backends_record_no_spread():
    r = run_case(CONV_CASE, RunOptions(backends=ALL))
    assert all(not x.nondeterministic for x in r.leaves), [(x.path, x.nondeterministic) for x in r.leaves]


def test_a_backend_that_writes_into_its_inputs_is_reported_and_the_next_one_gets_clean_values(monkeypatch):
    from gradcheck.backends import get_backend

    driver = get_backend("tape")
    original = driver.evaluate

    def scribbler(f, args, prefixes=None):  # a test double: evaluates, then writes into the input it was handed
        ev = original(f, args, prefixes)
        np.asarray(args[1])[...] = 0.0
        return ev

    monkeypatch.setattr(driver, "evaluate", scribbler)
    case = Case("mlp", lambda rng: L.Chain(L.Dense(3, 4, activation=ops.tanh, rng=rng), L.Dense(4, 2, rng=rng)),
                lambda rng: (rng.standard_normal((5, 3)),))
    r = run_case(case, RunOptions(backends=ALL))
    assert "tape (mutates its inputs)" in r.errors and "input" in r.errors["tape (mutates its inputs)"]
    assert r.verdict == "error"
    # torch and jax, which ran after it, were handed the case's own input: they agree with each other, and
    # nothing is blamed on them (the tape's own second call saw the zeros it wrote).
    for x in r.leaves:
        assert all(p.verdict == "agree" for p in x.pairs if {p.backend, p.reference} == {"torch", "jax"}), x.path
        assert set(x.blame) <= {"tape"}, (x.path, x.blame, x.message)


@pytest.mark.parametrize("precision", [np.float64, np.float32])
def test_a_write_in_one_precision_is_caught_against_the_one_snapshot_both_share(monkeypatch, precision):
    # A float32 case keeps one snapshot, of its float32 arguments; the float64 arguments are checked against it
    # widened (localise.Widened).  A backend writing into the arguments of one precision only is still caught,
    # and the next backend is handed the case's own values in that precision.
    from gradcheck.backends import get_backend

    driver = get_backend("tape")
    original = driver.evaluate

    def scribbler(f, args, prefixes=None):  # a test double: writes into the first weight in one precision only
        ev = original(f, args, prefixes)
        weight = args[0].layers[0].weight
        if weight.dtype == precision:
            weight[0, 0] += 1.0
        return ev

    monkeypatch.setattr(driver, "evaluate", scribbler)
    case = Case("mlp", lambda rng: L.Chain(L.Dense(3, 4, activation=ops.tanh, rng=rng), L.Dense(4, 2, rng=rng)),
                lambda rng: (rng.standard_normal((5, 3)),), dtype="float32")
    r = run_case(case, RunOptions(backends=ALL))
    bits = "64" if precision == np.float64 else "32"
    message = r.errors.get("tape (mutates its inputs)", "")
    assert f"float{bits} call" in message and "0.weight: 1 of 12 elements changed" in message, r.errors
    assert r.verdict == "error"
    for x in r.leaves:
        assert all(p.verdict == "agree" for p in x.pairs if {p.backend, p.reference} == {"torch", "jax"}), x.path

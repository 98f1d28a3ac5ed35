"""The cross-check end to end: three backends and the referee agree on correct models,
and each kind of wrong gradient is caught in float64, named and blamed on the right backend;
float32 is measured against float64."""

from __future__ import annotations

import numpy as np
import pytest

import gradcheck.layers as L
from gradcheck import ops, results
from gradcheck.backends import get_backend
from gradcheck.backends.numpy import kernels
from gradcheck.backends.tape import ops as tape_ops
from gradcheck.case import Case
from gradcheck.check.runner import RunOptions, run, run_case
from gradcheck.check.tolerance import ToleranceRules

ALL = ("tape", "torch", "jax")


def need(backends):
    """Skip a test whose backends are not installed; the tape-only tests here run everywhere."""
    for b in backends:
        if b != "tape":
            pytest.importorskip(b)
    return backends


def chain(rng):
    return L.Chain(L.Dense(2, 3, activation=ops.tanh, rng=rng), L.Dense(3, 1, bias=False, rng=rng))


def conv_bn_dense(rng):
    return L.Chain(
        L.Conv2d(3, 4, 3, stride=2, padding=1, bias=False, rng=rng),
        L.BatchNorm2d(4),
        Flatten(),
        L.Dense(4 * 4 * 4, 5, rng=rng),
    )


class Flatten(L.Chain):
    def __init__(self):
        super().__init__()

    def __call__(self, x):
        return ops.flatten(x)


CASES = {
    "chain": Case("chain", chain, lambda rng: (rng.standard_normal((4, 2)),)),
    "conv_bn_dense": Case("conv_bn_dense", conv_bn_dense, lambda rng: (rng.standard_normal((2, 3, 8, 8)),)),
}


def check(name, dtype="float32", backends=ALL, **kw):
    return run_case(CASES[name].with_(dtype=dtype), RunOptions(backends=need(backends), **kw))


def leaf(result, path):
    return next(x for x in result.leaves if x.path == path)


def failing(result):
    return {x.path: x for x in result.leaves if x.verdict in results.FAILING}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["chain", "conv_bn_dense"])
def test_correct_models_agree_on_every_leaf(name, dtype):
    r = check(name, dtype, referee="leaves")
    assert r.verdict == "agree", [(x.path, x.verdict, x.message) for x in r.leaves]
    assert not r.errors and not r.unavailable
    grads = [x for x in r.leaves if x.role in ("param", "input")]
    assert r.leaves_compared == len(r.leaves) >= len(grads) + 1  # the output is compared too
    for x in grads:
        assert {c.backend for c in x.referee} == set(ALL), x.path
        assert all(c.agrees for c in x.referee), (x.path, x.referee)
        assert {(p.backend, p.reference) for p in x.pairs} == {("jax", "torch"), ("tape", "torch"), ("tape", "jax")}
    assert r.timings["jax"].first is not None and r.timings["jax"].second is not None
    assert r.timings["jax"].float64 is not None
    if dtype == "float32":  # checked in float64, measured in float32
        assert r.float32 == "ok" and all(x.float32 is not None and set(x.float32.errors) == set(ALL) for x in grads)
        assert all(max(x.float32.errors.values()) < 1e-4 for x in grads), [(x.path, x.float32) for x in grads]
    else:
        assert r.float32 == "" and all(x.float32 is None for x in r.leaves)
    assert all(x.tolerance.rule.startswith("elementwise") for x in r.leaves if x.tolerance)  # float64 decides


def test_batchnorm_running_stats_are_compared_as_buffers():
    r = check("conv_bn_dense")
    assert leaf(r, "1.running_mean").role == "buffer"
    assert leaf(r, "1.running_mean").verdict == "agree"
    assert leaf(r, "1.running_var").verdict == "agree"
    assert not any(x.path.endswith("num_batches_tracked") and x.role != "buffer" for x in r.leaves)


def test_a_running_statistic_that_is_rounding_noise_is_held_to_the_statistics_scale():
    # A channel whose batch mean is 0 in exact arithmetic (timm's MobileNetV3 and EfficientNet have them): each
    # backend's running mean is ~1e-17 of noise, which its own values cannot scale a tolerance for.
    from gradcheck.check.compare import compare_leaf

    rng = np.random.default_rng(0)
    noise = {b: rng.standard_normal(8) * 1e-17 for b in ("tape", "torch", "jax")}
    rules = ToleranceRules()
    held = compare_leaf("bn.running_mean", "buffer", noise, dtype="float64", rules=rules, case_scale=0.9)
    assert held.verdict == "agree"
    assert compare_leaf("bn.running_mean", "buffer", noise, dtype="float64", rules=rules).verdict == "disagree"
    # The control: at that scale a real error in the statistic (one part in a million of it) still fails.
    mean = {b: np.linspace(-0.3, 0.3, 8) for b in noise}
    mean["torch"] = mean["torch"] * (1 + 1e-6)
    assert compare_leaf("bn.running_mean", "buffer", mean, dtype="float64", rules=rules,
                        case_scale=0.9).verdict == "disagree"


# ---------------------------------------------------------------- negative controls
def test_scaled_bias_gradient_on_the_tape_is_blamed_on_the_tape(monkeypatch):
    wrong = lambda g, ans, a, b: tape_ops.unbroadcast(ops.mul(g, 1.01), tape_ops._shape(b))
    monkeypatch.setitem(tape_ops.add.vjps, 1, wrong)
    r = check("chain")
    bad = failing(r)
    assert set(bad) == {"0.bias"}
    assert bad["0.bias"].verdict == "disagree" and bad["0.bias"].blame == ["tape"]
    assert bad["0.bias"].message.startswith("tape: the float64 referee and torch and jax agree")
    assert r.first_disagreement == "0.bias"


def test_flipped_conv_weight_gradient_is_caught(monkeypatch):
    original = tape_ops._conv.vjps[1]
    monkeypatch.setitem(tape_ops._conv.vjps, 1, lambda *a, **k: np.flip(np.asarray(original(*a, **k)), (-1, -2)))
    r = check("conv_bn_dense")
    bad = failing(r)
    assert set(bad) == {"0.weight"}
    assert bad["0.weight"].blame == ["tape"]
    assert bad["0.weight"].worst and set(bad["0.weight"].worst[0]["values"]) == set(ALL)


def test_batchnorm_backward_missing_its_mean_term_is_localised(monkeypatch):
    # The tape forgets that the batch mean depends on x: BatchNorm's input
    # gradient loses a term, so everything *before* the BatchNorm is wrong.
    # (Without its fused normalize the tape composes BatchNorm from ops.mean.)
    monkeypatch.delattr(tape_ops, "normalize")
    derived_mean = ops.mean.__wrapped__
    monkeypatch.setattr(tape_ops, "mean", lambda x, axis=None, keepdims=False:
                        ops.stop_gradient(derived_mean(x, axis=axis, keepdims=keepdims)), raising=False)
    r = check("conv_bn_dense")
    bad = failing(r)
    assert set(bad) == {"0.weight", "input"}, sorted(bad)
    assert all(x.blame == ["tape"] for x in bad.values())
    assert r.first_disagreement == "0.weight"
    assert leaf(r, "1.weight").verdict == "agree"  # after the bug: unaffected


def test_fused_batchnorm_weight_gradient_halved_is_caught(monkeypatch):
    # The tape's one-node normalize: a wrong weight gradient from its fused kernel is that leaf's alone.
    original = kernels.normalize_grads

    def halved_weight_grad(argnums, *a, **k):
        grads = original(argnums, *a, **k)
        return [g * 0.5 if i == 1 else g for i, g in zip(argnums, grads, strict=True)]

    monkeypatch.setattr(kernels, "normalize_grads", halved_weight_grad)
    r = check("conv_bn_dense")
    bad = failing(r)
    assert set(bad) == {"1.weight"}, sorted(bad)
    assert bad["1.weight"].blame == ["tape"]


def _wrap_evaluate(monkeypatch, backend, edit):
    need([backend])
    driver = get_backend(backend)
    original = driver.evaluate

    def evaluate(f, args, prefixes=None):
        ev = original(f, args, prefixes)
        edit(ev)
        return ev

    monkeypatch.setattr(driver, "evaluate", evaluate)


def _read_only(ev):
    """Every array a backend returned made read-only, as the jax driver returns its own (its result's buffer)."""
    for array in [*(ev.value if isinstance(ev.value, tuple) else [ev.value]), *ev.grads.values(),
                  *ev.buffers.values()]:
        if isinstance(array, np.ndarray):
            array.flags.writeable = False


@pytest.mark.parametrize("inject", [False, True])
def test_nothing_writes_into_what_a_backend_returned(monkeypatch, inject):
    """The jax driver hands back read-only views of its results instead of copies: the comparison, the referee,
    localisation (the failing case) and the reports must only read what every backend returned."""
    for backend in ALL:
        _wrap_evaluate(monkeypatch, backend, _read_only)
    if inject:  # a wrong batch-norm weight gradient on the tape: localisation and the per-leaf referee run
        original = kernels.normalize_grads
        monkeypatch.setattr(kernels, "normalize_grads", lambda argnums, *a, **k: [
            g * 0.5 if i == 1 else g for i, g in zip(argnums, original(argnums, *a, **k), strict=True)])
    r = check("conv_bn_dense")
    assert not r.errors, r.errors
    assert r.verdict == ("disagree" if inject else "agree"), [(x.path, x.verdict, x.message) for x in r.leaves]
    if inject:
        assert set(failing(r)) == {"1.weight"} and leaf(r, "1.weight").blame == ["tape"]


def test_the_jax_driver_returns_its_results_without_copying_them():
    from gradcheck.check.runner import CaseRun

    need(["jax"])
    cr = CaseRun(CASES["conv_bn_dense"])
    ev = get_backend("jax").evaluate(cr.f64, cr.args64, cr.prefixes)
    assert ev.grads and all(not g.flags.writeable for g in ev.grads.values())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_reference_forward_reads_the_float64_arrays_and_leaves_the_case_its_buffers(dtype):
    """The reference forward runs on modules of its own over the float64 arrays the backends get (no second copy
    of the model), and a running statistic it updates stays in its modules: the backends start from the case's."""
    from gradcheck.check.runner import CaseRun

    models = []

    def forward(m, *xs):
        models.append(m)
        return m(*xs)

    cr = CaseRun(CASES["conv_bn_dense"].with_(dtype=dtype, forward=forward))
    reference, model = models[0].layers, cr.model.layers
    assert models[0] is not cr.model and reference[1] is not model[1]
    assert reference[0].weight is model[0].weight and reference[0].weight.dtype == np.float64
    assert np.any(reference[1].running_mean != 0.0)  # the forward in train mode updated it ...
    assert np.all(model[1].running_mean == 0.0) and model[1].running_mean.dtype == np.float64  # ... there only


class WritesIntoItsWeight(L.Dense):
    """A layer that moves its own weight in place in the numpy forward (the reference's, and no backend's)."""

    def __call__(self, x):
        if isinstance(self.weight, np.ndarray):
            self.weight[0, 0] += 1e-3
        return super().__call__(x)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layer", [L.Dense, WritesIntoItsWeight])
def test_a_model_writing_into_its_arrays_in_the_reference_forward_is_reported_as_such(dtype, layer):
    case = Case("scribble", lambda rng: L.Chain(layer(4, 3, rng=rng)), lambda rng: (rng.standard_normal((2, 4)),),
                seed=1, dtype=dtype)
    r = run_case(case, RunOptions(backends=need(ALL)))
    if layer is L.Dense:  # the clean control
        assert r.verdict == "agree" and not r.errors
        return
    assert r.verdict == "error" and list(r.errors) == ["numpy reference forward (mutates its inputs)"], r.errors
    assert "0.weight: 1 of 12 elements changed" in r.errors["numpy reference forward (mutates its inputs)"]


def test_a_framework_backend_can_be_blamed_too(monkeypatch):
    _wrap_evaluate(monkeypatch, "jax", lambda ev: ev.grads.__setitem__("3.bias", ev.grads["3.bias"] * 1.5))
    r = check("conv_bn_dense")
    assert set(failing(r)) == {"3.bias"}
    assert leaf(r, "3.bias").blame == ["jax"]


def test_referee_decides_between_two_backends(monkeypatch):
    _wrap_evaluate(monkeypatch, "torch", lambda ev: ev.grads.__setitem__("0.weight", ev.grads["0.weight"] * 0.9))
    r = check("chain", backends=("tape", "torch"))
    x = leaf(r, "0.weight")
    assert x.verdict == "disagree" and x.blame == ["torch"]
    assert [c.agrees for c in sorted(x.referee, key=lambda c: c.backend)] == [True, False]  # tape, torch


def test_two_backends_without_referee_blame_nobody(monkeypatch):
    _wrap_evaluate(monkeypatch, "torch", lambda ev: ev.grads.__setitem__("0.weight", ev.grads["0.weight"] * 0.9))
    r = check("chain", backends=("tape", "torch"), referee="off")
    x = leaf(r, "0.weight")
    assert x.verdict == "disagree" and x.blame == []
    assert x.message.startswith("torch and tape disagree in float64 and the referee does not decide between them (the referee did not check this leaf)")


def test_gradient_for_a_buffer_is_structural(monkeypatch):
    _wrap_evaluate(monkeypatch, "tape", lambda ev: ev.grads.__setitem__("1.running_mean", np.zeros(4, np.float32)))
    r = check("conv_bn_dense")
    x = next(x for x in r.leaves if x.path == "1.running_mean" and x.verdict == "structural")
    assert x.blame == ["tape"] and "buffer" in x.message
    assert r.verdict == "structural" and r.failed


def test_missing_gradient_and_wrong_shape_are_structural(monkeypatch):
    def edit(ev):
        del ev.grads["0.bias"]
        ev.grads["1.weight"] = ev.grads["1.weight"].reshape(3, 1)

    _wrap_evaluate(monkeypatch, "torch", edit)
    r = check("chain")
    assert leaf(r, "0.bias").verdict == "structural" and leaf(r, "0.bias").blame == ["torch"]
    assert leaf(r, "1.weight").verdict == "structural" and "shape" in leaf(r, "1.weight").message


def test_nan_in_one_backend_is_nonfinite_and_blamed(monkeypatch):
    def edit(ev):
        ev.grads["0.weight"] = ev.grads["0.weight"].copy()
        ev.grads["0.weight"][0, 0] = np.nan

    _wrap_evaluate(monkeypatch, "jax", edit)
    r = check("chain")
    assert leaf(r, "0.weight").verdict == "nonfinite" and leaf(r, "0.weight").blame == ["jax"]


def test_forward_disagreement_is_reported_on_the_output(monkeypatch):
    _wrap_evaluate(monkeypatch, "tape", lambda ev: None)
    original = tape_ops.tanh.forward
    monkeypatch.setattr(tape_ops.tanh, "forward", lambda x: original(x) * 1.1)
    r = check("chain")
    assert leaf(r, "output").verdict == "disagree" and leaf(r, "output").blame == ["tape"]


# ---------------------------------------------------------------- robustness
def test_a_backend_that_raises_is_an_error_and_the_others_still_compare(monkeypatch):
    def boom(f, args, prefixes=None):
        raise RuntimeError("simulated backend crash")

    monkeypatch.setattr(get_backend(need(["jax"])[0]), "evaluate", boom)
    r = check("chain")
    assert "simulated backend crash" in r.errors["jax"]
    assert r.verdict == "error"
    assert all(x.verdict == "agree" for x in r.leaves)  # tape and torch were still compared
    assert {p.backend for x in r.leaves for p in x.pairs} == {"tape"}


def test_one_broken_case_does_not_stop_the_run(tmp_path):
    def broken(rng):
        raise ValueError("this model cannot be built")

    cases = [Case("broken", broken, lambda rng: (np.zeros(2),)), CASES["chain"]]
    out = run(cases, RunOptions(backends=("tape",)), results_path=tmp_path / "r.jsonl")
    assert [c.verdict for c in out.cases] == ["error", "agree"]
    assert "cannot be built" in out.cases[0].errors["case"]
    assert [c.name for c in results.load(tmp_path / "r.jsonl").cases] == ["broken", "chain"]


def test_a_scalar_output_is_compared_like_any_leaf():
    # A model that returns its own loss: the output leaf is 0-d.
    case = Case("scalar", chain, lambda rng: (rng.standard_normal((4, 2)),), forward=lambda m, x: ops.sum(m(x)))
    r = run_case(case, RunOptions(backends=need(ALL)))
    assert r.verdict == "agree", [(x.path, x.message) for x in r.leaves]
    out = leaf(r, "output")
    assert out.shape == [] and len(out.pairs) == 3 and out.worst and out.worst[0]["index"] == []


def test_a_bug_in_comparing_one_case_is_that_cases_error(tmp_path, monkeypatch):
    from gradcheck.check import runner

    def judge(path, *a, **k):
        if path == "output":
            raise RuntimeError("comparison bug")
        return original(path, *a, **k)

    original = runner.compare_leaf
    monkeypatch.setattr(runner, "compare_leaf", judge)
    out = run([CASES["chain"], CASES["chain"].with_(name="again")], RunOptions(backends=("tape",)),
              results_path=tmp_path / "r.jsonl")
    assert [c.verdict for c in out.cases] == ["error", "error"]
    assert "comparison bug" in out.cases[0].errors["case"] and "a bug in gradcheck" in out.cases[0].errors["case"]
    assert [c.name for c in results.load(tmp_path / "r.jsonl").cases] == ["chain", "again"]


def test_an_interrupted_run_keeps_every_finished_case(tmp_path):
    def stop_after_two(i, total, result):
        if i == 1:
            raise KeyboardInterrupt

    cases = [CASES["chain"].with_(name=f"chain{i}", seed=i) for i in range(4)]
    with pytest.raises(KeyboardInterrupt):
        run(cases, RunOptions(backends=("tape",)), results_path=tmp_path / "r.jsonl", on_case=stop_after_two)
    stored = results.load(tmp_path / "r.jsonl")
    assert [c.name for c in stored.cases] == ["chain0", "chain1"]


def test_a_model_with_no_trainable_leaf_fails():
    class Frozen(L.Chain):
        pass

    def build(rng):
        return Frozen(L.Dense(2, 2, rng=rng)).freeze("0.*")

    r = run_case(Case("frozen", build, lambda rng: (np.arange(4).reshape(2, 2),)), RunOptions(backends=("tape",)))
    assert r.failed


def test_vacuous_leaf_is_flagged_not_failed():
    def build(rng):  # a conv bias followed by train-mode BatchNorm has an exactly zero gradient
        return L.Chain(L.Conv2d(3, 2, 3, rng=rng), L.BatchNorm2d(2))

    r = run_case(Case("bias_bn", build, lambda rng: (rng.standard_normal((2, 3, 5, 5)),)), RunOptions(backends=need(ALL)))
    assert leaf(r, "0.bias").verdict == "vacuous"
    assert r.verdict == "agree"


# ---------------------------------------------------------------- tolerance rules
def test_tolerance_rule_decides_and_is_recorded(monkeypatch):
    _wrap_evaluate(monkeypatch, "torch", lambda ev: ev.grads.__setitem__("0.bias", ev.grads["0.bias"] * 1.01))
    strict = check("chain", referee="off")
    assert leaf(strict, "0.bias").verdict == "disagree"
    rules = ToleranceRules.from_config({"rules": [{"leaf": "*.bias", "rtol": 0.05, "name": "loose biases"}]})
    loose = check("chain", referee="off", rules=rules)
    assert leaf(loose, "0.bias").verdict == "agree"
    assert "loose biases" in leaf(loose, "0.bias").tolerance.rule
    assert "loose biases" not in leaf(loose, "0.weight").tolerance.rule


def test_bad_tolerance_config_names_the_key():
    with pytest.raises(ValueError, match="rtl"):
        ToleranceRules.from_config({"rules": [{"leaf": "*", "rtl": 1e-3}]})
    with pytest.raises(ValueError, match="non-negative"):
        ToleranceRules.from_config({"float32": {"rtol": -1}})


def test_criterion_can_be_switched_by_a_rule():
    rules = ToleranceRules.from_config({"rules": [{"layer": "Dense", "criterion": "norm", "norm_rtol": 1e-9}]})
    r = check("conv_bn_dense", rules=rules)
    assert leaf(r, "3.weight").tolerance.criterion == "norm"
    assert leaf(r, "0.weight").tolerance.criterion == "elementwise"
    with pytest.raises(ValueError, match="criterion"):
        ToleranceRules.from_config({"rules": [{"criterion": "cosine"}]})

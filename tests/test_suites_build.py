"""Every suite's cases materialise and run forward on numpy, in their own dtype; the smoke suite agrees end to end
on every backend installed, and every layer case's tape gradients agree with the float64 referee.

(`gradcheck run smoke layers models` itself, on all three backends, is CI's headline step: .ci/headline.py.)"""

from __future__ import annotations

import os

import numpy as np
import pytest

from gradcheck.backends import get_backend
from gradcheck.case import Case, materialise
from gradcheck.check.runner import DEFAULT_BACKENDS, RunOptions, run_case
from gradcheck.suites import SUITES, fuzz_cases
from gradcheck.suites.inputs import kink_free
from gradcheck.suites.layers import rows


def _outputs(case: Case):
    model, inputs = materialise(case)
    forward = case.forward or (lambda m, *xs: m(*xs))
    out = forward(model, *inputs)
    return list(out) if isinstance(out, tuple) else [out]


def _check_forward(case: Case):
    for k, y in enumerate(_outputs(case)):
        y = np.asarray(y)
        assert np.all(np.isfinite(y)), f"{case.name}: output {k} is not finite"
        # A float64 constant slipping into a float32 case would silently promote the whole case.
        assert y.dtype == np.dtype(case.dtype), f"{case.name}: output {k} is {y.dtype}, not {case.dtype}"


LAYER_CASES = SUITES["layers"]()


@pytest.mark.parametrize("case", LAYER_CASES, ids=[c.name for c in LAYER_CASES])
def test_layer_case_builds_and_runs(case):
    _check_forward(case)


def test_layers_suite_covers_every_layer_once_checked_in_float64_and_measured_in_float32():
    names = {c.name for c in LAYER_CASES}
    assert len(names) == len(LAYER_CASES)
    assert {c.dtype for c in LAYER_CASES} == {"float32"}  # float32: both parts (see gradcheck.check.verdict)
    assert "Conv2d[k3,s2,p1,g2]" in names and len(names) == len(set(names))
    expected = {
        "Linear", "Conv1d", "Conv2d", "ConvTranspose2d", "ConvTranspose1d", "BatchNorm1d", "BatchNorm2d", "LayerNorm",
        "GroupNorm", "RMSNorm", "Dropout", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "Flatten", "Embedding",
        "scaled_dot_product_attention", "MultiheadAttention", "LSTM", "GRU", "ReLU", "LeakyReLU", "ELU", "GELU",
        "SiLU", "Tanh", "Sigmoid", "Softplus", "Softmax", "LogSoftmax", "mse_loss", "cross_entropy",
        "binary_cross_entropy_with_logits", "Chain", "Parallel", "SkipConnection",
    }
    assert expected <= {c.model for c in LAYER_CASES}
    assert {c.mode for c in LAYER_CASES if c.model == "BatchNorm2d"} == {"train", "eval"}
    assert SUITES["layers"](dtype="float64") and all(c.dtype == "float64" for c in SUITES["layers"](dtype="float64"))


def test_every_case_has_a_trainable_leaf():
    """A case with nothing to differentiate could never fail (a vacuous check)."""
    from gradcheck.tree import leaves_with_paths

    for row in rows():
        case = Case(name=row.label, build=row.build, inputs=row.inputs, mode=row.mode, dtype="float64")
        model, inputs = materialise(case)
        assert any(leaf.trainable for leaf in leaves_with_paths((model, inputs))), row.label


def test_kinked_layers_get_kink_free_inputs():
    kinked = {"ReLU", "LeakyReLU", "ELU", "MaxPool2d"}
    for row in rows():
        if row.layer in kinked:
            (x,) = row.inputs(np.random.default_rng(0))
            assert np.abs(x).min() >= 1e-3, row.label
            flat = np.sort(x.ravel())
            assert np.diff(flat).min() >= 2e-3, f"{row.label}: near-tie in the input"


def test_kink_free_spacing():
    x = kink_free(np.random.default_rng(0), (4, 3, 9, 9))
    assert np.abs(x).min() >= 1e-3 and np.diff(np.sort(x.ravel())).min() >= 2e-3
    y = kink_free(np.random.default_rng(0), (5,), scale=2.0)
    assert np.abs(y).max() <= 2.0 and np.abs(y).min() > 0.1


def test_models_suite_builds_and_runs():
    cases = SUITES["models"]()
    names = [c.name for c in cases]
    assert len(set(names)) == len(names)
    assert "resnet18[3x64x64,b2]" in names and "resnet18[3x64x64,b2,eval]" in names
    assert {c.model for c in cases} >= {"mlp", "lenet5", "resnet18", "resnet34", "resnet50", "transformer",
                                        "lstm_lm", "unet_small"}
    r18 = next(c for c in cases if c.name == "resnet18[3x64x64,b2]")
    model, (x,) = materialise(r18)
    assert x.shape == (2, 3, 64, 64) and model.num_parameters() == 11_689_512
    # Forward once per model in float32 (the float64 twins differ only by the cast);
    # ResNet-34/50 only build here, tests/test_models.py runs them at 32x32.
    for case in cases:
        if case.dtype == "float32" and case.model not in ("resnet18", "resnet34", "resnet50"):
            _check_forward(case)
        elif case.model in ("resnet34", "resnet50") and case.dtype == "float32":
            model, (x,) = materialise(case)
            assert x.shape == (2, 3, 64, 64)
    _check_forward(r18)


def test_smoke_suite_builds_and_runs():
    cases = SUITES["smoke"]()
    assert 10 <= len(cases) <= 40
    for case in cases:
        _check_forward(case)


def test_fuzz_suite_is_deterministic_valid_and_runs():
    cases = SUITES["fuzz"](seed=3)
    assert len(cases) >= 200
    assert [c.name for c in cases] == [c.name for c in SUITES["fuzz"](seed=3)]
    assert [c.name for c in cases] != [c.name for c in SUITES["fuzz"](seed=4)]
    assert len({c.name for c in cases}) == len(cases)
    assert len({c.model for c in cases}) >= 8
    for case in cases:
        _check_forward(case)
    assert all(c.dtype == "float32" for c in fuzz_cases(20, seed=1, dtype="float32"))


def test_suite_functions_take_seed_and_dtype():
    for name, fn in SUITES.items():
        cases = fn(seed=5, dtype="float64")
        assert cases and all(isinstance(c, Case) for c in cases), name
        assert all(c.seed == 5 and c.dtype == "float64" for c in cases), name
        assert (fn.__doc__ or "").strip(), f"suite {name} needs a one-line docstring (gradcheck list shows it)"


# ---------------------------------------------------------------- run as the runner runs them, every leaf agrees
INSTALLED = tuple(b for b in DEFAULT_BACKENDS if get_backend(b).available()[0])


def _agrees(res, backends):
    assert res.verdict == "agree", (res.verdict, res.errors, [(x.path, x.verdict, x.message) for x in res.leaves
                                                             if x.verdict != "agree"])
    assert sorted(res.timings) == sorted(backends) and not res.errors
    assert [(x.path, x.verdict, x.blame) for x in res.leaves if x.verdict != "agree" or x.blame] == []
    # Every leaf compared across backends; with one backend, every gradient against the referee (an output or
    # a buffer has nothing to be held against then).
    compared = len(res.leaves) if len(backends) > 1 else sum(1 for x in res.leaves if x.role in ("param", "input"))
    assert res.leaves_compared == compared > 0


SMOKE_CASES = SUITES["smoke"]()


@pytest.mark.parametrize("case", SMOKE_CASES, ids=[c.name for c in SMOKE_CASES])
def test_smoke_case_agrees_on_every_leaf_and_backend(case):
    # Every backend installed (the numpy-only install: the tape and the referee alone); where CI requires a
    # framework (GRADCHECK_REQUIRE, tests/conftest.py) it must be one of them, not quietly left out.
    required = {n for n in os.environ.get("GRADCHECK_REQUIRE", "").split(",") if n in DEFAULT_BACKENDS}
    assert required <= set(INSTALLED), f"required {sorted(required)}, installed {INSTALLED}"
    _agrees(run_case(case, RunOptions(backends=INSTALLED)), INSTALLED)


@pytest.mark.parametrize("case", LAYER_CASES, ids=[c.name for c in LAYER_CASES])
def test_layer_case_tape_gradients_agree_with_the_float64_referee(case):
    # numpy only, so the numpy-only install checks every layer's gradients too: each leaf refereed.
    res = run_case(case.with_(dtype="float64"), RunOptions(backends=("tape",), referee="leaves"))
    _agrees(res, ("tape",))
    grads = [x for x in res.leaves if x.role in ("param", "input")]
    assert grads and all([(c.backend, c.agrees, c.stable) for c in x.referee] == [("tape", True, True)]
                         for x in grads), [(x.path, x.referee) for x in grads]

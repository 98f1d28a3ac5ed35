"""gradcheck.strategies: valid configurations, safe arrays, the CI profile, and a shrinking failure."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis")

from draws import examples  # noqa: E402
from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import gradcheck  # noqa: E402
from gradcheck import strategies as gst  # noqa: E402
from gradcheck.assertions import check_gradients  # noqa: E402
from gradcheck.backends.tape import ops as tape_ops  # noqa: E402
from gradcheck.results import FAILING  # noqa: E402

pytest_plugins = ["pytester"]

# Derandomized in CI by the test profile (tests/conftest.py); a developer widens it with another.
FAST = settings(max_examples=examples(40), deadline=None)


@pytest.mark.parametrize("shape", [(1,), (3, 4), (2, 3, 5, 5), (4, 16, 16)])
def test_kink_free_arrays_are_distinct_float32_exact_and_clear_of_zero(shape):
    x = gst.make_array(shape, seed=3)
    n = x.size
    assert x.shape == shape and x.dtype == np.float32
    step = np.min(np.abs(x))
    assert step > 0 and np.log2(step) == int(np.log2(step))  # a power of two
    assert len(np.unique(x)) == n
    assert np.min(np.diff(np.sort(x.ravel()))) >= step if n > 1 else True
    assert np.max(np.abs(x)) <= 1.0
    assert np.array_equal(x, gst.make_array(shape, seed=3))  # replayable from its seed
    wide = gst.make_array(shape, seed=3, min_gap=0.1)
    assert np.min(np.abs(wide)) >= 0.1


def test_arrays_strategy_draws_the_shape_it_is_given():
    @FAST
    @given(gst.arrays(st.tuples(st.integers(1, 4), st.integers(1, 4))))
    def check(x):
        assert x.ndim == 2 and len(np.unique(x)) == x.size and np.all(x != 0)

    check()


@FAST
@given(gst.layer_cases())
def test_every_drawn_layer_accepts_its_drawn_input(drawn):
    model, (x,) = drawn.model(), drawn.inputs()
    y = model(np.asarray(x, np.float64))  # numpy forward: shapes must be compatible
    assert np.all(np.isfinite(y)) and np.size(y) > 0


@FAST
@given(gst.conv2d_configs())
def test_conv_configs_are_valid_by_construction(config):
    c_in, c_out, kernel = config.args
    kw = dict(config.kwargs)
    assert c_in % kw["groups"] == 0 and c_out % kw["groups"] == 0
    for k, d, p in zip(kernel, kw["dilation"], kw["padding"], strict=True):
        assert 0 <= p <= d * (k - 1) // 2


def test_drawn_tape_gradients_agree_with_the_referee():
    @settings(max_examples=examples(15), deadline=None)
    @given(gst.layer_cases(kinds=("dense", "conv2d", "norm", "pool")))
    def check(drawn):
        gradcheck.assert_gradients_agree(drawn.model(), *drawn.inputs(), backends=("tape",), name="drawn")

    check()


def test_replay_snippet_rebuilds_the_same_model_and_input():
    config = gst.LayerConfig("Conv2d", (2, 4, (3, 1)), (("stride", (1, 2)), ("padding", (1, 0)),
                                                        ("dilation", (1, 1)), ("groups", 2), ("bias", True)),
                             rank=4, features=2, min_spatial=(1, 1))
    drawn = gst.DrawnLayer(config, (1, 2, 3, 4), param_seed=7, input_seed=9)
    code = drawn.replay(backends=("tape",))
    assert "model = L.Conv2d(2, 4, (3, 1), stride=(1, 2), padding=(1, 0), dilation=(1, 1), groups=2, " \
           "bias=True, rng=7)" in code
    assert "x = make_array((1, 2, 3, 4), seed=9, kink_free=True, dtype='float32')" in code
    namespace: dict = {}
    exec(code, namespace)  # runs the check itself, on the tape
    assert np.array_equal(namespace["model"].weight, drawn.model().weight)
    assert np.array_equal(namespace["x"], drawn.inputs()[0])


def test_ci_profile_is_registered():
    profile = settings.get_profile("gradcheck-ci")
    assert profile.derandomize and profile.deadline is None and profile.max_examples <= 50


def test_ci_profile_loads_from_the_command_line(pytester):
    pytester.makepyfile(test_profile='''
        from hypothesis import settings

        def test_profile():
            assert settings.get_current_profile_name() == "gradcheck-ci"
            assert settings.default.derandomize
    ''')
    previous = settings.get_current_profile_name()
    try:  # the inner run is in this process: it loads the profile here too
        pytester.runpytest("-p", "no:cacheprovider", "--hypothesis-profile", "gradcheck-ci").assert_outcomes(passed=1)
    finally:
        settings.load_profile(previous)


def test_wrong_vjp_shrinks_to_the_smallest_dense_layer_and_prints_the_replay(pytester):
    # The tape's gradient of `a + b` w.r.t. b (a Dense bias) is 1.5 times too large.
    pytester.makepyfile(test_wrong='''
        from hypothesis import Phase, given, settings
        import gradcheck
        from gradcheck import ops, strategies as gst
        from gradcheck.backends.tape import ops as tape_ops

        # No explain phase: it traces every line of every re-run, and is not the point here.
        @settings(max_examples=30, deadline=None, derandomize=True, database=None,
                  phases=[Phase.explicit, Phase.generate, Phase.shrink])
        @given(gst.layer_cases(configs=gst.dense_configs(), check_kwargs={"backends": ("tape",)}))
        def test_dense_gradients(drawn):
            original = tape_ops.add.vjps[1]
            tape_ops.add.vjps[1] = lambda g, ans, a, b: ops.mul(original(g, ans, a, b), 1.5)
            try:
                gradcheck.assert_gradients_agree(drawn.model(), *drawn.inputs(), backends=("tape",))
            finally:
                tape_ops.add.vjps[1] = original
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "Falsifying example" in out or "Failing test case" in out  # hypothesis' wording changed
    # Shrunk to one input feature, one output, batch 1, and the seeds to 0: the smallest failing case.
    result.stdout.fnmatch_lines([
        "*replay this example:",
        "*import gradcheck, gradcheck.layers as L",
        "*from gradcheck.strategies import make_array",
        "*model = L.Dense(1, 1, bias=True, rng=0)",
        "*x = make_array((1, 1), seed=0, kink_free=True, dtype='float32')",
        "*gradcheck.assert_gradients_agree(model, x, backends=('tape',))",
    ])
    result.stdout.fnmatch_lines(["*GradientsDisagree: 1/3 leaves disagree: bias (tape vs referee)"])
    assert tape_ops.add.vjps[1](np.ones(2), None, np.ones(2), np.ones(2)).tolist() == [1.0, 1.0]


def test_two_hundred_drawn_layers_agree_across_tape_and_torch():
    """The fuzz bar: 200 hypothesis-drawn configurations, no false alarm (jax: `gradcheck run fuzz`)."""
    pytest.importorskip("torch")

    @settings(max_examples=examples(200), deadline=None)
    @given(gst.layer_cases())
    def check(drawn):
        res = check_gradients(drawn.model(), *drawn.inputs(), backends=("tape", "torch"))
        # A draw whose every gradient is zero on every backend (a relu dead on each input) compares nothing:
        # gradcheck fails such a case as vacuous by design, and for a fuzz of agreement it is another draw's turn.
        assume(res.verdict != "vacuous")
        assert not res.failed, [(x.path, x.verdict, x.message) for x in res.leaves if x.verdict in FAILING]

    check()

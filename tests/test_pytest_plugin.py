"""The pytest plugin and assert_gradients_agree, driven through pytester.

Plumbing tests use the tape backend alone (its gradients are checked
against the float64 referee), so they run without torch or jax; the ones
whose point is blame between backends need torch and skip without it.
In-process pytester runs share this process's imports (torch is imported
once); subprocess runs are used where isolation is the point.
"""

from __future__ import annotations

import json
import re
import textwrap

import numpy as np
import pytest

import gradcheck
import gradcheck.check.runner  # noqa: F401  (imported once here, see below)
import gradcheck.layers as L
from gradcheck import ops
from gradcheck.backends import get_backend
from gradcheck.backends.tape import ops as tape_ops

pytest_plugins = ["pytester"]

# In-process pytester runs drop the modules they imported when they end, and
# hypothesis' plugin imports hypothesis in every run's terminal summary: import
# it (and the runner) here once, or each run pays for it again (hypothesis with
# assertion rewriting, since it is a pytest plugin's distribution).
try:
    import hypothesis  # noqa: F401
except ImportError:
    pass

# A tiny model and input every pytester file starts from; `wrong_bias_vjp`
# scales the tape's gradient of `a + b` w.r.t. b (every Dense bias) by `factor`.
PRELUDE = '''
import numpy as np
import pytest
import gradcheck
import gradcheck.layers as L
from gradcheck import ops
from gradcheck.backends.tape import ops as tape_ops


def model():
    return L.Chain(L.Dense(3, 4, activation=ops.tanh, rng=0), L.Dense(4, 2, rng=1))


X = np.random.default_rng(0).standard_normal((2, 3))


@pytest.fixture
def wrong_bias_vjp(monkeypatch):
    def install(factor):
        original = tape_ops.add.vjps[1]
        monkeypatch.setitem(tape_ops.add.vjps, 1, lambda g, ans, a, b: ops.mul(original(g, ans, a, b), factor))
    return install
'''


def make_tests(pytester, body: str, name: str = "test_checks"):
    return pytester.makepyfile(**{name: PRELUDE + textwrap.dedent(body)})


def small_model():
    return L.Chain(L.Dense(3, 4, activation=ops.tanh, rng=0), L.Dense(4, 2, rng=1))


X = np.random.default_rng(0).standard_normal((2, 3))


@pytest.fixture
def wrong_bias_vjp(monkeypatch):
    def install(factor):
        original = tape_ops.add.vjps[1]
        monkeypatch.setitem(tape_ops.add.vjps, 1, lambda g, ans, a, b: ops.mul(original(g, ans, a, b), factor))
    return install


@pytest.fixture(scope="module")
def torch():
    # Module scope: set up before `pytester`, whose teardown drops every module
    # imported after it started; torch's C extension cannot be imported twice.
    return pytest.importorskip("torch")


def load_json(path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------- assert_gradients_agree itself
def test_agreeing_check_returns_the_case_result():
    m = small_model().eval()
    result = gradcheck.assert_gradients_agree(m, X, backends=("tape",), name="small")
    assert result.name == "small" and result.verdict == "agree"
    assert result.dtype == "float32" and result.mode == "eval"
    assert {leaf.path for leaf in result.leaves} >= {"0.weight", "0.bias", "1.weight", "1.bias", "input"}
    assert m.training is False and m[0].training is False  # the model's mode is left as it was


def test_float64_model_is_checked_in_float64():
    m = L.Dense(3, 2, rng=0)
    m.weight, m.bias = m.weight.astype(np.float64), m.bias.astype(np.float64)
    assert gradcheck.assert_gradients_agree(m, X, backends=("tape",)).dtype == "float64"


def test_failure_message_starts_with_a_summary_line(wrong_bias_vjp):
    wrong_bias_vjp(1.5)
    with pytest.raises(AssertionError) as info:
        gradcheck.assert_gradients_agree(small_model(), X, backends=("tape",), name="small")
    lines = str(info.value).splitlines()
    assert lines[0] == "2/5 leaves disagree: 0.bias (tape vs referee), 1.bias (tape vs referee)"
    assert lines[1].startswith("case 'small': float32, train, seed 0, backends tape")
    header = lines[2].split()
    assert header == ["leaf", "verdict", "blamed", "max", "abs", "max", "rel", "headroom", "message"]
    assert lines[3].split()[:2] == ["0.bias", "disagree"]
    assert "3 other leaves agree" in lines[5]
    assert isinstance(info.value.result, gradcheck.results.CaseResult)


def test_fewer_than_two_installed_backends_fail_with_the_install_hint(monkeypatch):
    monkeypatch.setattr(get_backend("torch"), "available", lambda: (False, "torch is not installed; pip install torch"))
    with pytest.raises(AssertionError, match=r"(?s)needs two backends.*only tape is installed.*pip install torch"):
        gradcheck.assert_gradients_agree(small_model(), X, backends=("tape", "torch"))


def test_a_missing_third_backend_is_skipped_with_a_note(monkeypatch, torch):
    monkeypatch.setattr(get_backend("jax"), "available", lambda: (False, "jax is not installed; pip install jax"))
    result = gradcheck.assert_gradients_agree(small_model(), X)
    assert result.verdict == "agree"
    assert result.unavailable == {"jax": "jax is not installed; pip install jax"}
    assert {p.backend for leaf in result.leaves for p in leaf.pairs} == {"tape"}  # tape vs torch


def test_bad_arguments_name_the_value_and_the_choices():
    with pytest.raises(ValueError, match="unknown backend 'pytorch'; choose from tape, torch, jax"):
        gradcheck.assert_gradients_agree(small_model(), X, backends=("tape", "pytorch"))
    with pytest.raises(ValueError, match="dtype='float16': expected one of float32, float64"):
        gradcheck.assert_gradients_agree(small_model(), X, dtype="float16")
    with pytest.raises(TypeError, match="pass a torch.nn.Module or a gradcheck Module"):
        gradcheck.assert_gradients_agree("not a model", X)  # a function is a jax model (from_jax)


def test_imprecise_reaches_the_case_from_the_call_the_marker_and_the_options(pytester):
    assert gradcheck.assert_gradients_agree(small_model(), X, backends=("tape",), imprecise="fail").imprecise == "fail"
    with pytest.raises(ValueError, match="imprecise='sometimes': expected one of warn, fail"):
        gradcheck.assert_gradients_agree(small_model(), X, imprecise="sometimes")
    pytester.makeini("[pytest]\ngradcheck_imprecise = fail\n")
    make_tests(pytester, '''
        def test_ini(gradcheck):
            assert gradcheck.settings.imprecise == "fail"
            assert gradcheck(model(), X).imprecise == "fail"

        @pytest.mark.gradcheck(imprecise="warn")
        def test_marker(gradcheck):
            assert gradcheck(model(), X).imprecise == "warn"
    ''')
    pytester.runpytest("-p", "no:cacheprovider", "--gradcheck-backends", "tape").assert_outcomes(passed=2)
    result = pytester.runpytest("-p", "no:cacheprovider", "--gradcheck-backends", "tape", "--gradcheck-imprecise",
                                "warn", "-k", "test_ini")
    result.assert_outcomes(failed=1, deselected=1)  # the command line beats the ini file


def test_one_backend_with_the_referee_off_fails_and_says_what_to_enable():
    with pytest.raises(AssertionError, match=r"needs two backends, or one backend and the referee.*"
                                             r"Turn the referee on \(referee='auto'\)"):
        gradcheck.assert_gradients_agree(small_model(), X, backends=("tape",), referee="off")


def test_removed_noise_probe_argument_is_refused():
    with pytest.raises(TypeError, match="noise_probe"):
        gradcheck.assert_gradients_agree(small_model(), X, backends=("tape",), noise_probe="auto")


def test_forward_and_loss_are_the_same_argument():
    m = small_model()
    r = gradcheck.assert_gradients_agree(m, X, backends=("tape",), loss=lambda m, x: ops.sum(m(x) * m(x)))
    assert [leaf.shape for leaf in r.leaves if leaf.path == "output"] == [[]]
    with pytest.raises(TypeError, match="not both"):
        gradcheck.assert_gradients_agree(m, X, forward=lambda m, x: m(x), loss=lambda m, x: m(x))


# ---------------------------------------------------------------- the plugin, through pytester
def test_loading_the_plugin_imports_neither_torch_nor_jax(pytester):
    pytester.makepyfile(test_load='''
        import sys
        import numpy as np
        import gradcheck, gradcheck.layers as L

        def test_plugin_is_loaded_and_frameworks_are_not(request):
            assert request.config.pluginmanager.hasplugin("gradcheck")
            assert "torch" not in sys.modules and "jax" not in sys.modules
            gradcheck.assert_gradients_agree(L.Dense(2, 2, rng=0), np.ones((1, 2)))  # tape, from the option
            assert "torch" not in sys.modules and "jax" not in sys.modules
    ''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                                           "--gradcheck-backends", "tape")
    result.assert_outcomes(passed=1)


def test_passing_check_and_the_fixture_follow_the_command_line(pytester):
    make_tests(pytester, '''
        def test_module_function():
            result = gradcheck.assert_gradients_agree(model(), X)
            assert result.backends == ["tape"] and result.dtype == "float64" and result.seed == 3

        def test_fixture(gradcheck):
            assert gradcheck.settings.backends == ("tape",) and gradcheck.settings.seed == 3
            assert gradcheck(model(), X).verdict == "agree"
            assert gradcheck.check(model(), X, dtype="float32").dtype == "float32"  # the call wins
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider", "--gradcheck-backends", "tape",
                                "--gradcheck-dtype", "float64", "--gradcheck-seed", "3")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*- gradcheck -*", "3 gradient check(s), 0 failed"])


def test_failing_check_names_the_leaf_and_the_backend(torch, pytester):
    make_tests(pytester, '''
        def test_wrong_bias_gradient(wrong_bias_vjp):
            wrong_bias_vjp(1.5)
            gradcheck.assert_gradients_agree(model(), X, backends=("tape", "torch"))
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    first = re.search(r"^E\s+gradcheck\.assertions\.GradientsDisagree: (.*)$", out, re.M)
    assert first, out
    assert first.group(1) == "2/6 leaves disagree: 0.bias (tape), 1.bias (tape)"
    assert re.search(r"^E\s+1\.bias\s+disagree\s+tape\s+", out, re.M), out
    assert "replay: pytest test_checks.py::test_wrong_bias_gradient" in out
    # The helpers' frames are hidden: the traceback ends in the test itself.
    assert "assertions.py" not in out and "runner.py" not in out
    assert re.search(r"^test_checks\.py:\d+: GradientsDisagree$", out, re.M), out


def test_marker_overrides_the_command_line(pytester):
    make_tests(pytester, '''
        @pytest.mark.gradcheck(backends=["tape"], dtype="float64", seed=5)
        def test_marked(gradcheck):
            assert gradcheck.settings.backends == ("tape",)
            result = gradcheck(model(), X)
            assert (result.backends, result.dtype, result.seed) == (["tape"], "float64", 5)

        @pytest.mark.gradcheck(seed=7)
        class TestClass:
            @pytest.mark.gradcheck(seed=8)
            def test_closest_marker_wins(self, gradcheck):
                assert gradcheck.settings.seed == 8 and gradcheck.settings.backends == ("jax",)

            def test_class_marker(self, gradcheck):
                assert gradcheck.settings.seed == 7

        @pytest.mark.gradcheck(rtl=1e-3)
        def test_typo():
            pass
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider", "--strict-markers", "--gradcheck-backends", "jax")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.re_match_lines([r".*test_typo: @pytest.mark.gradcheck: unknown setting\(s\) \['rtl'\]; "
                                  r"allowed: backends, dtype, seed, rtol, atol, referee, mode, imprecise, unavailable, order, steps, "
                                  r"optimizer, lr$"])
    assert "pytest_plugin.py" not in result.stdout.str()


def test_marker_rtol_lets_a_mildly_off_gradient_pass(torch, pytester):
    # float64, tape vs torch: a bias gradient off by 1e-6 (relative) breaks the
    # default rtol 1e-7 but is within the referee's 1e-5, so rtol alone decides.
    make_tests(pytester, '''
        def f64():
            m = model()
            for layer in m.layers:
                layer.weight, layer.bias = layer.weight.astype(np.float64), layer.bias.astype(np.float64)
            return m

        def test_default_tolerance(wrong_bias_vjp):
            wrong_bias_vjp(1 + 1e-6)
            gradcheck.assert_gradients_agree(f64(), X)

        @pytest.mark.gradcheck(rtol=1e-4)
        def test_loose_marker(wrong_bias_vjp):
            wrong_bias_vjp(1 + 1e-6)
            result = gradcheck.assert_gradients_agree(f64(), X)
            bias = next(leaf for leaf in result.leaves if leaf.path == "1.bias")
            assert bias.tolerance.rtol == 1e-4 and "gradcheck marker" in bias.tolerance.rule
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider", "--gradcheck-backends", "tape,torch")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*GradientsDisagree: 2/6 leaves disagree: 0.bias (unresolved), 1.bias (unresolved)"])


def test_ini_options_and_usage_errors(pytester):
    pytester.makeini("[pytest]\ngradcheck_backends = tape\ngradcheck_rtol = 0.01\n")
    make_tests(pytester, '''
        def test_ini(gradcheck):
            assert gradcheck.settings.backends == ("tape",) and gradcheck.settings.rtol == 0.01
    ''')
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    bad = pytester.runpytest("-p", "no:cacheprovider", "--gradcheck-backends", "tape,pytorch")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*unknown backend 'pytorch'; choose from tape, torch, jax*"])


def test_pyproject_settings_and_tolerance_rules_apply(pytester):
    pytester.makepyprojecttoml('''
        [tool.gradcheck]
        backends = ["tape"]
        seed = 4
        dtype = "both"  # for `gradcheck run`; an assertion keeps its own dtype

        [[tool.gradcheck.tolerance.rules]]
        leaf = "*.bias"
        rtol = 0.5
        name = "biases are loose here"
    ''')
    make_tests(pytester, '''
        def test_settings(gradcheck):
            assert gradcheck.settings.backends == ("tape",) and gradcheck.settings.seed == 4
            result = gradcheck(model(), X)
            bias = next(leaf for leaf in result.leaves if leaf.path == "1.bias")
            assert "biases are loose here" in bias.tolerance.rule
    ''')
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


REPORTED = '''
    def test_one():
        gradcheck.assert_gradients_agree(model(), X)

    def test_two_checks():
        gradcheck.assert_gradients_agree(model(), X)
        gradcheck.assert_gradients_agree(model(), X * 2, name="doubled")

    def test_broken(wrong_bias_vjp):
        wrong_bias_vjp(1.5)
        gradcheck.assert_gradients_agree(model(), X)

    def test_without_checks():
        pass
'''


def test_json_report_holds_every_check_of_the_session(pytester):
    make_tests(pytester, REPORTED)
    result = pytester.runpytest("-p", "no:cacheprovider", "--gradcheck-backends", "tape",
                                "--gradcheck-json", "out/report.json")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["4 gradient check(s), 1 failed", "json report: *out*report.json"])
    data = load_json(pytester.path / "out" / "report.json")
    assert data["schema"].startswith("gradcheck.results/")
    assert [(c["name"], c["verdict"]) for c in data["cases"]] == [
        ("test_checks.py::test_one", "agree"),
        ("test_checks.py::test_two_checks", "agree"),
        ("doubled", "agree"),
        ("test_checks.py::test_broken", "disagree"),
    ]
    assert data["env"]["tests"] == ["test_checks.py::test_one", "test_checks.py::test_two_checks",
                                    "test_checks.py::test_broken"]
    assert data["cases"][3]["replay"].startswith("pytest test_checks.py::test_broken --gradcheck-backends tape")
    assert gradcheck.results.load(pytester.path / "out" / "report.json").cases[3].first_disagreement == "1.bias"


def test_html_junit_and_markdown_reports(pytester):
    # No skip: a plugin whose reports cannot be rendered is broken, not unsupported.
    make_tests(pytester, REPORTED)
    result = pytester.runpytest("-p", "no:cacheprovider", "--gradcheck-backends", "tape",
                                "--gradcheck-html", "r/report.html", "--gradcheck-junit", "r/junit.xml",
                                "--gradcheck-markdown", "r/summary.md")
    result.assert_outcomes(passed=3, failed=1)
    html = (pytester.path / "r" / "report.html").read_text(encoding="utf-8")
    junit = (pytester.path / "r" / "junit.xml").read_text(encoding="utf-8")
    for name in ("test_checks.py::test_one", "doubled", "test_checks.py::test_broken"):
        assert name in html and name in junit
    assert "1.bias" in html
    assert (pytester.path / "r" / "summary.md").read_text(encoding="utf-8").strip()


def test_a_report_path_that_cannot_be_written_is_refused_before_the_tests_run(pytester):
    make_tests(pytester, "def test_one():\n    raise AssertionError('ran')\n")
    pytester.makefile(".txt", blocker="a file where the report's folder should be")
    pytester.mkdir("somefolder")
    for flag, path, why in [("--gradcheck-json", "blocker.txt/report.json", "blocker.txt is a file, not a folder"),
                            ("--gradcheck-html", "somefolder", "is a folder")]:
        result = pytester.runpytest("-p", "no:cacheprovider", "--gradcheck-backends", "tape", flag, path)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"*gradcheck: {flag} *{path}*{why}*"])
        assert "ran" not in result.stdout.str()


def test_a_report_that_fails_to_be_written_at_the_end_fails_the_session(pytester, monkeypatch):
    from gradcheck.app import output

    def broken(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output, "write_atomic", broken)  # in this process: the in-process run sees it
    make_tests(pytester, "def test_one():\n    gradcheck.assert_gradients_agree(model(), X)\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--gradcheck-backends", "tape",
                                "--gradcheck-json", "out/report.json")
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(["*could not write the json report to *report.json: OSError*No space left*"])


def test_an_interrupted_session_says_so_in_its_report(pytester):
    make_tests(pytester, '''
        def test_one():
            gradcheck.assert_gradients_agree(model(), X)

        def test_interrupt():
            raise KeyboardInterrupt

        def test_never():
            gradcheck.assert_gradients_agree(model(), X)
    ''')
    # no_reraise_ctrlc: the inner session's Ctrl-C must not stop this one.
    result = pytester.runpytest("-p", "no:cacheprovider", "--gradcheck-backends", "tape",
                                "--gradcheck-json", "report.json", no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    data = load_json(pytester.path / "report.json")
    assert data["interrupted"] is True
    assert [c["name"] for c in data["cases"]] == ["test_checks.py::test_one"]


def test_xdist_workers_send_their_checks_and_the_controller_writes_one_report(pytester):
    pytest.importorskip("xdist")
    make_tests(pytester, '''
        import os

        from gradcheck.app.pytest_plugin import _STATE

        @pytest.mark.parametrize("i", range(8))
        def test_check(i, request):
            assert request.config.stash[_STATE].worker  # so it never writes a report itself
            worker = os.environ.get("PYTEST_XDIST_WORKER", "controller")
            gradcheck.assert_gradients_agree(model(), X * (i + 1), name=f"check{i}@{worker}")
    ''')
    # (hypothesis' plugin off: each worker would import and assertion-rewrite all of hypothesis)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "xdist",
                                           "-n", "2",
                                           "--gradcheck-backends", "tape", "--gradcheck-json", "report.json")
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines(["8 gradient check(s), 0 failed"])
    cases = load_json(pytester.path / "report.json")["cases"]
    names = [c["name"].split("@")[0] for c in cases]
    assert names == [f"check{i}" for i in range(8)]  # every check, in collection order
    assert {c["name"].split("@")[1] for c in cases} == {"gw0", "gw1"}


def test_property_test_adds_one_case_to_the_report(pytester):
    pytest.importorskip("hypothesis")
    make_tests(pytester, '''
        from hypothesis import given, settings, strategies as st

        @settings(max_examples=5, deadline=None, database=None)
        @given(st.floats(0.5, 2.0))
        def test_scaled(s):
            gradcheck.assert_gradients_agree(model(), X * s)
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider", "--gradcheck-backends", "tape",
                                "--gradcheck-json", "report.json")
    result.assert_outcomes(passed=1)
    assert [c["name"] for c in load_json(pytester.path / "report.json")["cases"]] == ["test_checks.py::test_scaled"]


# ---------------------------------------------------------------- suites as pytest items
SUITE = '''
import gradcheck.layers as L
from gradcheck.case import Case


def cases(seed=0, dtype=None):
    return [Case(f"dense_{n}", lambda rng, n=n: L.Dense(n, 2, rng=rng),
                 lambda rng, n=n: (rng.standard_normal((2, n)),), seed=seed, dtype=dtype or "float32")
            for n in (1, 2, 3)]
'''


def test_suite_option_collects_one_item_per_case(pytester):
    pytester.makepyfile(tinysuite=SUITE)
    pytester.syspathinsert()
    collected = pytester.runpytest("-p", "no:cacheprovider", "--co", "-q", "--gradcheck-suite", "tinysuite:cases")
    collected.stdout.fnmatch_lines(["gradcheck/tinysuite:cases::dense_1", "gradcheck/tinysuite:cases::dense_2",
                                    "gradcheck/tinysuite:cases::dense_3", "3 tests collected*"])
    result = pytester.runpytest("-p", "no:cacheprovider", "--gradcheck-suite", "tinysuite:cases", "-m", "gradcheck",
                                "--gradcheck-backends", "tape", "--gradcheck-json", "r.json", "-k", "not dense_2")
    result.assert_outcomes(passed=2, deselected=1)
    cases = load_json(pytester.path / "r.json")["cases"]
    assert [(c["name"], c["dtype"]) for c in cases] == [("dense_1", "float32"), ("dense_3", "float32")]
    assert cases[0]["replay"] == "gradcheck run tinysuite:cases --backends tape --dtype float32 -k dense_1"


def test_failing_suite_case_reports_the_summary_not_a_traceback(pytester, wrong_bias_vjp):
    pytester.makepyfile(tinysuite=SUITE)
    pytester.syspathinsert()
    wrong_bias_vjp(1.5)  # in this process: the in-process run below sees it
    result = pytester.runpytest("-p", "no:cacheprovider", "--gradcheck-suite", "tinysuite:cases",
                                "--gradcheck-backends", "tape", "-k", "dense_2")
    result.assert_outcomes(failed=1, deselected=2)
    result.stdout.fnmatch_lines(["*_ gradcheck tinysuite:cases: dense_2 _*", "1/3 leaves disagree: bias (tape vs referee)",
                                 "case 'dense_2': float32, train, seed 0, backends tape*"])
    assert "Traceback" not in result.stdout.str()


def test_builtin_smoke_suite_collects_its_cases(pytester):
    # No skip: the smoke suite is part of gradcheck; if it is gone, this must fail.
    from gradcheck.app import targets

    names = [c.name for c in targets.resolve(["smoke"])]
    result = pytester.runpytest("-p", "no:cacheprovider", "--co", "-q", "--gradcheck-suite", "smoke")
    result.stdout.fnmatch_lines([f"gradcheck/smoke::{names[0]}", f"{len(names)} tests collected*"])


def test_pyargs_collects_the_builtin_suites(pytester, monkeypatch):
    import gradcheck.suites

    monkeypatch.syspath_prepend(str(pytester.path))
    pytester.makepyfile(tinysuite=SUITE)
    import tinysuite

    monkeypatch.setattr(gradcheck.suites, "SUITES", {"tiny": tinysuite.cases}, raising=False)
    result = pytester.runpytest("-p", "no:cacheprovider", "--co", "-q", "--pyargs", "gradcheck.suites")
    result.stdout.fnmatch_lines(["*::tiny::dense_1", "*::tiny::dense_2", "*::tiny::dense_3", "3 tests collected*"])
    monkeypatch.delitem(__import__("sys").modules, "tinysuite")


def test_every_settings_layer_is_checked_and_named(pytester):
    make_tests(pytester, "def test_one():\n    pass\n")
    pytester.makeini("[pytest]\ngradcheck_seed = 1.5\n")
    bad = pytester.runpytest("-p", "no:cacheprovider")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*gradcheck: tox.ini: gradcheck_seed = 1.5: must be a non-negative integer*"])
    (pytester.path / "tox.ini").unlink()
    pytester.makepyprojecttoml('''
        [tool.gradcheck]
        seed = "abc"
    ''')
    bad = pytester.runpytest("-p", "no:cacheprovider")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(['*pyproject.toml: seed = "abc": must be a non-negative integer*'])
    (pytester.path / "pyproject.toml").unlink()
    bad = pytester.runpytest("-p", "no:cacheprovider", "--gradcheck-rtol", "nan")
    bad.stderr.fnmatch_lines(["*--gradcheck-rtol nan: must be a finite number >= 0*"])

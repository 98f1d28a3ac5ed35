"""Usage errors: every bad target, setting, option or path is exit 2 with a message that names it.

Never a traceback, never exit 3 (that is gradcheck's own bug), and a path
that cannot be written is refused before the first case runs.  Also the
settings layers themselves, targets named together, the current folder as
an import root, and refusing a check that compares nothing.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gradcheck
from gradcheck.app import targets
from gradcheck.app.cli import Progress, main
from gradcheck.backends import get_backend
from gradcheck.check import runner
from gradcheck.results import CaseResult, LeafResult, RunResult, dumps

REPO = Path(__file__).resolve().parent.parent
TARGET = "tests.test_cli:tiny_cases"


@pytest.fixture(autouse=True)
def _in_tmp(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.chdir(tmp_path)
    # Loading a target may put the working folder on sys.path; keep that to this test.
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture
def never_runs(monkeypatch):
    """Fail loudly if a case would run: the error must come before the run."""

    def run(*args, **kwargs):
        raise AssertionError("the run started although its options were invalid")

    monkeypatch.setattr(runner, "run", run)


def usage_error(capsys, *argv) -> str:
    code = main(list(argv))
    captured = capsys.readouterr()
    assert code == 2, (code, captured.err, captured.out)
    assert "Traceback" not in captured.err and "internal error" not in captured.err, captured.err
    return captured.err


def write_module(tmp_path, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    sys.modules.pop(name, None)
    return name


# ---------------------------------------------------------------- targets
CASES = '''
import gradcheck.layers as L
from gradcheck.case import Case


def build(rng):
    return L.Dense(3, 2, rng=rng)


def inputs(rng):
    return (rng.standard_normal((2, 3)),)


def cases():
    return [Case("mine", build, inputs)]
'''

BAD_TARGETS = [
    ("raises_on_import", "raise RuntimeError('no GPU here')\n", "cases", ["raises_on_import", "no GPU here"]),
    ("syntax_error", "def cases(:\n    pass\n", "cases", ["syntax_error", "SyntaxError", "syntax_error.py:1"]),
    ("needs_args", "def cases(n_layers, width):\n    return []\n", "cases", ["needs argument(s) n_layers, width"]),
    ("raises", "def cases():\n    raise KeyError('width')\n", "cases", ["cases() raised KeyError", "'width'"]),
    ("empty_list", "def cases():\n    return []\n", "cases", ["empty", "non-empty list"]),
    ("typo", "def cases():\n    return []\n", "casse", ["no attribute 'casse'", "did you mean cases"]),
    ("bad_import", "import no_such_dependency_xyz\n", "cases", ["importing 'bad_import' failed",
                                                                "no_such_dependency_xyz"]),
]


@pytest.mark.parametrize("module, body, attr, needles", BAD_TARGETS, ids=[t[0] for t in BAD_TARGETS])
def test_a_target_that_cannot_give_cases_is_a_usage_error_naming_it(module, body, attr, needles, tmp_path, capsys,
                                                                    never_runs, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))  # importable anyway: this is about what importing it gives
    write_module(tmp_path, module, body)
    err = usage_error(capsys, "run", f"{module}:{attr}", "--backends", "tape")
    assert f"target '{module}:{attr}'" in err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("target", [":ok", "mod:", "a b:c", "mod:1x"])
def test_a_malformed_target_says_what_a_target_looks_like(target, capsys, never_runs):
    err = usage_error(capsys, "run", target, "--backends", "tape")
    assert repr(target) in err and "package.module:function" in err


def test_a_module_in_the_current_folder_is_a_target(tmp_path, capsys):
    # `gradcheck run mycases:cases` next to mycases.py, as pytest and `python -m` import it.
    assert str(tmp_path) not in sys.path
    write_module(tmp_path, "mycases_here", CASES)
    assert main(["run", "mycases_here:cases", "--backends", "tape", "--no-html", "-q"]) == 0
    assert "mine" in capsys.readouterr().out


def test_the_console_script_and_python_m_run_a_module_of_the_current_folder(tmp_path):
    write_module(tmp_path, "mycases_sub", CASES)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for command in (["gradcheck"], [sys.executable, "-m", "gradcheck"]):
        done = subprocess.run(command + ["run", "mycases_sub:cases", "--backends", "tape", "--no-html", "-q"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        assert "mine" in done.stdout


def test_suites_named_together_run_each_shared_case_once():
    smoke, layers = targets.resolve(["smoke"]), targets.resolve(["layers"])
    shared = {c.name for c in smoke} & {c.name for c in layers}
    assert shared, "smoke picks rows of the layers suite; this test needs some"
    both = targets.resolve(["smoke", "layers"])
    names = [c.name for c in both]
    assert len(names) == len(set(names))
    assert set(names) == {c.name for c in smoke} | {c.name for c in layers}
    assert targets.resolve(["smoke", "smoke"]) and len(targets.resolve(["smoke", "smoke"])) == len(smoke)


def test_two_different_cases_under_one_name_name_both_targets(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    write_module(tmp_path, "clash_a", CASES)
    write_module(tmp_path, "clash_b", CASES.replace("L.Dense(3, 2, rng=rng)", "L.Dense(3, 5, rng=rng)"))
    assert len(targets.resolve(["clash_a:cases", "clash_a:cases"])) == 1  # the same case twice: once
    with pytest.raises(targets.TargetError, match=r"two different cases are named 'mine' \(from targets "
                                                  r"'clash_a:cases' and 'clash_b:cases'\)"):
        targets.resolve(["clash_a:cases", "clash_b:cases"])


def test_dtype_float64_checks_cases_in_float64_under_no_float32_name(tmp_path):
    for target in ("smoke", "mlp"):
        f64 = targets.resolve([target], targets.Request(dtype="float64"))
        assert {c.dtype for c in f64} == {"float64"}
        assert not any(c.name.endswith("-float32") for c in f64), [c.name for c in f64]
    own = write_module(tmp_path, "own_cases", CASES) + ":cases"
    f64 = targets.resolve([own], targets.Request(dtype="float64"))
    assert [(c.name, c.dtype) for c in f64] == [("mine", "float64")]  # renamed by nobody


# ---------------------------------------------------------------- [tool.gradcheck]
BAD_CONFIG = [
    ("backends = 3", "backends = 3"),
    ('backends = ["tape", 3]', "backends"),
    ('backends = "tape,theano"', "theano"),
    ('seed = "abc"', 'seed = "abc"'),
    ("seed = 1.5", "seed = 1.5"),
    ("seed = -5", "seed = -5"),
    ("seed = true", "seed = true"),
    ('mode = "test"', 'mode = "test"'),
    ('dtype = "float16"', 'dtype = "float16"'),
    ('referee = "always"', 'referee = "always"'),
    ('imprecise = "maybe"', 'imprecise = "maybe"'),
    ("output = 5", "output = 5"),
    ('rtol = "big"', 'rtol = "big"'),
    ("rtol = -1", "rtol = -1"),
    ("atol = nan", "atol = NaN"),
    ('referee_budget_s = "long"', "referee_budget_s"),
    ("tolerance = 3", "tolerance = 3"),
    ('noise_probe = "auto"', "noise_probe"),  # removed: an unknown key now
]


@pytest.mark.parametrize("line, needle", BAD_CONFIG, ids=[c[0] for c in BAD_CONFIG])
def test_a_wrong_config_value_names_the_file_and_the_key(line, needle, tmp_path, capsys, never_runs):
    (tmp_path / "pyproject.toml").write_text(f"[tool.gradcheck]\n{line}\n")
    err = usage_error(capsys, "run", TARGET)
    assert "pyproject.toml" in err and needle in err, err


def test_a_config_file_given_with_config_is_checked_the_same(tmp_path, capsys, never_runs):
    (tmp_path / "gc.toml").write_text('seed = "abc"\n')
    assert 'seed = "abc"' in usage_error(capsys, "run", TARGET, "--config", "gc.toml")
    (tmp_path / "folder.toml").mkdir()
    assert "folder.toml: a folder" in usage_error(capsys, "run", TARGET, "--config", "folder.toml")


# ---------------------------------------------------------------- flags
BAD_FLAGS = [
    (["--batch", "-1"], "--batch -1: must be a positive integer"),
    (["--batch", "0"], "--batch 0: must be a positive integer"),
    (["--batch", "two"], "--batch two: must be a positive integer"),
    (["--seed", "-5"], "--seed -5: must be a non-negative integer"),
    (["--seed", "1.5"], "--seed 1.5: must be a non-negative integer"),
    (["--rtol", "-1"], "--rtol -1: must be a finite number >= 0"),
    (["--rtol", "nan"], "--rtol nan: must be a finite number >= 0"),
    (["--atol", "inf"], "--atol inf: must be a finite number >= 0"),
    (["--dtype", "float16"], "--dtype float16: expected one of float32, float64, both"),
    (["--mode", "test"], "--mode test: expected one of train, eval"),
    (["--referee", "always"], "--referee always: expected one of auto, leaves, joint, off"),
    (["--imprecise", "maybe"], "--imprecise maybe: expected one of warn, fail"),
    (["--backends", ","], "--backends ,: names no backend"),
    (["--shard", "0/3"], "--shard 0/3: I must be between 1 and N"),
]


@pytest.mark.parametrize("flags, needle", BAD_FLAGS, ids=[" ".join(f[0]) for f in BAD_FLAGS])
def test_a_wrong_flag_value_says_what_it_must_be(flags, needle, capsys, never_runs):
    assert needle in usage_error(capsys, "run", "mlp", *flags)


def test_removed_noise_probe_flag_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", TARGET, "--noise-probe", "tape"])
    assert exit_.value.code == 2 and "--noise-probe" in capsys.readouterr().err


# ---------------------------------------------------------------- output paths
def test_output_paths_are_checked_before_the_run(tmp_path, capsys, never_runs):
    (tmp_path / "afile").write_text("not a folder")
    (tmp_path / "somefolder").mkdir()
    assert "--output afile: is a file" in usage_error(capsys, "run", TARGET, "--backends", "tape",
                                                      "--output", "afile")
    assert "--results somefolder: is a folder" in usage_error(capsys, "run", TARGET, "--backends", "tape",
                                                              "--results", "somefolder")
    assert "--json afile/x.json: afile is a file" in usage_error(capsys, "run", TARGET, "--backends", "tape",
                                                                 "--json", "afile/x.json")
    if Path("/proc").is_dir():
        assert "--html /proc/x.html: cannot write in /proc" in usage_error(capsys, "run", TARGET, "--backends",
                                                                           "tape", "--html", "/proc/x.html")
    (tmp_path / "pyproject.toml").write_text('[tool.gradcheck]\noutput = "afile"\n')
    assert "--output afile: is a file" in usage_error(capsys, "run", TARGET, "--backends", "tape")


# ---------------------------------------------------------------- report and diff inputs
def _stored(tmp_path, name, cases) -> Path:
    path = tmp_path / name
    path.write_text(dumps(RunResult(env={"seed": 0}, cases=cases)))
    return path


@pytest.mark.parametrize("text", ["garbage, not JSON\n", "[1, 2, 3]\n", '{"a": 1}\n', "", '"just a string"\n',
                                  '{"schema": "gradcheck.results/2", "cases": 5}\n'])
def test_report_on_something_that_is_not_results_names_the_file(text, tmp_path, capsys):
    (tmp_path / "what.json").write_text(text)
    err = usage_error(capsys, "report", "what.json")
    assert "what.json" in err and "results" in err
    good = _stored(tmp_path, "good.json", [CaseResult(name="a", verdict="agree")])
    assert "what.json" in usage_error(capsys, "diff", str(good), "what.json")


def test_report_on_a_folder_names_it(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    assert "'runs' is a folder" in usage_error(capsys, "report", "runs")


def test_diff_counts_a_vanished_case_as_a_change_for_the_worse(tmp_path, capsys):
    leaf = LeafResult(path="w", role="param", verdict="agree")
    base = _stored(tmp_path, "base.json", [CaseResult(name="a", verdict="agree", leaves=[leaf]),
                                           CaseResult(name="b", verdict="agree", leaves=[leaf])])
    new = _stored(tmp_path, "new.json", [CaseResult(name="a", verdict="agree", leaves=[leaf])])
    assert main(["diff", str(base), str(new)]) == 1
    out = capsys.readouterr().out
    assert "! b" in out and "case no longer run" in out


# ---------------------------------------------------------------- nothing to compare
def test_one_backend_with_the_referee_off_is_refused_up_front(capsys, never_runs):
    err = usage_error(capsys, "run", TARGET, "--backends", "tape", "--referee", "off")
    assert "needs two backends, or one backend and the referee" in err
    assert "--referee auto" in err and "--backends tape,torch" in err


def test_only_one_installed_framework_is_refused_with_what_to_install(monkeypatch, capsys, never_runs):
    for name in ("torch", "jax"):
        monkeypatch.setattr(get_backend(name), "available",
                            lambda name=name: (False, f"{name} is not installed; pip install {name}"))
    err = usage_error(capsys, "run", TARGET)
    assert "of tape, torch, jax only tape is installed" in err
    assert "pip install torch" in err and "pip install jax" in err and "--backends tape alone" in err


def test_the_assertion_and_the_command_share_the_rule():
    import numpy as np

    import gradcheck.layers as L
    from gradcheck.app import settings as S

    with pytest.raises(gradcheck.assertions.GradientsDisagree,
                       match=r"needs two backends, or one backend and the referee.*backends=\('tape',\) with "
                             r"referee='off' compares nothing"):
        gradcheck.assert_gradients_agree(L.Dense(3, 2, rng=0), np.ones((2, 3)), backends=["tape"], referee="off")
    with pytest.raises(S.NothingToCompare, match=r"--backends tape with --referee off compares nothing"):
        S.require_comparison(("tape",), "off", cli=True)
    assert S.require_comparison(("tape",), "auto") == ("tape",)


# ---------------------------------------------------------------- shards, interruption
def test_an_empty_shard_exits_zero_with_a_note(capsys, never_runs):
    assert main(["run", TARGET, "--backends", "tape", "--shard", "29/30"]) == 0
    err = capsys.readouterr().err
    assert "shard 29/30 has no case (2 case(s) over 30 shards)" in err


def test_an_interrupted_run_records_what_was_planned(monkeypatch, tmp_path, capsys):
    real = runner.run_case
    calls = []

    def run_case(case, options=None):
        calls.append(case.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(case, options)

    monkeypatch.setattr(runner, "run_case", run_case)
    assert main(["run", TARGET, "--backends", "tape", "--json", "out.json", "--no-html", "-q"]) == 130
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["interrupted"] is True and data["planned"] == 2
    assert [c["name"] for c in data["cases"]] == ["tiny-a"]
    assert "interrupted after 1 of 2 case(s)" in capsys.readouterr().err


# ---------------------------------------------------------------- the settings layers
def test_settings_stack_in_order_and_each_layer_names_its_tolerance_rule():
    from gradcheck.app import settings as S

    config = S.from_values({"seed": 3, "rtol": 1e-3, "backends": ["tape", "torch"]}, "pyproject.toml",
                           spell=S.spell_toml, allowed=tuple(S.KEYS))
    flags = S.from_values({"seed": "4", "atol": "1e-6", "dtype": "both", "rtol": ""}, "gradcheck run",
                          spell=S.spell_flag(), text=True)
    call = S.from_values({"rtol": 0.5, "imprecise": "fail"}, "assert_gradients_agree")
    merged = call.over(flags.over(config))
    assert (merged.seed, merged.rtol, merged.atol, merged.dtype, merged.backends, merged.imprecise) == (
        4, 0.5, 1e-6, "float32", ("tape", "torch"), "fail")
    assert [name for _, _, name in merged.overrides] == ["pyproject.toml", "gradcheck run", "assert_gradients_agree"]
    tol = merged.rules().resolve("w", "float64")
    assert tol.rtol == 0.5 and tol.atol == 1e-6
    assert S.from_values({"backends": "", "seed": None}, "here", text=True) == S.Settings()


@pytest.mark.parametrize("values, needle", [
    ({"seed": "2"}, "seed='2': must be a non-negative integer"),  # typed places take typed values
    ({"seed": True}, "seed=True"),
    ({"rtol": float("nan")}, "rtol=nan: must be a finite number"),
    ({"backends": ("tape", "pytorch")}, "unknown backend 'pytorch'; choose from tape, torch, jax"),
    ({"dtype": "float16"}, "dtype='float16': expected one of float32, float64"),
    ({"rtl": 1e-3}, "unknown setting(s) ['rtl']; allowed: backends, dtype"),
    ({"output": "x"}, "unknown setting(s) ['output']"),  # a run's setting, not a check's
])
def test_settings_refuse_what_they_cannot_use(values, needle):
    from gradcheck.app import settings as S

    with pytest.raises(S.SettingsError) as info:
        S.from_values(values, "here")
    assert needle in str(info.value) and str(info.value).startswith("here: ")


def test_the_default_backends_are_the_runners():
    from gradcheck.app import settings as S

    assert S.Settings().backends_or_default() == runner.DEFAULT_BACKENDS


def test_assert_gradients_agree_is_public():
    assert "assert_gradients_agree" in gradcheck.__all__


# ---------------------------------------------------------------- progress lines reach CI logs
class _Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("stream", [io.StringIO, _Tty])
def test_progress_lines_are_sanitised_and_fit_the_terminal(stream, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = stream()
    progress = Progress(1, stream=out)
    name = "evil\n::error file=x::boom \x1b[31m" + "x" * 100
    progress.case_start(0, 1, type("C", (), {"name": name})())
    progress.case_done(0, 1, CaseResult(name=name, verdict="agree"))
    progress.close()
    text = out.getvalue()
    assert "\x1b" not in text
    lines = [ln for chunk in text.split("\n") for ln in chunk.split("\r")]
    assert not any(ln.lstrip().startswith("::") for ln in lines)
    assert all(len(ln) < 80 for ln in lines if not ln.startswith("[1/1]"))

"""The gradcheck command: targets, options, outputs, exit codes, list/report/diff."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET

import pytest

import gradcheck.layers as L
from gradcheck import ops, results
from gradcheck.app.cli import main
from gradcheck.backends.tape import ops as tape_ops
from gradcheck.case import Case


def tiny_cases():
    """A target for `gradcheck run tests.test_cli:tiny_cases` (how a library points at its models)."""

    def build(rng):
        return L.Chain(L.Dense(3, 4, activation=ops.tanh, rng=rng), L.Dense(4, 2, rng=rng))

    inputs = lambda rng: (rng.standard_normal((2, 3)),)  # noqa: E731
    return [Case("tiny-a", build, inputs, seed=1), Case("tiny-b", build, inputs, seed=2)]


def one_case():
    return tiny_cases()[0]


def not_a_case():
    return 42


TARGET = "tests.test_cli:tiny_cases"


@pytest.fixture(autouse=True)
def _importable(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    monkeypatch.chdir(tmp_path)


def run_cli(*argv):
    return main(list(argv))


def test_run_writes_every_output_and_exits_zero(tmp_path, capsys):
    code = run_cli("run", TARGET, "--backends", "tape", "--json", "out.json", "--junit", "out.xml",
                   "--markdown", "out.md")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "tiny-a" in out and "tiny-b" in out
    assert (tmp_path / "gradcheck-report" / "report.html").is_file()
    stored = results.load(tmp_path / "gradcheck-report" / "results.jsonl")
    assert [c.name for c in stored.cases] == ["tiny-a", "tiny-b"]
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["schema"].startswith("gradcheck.results/") and len(data["cases"]) == 2
    ET.parse(tmp_path / "out.xml")
    assert "tiny-a" in (tmp_path / "out.md").read_text()
    assert stored.cases[0].replay == f"gradcheck run {TARGET} --backends tape --dtype float32 -k tiny-a"


def test_disagreement_exits_one_and_names_leaf_and_backend(monkeypatch, capsys):
    pytest.importorskip("torch")
    wrong = lambda g, ans, a, b: tape_ops.unbroadcast(ops.mul(g, 1.5), tape_ops._shape(b))  # noqa: E731
    monkeypatch.setitem(tape_ops.add.vjps, 1, wrong)
    code = run_cli("run", "tests.test_cli:one_case", "--backends", "tape,torch", "--no-html")
    out = capsys.readouterr().out
    assert code == 1
    # Each disagreeing leaf's own line names whom it blames (the case line names every backend that ran).
    blamed = dict(re.findall(r"^\S+ DISAGREE tiny-a :: (\S+) — .*?; blamed: ([\w, ]+) \(", out, re.M))
    assert blamed == {"0.bias": "tape", "1.bias": "tape"}, out


def test_keyword_and_shard_select_cases(capsys):
    assert run_cli("run", TARGET, "--backends", "tape", "-k", "TINY-B", "--no-html") == 0
    out = capsys.readouterr().out
    assert "tiny-b" in out and "tiny-a" not in out
    assert run_cli("run", TARGET, "--backends", "tape", "--shard", "1/2", "--no-html") == 0
    out = capsys.readouterr().out
    assert "tiny-a" in out and "tiny-b" not in out


@pytest.mark.parametrize("argv, needle", [
    (["run", "no_such_model"], "no_such_model"),
    (["run", TARGET, "--backends", "tape,theano"], "theano"),
    (["run", TARGET, "--shard", "3/2"], "--shard"),
    (["run", TARGET, "--shard", "x"], "I/N"),
    (["run", TARGET, "--input-shape", "3xfoo"], "--input-shape"),
    (["run", "tests.test_cli:not_a_case"], "not_a_case"),
    (["run", "tests.test_cli:missing_fn"], "missing_fn"),
    (["run", "no_such_pkg.mod:fn"], "no_such_pkg"),
    (["run", TARGET, "-k", "zzz"], "zzz"),
    (["run", TARGET, "--config", "nope.toml"], "nope.toml"),
    (["run", TARGET, "--imprecise", "sometimes"], "--imprecise sometimes"),
    (["report", "missing.jsonl"], "missing.jsonl"),
])
def test_usage_errors_exit_two_and_name_the_problem(argv, needle, capsys):
    assert run_cli(*argv) == 2
    err = capsys.readouterr().err
    assert needle in err, err


def test_bad_config_names_file_and_key(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text("[tool.gradcheck]\nbackend = ['tape']\n")
    assert run_cli("run", TARGET) == 2
    err = capsys.readouterr().err
    assert "backend" in err and "pyproject.toml" in err
    (tmp_path / "pyproject.toml").write_text("[tool.gradcheck\n")
    assert run_cli("run", TARGET) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_config_supplies_defaults_and_flags_override(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text('[tool.gradcheck]\nbackends = ["tape"]\ndtype = "float64"\nseed = 7\n')
    assert run_cli("run", TARGET, "--no-html", "--json", "a.json") == 0
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["env"]["seed"] == 7
    assert {c["dtype"] for c in data["cases"]} == {"float64"}
    assert set(data["cases"][0]["backends"]) == {"tape"}
    assert run_cli("run", TARGET, "--no-html", "--json", "b.json", "--seed", "3") == 0
    assert json.loads((tmp_path / "b.json").read_text())["env"]["seed"] == 3


def test_imprecise_flag_and_config_reach_every_case(tmp_path):
    def policies(path):
        return {c["imprecise"] for c in json.loads((tmp_path / path).read_text())["cases"]}

    assert run_cli("run", TARGET, "--backends", "tape", "--no-html", "--json", "a.json", "-q") == 0
    assert policies("a.json") == {"warn"}
    (tmp_path / "pyproject.toml").write_text('[tool.gradcheck]\nimprecise = "fail"\n')
    assert run_cli("run", TARGET, "--backends", "tape", "--no-html", "--json", "b.json", "-q") in (0, 1)
    assert policies("b.json") == {"fail"}
    assert run_cli("run", TARGET, "--backends", "tape", "--imprecise", "warn", "--no-html", "--json", "c.json",
                   "-q") == 0
    assert policies("c.json") == {"warn"}


def test_dtype_sets_each_cases_dtype_and_keeps_its_name(tmp_path):
    # float32 (and its old alias both) checks in float64 and measures float32: one case each.
    for dtype in ("float32", "both", "float64"):
        assert run_cli("run", TARGET, "--backends", "tape", "--dtype", dtype, "--no-html", "--json", "a.json",
                       "-q") == 0
        data = json.loads((tmp_path / "a.json").read_text())
        expected = "float64" if dtype == "float64" else "float32"
        assert [(c["name"], c["dtype"]) for c in data["cases"]] == [("tiny-a", expected), ("tiny-b", expected)]


def test_report_rerenders_and_diff_flags_a_changed_leaf(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    assert run_cli("run", TARGET, "--backends", "tape,torch", "--results", "base.jsonl", "--no-html") == 0
    wrong = lambda g, ans, a, b: tape_ops.unbroadcast(ops.mul(g, 1.5), tape_ops._shape(b))  # noqa: E731
    monkeypatch.setitem(tape_ops.add.vjps, 1, wrong)
    assert run_cli("run", TARGET, "--backends", "tape,torch", "--results", "new.jsonl", "--no-html") == 1
    capsys.readouterr()
    assert run_cli("report", "new.jsonl", "--html", "again.html", "--junit", "again.xml") == 1
    assert "0.bias" in (tmp_path / "again.html").read_text()
    assert run_cli("diff", "base.jsonl", "new.jsonl") == 1
    out = capsys.readouterr().out
    assert "0.bias" in out and "agree -> disagree" in out
    assert run_cli("diff", "base.jsonl", "base.jsonl") == 0
    assert "no changes" in capsys.readouterr().out


def test_list_shows_backends_with_versions(capsys):
    assert run_cli("list", "backends") == 0
    out = capsys.readouterr().out
    assert "tape" in out and "torch" in out and "jax" in out


def test_list_shows_models_and_suites(capsys):
    assert run_cli("list") == 0
    out = capsys.readouterr().out
    assert "resnet18" in out and "smoke" in out and "Conv2d" in out


def test_console_script_entry_point_is_installed():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "gradcheck"]
    assert ep.value == "gradcheck.app.cli:command"


def test_importing_gradcheck_does_not_import_torch_or_jax():
    import subprocess

    code = "import gradcheck, gradcheck.layers, gradcheck.app.cli, sys; print('torch' in sys.modules, 'jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]

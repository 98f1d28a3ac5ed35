"""Reproducers of a ``from_jax`` origin (``gradcheck.repro``, ``gradcheck.frontends.jax.replay``): the origin is a call
of the user's custom rule, and the folder holds its data and a script that imports the rule by its import path
and replays the call with jax alone.  The scripts run here in a fresh, isolated interpreter where gradcheck
cannot be imported, with the user's package (``tests/jax_models.py``, ``tests/jax_rule_models.py``) on its path
or not, next to a clean control whose script reports agreement.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("torch")

import jax_models as jm  # noqa: E402
import jax_rule_models as jr  # noqa: E402
from isolated import run_scripts  # noqa: E402

from gradcheck import repro  # noqa: E402
from gradcheck.check import runner  # noqa: E402
from gradcheck.check.runner import RunOptions, run_case  # noqa: E402
from gradcheck.frontends.jax import from_jax  # noqa: E402

TESTS = str(Path(__file__).resolve().parent)  # the "user's package": the models' modules live here

def run_script(script: Path, cwd: Path, package: bool = True) -> tuple[int, str]:
    """One reproducer, run where gradcheck cannot be imported, with the user's package on its path or not."""
    (code, text), = run_scripts([script], cwd, [TESTS] if package else [], timeout=300).values()
    return code, text


def distances(text: str, leaf: str) -> dict[str, float]:
    """``{backend: max_rel}`` from the line under ``RESULT <leaf>``: jax's gradient now against each recorded one."""
    block = text.split(f"RESULT {leaf} ", 1)[1].split("\nRESULT ", 1)[0]
    line = re.search(r"jax now vs each backend's recorded value: (.*)", block).group(1)
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"(\w+) max_abs=\S+ max_rel=([^;\s]+)", line)}


def check(make, folder: Path, **options):
    target, args, kwargs = make()
    return run_case(from_jax(target, *args, **kwargs, dtype="float64"),
                    RunOptions(repeat=False, repro=str(folder), **options))


@pytest.fixture(scope="module")
def wrong_vjp(tmp_path_factory):
    """The plain-jax model whose custom_vjp scales a's gradient by (1 + 1e-3), run with --repro."""
    folder = tmp_path_factory.mktemp("repro")
    res = check(jm.make_jax_wrong_vjp, folder)
    return res, folder


# ---------------------------------------------------------------- a wrong custom_vjp
def test_a_wrong_custom_vjp_writes_the_rules_data_and_a_jax_script(wrong_vjp):
    res, folder = wrong_vjp
    assert res.verdict == "disagree" and res.origin is not None and res.origin.path == "scaled_tanh"
    d = folder / "plain_model_wrong_vjp" / "scaled_tanh"
    assert any(str(d) in note for note in res.notes), res.notes
    assert sorted(p.name for p in d.iterdir()) == ["README.md", "layer.npz", "meta.json", "repro_jax.py"]
    meta = json.loads((d / "meta.json").read_text())
    # The object the model calls, not the correct rule made by the same factory (same code, another bwd).
    assert meta["import_path"] == "jax_models:scaled_tanh_wrong", meta
    assert (meta["rule"], meta["function"], meta["blame"], meta["unsupported"]) == ("custom_vjp", "scaled_tanh",
                                                                                   ["jax"], "")
    assert meta["args"] == {"tuple": [{"leaf": 0}, {"leaf": 1}]} and meta["operands"] == ["input.0", "input.1"]
    data = np.load(d / "layer.npz")
    for name in ("input.0", "input.1"):
        for what in ("reference", "tape", "torch", "jax"):
            assert data[f"{what}.{name}"].dtype == np.float64
    assert {"input.0", "input.1", "cotangent.0", "reference.output"} <= set(data.files)
    # What gradcheck stored: jax's gradient of a is 1e-3 off the tape's and torch's, which agree.
    np.testing.assert_allclose(data["jax.input.1"], (1 + 1e-3) * data["torch.input.1"], rtol=1e-9)
    np.testing.assert_allclose(data["tape.input.1"], data["torch.input.1"], rtol=1e-12)
    script = (d / "repro_jax.py").read_text()
    assert not re.search(r"^\s*(import|from)\s+gradcheck", script, re.M)
    assert "jax_models:scaled_tanh_wrong" in (d / "README.md").read_text()


def test_the_script_replays_the_rule_with_jax_alone_and_reports_it_off_the_tape_and_torch(wrong_vjp, tmp_path):
    _, folder = wrong_vjp
    code, text = run_script(folder / "plain_model_wrong_vjp" / "scaled_tanh" / "repro_jax.py", tmp_path)
    assert code == 1, text  # jax's gradient disagrees with the reference now: the bug reproduces
    assert "replaying jax_models:scaled_tanh_wrong with jax.vjp" in text
    assert "RESULT input.0 agree" in text and "RESULT input.1 disagree" in text and "RESULT output agree" in text
    far = distances(text, "input.1")
    assert far["tape"] == pytest.approx(1e-3, rel=0.01) and far["torch"] == pytest.approx(1e-3, rel=0.01), far
    assert far["jax"] < 1e-12, far  # the same gradient jax gave gradcheck
    assert max(distances(text, "input.0").values()) < 1e-10
    # The primal's finite difference sides with the tape and torch, not with the rule.
    fd = dict(re.findall(r"(\w+)'s recorded gradient gives \S+ \(relative difference (\S+)\)", text))
    assert float(fd["tape"]) < 1e-6 and float(fd["torch"]) < 1e-6 and float(fd["jax"]) > 1e-4, fd
    assert "SUMMARY jax DISAGREES" in text


def test_without_the_users_package_the_script_prints_the_stored_numbers(wrong_vjp, tmp_path):
    _, folder = wrong_vjp
    code, text = run_script(folder / "plain_model_wrong_vjp" / "scaled_tanh" / "repro_jax.py", tmp_path,
                            package=False)
    assert code == 2, text
    assert "cannot import jax_models:scaled_tanh_wrong (ModuleNotFoundError" in text
    assert "STORED input.1 disagree blame=jax" in text and "index (2,): reference" in text


# ---------------------------------------------------------------- a custom_jvp inside a flax module
def test_a_wrong_custom_jvp_in_a_linen_module_is_replayed_by_its_import_path(tmp_path):
    res = check(jr.make_smooth_mlp, tmp_path / "repro")
    assert res.origin is not None and res.origin.path == "SmoothMLP/smooth_relu" and res.origin.blame == ["jax"]
    d = tmp_path / "repro" / "SmoothMLP" / "SmoothMLP_smooth_relu"
    meta = json.loads((d / "meta.json").read_text())
    assert meta["import_path"] == "jax_rule_models:smooth_relu" and meta["rule"] == "custom_jvp", meta
    code, text = run_script(d / "repro_jax.py", tmp_path)
    assert code == 1, text
    far = distances(text, "input.0")  # x's gradient carries the rule's error; scale's is right
    assert far["tape"] == pytest.approx(1e-3, rel=0.01) and far["jax"] < 1e-12, far
    assert "RESULT input.1 agree" in text


# ---------------------------------------------------------------- a rule no import path names
def test_a_rule_made_inside_the_forward_gets_a_script_that_says_why_it_cannot_replay_it(tmp_path):
    res = check(jr.make_inner, tmp_path / "repro")
    assert res.origin is not None and res.origin.path == "times" and res.origin.blame == ["jax"]
    d = tmp_path / "repro" / "make_inner_rule" / "times"
    meta = json.loads((d / "meta.json").read_text())
    assert meta["import_path"] == "" and "no module-level name holds the rule times" in meta["unsupported"]
    assert "no module-level name" in (d / "README.md").read_text()
    code, text = run_script(d / "repro_jax.py", tmp_path)
    assert code == 2, text
    assert "cannot replay times with jax here: no module-level name" in text
    assert "STORED input.1 disagree blame=jax" in text


# ---------------------------------------------------------------- the clean control
def test_a_correct_model_writes_no_reproducer_and_a_replay_of_its_rule_agrees(monkeypatch, tmp_path):
    seen = {}
    original = runner.CaseRun

    def capture(case):
        seen["cr"] = original(case)
        return seen["cr"]

    monkeypatch.setattr(runner, "CaseRun", capture)  # only to hand the CaseRun back
    res = check(jm.make_jax_function, tmp_path / "repro", per_layer=True, keep_replays=True)
    assert res.verdict == "agree" and res.origin is None
    assert not (tmp_path / "repro").exists() or not any((tmp_path / "repro").iterdir())
    # Asked for every replayed call, the correct rule's script runs and agrees.
    folders = repro.write_repro(tmp_path / "all", seen["cr"], res, calls="all")
    assert [f.name for f in folders] == ["scaled_tanh"]
    meta = json.loads((folders[0] / "meta.json").read_text())
    assert meta["import_path"] == "jax_models:scaled_tanh"
    code, text = run_script(folders[0] / "repro_jax.py", tmp_path)
    assert code == 0, text
    assert "RESULT input.0 agree" in text and "RESULT input.1 agree" in text
    assert max(distances(text, "input.1").values()) < 1e-10
    assert "SUMMARY jax agrees with the float64 reference on every leaf" in text

"""jax's persistent compilation cache: on by default in a per-user folder, chosen by ``cache_dir``, and never wrong.

A cached executable is looked up by jax's key of the lowered program itself, so it is handed back only for the
identical program: a fault injected into a jax op lowers to another program and is caught, and a clean control
run after it is served from the cache.  A second process with the same folder reads what the first one compiled
and writes nothing new; ``--no-cache`` writes nothing.  The session runs with the cache off (tests/conftest.py);
every test here uses folders of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from faults import wrong_bias_gradient

import gradcheck.layers as L
from gradcheck import ops
from gradcheck.app import settings as S
from gradcheck.app.cli import main
from gradcheck.backends.jax import driver as jax_driver
from gradcheck.case import Case
from gradcheck.check.runner import RunOptions, run_case
from gradcheck.results import to_dict

ENV = ("GRADCHECK_CACHE_DIR", "GRADCHECK_NO_CACHE", "JAX_COMPILATION_CACHE_DIR", "JAX_ENABLE_COMPILATION_CACHE",
       "XDG_CACHE_HOME")
HITS = "/jax/compilation_cache/cache_hits"


@pytest.fixture(autouse=True)
def _session_cache_restored():
    """Each test leaves the driver as the session has it: no setting of its own, so the cache off."""
    yield
    jax_driver.use_compile_cache(None)


def entries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.name.endswith("-cache")} if folder.is_dir() else set()


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ENV}
    env.update(extra)
    return env


# ---------------------------------------------------------------- where the folder comes from
def test_the_default_folder_is_per_user(monkeypatch, tmp_path):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert jax_driver.default_cache_folder() == str(tmp_path / ".cache" / "gradcheck" / "jax")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jax_driver.default_cache_folder() == str(tmp_path / "xdg" / "gradcheck" / "jax")
    monkeypatch.setattr(sys, "platform", "darwin")
    assert jax_driver.default_cache_folder() == str(tmp_path / "Library" / "Caches" / "gradcheck" / "jax")


def test_the_setting_comes_before_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("GRADCHECK_NO_CACHE")
    monkeypatch.setenv("GRADCHECK_CACHE_DIR", str(tmp_path / "env"))
    assert jax_driver.cache_choice(None) == jax_driver.CacheChoice(str(tmp_path / "env"), "GRADCHECK_CACHE_DIR")
    assert jax_driver.cache_choice(str(tmp_path / "set"), "--cache-dir").folder == str(tmp_path / "set")
    assert jax_driver.cache_choice(False, "--no-cache") == jax_driver.CacheChoice(None, "--no-cache")
    monkeypatch.setenv("GRADCHECK_NO_CACHE", "1")
    assert jax_driver.cache_choice(None) == jax_driver.CacheChoice(None, "GRADCHECK_NO_CACHE")
    assert jax_driver.cache_choice("~/c", "--cache-dir").folder == os.path.expanduser("~/c")


@pytest.mark.parametrize("how", ["environment", "config"])
def test_jax_own_cache_configuration_is_left_as_it_is(tmp_path, how):
    pytest.importorskip("jax")
    own, default = tmp_path / "own", tmp_path / "xdg"
    env = clean_env(XDG_CACHE_HOME=str(default))
    if how == "environment":
        env["JAX_COMPILATION_CACHE_DIR"] = str(own)
        user = ""
    else:
        user = f"jax.config.update('jax_compilation_cache_dir', {str(own)!r})"
    script = f"""
import jax
{user}
from gradcheck.backends.jax import driver
jax = driver.configure_jax()
print(driver.cache_choice().source, jax.config.jax_compilation_cache_dir,
      jax.config.jax_persistent_cache_min_compile_time_secs)
"""
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["jax", str(own), "1.0"]  # jax's own threshold too
    assert not default.exists()


def test_a_default_folder_that_cannot_be_written_warns_and_jax_compiles_without_it(monkeypatch, tmp_path):
    jax = pytest.importorskip("jax")
    jax_driver.configure_jax()
    (tmp_path / "afile").write_text("")
    monkeypatch.delenv("GRADCHECK_NO_CACHE")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "afile"))
    with pytest.warns(jax_driver.CacheWarning, match=r"the default folder .*afile/gradcheck/jax cannot be written.*"
                                                     r"--no-cache"):
        assert jax_driver.use_compile_cache(None).source == "default"
    assert jax.config.jax_compilation_cache_dir is None and not jax.config.jax_enable_compilation_cache


# ---------------------------------------------------------------- the setting
def test_cache_dir_is_a_setting_of_the_config_file():
    read = lambda v: S.from_values({"cache_dir": v}, "pyproject.toml", spell=S.spell_toml, allowed=tuple(S.KEYS))
    assert read("~/ci-cache").cache_dir == "~/ci-cache"
    assert read(False).cache_dir is False
    for bad in (True, "", 3):
        with pytest.raises(S.SettingsError, match=r"pyproject.toml: cache_dir = .*must be a folder.*cache_dir = false"):
            read(bad)
    assert S.Settings(cache_dir=False).over(S.Settings(cache_dir="x")).cache_dir is False


def test_a_cache_dir_that_is_a_file_is_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    assert main(["run", "smoke", "-k", "mlp", "--backends", "tape", "--cache-dir", "afile", "--no-html"]) == 2
    err = capsys.readouterr().err
    assert "--cache-dir afile: afile is a file, not a folder; choose another path" in err and "--no-cache" in err
    (tmp_path / "pyproject.toml").write_text('[tool.gradcheck]\ncache_dir = "afile/sub"\n')
    assert main(["run", "smoke", "-k", "mlp", "--backends", "tape", "--no-html"]) == 2
    assert "pyproject.toml: cache_dir = afile/sub: afile is a file" in capsys.readouterr().err
    assert not (tmp_path / "gradcheck-report").exists()  # refused before the first case


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a folder this user cannot write in")
def test_a_cache_dir_that_cannot_be_written_is_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    assert main(["run", "smoke", "-k", "mlp", "--backends", "tape", "--cache-dir", str(locked), "--no-html"]) == 2
    assert f"--cache-dir {locked}: cannot write in {locked}" in capsys.readouterr().err


def test_no_cache_and_cache_dir_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "smoke", "--cache-dir", "x", "--no-cache"])
    assert exc.value.code == 2 and "not allowed with" in capsys.readouterr().err


# ---------------------------------------------------------------- a cached program is never the wrong one
def _model(rng):
    return L.Chain(L.Dense(3, 4, activation=ops.tanh, rng=rng), L.Dense(4, 2, rng=rng))


CASE = Case("dense_chain", _model, lambda rng: (rng.standard_normal((2, 3)),))


@contextlib.contextmanager
def served_from(folder: Path):
    """``check(case) -> (result, programs read from folder, entries in folder)``, with nothing compiled in this
    process reused: only the folder can serve a program."""
    jax = pytest.importorskip("jax")
    hits = []
    listener = lambda event, **kw: hits.append(event) if event == HITS else None  # noqa: E731
    jax.monitoring.register_event_listener(listener)
    try:
        jax_driver.use_compile_cache(str(folder), "--cache-dir")
        jax_driver.configure_jax()
        options = RunOptions(backends=("tape", "jax"), repeat=False)

        def check(case=CASE):
            jax.clear_caches()
            hits.clear()
            return run_case(case, options), len(hits), entries(folder)

        yield check
    finally:
        jax.monitoring.unregister_event_listener(listener)


def test_a_faulty_op_is_compiled_anew_and_caught_and_the_clean_program_is_served(tmp_path, monkeypatch):
    with served_from(tmp_path) as check:
        clean, clean_hits, filled = check()
        assert clean.verdict == "agree" and filled and clean_hits == 0

        wrong_bias_gradient(monkeypatch, "jax")
        faulty, _, after_fault = check()
        assert faulty.verdict == "disagree"
        assert {x.path for x in faulty.leaves if x.verdict == "disagree"} == {"0.bias", "1.bias"}
        assert all(x.blame == ["jax"] for x in faulty.leaves if x.verdict == "disagree")
        assert after_fault > filled  # the faulty programs were compiled, and stored under keys of their own

        monkeypatch.undo()
        control, control_hits, after_control = check()
        assert control.verdict == "agree" and control_hits >= 2  # float32 and float64 programs from the folder
        assert after_control == after_fault  # nothing compiled anew
        assert to_dict(control)["leaves"] == to_dict(clean)["leaves"]  # the served executables compute what the compiled ones did


def test_another_seed_is_served_the_same_programs_and_still_catches_a_fault(tmp_path, monkeypatch):
    """The loss's cotangents, drawn from the case seed, are inputs of jax's programs, not constants in them: a
    second seed is served the first seed's float32 and float64 executables with its own cotangents, and agrees with
    the tape (served the first seed's cotangents, jax's gradients would not); a wrong gradient injected into jax
    at a third seed is compiled anew and blamed on jax."""
    with served_from(tmp_path) as check:
        first, first_hits, filled = check(dataclasses.replace(CASE, seed=0))
        assert first.verdict == "agree" and first_hits == 0 and filled
        second, second_hits, after = check(dataclasses.replace(CASE, seed=1))
        assert second.verdict == "agree" and second.leaves_compared == first.leaves_compared
        assert second_hits >= 2 and after == filled  # both programs from the folder, nothing compiled anew
        grads = lambda res: [x.norms["jax"] for x in res.leaves if x.role == "param"]  # noqa: E731
        assert grads(second) != grads(first)  # the control: another seed, other gradients

        wrong_bias_gradient(monkeypatch, "jax")
        faulty, _, after_fault = check(dataclasses.replace(CASE, seed=2))
        assert faulty.verdict == "disagree" and after_fault > filled
        assert {x.path for x in faulty.leaves if x.verdict == "disagree"} == {"0.bias", "1.bias"}
        assert all(x.blame == ["jax"] for x in faulty.leaves if x.verdict == "disagree")


# ---------------------------------------------------------------- across processes
RUN = f"""
import sys
import jax.monitoring
hits = []
jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event) if event == {HITS!r} else None)
from gradcheck.app.cli import main
rc = main(sys.argv[1:])
print("hits", len(hits))
sys.exit(rc)
"""


def gradcheck_run(tmp_path, *flags, **env):
    pytest.importorskip("jax")
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", RUN, "run", "smoke", "-k", "mlp", "--backends", "tape,jax", "-q", "--no-html",
           "--output", str(out), *flags]
    done = subprocess.run(cmd, env=clean_env(**env), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    hits = int(done.stdout.rsplit("hits", 1)[1].split()[0])
    cases = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()][1:]
    return hits, [c["case"]["leaves"] for c in cases]


def test_a_second_process_reads_what_the_first_compiled(tmp_path):
    folder = tmp_path / "xdg" / "gradcheck" / "jax"  # the default folder, then the same one given as --cache-dir
    cold_hits, cold = gradcheck_run(tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    filled = entries(folder)
    assert filled and cold_hits == 0
    warm_hits, warm = gradcheck_run(tmp_path, "--cache-dir", str(folder))
    assert warm_hits >= 2 and entries(folder) == filled  # read, and nothing new compiled or written
    assert warm == cold


def test_no_cache_writes_nothing(tmp_path):
    folder = tmp_path / "cache"
    hits, _ = gradcheck_run(tmp_path, "--no-cache", GRADCHECK_CACHE_DIR=str(folder),
                            XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert hits == 0 and not entries(folder) and not entries(tmp_path / "xdg" / "gradcheck" / "jax")

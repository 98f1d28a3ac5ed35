"""A case that would not fit in memory is refused before it runs (gradcheck.check.memory), and only then."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradcheck.app.cli import main
from gradcheck.check import memory, runner
from gradcheck.layers.models import MODELS

ROOT = Path(__file__).resolve().parent.parent

# One case in a fresh process, as run_case runs it (memory check off): its facts and the process's peak.
MEASURE = r"""
import json, resource, sys
from gradcheck.check import memory, runner
from gradcheck.layers.models import MODELS
seen = {}
inner = runner._run_backends
def run_backends(cr, options, res):
    seen.update(vars(memory.facts_of(cr)))
    return inner(cr, options, res)
runner._run_backends = run_backends
res = runner.run_case(MODELS[sys.argv[1]].case(), runner.RunOptions(memory_limit=float("inf")))
# This process's own high-water mark: ru_maxrss also keeps the RSS of the process that forked it (Linux carries
# it across exec), so a child of a large pytest process would report the parent's size.
try:
    with open("/proc/self/status") as fh:
        peak = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
except OSError:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
print(json.dumps({"facts": seen, "backends": len(res.timings), "verdict": res.verdict, "peak": peak}))
"""


@pytest.mark.parametrize("model", ["mlp", "lenet5"])
def test_estimate_is_within_its_stated_error_of_the_measured_peak(model):
    pytest.importorskip("torch")  # the estimate is calibrated on all three backends
    pytest.importorskip("jax")
    env = {**os.environ, "GRADCHECK_NO_CACHE": "1"}  # compiling is part of a first run's peak
    done = subprocess.run([sys.executable, "-c", MEASURE, model], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["verdict"] == "agree" and out["backends"] == 3, out
    est = memory.estimate(memory.Facts(**out["facts"]), out["backends"])
    ratio = est.total / out["peak"]
    low, high = memory.STATED_ERROR
    assert low <= ratio <= high, (f"{model}: estimate {memory.gib(est.total)} is {ratio:.2f}x the measured peak "
                                  f"{memory.gib(out['peak'])}; the stated error is {low}x..{high}x")


def mlp_case(**kw):
    return MODELS["mlp"].case(**kw)


def fixed_room(monkeypatch, limit_bytes: float):
    monkeypatch.setattr(memory, "available", lambda: memory.Room(limit_bytes, f"{memory.gib(limit_bytes)} available"))


def estimate_of(case, backends: int = 3):
    """The estimate run_case makes for ``case`` (from the built case's facts)."""
    return memory.estimate(memory.facts_of(runner.CaseRun(case)), backends)


def test_a_case_is_refused_when_memory_is_short_and_the_message_says_why_and_what_to_do(monkeypatch):
    fixed_room(monkeypatch, 200 * memory.MIB)
    res = runner.run_case(mlp_case())
    assert res.verdict == "error"
    assert not res.timings, "a refused case must not reach any backend"
    message = res.errors["case"]
    assert "estimated peak" in message and "200 MiB available" in message
    ways = ["--batch N", "--memory-limit GiB", "--memory-limit off"]
    if len(memory._runnable(runner.RunOptions().backends)) > 2:  # fewer backends is a way out only with three
        ways.append("--backends torch,jax")
    for way in ways:
        assert way in message, way
    assert "saves" in message


def test_the_same_case_runs_and_agrees_with_ample_memory(monkeypatch):
    fixed_room(monkeypatch, 1024 * memory.GIB)
    res = runner.run_case(mlp_case())
    assert res.verdict == "agree", res.errors
    assert not any(n.startswith("memory:") for n in res.notes)


def test_a_case_near_the_limit_runs_with_a_note(monkeypatch):
    est = estimate_of(mlp_case())
    fixed_room(monkeypatch, est.total / 0.9)  # the estimate is 90% of what is there
    res = runner.run_case(mlp_case())
    assert res.verdict == "agree", res.errors
    assert [n for n in res.notes if n.startswith("memory:") and "90%" in n], res.notes


def test_the_main_term_is_named():
    wide = memory.Facts(parameters=50_000_000, inputs=10, activations=1000, dtype="float32")
    deep = memory.Facts(parameters=1000, inputs=10, activations=2_000_000_000, dtype="float32")
    assert memory.estimate(wide, 3).main_term() == "parameters"
    assert memory.estimate(deep, 3).main_term() == "activations"
    room = memory.Room(2 * memory.GIB, "2 GiB available")
    assert "most of it is parameters" in memory._judge(wide, room, ("tape", "torch", "jax"), True).refusal
    assert "most of it is activations" in memory._judge(deep, room, ("tape", "torch", "jax"), True).refusal


def test_fewer_backends_lower_the_estimate_and_float64_does_not_raise_it():
    facts = memory.Facts(parameters=10_000_000, inputs=1000, activations=10_000_000, dtype="float32")
    f32 = memory.estimate(facts, 3).total
    assert memory.estimate(facts, 2).total < f32
    # A float32 case's float32 gradients are measured as they return (runner._measured32): it holds as many
    # copies as the float64 case, whose second call is a float64 copy.  So --dtype float64 is no way out of a
    # refusal, and the refusal does not offer it.
    assert memory.estimate(memory.replace(facts, dtype="float64"), 3).total == f32
    assert estimate_of(mlp_case(dtype="float64")).total <= estimate_of(mlp_case()).total


def test_a_refusal_does_not_offer_float64_which_saves_nothing(monkeypatch):
    fixed_room(monkeypatch, 200 * memory.MIB)
    message = runner.run_case(mlp_case()).errors["case"]
    assert "Ways out" in message and "--dtype float64" not in message


def test_the_override_lets_a_refused_case_run(monkeypatch):
    fixed_room(monkeypatch, 100 * memory.MIB)
    assert runner.run_case(mlp_case()).verdict == "error"
    assert runner.run_case(mlp_case(), runner.RunOptions(memory_limit=math.inf)).verdict == "agree"
    assert runner.run_case(mlp_case(), runner.RunOptions(memory_limit=64.0)).verdict == "agree"


def test_a_refused_case_does_not_stop_the_run(monkeypatch):
    small = estimate_of(mlp_case())
    fixed_room(monkeypatch, small.total * 1.5)
    big = mlp_case(hidden=(4096, 4096, 4096), name="big")  # ~34 M parameters: over the room
    result = runner.run([big, mlp_case()])
    assert [c.verdict for c in result.cases] == ["error", "agree"]
    assert "estimated peak" in result.cases[0].errors["case"]


def test_an_estimate_that_fails_is_a_note_and_the_case_runs(monkeypatch):
    def broken(*_):
        raise RuntimeError("boom")

    monkeypatch.setattr(memory, "facts_of", broken)
    fixed_room(monkeypatch, 100 * memory.MIB)
    res = runner.run_case(mlp_case())
    assert res.verdict == "agree"
    assert any("the estimate failed (RuntimeError: boom)" in n for n in res.notes)


# ---------------------------------------------------------------- what is available
def fake_files(monkeypatch, files: dict[str, str]):
    monkeypatch.setattr(memory, "_read", lambda path: files.get(path))


MEMINFO = "MemTotal:       33554432 kB\nMemFree:  1000 kB\nMemAvailable:   10485760 kB\n"  # 32 GiB, 10 available


def test_available_is_meminfo_without_a_cgroup_limit(monkeypatch):
    fake_files(monkeypatch, {"/proc/meminfo": MEMINFO, "/proc/self/status": "VmRSS:\t1048576 kB\n"})
    room = memory.available()
    assert room.limit == 11 * memory.GIB  # 10 available + the 1 this process holds


def test_a_cgroup_v2_limit_smaller_than_meminfo_wins(monkeypatch):
    fake_files(monkeypatch, {"/proc/meminfo": MEMINFO, "/proc/self/status": "VmRSS:\t0 kB\n",
                             "/proc/self/cgroup": "0::/job\n",
                             "/sys/fs/cgroup/job/memory.max": str(4 * memory.GIB),
                             "/sys/fs/cgroup/job/memory.current": str(3 * memory.GIB),
                             "/sys/fs/cgroup/job/memory.stat": f"anon 1\ninactive_file {memory.GIB}\n"})
    assert memory.available().limit == 2 * memory.GIB  # 4 - (3 - 1 reclaimable)


def test_a_cgroup_v1_limit_is_read_too(monkeypatch):
    fake_files(monkeypatch, {"/proc/meminfo": MEMINFO, "/proc/self/status": "VmRSS:\t0 kB\n",
                             "/proc/self/cgroup": "4:memory:/job\n",
                             "/sys/fs/cgroup/memory/job/memory.limit_in_bytes": str(4 * memory.GIB),
                             "/sys/fs/cgroup/memory/job/memory.usage_in_bytes": str(memory.GIB)})
    assert memory.available().limit == 3 * memory.GIB


def test_an_unlimited_cgroup_leaves_meminfo(monkeypatch):
    fake_files(monkeypatch, {"/proc/meminfo": MEMINFO, "/proc/self/status": "VmRSS:\t0 kB\n",
                             "/sys/fs/cgroup/memory.max": "max", "/sys/fs/cgroup/memory.current": "5"})
    assert memory.available().limit == 10 * memory.GIB


def test_nothing_is_refused_where_memory_cannot_be_read(monkeypatch):
    fake_files(monkeypatch, {})
    assert memory.available() is None
    res = runner.run_case(mlp_case())
    assert res.verdict == "agree" and not any(n.startswith("memory:") for n in res.notes)


# ---------------------------------------------------------------- the command line
def test_the_cli_exits_non_zero_for_a_refused_case(tmp_path):
    # --backends tape: one that is always installed, so that the run is refused for memory and nothing else
    done = subprocess.run([sys.executable, "-m", "gradcheck", "run", "mlp", "--backends", "tape", "--memory-limit",
                           "0.01", "--no-html",
                           "--output", str(tmp_path / "out")], capture_output=True, text=True, cwd=tmp_path,
                          timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    case = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()][1]["case"]
    assert case["verdict"] == "error"
    assert "would not fit in memory" in case["errors"]["case"] and "memory_limit setting of 0.01 GiB" in \
        case["errors"]["case"]


@pytest.mark.parametrize("value", ["0", "-1", "lots", "nan", "inf"])
def test_a_bad_memory_limit_exits_two_and_says_what_it_takes(value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "mlp", f"--memory-limit={value}"]) == 2
    err = capsys.readouterr().err
    assert f"--memory-limit {value}: must be a number of GiB > 0" in err and "or off" in err
    assert "Traceback" not in err


def test_memory_limit_reaches_the_runner_from_the_flag_and_the_config(tmp_path, monkeypatch):
    from gradcheck.app import settings as S
    from gradcheck.app.cli import build_parser, run_settings

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.gradcheck]\nmemory_limit = 6\n")
    args = build_parser().parse_args(["run", "mlp"])
    assert run_settings(args).run_options().memory_limit == 6.0
    args = build_parser().parse_args(["run", "mlp", "--memory-limit", "off"])
    assert run_settings(args).run_options().memory_limit == math.inf
    (tmp_path / "pyproject.toml").write_text("[tool.gradcheck]\nmemory_limit = false\n")
    assert run_settings(build_parser().parse_args(["run", "mlp"])).run_options().memory_limit == math.inf
    assert S.Settings().run_options().memory_limit is None  # the default measures
    (tmp_path / "pyproject.toml").write_text('[tool.gradcheck]\nmemory_limit = "lots"\n')
    with pytest.raises(S.SettingsError, match='memory_limit = "lots": must be a number of GiB'):
        run_settings(build_parser().parse_args(["run", "mlp"]))

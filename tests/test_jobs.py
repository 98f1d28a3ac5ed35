"""``gradcheck run --jobs N``: the same results as one process, streamed, and a worker's death is one case's error.

Each test that starts workers writes its target module into its own folder:
cases from user code do not pickle, so every worker imports the module and
builds the cases again.  The tests that need no cross-framework fault run
on the tape alone (``--backends tape`` and the referee), so their workers
start without importing torch or jax.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gradcheck import results
from gradcheck.app import parallel
from gradcheck.app.cli import main
from gradcheck.check import cores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TARGETS = textwrap.dedent('''
    """Cases for tests/test_jobs.py: tiny gradcheck models, a torch model with a wrong backward, a case that
    kills its worker and one that takes a minute."""

    import multiprocessing
    import os
    import signal
    import time

    import gradcheck.layers as L
    from gradcheck import ops
    from gradcheck.case import Case


    def in_worker():
        return multiprocessing.parent_process() is not None


    def tiny(name, seed, before=None):
        def build(rng):
            if before is not None:
                before()
            if in_worker():  # what this worker's thread pools were sized to
                with open(f"threads-{name}.txt", "w") as fh:
                    fh.write(os.environ.get("OMP_NUM_THREADS", ""))
            return L.Chain(L.Dense(3, 4, activation=ops.tanh, rng=rng), L.Dense(4, 2, rng=rng))

        return Case(name, build, lambda rng: (rng.standard_normal((2, 3)),), seed=seed)


    def die():
        if not in_worker():
            raise RuntimeError("this case kills the process it runs in; run it with --jobs 2")
        os.kill(os.getpid(), signal.SIGKILL)


    def torch_wrong():
        import torch
        from torch import nn

        from gradcheck import from_torch

        class WrongTanh(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = torch.tanh(x)
                ctx.save_for_backward(y)
                return y

            @staticmethod
            def backward(ctx, g):
                (y,) = ctx.saved_tensors
                return g * (1 - y * y) * 1.01  # 1 % too large

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 3)

            def forward(self, x):
                return WrongTanh.apply(self.lin(x))

        torch.manual_seed(0)
        return from_torch(Net(), torch.randn(2, 4), name="torch-wrong")


    def cases():
        return [tiny("tiny-a", 1), torch_wrong(), tiny("tiny-b", 2)]


    def with_crash():
        return [tiny("tiny-a", 1), tiny("tiny-crash", 3, before=die), tiny("tiny-b", 2), tiny("tiny-c", 4)]


    def with_slow():
        return [tiny("tiny-a", 1), tiny("tiny-slow", 3, before=lambda: time.sleep(120) if in_worker() else None)]
''')


@pytest.fixture()
def here(tmp_path, monkeypatch):
    (tmp_path / "jobcases.py").write_text(TARGETS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _comparable(path) -> list[dict]:
    """Every case of a JSON report as dicts, timings left out (they differ run to run)."""
    cases = json.loads(path.read_text())["cases"]
    for case in cases:
        case.pop("timings")
        case["notes"] = [re.sub(r"\b\d+(\.\d+)? ?(s|ms|µs)\b", "T", n) for n in case["notes"]]
        if case.get("second_order"):
            case["second_order"].pop("timings")
    return cases


def test_jobs_2_reports_what_one_process_reports_and_catches_a_wrong_backward(here, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    argv = ["run", "jobcases:cases", "--no-html"]
    assert main(argv + ["--json", "one.json"]) == 1
    capsys.readouterr()
    assert main(argv + ["--json", "two.json", "--jobs", "2", "--cache-dir", "jax-cache"]) == 1
    err = capsys.readouterr().err
    assert err.count("/3] ") == 3, err  # a progress line per case, as each arrives

    one, two = _comparable(here / "one.json"), _comparable(here / "two.json")
    assert [c["name"] for c in two] == ["tiny-a", "torch-wrong", "tiny-b"]  # the planned order
    assert two == one
    verdicts = {c["name"]: c["verdict"] for c in two}
    assert verdicts == {"tiny-a": "agree", "torch-wrong": "disagree", "tiny-b": "agree"}, verdicts
    wrong = next(c for c in two if c["name"] == "torch-wrong")
    assert {tuple(leaf["blame"]) for leaf in wrong["leaves"] if leaf["verdict"] == "disagree"} == {("torch",)}
    # The workers compiled into the run's compilation cache (the test session's is off: GRADCHECK_NO_CACHE).
    assert any((here / "jax-cache").iterdir()), "the workers did not use --cache-dir"
    # Every case was streamed to the results file (in the order they finished).
    stored = results.load(here / "gradcheck-report" / "results.jsonl")
    assert sorted(c.name for c in stored.cases) == ["tiny-a", "tiny-b", "torch-wrong"]


def test_a_worker_that_dies_is_its_case_error_and_the_other_cases_finish(here, capsys):
    code = main(["run", "jobcases:with_crash", "-k", "tiny", "--backends", "tape", "--per-layer", "--no-html",
                 "--json", "out.json", "--jobs", "2"])
    assert code == 1
    cases = {c["name"]: c for c in json.loads((here / "out.json").read_text())["cases"]}
    assert list(cases) == ["tiny-a", "tiny-crash", "tiny-b", "tiny-c"]
    crash = cases.pop("tiny-crash")
    assert crash["verdict"] == "error"
    message = crash["errors"]["case"]
    assert "tiny-crash" in message and "signal 9, SIGKILL" in message, message
    assert "-k tiny-crash" in message and crash["replay"].endswith("-k tiny-crash"), message
    assert {name: c["verdict"] for name, c in cases.items()} == {"tiny-a": "agree", "tiny-b": "agree",
                                                                  "tiny-c": "agree"}
    # The workers ran with the run's options: --per-layer replays even the agreeing cases.
    assert all(any(n.startswith("per-layer replay:") for n in c["notes"]) for c in cases.values()), cases
    stored = results.load(here / "gradcheck-report" / "results.jsonl")
    assert len(stored.cases) == 4 and not stored.interrupted
    # Each worker sized its thread pools to its share of the cores.
    share = parallel.thread_env(max(cores.available() // 2, 1))["OMP_NUM_THREADS"]
    assert {(here / f"threads-{n}.txt").read_text() for n in ("tiny-a", "tiny-b", "tiny-c")} == {share}


def test_ctrl_c_stops_the_workers_and_reports_what_finished(here):
    psutil = pytest.importorskip("psutil")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "gradcheck", "run", "jobcases:with_slow", "--backends", "tape",
                             "--jobs", "2", "--json", "out.json"], cwd=here, env=env, stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # wait for the quick case to finish; the slow one is then running
            if line.startswith("[1/2] tiny-a"):
                break
        workers = psutil.Process(proc.pid).children()
        assert any("gradcheck-worker" in " ".join(w.cmdline()) or "multiprocessing" in " ".join(w.cmdline())
                   for w in workers), [w.cmdline() for w in workers]
        proc.send_signal(signal.SIGINT)
        # Read its output while it stops: a pipe nobody reads would stall the writes of its last lines.
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    report = json.loads((here / "out.json").read_text())
    assert [c["name"] for c in report["cases"]] == ["tiny-a"] and report["interrupted"]
    time.sleep(0.5)
    assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("argv, config, needle", [
    (["--jobs", "0"], "", "--jobs 0: must be a number of worker processes >= 1, e.g. --jobs 2, or auto"),
    (["--jobs", "x"], "", "--jobs x: must be"),
    ([], "[tool.gradcheck]\njobs = 0\n", "jobs = 0: must be a number of worker processes >= 1, e.g. jobs = 2"),
    ([], '[tool.gradcheck]\njobs = "many"\n', 'jobs = "many": must be'),
])
def test_bad_jobs_are_usage_errors_naming_the_flag_the_value_and_the_fix(here, capsys, argv, config, needle):
    if config:
        (here / "pyproject.toml").write_text(config)
    assert main(["run", "jobcases:with_crash", "-k", "tiny-a", "--backends", "tape", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err, err


def test_jobs_auto_is_the_cores_this_process_may_use():
    assert parallel.resolve_jobs("auto") == len(os.sched_getaffinity(0))
    assert parallel.resolve_jobs(None) == 1 and parallel.resolve_jobs(3) == 3


def test_worker_threads_are_their_share_and_a_smaller_limit_of_the_users_stays():
    env = parallel.thread_env(2, environ={})
    assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"
    assert "--xla_cpu_multi_thread_eigen=false" in env["XLA_FLAGS"]
    assert parallel.thread_env(2, environ={"OMP_NUM_THREADS": "1"})["OMP_NUM_THREADS"] == "1"
    assert parallel.thread_env(2, environ={"OMP_NUM_THREADS": "8"})["OMP_NUM_THREADS"] == "2"


def test_cases_are_handed_out_unknown_first_then_costliest_first_from_the_last_run(tmp_path):
    from gradcheck.case import Case

    made = [Case(n, None, None) for n in ("a", "b", "c", "d")]
    lines = [{"type": "run", "schema": results.SCHEMA},
             {"type": "case", "case": {"name": "a", "dtype": "float32", "timings": {"jax": {"first": 1.0}}}},
             {"type": "case", "case": {"name": "c", "dtype": "float32",
                                       "timings": {"tape": {"first": 2.0, "second": None, "float64": 3.0}}}},
             {"type": "case", "case": {"name": "d", "dtype": "float64", "timings": {"tape": {"first": 9.0}}}}]
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n{partial")
    costs = parallel.previous_costs(path)
    assert costs == {"a\0float32": 1.0, "c\0float32": 5.0, "d\0float64": 9.0}
    # d ran in float64 last time: another case now, of unknown cost.
    assert parallel.hand_out_order(made, costs) == [1, 3, 2, 0]
    assert parallel.hand_out_order(made, parallel.previous_costs(tmp_path / "none.jsonl")) == [0, 1, 2, 3]

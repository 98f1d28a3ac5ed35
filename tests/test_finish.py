"""The ``gradcheck`` command ends its process without interpreter teardown (``gradcheck.app.finish``), and loses
nothing by it: exit codes, ``atexit`` handlers, files a user's code left open, a user's running thread, a
profiler's report.  Each test runs the command in a fresh process, on the tape alone (no torch or jax import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TARGETS = textwrap.dedent('''
    """Cases for tests/test_finish.py, and what a user's module may leave behind at exit."""

    import atexit
    import os
    import threading
    import time

    import gradcheck.layers as L
    from gradcheck import ops
    from gradcheck.case import Case

    LOG = open("left-open.txt", "w")  # never closed: its buffered line must still reach the disk


    def _goodbye():
        with open("atexit.txt", "w") as fh:
            fh.write("ran")


    def tiny():
        atexit.register(_goodbye)
        LOG.write("buffered line")

        def build(rng):
            return L.Chain(L.Dense(3, 4, activation=ops.tanh, rng=rng), L.Dense(4, 2, rng=rng))

        return Case("tiny", build, lambda rng: (rng.standard_normal((2, 3)),), seed=0)


    def with_thread():
        def late():
            time.sleep(1.0)
            with open("thread.txt", "w") as fh:
                fh.write("finished")

        threading.Thread(target=late).start()  # not a daemon: Python waits for it, so must the command
        return tiny()


    def wrong():
        """``tiny`` with the tape's bias gradient 1 % too large: the referee blames it (tests/faults.py's fault)."""
        from gradcheck.backends.tape import ops as tape_ops

        original = tape_ops.add.vjps[1]
        tape_ops.add.vjps[1] = lambda g, ans, a, b: ops.mul(original(g, ans, a, b), 1.01)
        return tiny()
''')


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "finish_targets.py").write_text(TARGETS)
    return tmp_path


def _command(folder, *argv, env=None, prefix=("-m", "gradcheck")):
    environ = {k: v for k, v in os.environ.items() if k != "GRADCHECK_FULL_EXIT"}
    environ.update({"PYTHONPATH": os.pathsep.join([str(folder), ROOT]), **(env or {})})
    return subprocess.run([sys.executable, *prefix, *argv], cwd=folder, env=environ, capture_output=True,
                          text=True, timeout=300)


RUN = ("run", "finish_targets:tiny", "--backends", "tape", "--no-html", "-q")


@pytest.mark.parametrize("full", [False, True], ids=["fast exit", "full teardown"])
def test_nothing_is_lost(folder, full):
    """The run's results, its exit code, the user's atexit handler and a file the user's code left open come out
    the same with and without teardown (the full teardown is the control)."""
    out = _command(folder, *RUN, env={"GRADCHECK_FULL_EXIT": "1"} if full else None)
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in (folder / "gradcheck-report" / "results.jsonl").read_text().splitlines()]
    assert [r["type"] for r in records] == ["run", "case"] and records[1]["case"]["verdict"] == "agree"
    assert (folder / "atexit.txt").read_text() == "ran"
    assert (folder / "left-open.txt").read_text() == "buffered line"
    assert "gradcheck PASS" in out.stdout


def test_exit_codes_pass_through(folder):
    """A disagreement is still 1 and a usage error still 2, each with its message."""
    out = _command(folder, "run", "finish_targets:wrong", "--backends", "tape", "--no-html", "-q")
    assert out.returncode == 1, out.stderr
    assert "gradcheck FAIL" in out.stdout
    out = _command(folder, "run", "finish_targets:nothing_here", "--backends", "tape", "--no-html")
    assert out.returncode == 2 and "nothing_here" in out.stderr


def test_a_running_thread_is_waited_for(folder):
    """A non-daemon thread of the user's still running: the command exits as Python would, after it."""
    out = _command(folder, "run", "finish_targets:with_thread", "--backends", "tape", "--no-html", "-q")
    assert out.returncode == 0, out.stderr
    assert (folder / "thread.txt").read_text() == "finished"


def test_a_profiler_still_writes_its_report(folder):
    """``python -m cProfile -m gradcheck``: the profile is written after the command returns."""
    out = _command(folder, "list", prefix=("-m", "cProfile", "-o", "run.prof", "-m", "gradcheck"))
    assert out.returncode == 0, out.stderr
    assert (folder / "run.prof").stat().st_size > 0


def test_a_closed_pipe_ends_quietly(folder):
    """``gradcheck list | head -1``: exit 141 as for SIGPIPE, and no traceback calling it an internal error."""
    environ = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "-m", "gradcheck", "list"], cwd=folder, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes away after one line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "internal error" not in err and "Traceback" not in err

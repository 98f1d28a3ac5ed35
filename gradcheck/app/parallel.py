"""``gradcheck run --jobs N``: the run's cases on N worker processes, reported once by this one.

Cases built from user code (``package.module:function`` targets, ``from_torch``
models) hold closures and captured programs that do not pickle, so cases
never cross a process boundary.  Each worker is a fresh interpreter (the
``spawn`` start method: torch and jax must not be forked) that builds the
run again from the same flags (``setup``, e.g. ``gradcheck.app.cli.rebuild_run``:
the same settings, targets, Request, selection and compilation-cache
setting), checks that it got the same case names in the same order, and
then runs the case indices it is handed, one at a time.

The parent hands out indices over one pipe per worker as workers come free
(cases differ in cost by 100x, so a fixed split would leave a worker idle),
the costliest first when an earlier run's results say what each case cost.
It writes each result to the results file as it arrives, so a crash or
Ctrl-C loses nothing finished; the returned run lists the cases in the
planned order, as a run in one process does.

A worker that dies (a segfault in native code, the OOM killer) makes its
case an error result that says how it died and how to re-run just that case;
a fresh worker takes over and the run goes on.

Each worker's BLAS, torch and XLA thread pools are sized to its share of the
cores through the environment it starts with, before it loads any of them.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable

from gradcheck.check import cores as check_cores

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
STOP_GRACE_S = 5.0  # how long a worker told to stop (or terminated) gets before it is killed


class WorkerSetupError(RuntimeError):
    """A worker could not build the run again; ``usage`` when the cause is the user's (a target, a setting)."""

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.usage = usage


def resolve_jobs(value) -> int:
    """The ``jobs`` setting as a number: unset is 1, ``auto`` the cores this process may run on
    (``gradcheck.check.cores.available``)."""
    if value is None:
        return 1
    if value == "auto":
        return check_cores.available()
    return int(value)


def thread_env(threads: int, environ=None) -> dict[str, str]:
    """The environment that limits a worker's BLAS, torch and XLA thread pools to ``threads``.

    A smaller limit the user already set is kept.  XLA's CPU backend ignores
    OMP_NUM_THREADS; its Eigen pool is switched to one thread by XLA_FLAGS.
    """
    environ = os.environ if environ is None else environ
    env = {}
    for name in THREAD_VARS:
        given = environ.get(name, "").strip()
        env[name] = given if given.isdigit() and 0 < int(given) <= threads else str(threads)
    flags = environ.get("XLA_FLAGS", "")
    if "xla_cpu_multi_thread_eigen" not in flags:
        env["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads={threads}".strip()
    return env


# ---------------------------------------------------------------- the order cases are handed out in
def previous_costs(results_path) -> dict[str, float]:
    """Seconds each case's backends took in the run whose results are still at ``results_path`` (none if no such
    file, or not one this can read): the only cost estimate that is both cheap and close."""
    costs: dict[str, float] = {}
    try:
        with open(results_path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    record = json.loads(line)
                    case = record["case"]
                    seconds = sum(v for timing in case["timings"].values() for v in timing.values()
                                  if isinstance(v, (int, float)))
                    costs[f"{case['name']}\0{case['dtype']}"] = float(seconds)
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # the header, a partial last line, an older writer's record
    except OSError:
        pass
    return costs


def hand_out_order(cases, costs: dict[str, float]) -> list[int]:
    """Case indices in the order to hand them out: cases of unknown cost first (they may be the costly ones),
    in the planned order, then the known ones costliest first."""
    cost = [costs.get(f"{c.name}\0{c.dtype}") for c in cases]
    unknown = [i for i, c in enumerate(cost) if c is None]
    known = sorted((i for i, c in enumerate(cost) if c is not None), key=lambda i: -cost[i])
    return unknown + known


# ---------------------------------------------------------------- the parent
def run(cases: list, options, setup: Callable, jobs: int, results_path=None, env: dict | None = None,
        on_case=None, on_start=None):
    """Run ``cases`` on ``jobs`` workers; the same result as ``gradcheck.check.runner.run`` gives.

    ``setup()`` is called in each worker and must return ``(cases, options)``
    equal to these (it must pickle: a module-level function, or a partial
    of one).  ``on_start(i, total, case)`` when a case is handed out and
    ``on_case(i, total, result)`` when one finishes, ``i`` counting finished
    cases.
    """
    import multiprocessing

    from gradcheck.check.runner import ResultsWriter, environment
    from gradcheck.results import RunResult

    total = len(cases)
    order = collections.deque(hand_out_order(cases, previous_costs(results_path) if results_path else {}))
    result = RunResult(env=env or environment(), planned=total)
    writer = ResultsWriter(results_path, result.env, planned=total) if results_path else None
    jobs = max(1, min(jobs, total))
    pool = _Pool(multiprocessing.get_context("spawn"), setup, [c.name for c in cases],
                 thread_env(max(check_cores.available() // jobs, 1)))
    done: dict[int, object] = {}

    def finish(i, case_result):
        done[i] = case_result
        if writer:
            writer.case(case_result)
        if on_case:
            on_case(len(done) - 1, total, case_result)

    def hand(worker):
        if not order:
            pool.stop(worker)
            return
        i = order.popleft()
        if not pool.give(worker, i):  # it died before taking it: the case goes to the next worker
            order.appendleft(i)
            return
        if on_start:
            on_start(len(done), total, cases[i])

    try:
        for _ in range(jobs):
            pool.start()
        while len(done) < total:
            if not pool.live():  # cases left and no worker: one that ended cleanly is not an event to restart on
                pool.start()
            for worker, message in pool.events():
                if message is None:  # it died
                    if worker.case is not None:
                        finish(worker.case, died(cases[worker.case], options, worker.proc.exitcode))
                    elif not worker.ready:
                        raise WorkerSetupError(f"a --jobs worker process died while building the run "
                                               f"({_how(worker.proc.exitcode)}); run with --jobs 1 to see why")
                    if order and pool.live() < jobs:
                        pool.start()
                elif message[0] == "ready":
                    hand(worker)
                elif message[0] == "done":
                    finish(message[1], _unpack(message[2]))
                    hand(worker)
                elif message[0] == "failed":
                    raise WorkerSetupError(message[1], usage=message[2])
    finally:
        pool.close()
        if writer:
            writer.close()
    result.cases = [done[i] for i in range(total)]
    return result


def died(case, options, exitcode) -> object:
    """The error result of a case whose worker died under it: how it died, and how to re-run just it."""
    import shlex

    from gradcheck.results import CaseResult

    rerun = options.replay(case) if options.replay else f"gradcheck run TARGET -k {shlex.quote(case.name)}"
    return CaseResult(
        name=case.name, model=case.model or case.name, dtype=case.dtype, mode=case.mode, seed=case.seed,
        backends=list(options.backends), notes=list(case.notes), imprecise=options.imprecise,
        unavailable_policy=options.unavailable, replay=rerun if options.replay else "", verdict="error",
        errors={"case": f"the worker process running case {case.name!r} died ({_how(exitcode)}) before the case "
                        "finished: a crash in native code, or the process was killed (out of memory?); the other "
                        f"cases ran on. Re-run just this case: {rerun}"})


def _how(exitcode) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by signal {-exitcode}, {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def _unpack(payload):
    from gradcheck.results import case_from_dict

    kind, data = payload
    return pickle.loads(data) if kind == "pickle" else case_from_dict(data)


class _Worker:
    def __init__(self, proc, conn):
        self.proc, self.conn = proc, conn
        self.case: int | None = None  # the index it is running
        self.ready = False  # built the run
        self.eof = False  # its end of the pipe is closed: wait for the process alone
        self.dead = False


class _Pool:
    """The worker processes and their pipes; ``events`` yields what they said, and ``None`` for each that died."""

    def __init__(self, ctx, setup, names: list[str], env: dict[str, str]):
        self.ctx, self.setup, self.names, self.env = ctx, setup, names, env
        self.workers: list[_Worker] = []

    def start(self) -> None:
        ours, theirs = self.ctx.Pipe()
        proc = self.ctx.Process(target=worker_main, args=(theirs, self.setup, self.names),
                                name=f"gradcheck-worker-{len(self.workers) + 1}", daemon=True)
        # The environment and an ignored SIGINT pass to the new interpreter before it imports anything:
        # thread pools are sized at load, and Ctrl-C is the parent's to handle (it stops the workers).
        with _environ(self.env), _sigint_ignored():
            proc.start()
        theirs.close()
        self.workers.append(_Worker(proc, ours))

    def live(self) -> int:
        return sum(1 for w in self.workers if not w.dead)

    def give(self, worker: _Worker, i: int) -> bool:
        try:
            worker.conn.send(i)
        except OSError:
            return False
        worker.case = i
        return True

    def stop(self, worker: _Worker) -> None:
        with contextlib.suppress(OSError):
            worker.conn.send(None)

    def events(self):
        from multiprocessing.connection import wait

        live = [w for w in self.workers if not w.dead]
        by_handle = {w.conn: w for w in live if not w.eof} | {w.proc.sentinel: w for w in live}
        for handle in wait(list(by_handle)):
            worker = by_handle[handle]
            if worker.dead:
                continue
            yield from self._read(worker)
            if not worker.proc.is_alive():
                yield from self._read(worker)  # what it sent before it ended
                worker.dead = True
                worker.proc.join()
                worker.conn.close()
                if worker.case is not None or not worker.ready or worker.proc.exitcode != 0:
                    yield worker, None
                    worker.case = None

    def _read(self, worker: _Worker):
        while True:
            try:
                if not worker.conn.poll():
                    return
                message = worker.conn.recv()
            except (EOFError, OSError):
                worker.eof = True
                return
            if message[0] == "ready":
                worker.ready = True
            elif message[0] == "done":
                worker.case = None
            yield worker, message

    def close(self) -> None:
        """Stop every worker: an idle one is told to, one mid-case (Ctrl-C, or a failure here) is terminated;
        each gets a grace period, then is killed."""
        for w in self.workers:
            if w.dead or not w.proc.is_alive():
                continue
            if w.case is None:
                self.stop(w)
            else:
                w.proc.terminate()
        for w in self.workers:
            if w.dead:
                continue
            w.proc.join(STOP_GRACE_S)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join()
            w.dead = True
            w.conn.close()


@contextlib.contextmanager
def _environ(changes: dict[str, str]):
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _sigint_ignored():
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# ---------------------------------------------------------------- the worker
def worker_main(conn, setup: Callable, names: list[str]) -> None:
    """A worker process: build the run, say ``ready``, then run each index handed over until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        cases, options = setup()
    except BaseException as exc:  # noqa: BLE001 - said to the parent, which reports it
        from gradcheck.app.output import OutputError
        from gradcheck.app.settings import SettingsError
        from gradcheck.app.targets import TargetError

        usage = isinstance(exc, (TargetError, SettingsError, OutputError))
        text = str(exc) if usage else "".join(traceback.format_exception(exc))
        conn.send(("failed", f"a --jobs worker process could not build the run: {text}", usage))
        return
    got = [c.name for c in cases]
    if got != names:
        differ = next((f"case {k + 1} is {a!r} there, {b!r} here" for k, (a, b) in enumerate(zip(got, names))
                       if a != b), f"{len(got)} case(s) there, {len(names)} here")
        conn.send(("failed", f"the targets gave other cases in a --jobs worker process ({differ}): --jobs needs "
                             "target functions that return the same cases, in the same order, on every call; "
                             "make them so, or run with --jobs 1", True))
        return
    _limit_loaded_threads()
    from gradcheck.check.errors import internal_error
    from gradcheck.check.runner import run_case
    from gradcheck.results import CaseResult, to_dict

    conn.send(("ready",))
    while True:
        try:
            i = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if i is None:
            conn.close()
            from gradcheck.app.finish import exit_now

            exit_now(0)  # without teardown; returns where teardown must run (gradcheck.app.finish)
            return
        try:
            result = run_case(cases[i], options)
        except Exception as exc:  # gradcheck's own bug: this case's error, and the run goes on (as in run_case)
            case = cases[i]
            result = CaseResult(name=case.name, model=case.model or case.name, dtype=case.dtype, mode=case.mode,
                                seed=case.seed, backends=list(options.backends), verdict="error",
                                replay=options.replay(case) if options.replay else "",
                                errors={"case": internal_error("internal error while running the case", exc)})
        try:
            payload = ("pickle", pickle.dumps(result))
        except Exception:  # noqa: BLE001 - something in it does not pickle; its stored form always does
            payload = ("dict", to_dict(result))
        try:
            conn.send(("done", i, payload))
        except OSError:
            return


def _limit_loaded_threads() -> None:
    """torch sizes its pool from OMP_NUM_THREADS when loaded; say it again to one loaded by the targets."""
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit():
        torch.set_num_threads(int(threads))

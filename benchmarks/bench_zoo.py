"""A 24-architecture zoo in one `gradcheck run`: cold and warm compilation cache, --jobs 1 and --jobs 2.

Each run is a fresh process, ``gradcheck run benchmarks.zoo:cases`` from the
repository root (``benchmarks/zoo.py``: six of gradcheck's own models and
eighteen torch.nn models through ``from_torch``), timed from outside:

* cold: an empty ``--cache-dir`` (and an empty ``XDG_CACHE_HOME``, so no
  per-user cache of any kind is read); jax compiles every program;
* warm: the same folders again, right after the cold run with the same
  ``--jobs``; its ``--output`` is the cold run's too, so ``--jobs 2`` hands the
  cases out costliest first from the cold run's timings.

The four runs go cold 1, cold 2, warm 1, warm 2, so that a drift in the
machine's load falls on both ``--jobs`` alike.  Recorded per run: wall
time, CPU time of the whole process tree (the workers are reaped by the
run, so ``wait4`` counts them), peak RSS of the largest process (``wait4``)
and of the tree summed (sampled every 0.2 s), the time to the first finished
case (setup: imports and building the cases, in the parent and, under
``--jobs``, again in each worker), and the verdict counts.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

THREADS = _common.setup_threads()
TARGET = "benchmarks.zoo:cases"


class TreeRSS:
    """The summed RSS of this process's children and their descendants, sampled; its peak in MiB."""

    def __init__(self, every: float = 0.2):
        import psutil

        self.psutil, self.every, self.peak = psutil, every, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        me = self.psutil.Process()
        while not self._stop.wait(self.every):
            total = 0
            for p in me.children(recursive=True):
                try:
                    total += p.memory_info().rss
                except self.psutil.Error:  # ended between listing and reading
                    pass
            self.peak = max(self.peak, total / 2**20)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def one_run(jobs: int, kind: str, work: str) -> dict:
    cache, out = os.path.join(work, f"cache-j{jobs}"), os.path.join(work, f"out-j{jobs}")
    report = os.path.join(work, f"{kind}-j{jobs}.json")
    cmd = _common.gradcheck_cli() + ["run", TARGET, "--jobs", str(jobs), "--cache-dir", cache, "--output", out,
                                     "--no-html", "--json", report]
    env = {**_common.thread_env(THREADS), "XDG_CACHE_HOME": os.path.join(work, f"xdg-j{jobs}")}
    load = _common._loadavg()
    with TreeRSS() as tree:
        child = _common.run_child(cmd, env=env, cwd=_common.ROOT, stderr_lines=True)
    if child["returncode"] not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {child['returncode']}:\n{child['stderr'][-3000:]}")
    cases = json.load(open(report, encoding="utf-8"))["cases"]
    done = [t for t, line in child["stderr_lines"] if line.startswith("[1/")]
    return {
        "jobs": jobs, "cache": kind, "wall_s": round(child["wall"], 2),
        "cpu_s": round(child["cpu_user"] + child["cpu_sys"], 2),
        "peak_rss_largest_mib": round(child["peak_rss_mib"], 1), "peak_rss_tree_mib": round(tree.peak, 1),
        "first_case_s": round(done[0], 2) if done else None,
        "verdicts": dict(collections.Counter(c["verdict"] for c in cases)), "cases": len(cases),
        "returncode": child["returncode"], "loadavg_before": load,
        "case_verdicts": {c["name"]: c["verdict"] for c in cases},
    }


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0])
    args = p.parse_args(argv)
    out = {"benchmark": "zoo", "target": TARGET, "threads": THREADS, "machine": _common.machine(), "runs": []}
    with tempfile.TemporaryDirectory() as work:
        for kind in ("cold", "warm"):
            for jobs in (1, 2):
                t0 = time.strftime("%H:%M:%S")
                run = one_run(jobs, kind, work)
                out["runs"].append(run)
                print(f"{t0} {kind} --jobs {jobs}: {run['wall_s']} s wall, {run['cpu_s']} s CPU, "
                      f"first case at {run['first_case_s']} s, {run['verdicts']}", file=sys.stderr)
    by = {(r["cache"], r["jobs"]): r for r in out["runs"]}
    out["ratios"] = {
        f"warm/cold jobs {j}": round(by["warm", j]["wall_s"] / by["cold", j]["wall_s"], 3) for j in (1, 2)
    } | {f"jobs 2/jobs 1 {k}": round(by[k, 2]["wall_s"] / by[k, 1]["wall_s"], 3) for k in ("cold", "warm")}
    same = all(by[k, 1]["case_verdicts"] == by[k, 2]["case_verdicts"] for k in ("cold", "warm"))
    out["same_verdicts_jobs_1_and_2"] = same
    _common.write(out, args.json)


if __name__ == "__main__":
    main()

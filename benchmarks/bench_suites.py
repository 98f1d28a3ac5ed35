"""Figure 4 (and the suite half of figure 5): wall time and peak memory of `gradcheck run <suite>`, and of CI's
headline step, the commands `.ci/headline.py` runs.

Each suite runs as a fresh process, timed from outside.  Its progress
lines (one per finished case, on stderr) are timestamped as they arrive, so
one run also gives suite time against the number of cases done.  From the
results file: the time each backend spent (first calls include jax's
compilation), the referee's forward passes and the leaves' verdicts.  Peak
resident memory is the child's ``ru_maxrss`` (``wait4``).  Then CI's headline
commands, as CI runs them: ``gradcheck run resnet18 --seed S`` for three
seeds and ``gradcheck run smoke layers models`` in one process.

Run it with the machine's own BLAS kernels (the shell may pin others):
``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_suites.py --threads 2``.  The
BLAS library, its kernels and threads are read with threadpoolctl and recorded with the figures.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

THREADS = _common.setup_threads()
# The CLI's plain progress line (gradcheck.app.cli.Progress): "[3/15] Linear: agree (4 leaves; 2.1s elapsed)".
PROGRESS = re.compile(r"^\[(\d+)/(\d+)\] (.*): (\w+) \((\d+) leaves; ([\d.]+)s elapsed\)$")
HEADLINE = [["resnet18", "--seed", str(seed)] for seed in (0, 1, 2)] + [["smoke", "layers", "models"]]
PINNING = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")  # set by some shells: they choose numpy's BLAS kernels


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--suites", default="smoke,layers,models")
    p.add_argument("--no-headline", action="store_true", help="skip CI's headline commands")
    args = p.parse_args(argv)
    env = _common.thread_env(THREADS)
    machine = _common.machine()
    if "threads by default" not in machine["blas"]:
        raise SystemExit("threadpoolctl is needed to record the BLAS kernels: pip install threadpoolctl")
    out = {"figure": 4, "threads": THREADS, "machine": machine, "suites": {}, "headline": [],
           "blas_environment": {name: os.environ.get(name) for name in PINNING}}
    for suite in args.suites.split(","):
        out["suites"][suite] = _run(["run", suite], env)
    if not args.no_headline:
        for targets in HEADLINE:
            out["headline"].append(_run(["run", *targets], env))
    if not any(out["blas_environment"].values()):  # how the figures were taken, where a shell pins the kernels
        out["command"] = "env -u " + " -u ".join(PINNING) + " " + _common.command_line()
    _common.write(out, args.json)


def _run(argv, env) -> dict:
    """One fresh `gradcheck ...` process: its wall time, memory, progress, and what its results say."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = _common.gradcheck_cli() + argv + ["--output", tmp]
        rec = _common.run_child(cmd, env=env, cwd=tmp, stderr_lines=True)
        if rec["returncode"] not in (0, 1):
            raise SystemExit(f"gradcheck {' '.join(argv)} failed ({rec['returncode']}):\n{rec['stderr'][-3000:]}")
        cases = _results(os.path.join(tmp, "results.jsonl"))
    progress = []
    for t, line in rec["stderr_lines"]:
        m = PROGRESS.match(line.strip())
        if m:
            progress.append({"done": int(m.group(1)), "total": int(m.group(2)), "wall": t,
                             "runner_elapsed": float(m.group(6)), "verdict": m.group(4)})
    backend_s: dict[str, float] = {}
    for c in cases:
        for b, tm in c["timings"].items():
            backend_s[f"{b} first calls"] = backend_s.get(f"{b} first calls", 0.0) + (tm.get("first") or 0.0)
            backend_s[f"{b} second calls"] = backend_s.get(f"{b} second calls", 0.0) + (tm.get("second") or 0.0)
    verdicts: dict[str, int] = {}
    leaf_verdicts: dict[str, int] = {}
    for c in cases:
        verdicts[c["verdict"]] = verdicts.get(c["verdict"], 0) + 1
        for leaf in c["leaves"]:
            leaf_verdicts[leaf["verdict"]] = leaf_verdicts.get(leaf["verdict"], 0) + 1
    return {
        "command": "gradcheck " + " ".join(argv), "wall": rec["wall"], "returncode": rec["returncode"],
        "peak_rss_mib": rec["peak_rss_mib"], "cpu_user": rec["cpu_user"], "cpu_sys": rec["cpu_sys"],
        "cases": len(cases), "verdicts": verdicts, "leaf_verdicts": leaf_verdicts, "backend_seconds": backend_s,
        "referee_passes": sum(c["referee_passes"] for c in cases), "progress": progress,
        "loadavg_end": _common._loadavg(),
    }


def _results(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line)["case"] for line in fh if '"type": "case"' in line]


if __name__ == "__main__":
    main()

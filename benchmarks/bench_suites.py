"""Figure 4 (and the suite half of figure 5): wall time and peak memory of `gradcheck run <suite>`.

Each suite runs as a fresh process, timed from outside.  Its progress
lines (one per finished case, on stderr) are timestamped as they arrive, so
one run also gives suite time against the number of cases done.  From the
results file: the time each backend spent (first calls include jax's
compilation) and the referee's forward passes.  Peak resident memory is
the child's ``ru_maxrss`` (``wait4``).
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
PROGRESS = re.compile(r"^\[(\d+)/(\d+)\] (.*): (\w+) \((\d+) leaves, ([\d.]+)s\)$")


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--suites", default="smoke,layers,models")
    args = p.parse_args(argv)
    env = _common.thread_env(THREADS)
    out = {"figure": 4, "threads": THREADS, "machine": _common.machine(), "suites": {}}
    for suite in args.suites.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = _common.gradcheck_cli() + ["run", suite, "--output", tmp]
            rec = _common.run_child(cmd, env=env, cwd=tmp, stderr_lines=True)
            if rec["returncode"] not in (0, 1):
                raise SystemExit(f"gradcheck run {suite} failed ({rec['returncode']}):\n{rec['stderr'][-3000:]}")
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
        for c in cases:
            verdicts[c["verdict"]] = verdicts.get(c["verdict"], 0) + 1
        out["suites"][suite] = {
            "command": f"gradcheck run {suite}", "wall": rec["wall"], "returncode": rec["returncode"],
            "peak_rss_mib": rec["peak_rss_mib"], "cpu_user": rec["cpu_user"], "cpu_sys": rec["cpu_sys"],
            "cases": len(cases), "verdicts": verdicts, "backend_seconds": backend_s,
            "referee_passes": sum(c["referee_passes"] for c in cases), "progress": progress,
        }
    _common.write(out, args.json)


def _results(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line)["case"] for line in fh if '"type": "case"' in line]


if __name__ == "__main__":
    main()

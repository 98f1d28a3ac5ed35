"""Figure 7: `gradcheck run layers models` of this version against an earlier one, side by side.

The earlier version is a commit installed (not editable) into a virtual
environment of its own with torch and jax (``--base-python``; make it with
``python -m venv ENV && ENV/bin/pip install torch==2.13.0 jax numpy &&
ENV/bin/pip install --no-deps <checkout of the commit>``).  Both run as fresh
processes from a temporary folder, taking turns, wall clock from outside.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--base-python", default=os.environ.get("GRADCHECK_BASE_PYTHON", ""),
                   help="python of the environment holding the earlier version")
    p.add_argument("--base", default=os.environ.get("GRADCHECK_BASE_COMMIT", "93b2cc1"),
                   help="the earlier version's commit, for the record")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args(argv)
    if not args.base_python:
        raise SystemExit("--base-python: the python of a virtual environment with the earlier version installed "
                         "(see this script's docstring for how to make one)")
    env = _common.thread_env(_common.cores())
    versions = {"this version": [sys.executable], "earlier version": [args.base_python]}
    out = {"figure": 7, "machine": _common.machine(), "rounds": args.rounds, "base": args.base,
           "command": "python benchmarks/bench_suites_side_by_side.py --base-python ENV/bin/python",
           "versions": {k: {"walls": []} for k in versions}}
    for _ in range(args.rounds):
        for name, python in versions.items():
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                done = subprocess.run([*python, "-m", "gradcheck.app.cli" if name == "earlier version" else "gradcheck",
                                       "run", "layers", "models", "--output", tmp, "-q"],
                                      cwd=tmp, env=env, capture_output=True, text=True)
                out["versions"][name]["walls"].append(time.perf_counter() - t0)
                out["versions"][name]["exit"] = done.returncode
    for v in out["versions"].values():
        v["median"] = statistics.median(v["walls"])
    out["ratio"] = out["versions"]["this version"]["median"] / out["versions"]["earlier version"]["median"]
    _common.write(out, args.json)


if __name__ == "__main__":
    main()

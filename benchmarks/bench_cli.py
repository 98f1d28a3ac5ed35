"""Figure 2: `gradcheck run resnet18` end to end against the bare frameworks in a plain script.

Both sides run as fresh processes, timed from outside (wall clock, process
start to exit, imports included), ``--runs`` times each, alternating:

* the harness: ``gradcheck run resnet18`` (the zoo's default input: batch 1,
  3x224x224, train mode; all three backends in float64 and float32, the
  referee, the HTML report);
* the bare frameworks: ``bare_resnet18.py``, the same forward+backward in
  torch eager and in jax (jit compilation included), each in float32 and
  float64: the least work that yields what the harness compares.

Caches: the bare script and the cold harness run without jax's persistent
compilation cache (``GRADCHECK_NO_CACHE=1``, ``--no-cache``): both compile
everything.  The warm harness runs with a cache folder that one unmeasured run
filled before the first round: a second ``gradcheck run`` on the same model.
Each round runs bare, cold harness and warm harness, in that order.

Also: the harness's peak resident memory (the child's ``ru_maxrss``, from
``wait4``) and, from one extra in-process run, where the harness's time goes
(model build and reference forward, each backend, referee, comparison; imports of
torch and jax are timed apart, reports are not included there).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

THREADS = _common.setup_threads()
HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--model", default="resnet18")
    args = p.parse_args(argv)
    env = _common.thread_env(THREADS)
    cold_env = {**env, "GRADCHECK_NO_CACHE": "1"}
    out = {"figure": 2, "threads": THREADS, "machine": _common.machine(), "harness": [], "warm": [], "bare": []}
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cache")
        harness = _common.gradcheck_cli() + ["run", args.model, "--output", tmp, "-q"]
        commands = {"harness": (harness + ["--no-cache"], cold_env), "warm": (harness + ["--cache-dir", cache], env),
                    "bare": ([sys.executable, os.path.join(HERE, "bare_resnet18.py"), "--json",
                              os.path.join(tmp, "bare.json")], cold_env)}
        out["harness_command"] = f"gradcheck run {args.model} --no-cache"
        out["warm_command"] = f"gradcheck run {args.model} --cache-dir DIR (DIR filled by one run before)"
        out["bare_command"] = "GRADCHECK_NO_CACHE=1 python benchmarks/bare_resnet18.py"
        _harness_run(*commands["warm"], tmp)  # fills the cache
        for _ in range(args.runs):
            b = _common.run_child(commands["bare"][0], env=cold_env, cwd=tmp)
            if b["returncode"] != 0:
                raise SystemExit(f"bare script failed:\n{b['stderr'][-3000:]}")
            with open(os.path.join(tmp, "bare.json"), encoding="utf-8") as fh:
                b["marks"] = json.load(fh)["marks"]
            out["bare"].append(_common.slim(b))
            for side in ("harness", "warm"):
                out[side].append(_harness_run(*commands[side], tmp))
    med = {side: statistics.median(r["wall"] for r in out[side]) for side in ("harness", "warm", "bare")}
    out["summary"] = {
        "harness_wall_median": med["harness"], "warm_wall_median": med["warm"], "bare_wall_median": med["bare"],
        "ratio": med["harness"] / med["bare"], "warm_ratio": med["warm"] / med["bare"],
        "harness_peak_rss_mib": max(r["peak_rss_mib"] for r in out["harness"]),
        "bare_peak_rss_mib": max(r["peak_rss_mib"] for r in out["bare"]),
    }
    out["breakdown"] = breakdown(args.model)
    _common.write(out, args.json)


def _harness_run(cmd, env, tmp) -> dict:
    h = _common.run_child(cmd, env=env, cwd=tmp)
    if h["returncode"] not in (0, 1):
        raise SystemExit(f"gradcheck run failed ({h['returncode']}):\n{h['stderr'][-3000:]}")
    h["case"] = _case_record(os.path.join(tmp, "results.jsonl"))
    return _common.slim(h)


def _case_record(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        cases = [json.loads(line)["case"] for line in fh if '"type": "case"' in line]
    c = cases[0]
    return {"name": c["name"], "verdict": c["verdict"], "timings": c["timings"], "params": c["params"],
            "referee_passes": c["referee_passes"], "leaves_compared": c["leaves_compared"]}


def breakdown(model: str) -> dict:
    """Where one in-process ``run_case`` spends its time, by wrapping the runner's stages (timing only).

    Cold, as the harness runs it: jax's persistent cache off, so that compiling is in the figures."""
    os.environ["GRADCHECK_NO_CACHE"] = "1"
    import numpy as np  # noqa: F401

    from gradcheck.check import runner
    from gradcheck.layers.models import MODELS

    spent: dict[str, float] = {}
    # The frameworks are imported by the first case that uses them; imported here, apart, so that
    # the stages below time work and not imports.
    t0 = time.perf_counter()
    import jax  # noqa: F401
    import torch  # noqa: F401

    imports = time.perf_counter() - t0
    _common.limit_loaded_libraries(THREADS)

    def timed(label, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0

        return wrapper

    originals = {name: getattr(runner, name) for name in ("_run_backends", "_referee", "compare_leaf")}
    init = runner.CaseRun.__init__
    try:
        runner.CaseRun.__init__ = timed("build model, inputs, float64 copy and reference forward (kinks)", init)
        runner._run_backends = timed("backends (float64, then float32 pinned; jax's float32 twice)",
                                     originals["_run_backends"])
        runner._referee = timed("referee", originals["_referee"])
        runner.compare_leaf = timed("compare leaves", originals["compare_leaf"])
        t0 = time.perf_counter()
        result = runner.run_case(MODELS[model].case())
        total = time.perf_counter() - t0
    finally:
        runner.CaseRun.__init__ = init
        for name, fn in originals.items():
            setattr(runner, name, fn)
    per_backend = {b: (t.first or 0.0) + (t.second or 0.0) + (t.float64 or 0.0) for b, t in result.timings.items()}
    spent["other"] = total - sum(spent.values())
    return {"run_case_total": total, "imports_s": imports, "stages": spent, "backends": per_backend,
            "backend_first_second_float64": {b: [t.first, t.second, t.float64] for b, t in result.timings.items()},
            "prepare": {b: t.prepare for b, t in result.timings.items() if t.prepare is not None},
            "referee_passes": result.referee_passes, "verdict": result.verdict}


if __name__ == "__main__":
    main()

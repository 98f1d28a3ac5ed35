"""A ``from_torch`` case end to end against the bare frameworks' fwd+bwd of the same module.

Three kinds of fresh process, timed from outside (wall clock, process start to
exit, imports included), ``--runs`` rounds, alternating within each round:

* **bare**: ``bare_model.py``: the module written in ``torch.nn`` (eager) and in
  plain ``jax.numpy`` (``jit(value_and_grad)``, compilation included), the
  gradient of ``<r, model(x)>`` with respect to every parameter (and a float
  input), in float32 and in float64, with jax's persistent cache off: the least
  work that yields what gradcheck compares;
* **cold**: the same ``torch.nn`` module (``bare_model.torch_model``, loaded with
  the same parameters) handed to ``gradcheck.from_torch`` and run by
  ``run_case`` with the default options: torch.export capture, decomposition
  and the node-by-node lowering check, then tape, torch and jax in float64 and
  float32 (float32 twice), the referee, the comparison.  Every cache off
  (``GRADCHECK_NO_CACHE=1``): capture and compilation counted in full;
* **warm**: the same with a cache folder one unmeasured run filled first (jax's
  compiled programs and the torch.export capture): a second CI run of the case.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_from_torch.py --threads 2 --runs 3 \\
        --json benchmarks/results/from_torch.json

``--model`` picks the module: ``gpt`` (a GPT-style transformer, 2 blocks at
d_model 256, 64 tokens, batch 2) or ``resnet18`` (batch 1, 3x224x224).  The
harness's own phases (capture, each backend, referee) are in each cold and warm
record, from the case's result.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _common  # noqa: E402

THREADS = _common.setup_threads()
MODELS = {
    "gpt": ("transformer", {"d_model": 256, "n_layer": 2, "n_head": 4, "block_size": 64, "vocab_size": 512}, 2),
    "resnet18": ("resnet18", {}, None),
}


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--model", choices=sorted(MODELS), default="gpt")
    p.add_argument("--child", metavar="OUT", help=argparse.SUPPRESS)  # one harness process, writing its record
    args = p.parse_args(argv)
    if args.child:
        return child(args.model, args.child)
    zoo, options, batch = MODELS[args.model]
    env = _common.thread_env(THREADS)
    cold_env = {**env, "GRADCHECK_NO_CACHE": "1"}
    out = {"threads": THREADS, "machine": _common.machine(), "model": args.model, "zoo_model": zoo,
           "options": options, "batch": batch, "bare": [], "cold": [], "warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        warm_env = {**env, "GRADCHECK_CACHE_DIR": os.path.join(tmp, "cache")}
        opts = [a for k, v in options.items() for a in ("--option", f"{k}={v}")]
        bare = [sys.executable, os.path.join(HERE, "bare_model.py"), zoo, *opts,
                *(["--batch", str(batch)] if batch else []), "--json", os.path.join(tmp, "bare.json")]
        harness = [sys.executable, os.path.abspath(__file__), "--threads", str(THREADS), "--model", args.model,
                   "--child", os.path.join(tmp, "case.json")]
        out["bare_command"] = "GRADCHECK_NO_CACHE=1 python benchmarks/bare_model.py " + " ".join(bare[2:-2])
        out["harness_command"] = f"python benchmarks/bench_from_torch.py --model {args.model} --child OUT"
        _run(harness, warm_env, tmp, "case.json")  # fills the warm cache folder
        for _ in range(args.runs):
            out["bare"].append(_run(bare, cold_env, tmp, "bare.json"))
            out["cold"].append(_run(harness, cold_env, tmp, "case.json"))
            out["warm"].append(_run(harness, warm_env, tmp, "case.json"))
    med = {side: statistics.median(r["wall"] for r in out[side]) for side in ("bare", "cold", "warm")}
    out["summary"] = {
        **{f"{side}_wall_median": v for side, v in med.items()},
        "cold_ratio": med["cold"] / med["bare"], "warm_ratio": med["warm"] / med["bare"],
        "cold_cpu_ratio": statistics.median(r["cpu"] for r in out["cold"]) /
        statistics.median(r["cpu"] for r in out["bare"]),
        "bare_peak_rss_mib": max(r["peak_rss_mib"] for r in out["bare"]),
        "cold_peak_rss_mib": max(r["peak_rss_mib"] for r in out["cold"]),
        "verdicts": sorted({r["record"]["verdict"] for side in ("cold", "warm") for r in out[side]}),
    }
    _common.write(out, args.json)


def _run(cmd, env, cwd, record) -> dict:
    done = _common.run_child(cmd, env=env, cwd=cwd)
    if done["returncode"] != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed ({done['returncode']}):\n{done['stderr'][-3000:]}")
    with open(os.path.join(cwd, record), encoding="utf-8") as fh:
        rec = json.load(fh)
    slim = _common.slim(done)
    slim["cpu"] = slim["cpu_user"] + slim["cpu_sys"]
    slim["record"] = {k: rec[k] for k in ("marks", "fwd_bwd_s", "verdict", "leaves_compared", "timings",
                                          "capture_s", "run_case_s", "referee_passes") if k in rec}
    return slim


def child(model: str, path: str) -> None:
    """One from_torch case, as a user's script runs it: the module, ``from_torch``, ``run_case``."""
    import bare_model
    import numpy as np
    import torch

    import gradcheck
    from gradcheck.check.runner import RunOptions, run_case
    from gradcheck.results import to_dict

    _common.limit_loaded_libraries(THREADS)
    zoo, options, batch = MODELS[model]
    _, built, inputs = bare_model.gradcheck_case(zoo, options, batch, None, 0)
    state = {p: np.asarray(v) for p, v, _ in built.named_arrays()}
    net = bare_model.torch_model(zoo, options, state)
    x = torch.from_numpy(np.asarray(inputs[0]).copy())
    t0 = time.perf_counter()
    case = gradcheck.from_torch(net, x, name=f"from_torch {model}")
    capture = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = run_case(case, RunOptions())
    ran = time.perf_counter() - t0
    record = {"verdict": res.verdict, "leaves_compared": res.leaves_compared, "referee_passes": res.referee_passes,
              "timings": {b: to_dict(t) for b, t in res.timings.items()}, "errors": res.errors, "capture_s": capture, "run_case_s": ran,
              "process_s": time.perf_counter() - T_START}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(record, fh)


if __name__ == "__main__":
    main()

"""from_torch with and without the capture cache: build time and run_case time, cold and warm, fresh processes.

Each measurement is a fresh process with the same cache folder: jax's compilation cache is primed first and
left warm, so cold and warm differ only in the capture cache (its subfolder is emptied before a cold run).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_capture_cache.py --build-only
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_capture_cache.py [transformer resnet64 lstm]

Writes ``benchmarks/results/capture_cache[_build].json``; BENCHMARKS.md has the figures.
"""
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import _blas, run_child  # noqa: E402

CHILD = r'''
import json, sys, time
sys.path.insert(0, sys.argv[4])  # the benchmarks folder: torch_models
import torch
torch.manual_seed(0)
which, folder, run = sys.argv[1], sys.argv[2], sys.argv[3] == "run"
from gradcheck.backends.jax import driver
driver.use_compile_cache(folder, "--cache-dir")
if which == "transformer":
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True)
    m, xs = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), (torch.randn(2, 16, 64),)
elif which == "lstm":
    m, xs = torch.nn.LSTM(16, 32, num_layers=2, batch_first=True), (torch.randn(2, 12, 16),)
else:
    from torch_models import ResNet18
    size = int(which[len("resnet"):])
    m, xs = ResNet18(10), (torch.randn(2 if size < 100 else 1, 3, size, size),)
calls = []
real = torch.export.export
torch.export.export = lambda *a, **k: calls.append(1) or real(*a, **k)
import gradcheck
t0 = time.perf_counter()
case = gradcheck.from_torch(m, *xs, name=which)
out = {"build_s": time.perf_counter() - t0, "exports": len(calls)}
if run:
    from gradcheck.check.runner import RunOptions, run_case
    t0 = time.perf_counter()
    res = run_case(case, RunOptions(backends=("torch", "tape", "jax")))
    out["run_case_s"] = time.perf_counter() - t0
    out["verdict"] = res.verdict
    out["leaves"] = [(l.path, l.verdict, l.layer) for l in res.leaves]
    out["exports_after_run"] = len(calls)
print(json.dumps(out))
'''


def child(which, folder, run):
    r = run_child([sys.executable, "-c", CHILD, which, folder, "run" if run else "build", HERE])
    if r["returncode"] != 0:
        raise SystemExit(r["stderr"][-3000:])
    out = json.loads(r["stdout"].strip().splitlines()[-1])
    out["process_s"] = r["wall"]
    return out


def main():
    run = "--build-only" not in sys.argv
    plan = [(m, run, 2) for m in ("transformer", "resnet64", "lstm")] + [("resnet224", False, 2)]
    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    if names:
        plan = [p for p in plan if p[0] in names]
    results = {"blas": _blas(), "models": {}}
    for which, run, reps in plan:
        folder = tempfile.mkdtemp(prefix="capture-cache-bench.")
        child(which, folder, run)  # primes jax's compilation cache (and the capture cache)
        rows = {"cold": [], "warm": []}
        for _ in range(reps):
            shutil.rmtree(os.path.join(folder, "torch-export"), ignore_errors=True)
            rows["cold"].append(child(which, folder, run))
            rows["warm"].append(child(which, folder, run))
        shutil.rmtree(folder, ignore_errors=True)
        results["models"][which] = rows
        print(which, json.dumps({k: [{kk: vv for kk, vv in r.items() if kk != "leaves"} for r in v]
                                 for k, v in rows.items()}), flush=True)
        same = all(r["leaves"] == rows["cold"][0]["leaves"] and r["verdict"] == rows["cold"][0]["verdict"]
                   for r in rows["cold"] + rows["warm"]) if run else None
        print(which, "same results cold/warm:", same, flush=True)
    name = "capture_cache_build.json" if "--build-only" in sys.argv else "capture_cache.json"
    with open(os.path.join(HERE, "results", name), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

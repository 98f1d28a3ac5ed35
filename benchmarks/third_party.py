"""The harness the third-party model sweeps share (``hf_models.py``, ``timm_models.py``, ``jax_libraries.py``).

Each (model, seed) runs in a fresh process with a time limit: ``child`` builds the model, checks it through
``gradcheck.from_torch`` (or ``from_jax``) and the runner on the tape, torch and jax, and prints one JSON row;
``sweep`` runs the children one after the other, appends each row to a JSON lines file as it comes (nothing is
lost when a model hangs or crashes), and ends with ``table``.

A run is "clean" when its verdict is ``agree`` with nothing unavailable, no error, and no float32 result that
is imprecise (a warning, which does not fail the case unless ``imprecise="fail"``).
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time


def check(model, inputs, forward, *, name: str, seed: int, row: dict) -> dict:
    """Check ``forward(model, *inputs)`` on all three backends and add what a sweep records to ``row``."""
    import gradcheck

    t0 = time.perf_counter()
    row.setdefault("params", sum(p.numel() for p in model.parameters()))
    case = gradcheck.from_torch(model, *inputs, forward=forward, name=name, seed=seed)
    row["capture_s"] = round(time.perf_counter() - t0, 2)
    return check_case(case, row)


def check_case(case, row: dict) -> dict:
    """Run a captured case (``from_torch``, ``from_jax``) on all three backends; add what a sweep records to ``row``."""
    from gradcheck.check.runner import RunOptions, run_case

    res = run_case(case, RunOptions(backends=("tape", "torch", "jax")))
    row.update(verdict=res.verdict, float32=res.float32, compared=res.compared, agreeing=res.agreeing,
               leaves=len(res.leaves), unavailable=res.unavailable, errors=res.errors, notes=res.notes,
               timings={b: {k: None if v is None else round(v, 2) for k, v in vars(t).items()}
                        for b, t in res.timings.items()},
               leaf_verdicts=dict(collections.Counter(leaf.verdict for leaf in res.leaves)),
               float32_off=[{"path": leaf.path, "verdict": leaf.float32.verdict, "message": leaf.float32.message[:400]}
                            for leaf in res.leaves
                            if leaf.float32 is not None and leaf.float32.verdict not in ("ok", "unmeasured")][:12],
               unpinned=list(res.unpinned),
               disagreeing=[{"path": leaf.path, "verdict": leaf.verdict, "blame": list(leaf.blame),
                             "message": leaf.message[:600]}
                            for leaf in res.leaves if leaf.verdict != "agree"][:12],
               disagreeing_roles=dict(collections.Counter(leaf.role for leaf in res.leaves
                                                          if leaf.verdict == "disagree")))
    if res.origin is not None:
        o = res.origin
        row["origin"] = {"kind": o.kind, "path": o.path, "layer": o.layer, "blame": list(o.blame)}
    row["clean"] = (res.verdict == "agree" and not res.unavailable and not res.errors
                    and res.float32 != "imprecise")
    return row


def run_one(script: str, name: str, seed: int, timeout: float, extra: list[str]) -> dict:
    """``script --child name seed *extra`` in a fresh process; its JSON row, or a timeout or crash row."""
    t0 = time.perf_counter()
    cmd = [sys.executable, script, "--child", name, str(seed), *extra]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "seed": seed, "verdict": "timeout", "clean": False,
                "wall_s": round(time.perf_counter() - t0, 1)}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"model": name, "seed": seed, "verdict": "crash", "clean": False, "returncode": proc.returncode,
            "stderr": proc.stderr[-3000:], "wall_s": round(time.perf_counter() - t0, 1)}


def table(rows) -> str:
    lines = ["| model | seed | verdict | float32 | agreeing / compared | unavailable | errors | wall s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        unavailable = ", ".join(r.get("unavailable") or {}) or "none"
        errors = ", ".join(r.get("errors") or {}) or "none"
        lines.append(f"| {r['model']} | {r['seed']} | {r.get('verdict')} | {r.get('float32', '')} | "
                     f"{r.get('agreeing', '-')} / {r.get('compared', '-')} | {unavailable} | {errors} | "
                     f"{r.get('wall_s', '-')} |")
    agree = sum(1 for r in rows if r.get("verdict") == "agree" and not r.get("unavailable") and not r.get("errors"))
    warned = sum(1 for r in rows if r.get("verdict") == "agree" and r.get("float32") == "imprecise")
    clean = sum(1 for r in rows if r.get("clean"))
    lines.append(f"\n{agree} of {len(rows)} runs agree on all three backends with nothing unavailable; {warned} of "
                 f"them warn of an imprecise float32 result; {clean} are clean (agree, nothing unavailable, no "
                 "error, no float32 warning)")
    return "\n".join(lines)


def parser(description: str, models, out: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--models", nargs="*", default=list(models), choices=list(models))
    p.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    p.add_argument("--out", default=out, help="JSON lines, one per (model, seed); appended to")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per (model, seed)")
    p.add_argument("--child", nargs=2, metavar=("MODEL", "SEED"), help=argparse.SUPPRESS)
    p.add_argument("--table", metavar="JSONL", help="print the table of a finished run and exit")
    return p


def print_table(path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    if path.endswith(".jsonl"):
        print(table([json.loads(line) for line in text.splitlines() if line.strip()]))
    else:  # a kept run: {"runs": [...]} (benchmarks/results/hf_models.json)
        print(table(json.loads(text)["runs"]))


def sweep(script: str, args, extra: list[str]) -> int:
    """Every (model, seed) of ``args`` through ``run_one``, each row appended to ``args.out`` as it comes."""
    rows = []
    for name in args.models:
        for seed in args.seeds:
            row = run_one(script, name, seed, args.timeout, extra)
            rows.append(row)
            with open(args.out, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row, default=str) + "\n")
            print(f"{name} seed {seed}: {row.get('verdict')} clean={row.get('clean')} "
                  f"{row.get('agreeing', '-')}/{row.get('compared', '-')} unavailable={list(row.get('unavailable') or {})} "
                  f"errors={list(row.get('errors') or {})} {row.get('wall_s')} s", flush=True)
    print(table(rows))
    return 0 if all(r.get("clean") for r in rows) else 1

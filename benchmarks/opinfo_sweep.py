"""torch's own op database through ``from_torch``: every differentiable OpInfo sample, checked on three backends.

Not a test and not a dependency: an external corpus of the functions a model
library calls.  torch's ``OpInfo`` database
(``torch.testing._internal.common_methods_invocations.op_db``) lists each
operator with sample inputs its own gradcheck tests use.  For every OpInfo
that supports autograd in float64 on the CPU, the first ``--samples`` of its
float64 samples are each wrapped as a module that makes the call (its
differentiable tensors are the module's inputs; every other argument, integer
tensors included, is closed over), and checked as a user's module is:
``gradcheck.from_torch`` and the runner on the tape, torch and jax, in eval
mode, float64 (a float64 case: float64 decides).

Each sample ends as one JSON line in ``--out``: ``outcome`` is

* ``agree``: every leaf agrees on all three backends;
* ``torch alone``: torch was checked against the referee without the others,
  the op or one of its forms having no lowering (``unavailable`` says why);
* ``lowering differs``: the node-by-node check found the lowering computing
  another value than torch's kernel (a bug in the lowering, or a form of the
  op the lowering misreads), so the tape and jax were not compared;
* ``capture``: torch.export (and the fallbacks) could not capture the call;
* ``disagree``: a verdict; its leaves and blame are in the row, to be read;
* ``vacuous``: nothing to compare (an empty tensor: every leaf is vacuous, which the runner reports as an error,
  never a pass);
* ``error`` / ``skipped`` (no float output, complex values) / ``timeout``.

Ops run in child processes that take the remaining list in order, so a crash
or a hang costs one sample, not the sweep:

    python benchmarks/opinfo_sweep.py --out opinfo.jsonl
    python benchmarks/opinfo_sweep.py --ops cumsum nn.functional.unfold --out some.jsonl
    python benchmarks/opinfo_sweep.py --table opinfo.jsonl
    python benchmarks/opinfo_sweep.py --fault tape --ops add mul sin --out faulty.jsonl

``--fault`` makes a backend's gradient of every ``add`` 1 % too large (``third_party.faulty``): a sample whose
call adds must then disagree, blamed on that backend alone.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import time

import third_party

OUTCOMES = ("agree", "torch alone", "lowering differs", "capture", "disagree", "vacuous", "error", "skipped",
            "timeout")


def _op_db():
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


def key(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def eligible(op) -> bool:
    import torch

    return bool(op.supports_autograd) and torch.float64 in op.supported_dtypes("cpu")


class _Call:
    """One OpInfo sample as a module's forward: the differentiable tensors are its inputs, the rest closed over."""

    def __new__(cls, op, sample):
        import torch
        from torch.utils import _pytree

        leaves, spec = _pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
        slots = [i for i, v in enumerate(leaves)
                 if isinstance(v, torch.Tensor) and v.is_floating_point() and v.requires_grad]
        process = sample.output_process_fn_grad

        class Call(torch.nn.Module):
            def forward(self, *tensors):
                filled = list(leaves)
                for i, t in zip(slots, tensors, strict=True):
                    filled[i] = t
                x, args, kwargs = _pytree.tree_unflatten(filled, spec)
                # As torch's own gradient tests call it: an op whose gradient torch defines for Hermitian or
                # triangular inputs only gets its input made so here (the convention is the op's, declared).
                out = process(op.gradcheck_wrapper(op.get_op(), x, *args, **kwargs))
                flat = [o for o in _pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.is_floating_point()]
                return tuple(flat)

        inputs = [leaves[i].detach().clone() for i in slots]
        return Call(), inputs


def _describe(sample) -> str:
    import torch
    from torch.utils import _pytree

    shapes = [tuple(v.shape) if isinstance(v, torch.Tensor) else v
              for v in _pytree.tree_leaves((sample.input, tuple(sample.args)))]
    text = f"{shapes} {dict(sample.kwargs) or ''}".strip()
    return text[:200]


def torch_expects_failure(op) -> bool:
    """Whether torch's own OpInfo marks its backward gradient test of the op as an expected failure (or skips it):
    a disagreement blamed on torch is then torch's known defect."""
    for d in list(op.decorators) + list(op.skips):
        if getattr(d, "cls_name", None) == "TestBwdGradients" and getattr(d, "test_name", None) == "test_fn_grad":
            return True
    return False


def classify(row: dict) -> str:
    if row.get("verdict") == "agree" and not row.get("unavailable") and not row.get("errors"):
        return "agree"
    unavailable = " ".join((row.get("unavailable") or {}).values())
    if "disagrees with torch's" in unavailable:
        return "lowering differs"
    if row.get("verdict") == "disagree":
        return "disagree"
    if unavailable and not row.get("errors"):
        return "torch alone"
    if row.get("verdict") == "vacuous":
        return "vacuous"
    return "error"


def check_sample(op, sample, seed: int, fault: str | None) -> dict:
    import torch

    import gradcheck

    row = {"op": key(op), "sample": _describe(sample), "seed": seed, "torch_expects_failure": torch_expects_failure(op)}
    leaves = [v for v in torch.utils._pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
              if isinstance(v, torch.Tensor)]
    if any(v.is_complex() for v in leaves):
        return {**row, "outcome": "skipped", "why": "complex values"}
    module, inputs = _Call(op, sample)
    if not inputs:
        return {**row, "outcome": "skipped", "why": "no differentiable tensor"}
    with torch.no_grad():
        outs = module(*inputs)
    if not outs:
        return {**row, "outcome": "skipped", "why": "no float output"}
    t0 = time.perf_counter()
    try:
        case = gradcheck.from_torch(module, *inputs, name=key(op), seed=seed, mode="eval", dtype="float64")
    except Exception as exc:  # noqa: BLE001 - what capture says is the row
        return {**row, "outcome": "capture", "why": f"{type(exc).__name__}: {exc}"[:600]}
    row["capture_s"] = round(time.perf_counter() - t0, 2)
    with third_party.faulty(fault, "torch"):
        third_party.check_case(case, row)
    row["outcome"] = classify(row)
    row["fault"] = fault
    return row


class _Timeout(Exception):
    pass


def child(keys: list[str], samples: int, seed: int, fault: str | None, timeout: float) -> None:
    """Check the samples of ``keys`` in order, one JSON line each (a ``start`` line before each sample, so that the
    parent knows which one a crash or a hang took)."""
    import torch

    by_key = {key(op): op for op in _op_db()}

    def alarm(signum, frame):
        raise _Timeout

    signal.signal(signal.SIGALRM, alarm)
    for k in keys:
        op = by_key[k]
        torch.manual_seed(seed)
        try:
            drawn = list(op.sample_inputs("cpu", torch.float64, requires_grad=True))[:samples]
        except Exception as exc:  # noqa: BLE001
            print(json.dumps({"op": k, "index": 0, "outcome": "error", "why": f"samples: {exc}"[:400]}), flush=True)
            continue
        for i, sample in enumerate(drawn):
            print(json.dumps({"start": k, "index": i}), flush=True)
            t0 = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                row = check_sample(op, sample, seed, fault)
            except _Timeout:
                row = {"op": k, "outcome": "timeout"}
            except Exception as exc:  # noqa: BLE001 - a sweep records what failed and goes on
                row = {"op": k, "outcome": "error", "why": f"{type(exc).__name__}: {exc}"[:600]}
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            row.update(index=i, wall_s=round(time.perf_counter() - t0, 2))
            print(json.dumps(row, default=str), flush=True)
        print(json.dumps({"done": k}), flush=True)


def sweep(args) -> int:
    keys = list(args.ops) if args.ops else [key(op) for op in _op_db() if eligible(op)]
    remaining = list(keys)
    rows = []
    while remaining:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--samples", str(args.samples),
               "--seed", str(args.seed), "--timeout", str(args.timeout), "--ops", *remaining]
        if args.fault:
            cmd += ["--fault", args.fault]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        started = None
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            rec = json.loads(line)
            if "start" in rec:
                started = rec
            elif "done" in rec:
                remaining.remove(rec["done"])
            else:
                started = None
                rows.append(rec)
                with open(args.out, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(rec, default=str) + "\n")
                print(f"{rec['op']}[{rec.get('index')}]: {rec['outcome']} {rec.get('wall_s', '')}", flush=True)
        proc.wait()
        if proc.returncode != 0 and remaining:  # the child died: its started sample is the crash, then go on
            rec = {"op": remaining[0], "outcome": "error", "why": f"child process died ({proc.returncode})",
                   "index": (started or {}).get("index")}
            rows.append(rec)
            with open(args.out, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(rec) + "\n")
            remaining.pop(0)
    print(table(rows))
    if args.fault:
        return 0 if all(third_party.caught_alone(r) for r in rows if r["outcome"] == "disagree") else 1
    return 0 if not any(r["outcome"] in ("disagree", "error", "timeout", "lowering differs") for r in rows) else 1


def slim(row: dict) -> dict:
    """What the kept record holds of a sample: its op, outcome and the first line of why."""
    detail = row.get("why") or "; ".join(f"{d['path']}: {d['verdict']} blamed on {d['blame']}"
                                         for d in row.get("disagreeing") or [])
    detail = detail or "; ".join(f"{b}: {w}" for b, w in (row.get("unavailable") or {}).items())
    return {"op": row["op"], "index": row.get("index"), "sample": row.get("sample", ""), "outcome": row["outcome"],
            "torch_expects_failure": row.get("torch_expects_failure", False),
            "detail": _relative(detail.split("\n")[0])[:240]}


def _relative(text: str) -> str:
    """Source paths as the project and the packages name them, not where this machine keeps them."""
    text = re.sub(r"/[^\s:'\"]*/(?:site|dist)-packages/", "", text)
    return re.sub(r"/[^\s:'\"]*/(?=(?:gradcheck|benchmarks|tests)/)", "", text)


def table(rows) -> str:
    counts = collections.Counter(r["outcome"] for r in rows)
    lines = [f"{len(rows)} samples of {len({r['op'] for r in rows})} ops: "
             + ", ".join(f"{o} {counts[o]}" for o in OUTCOMES if counts[o])]
    for outcome in ("disagree", "lowering differs", "error", "timeout", "capture"):
        for r in (r for r in rows if r["outcome"] == outcome):
            detail = r.get("why") or "; ".join(f"{d['path']}: {d['verdict']} blamed on {d['blame']}"
                                                 for d in r.get("disagreeing") or [])
            if r.get("torch_expects_failure"):
                detail += " (torch's OpInfo expects its own gradient test of this op to fail)"
            detail = detail or "; ".join(f"{b}: {w}" for b, w in (r.get("unavailable") or {}).items())
            lines.append(f"- {outcome}: {r['op']}[{r.get('index')}] {r.get('sample', '')}: {detail[:300]}")
    missing = collections.Counter()
    for r in rows:
        if r["outcome"] == "torch alone":
            for why in (r.get("unavailable") or {}).values():
                missing[why.split(" is an op without a lowering")[0][:120]] += 1
    if missing:
        lines.append("torch alone, by what is missing: " + "; ".join(f"{w} ({n})" for w, n in missing.most_common()))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", nargs="*", help="OpInfo names (name or name.variant); default: every eligible one")
    p.add_argument("--samples", type=int, default=1, help="samples per OpInfo (the first ones torch lists)")
    p.add_argument("--seed", type=int, default=0, help="torch's seed for the samples, and the case seed")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per sample")
    p.add_argument("--out", default="opinfo_sweep.jsonl", help="JSON lines, one per sample; appended to")
    p.add_argument("--fault", choices=["tape", "torch", "jax"],
                   help="make that backend's gradient of every add 1%% too large (the negative control)")
    p.add_argument("--table", metavar="JSONL", help="print the table of a finished run and exit")
    p.add_argument("--slim", metavar="JSON", help="with --table: also write each sample's outcome, in a line, there")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.table:
        with open(args.table, encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        print(table(rows))
        if args.slim:
            with open(args.slim, "w", encoding="utf-8") as fh:  # a sample a line, for diffs between runs
                fh.write('{"command": "python benchmarks/opinfo_sweep.py --samples 2", "rows": [\n'
                         + ",\n".join(json.dumps(slim(r)) for r in rows) + "\n]}\n")
        return 0
    if args.child:
        child(args.ops, args.samples, args.seed, args.fault, args.timeout)
        return 0
    return sweep(args)


if __name__ == "__main__":
    sys.exit(main())

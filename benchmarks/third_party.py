"""The harness the third-party model sweeps share (``hf_models.py``, ``timm_models.py``, ``jax_libraries.py``).

Each (model, seed) runs in a fresh process with a time limit: ``child`` builds the model, checks it through
``gradcheck.from_torch`` (or ``from_jax``) and the runner on the tape, torch and jax, and prints one JSON row;
``sweep`` runs the children one after the other, appends each row to a JSON lines file as it comes (nothing is
lost when a model hangs or crashes), and ends with ``table``.

A run is "clean" when its verdict is ``agree`` with nothing unavailable, no error, and no float32 result that
is imprecise (a warning, which does not fail the case unless ``imprecise="fail"``).

``--fault BACKEND`` (every script) is the negative control: that backend's gradient of every ``add`` is made 1 %
too large (``fault``), so every run must disagree, blamed on that backend alone, with an origin; the table then
counts the runs that did.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import subprocess
import sys
import time


def check(model, inputs, forward, *, name: str, seed: int, row: dict, fault: str | None = None) -> dict:
    """Check ``forward(model, *inputs)`` on all three backends and add what a sweep records to ``row``; with
    ``fault``, that backend's gradient of ``add`` is wrong while the case runs (captured as it is)."""
    import gradcheck

    t0 = time.perf_counter()
    row.setdefault("params", sum(p.numel() for p in model.parameters()))
    case = gradcheck.from_torch(model, *inputs, forward=forward, name=name, seed=seed)
    row["capture_s"] = round(time.perf_counter() - t0, 2)
    with faulty(fault, "torch"):
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


FACTOR = 1.01


@contextlib.contextmanager
def faulty(backend: str | None, frontend: str):
    """While it is open, ``backend``'s gradient of every ``add`` is ``FACTOR`` times too large (``--fault``);
    nothing changes for ``None``.  ``frontend`` ("torch" or "jax") is the model's framework, which says what torch
    runs: a ``from_torch`` case's torch backend runs the user's module itself, a ``from_jax`` case's runs the
    jaxpr's lowering.

    * jax: its own rule for ``add`` (the JVP that its transpose and ``grad`` come from) scales the tangent;
    * the tape, and torch on a ``from_jax`` case: the frontend's lowering of ``add`` passes its result through an
      identity whose gradient is scaled, on that backend's values only;
    * torch on a ``from_torch`` case: a torch function mode passes every floating result of an ``add`` (``+``,
      ``torch.add``, ``+=``, ``add_``) that needs a gradient through such an identity (in place for the in-place
      forms).
    """
    if backend is None:
        yield
        return
    with contextlib.ExitStack() as stack:
        if backend == "jax":
            _patch(stack, *_jax_add())
        elif backend == "torch" and frontend == "torch":
            stack.enter_context(_torch_adds())
        else:
            _patch(stack, *_lowered_add(backend, frontend))
        yield


def _patch(stack: contextlib.ExitStack, table: dict, replaced: dict) -> None:
    """``table`` updated with ``replaced``, restored when ``stack`` closes."""
    before = {k: table[k] for k in replaced}
    table.update(replaced)
    stack.callback(table.update, before)


def _jax_add():
    from jax import lax
    from jax._src.interpreters import ad

    right = ad.primitive_jvps[lax.add_p]

    def wrong(primals, tangents, **params):
        out, tangent = right(primals, tangents, **params)
        return out, (tangent if type(tangent) is ad.Zero else tangent * FACTOR)

    return ad.primitive_jvps, {lax.add_p: wrong}


def _lowered_add(backend: str, frontend: str):
    """The frontend's lowering table and its ``add`` entries, each passing ``backend``'s results through
    ``scaled_gradient(backend)``."""
    from gradcheck.backends import backend_of

    if frontend == "jax":
        from gradcheck.frontends.jax.primitives import LOWERINGS as table
        names = ("add",)
    else:
        from gradcheck.frontends.torch.aten import LOWERINGS as table
        names = ("aten.add.Tensor", "aten.add.Scalar")
    scaled = scaled_gradient(backend)

    def wrong(right):
        def lowering(*args, **kwargs):
            out = right(*args, **kwargs)
            return scaled(out) if backend_of(out) == backend else out

        return lowering

    return table, {name: wrong(table[name]) for name in names}


def scaled_gradient(backend: str, factor: float = FACTOR):
    """An identity on ``backend``'s arrays whose gradient is ``factor`` times the incoming one (the sweeps'
    faults, and ``bench_localise.py``'s wrong VJP)."""
    if backend == "tape":
        import numpy as np

        from gradcheck import ops
        from gradcheck.backends.tape.tape import Primitive

        return Primitive("scaled_gradient", lambda y: np.asarray(y)).defvjp(lambda g, ans, y: ops.mul(g, factor))
    import torch

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            return y.clone()

        @staticmethod
        def backward(ctx, g):
            return g * factor

    return Scaled.apply


def _torch_adds():
    """A torch function mode scaling the gradient of every floating ``add`` result that needs one."""
    import torch
    from torch.overrides import TorchFunctionMode

    class ScaledInPlace(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            ctx.mark_dirty(y)
            return y

        @staticmethod
        def backward(ctx, g):
            return g * FACTOR

    scaled = scaled_gradient("torch")
    T = torch.Tensor
    out_of_place = {torch.add, T.add, T.__add__, T.__radd__}
    in_place = {T.add_, T.__iadd__}

    class Adds(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if (isinstance(out, torch.Tensor) and out.is_floating_point() and out.requires_grad
                    and torch.is_grad_enabled()):
                if func in out_of_place:
                    return scaled(out)
                if func in in_place:
                    return ScaledInPlace.apply(out)
            return out

    return Adds()


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
    for backend in sorted({r["fault"] for r in rows if r.get("fault")}):
        faulted = [r for r in rows if r.get("fault") == backend]
        caught = sum(1 for r in faulted if caught_alone(r))
        lines.append(f"with {backend}'s add gradient wrong: {caught} of {len(faulted)} runs disagree, blamed on "
                     f"{backend} alone, with an origin blamed on it")
    return "\n".join(lines)


def caught_alone(row: dict) -> bool:
    """A fault run (``--fault``) that did what the negative control asks: disagree, every disagreeing leaf blamed
    on the faulty backend alone, and an origin blamed on it alone."""
    fault = row.get("fault")
    off = row.get("disagreeing") or []
    return (row.get("verdict") == "disagree" and bool(off) and not row.get("unavailable")
            and all(d["blame"] == [fault] for d in off if d["verdict"] == "disagree")
            and (row.get("origin") or {}).get("blame") == [fault])


def parser(description: str, models, out: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--models", nargs="*", default=list(models), choices=list(models))
    p.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    p.add_argument("--out", default=out, help="JSON lines, one per (model, seed); appended to")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per (model, seed)")
    p.add_argument("--child", nargs=2, metavar=("MODEL", "SEED"), help=argparse.SUPPRESS)
    p.add_argument("--table", metavar="JSONL", help="print the table of a finished run and exit")
    p.add_argument("--fault", choices=["tape", "torch", "jax"],
                   help="make that backend's gradient of every add 1%% too large (the negative control)")
    return p


def print_table(path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    if path.endswith(".jsonl"):
        print(table([json.loads(line) for line in text.splitlines() if line.strip()]))
    else:  # a kept run: {"runs": [...]} (benchmarks/results/hf_models.json)
        print(table(json.loads(text)["runs"]))


def sweep(script: str, args, extra: list[str]) -> int:
    """Every (model, seed) of ``args`` through ``run_one``, each row appended to ``args.out`` as it comes.  Exit 0
    when every run is clean, or with ``--fault`` when every run caught it (``caught_alone``)."""
    extra = extra + (["--fault", args.fault] if args.fault else [])
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
    return 0 if all(caught_alone(r) if args.fault else r.get("clean") for r in rows) else 1

"""How a gradcheck case's time and memory grow with the model, next to the bare frameworks' forward+backward.

Points: the zoo's ResNet-18, -34 and -50 (batch 1, 3x224x224) and its
GPT-style transformer with 2, 4, 8 and 12 blocks at d_model 256 (4 heads)
and at d_model 768 (12 heads), on batch 2 of 64 tokens from a vocabulary of
512; smallest first.  For each point, two fresh processes, the bare one
first (peak resident memory is only meaningful per process):

* ``bare``: ``bare_model.py``, the same model with the same parameters
  written in plain torch.nn (eager) and plain jax (``jit(value_and_grad)``,
  compilation included), forward+backward in float32 and in float64;
* ``gradcheck``: the case ``gradcheck run`` builds (``ModelSpec.case``,
  seed 0) through ``runner.run_case`` with the default options (tape, torch,
  jax; float64 and float32; referee auto; jax's persistent cache off), each
  runner step wrapped to record its seconds and how much it raised the
  process's peak resident memory.

After each point the JSON (with the growth exponent of each phase against
parameters and against the bare forward+backward, and a memory model: peak
RSS fitted on parameters, float inputs, activation elements and the forward's
op count) and the SVG figure beside it (time and peak memory against
parameter count, log axes) are rewritten; ``--figure-only`` redoes both from
the JSON.  A point whose gradcheck run takes over ``--max-seconds`` ends its
family's sweep, and a point predicted (linearly in parameters, from the
family's last) to need more memory than is available is not run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_model_scaling.py --threads 1 \\
        --json benchmarks/results/model_scaling.json

One thread per framework on a shared machine: with more BLAS threads than
free cores, OpenBLAS's float64 matmul (the tape's and the referee's) slows
down by an order of magnitude, and the figures would measure the neighbours.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SEQ, VOCAB, TOKEN_BATCH = 64, 512, 2


def points() -> list[dict]:
    """Every point of the sweep: name, family, zoo model, options, batch, per-example input shape."""
    out = [{"name": name, "family": "resnet", "model": name, "options": {}, "batch": 1,
            "input_shape": [3, 224, 224]} for name in ("resnet18", "resnet34", "resnet50")]
    for d_model, n_head in ((256, 4), (768, 12)):
        for n_layer in (2, 4, 8, 12):
            out.append({"name": f"gpt d{d_model} L{n_layer}", "family": f"gpt d{d_model}", "model": "transformer",
                        "options": {"vocab_size": VOCAB, "block_size": SEQ, "d_model": d_model, "n_head": n_head,
                                    "n_layer": n_layer},
                        "batch": TOKEN_BATCH, "input_shape": [SEQ]})
    return out


def parameter_count(point: dict) -> int:
    """Trainable elements before anything is built (to run the points smallest first): the GPT's from its
    shapes, the ResNets' as the zoo's table gives them."""
    if point["family"] == "resnet":
        return {"resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032}[point["model"]]
    o = point["options"]
    d, v, t = o["d_model"], o["vocab_size"], o["block_size"]
    block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    return v * d + t * d + o["n_layer"] * block + 2 * d + v * d


# ------------------------------------------------------------------ the gradcheck child
def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _rss_mib() -> float:
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Phases:
    """Wraps runner steps; each stretch of time between two wrapper events goes to the innermost open phase,
    with the seconds it took and how much it raised the process's peak RSS (``ru_maxrss`` only grows, so the
    phase that raised it last is where the peak is)."""

    def __init__(self):
        self.stack: list[str] = []
        self.self_s: dict[str, float] = {}
        self.peak_gain_mib: dict[str, float] = {}
        self.rss_after_mib: dict[str, float] = {}
        self.order: list[str] = []
        self._t, self._peak = time.perf_counter(), _peak_mib()

    def _flush(self) -> None:
        now, peak = time.perf_counter(), _peak_mib()
        key = "/".join(self.stack) or "(between steps)"
        if key not in self.self_s:
            self.order.append(key)
        self.self_s[key] = self.self_s.get(key, 0.0) + now - self._t
        self.peak_gain_mib[key] = self.peak_gain_mib.get(key, 0.0) + peak - self._peak
        if peak > self._peak:
            self.peak_in = key
        self._t, self._peak = now, peak

    def wrap(self, owner, name: str, label) -> None:
        inner = getattr(owner, name, None)
        if inner is None:  # a step this version of the runner does not have
            return

        def wrapper(*args, **kwargs):
            text = label(*args, **kwargs) if callable(label) else label
            self._flush()
            self.stack.append(text)
            try:
                return inner(*args, **kwargs)
            finally:
                self._flush()
                self.rss_after_mib["/".join(self.stack)] = _rss_mib()
                self.stack.pop()

        setattr(owner, name, wrapper)


def _nbytes_held(objs, seen: set) -> int:
    """Bytes of the distinct numpy buffers reachable in dicts, lists and tuples of ``objs`` (each buffer once)."""
    import numpy as np

    total = 0
    stack = [objs]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif isinstance(o, np.ndarray):
            base = o
            while isinstance(base.base, np.ndarray):
                base = base.base
            key = (base.__array_interface__["data"][0], base.nbytes)
            if key not in seen:
                seen.add(key)
                total += base.nbytes
        elif hasattr(o, "value") and hasattr(o, "path"):  # a Leaf
            stack.append(o.value)
    return total


def gradcheck_child(point: dict, seed: int) -> dict:
    """One ``run_case`` of the point's zoo case in this fresh process, with its phases and memory."""
    t0 = time.perf_counter()
    import jax  # noqa: F401 - imported first, so that the phases below time work and not imports
    import numpy as np
    import torch  # noqa: F401

    from gradcheck.check import localise, runner
    from gradcheck.layers.models import MODELS

    _common.limit_loaded_libraries(int(os.environ.get("OMP_NUM_THREADS", _common.cores())))
    imports_s, rss_imports = time.perf_counter() - t0, _rss_mib()

    ph = Phases()
    seen: dict = {}
    ph.wrap(runner.CaseRun, "__init__", "build case + reference forward")
    try:
        from gradcheck.check import memory

        ph.wrap(memory, "judge", "memory check")
    except ImportError:  # a runner without the memory check
        pass
    ph.wrap(runner, "_run_backends", "backends")
    ph.wrap(runner, "_prepare_compiled", "jax prepare")  # tracing; compiling then overlaps tape and torch
    ph.wrap(localise, "snapshot", "snapshots")
    ph.wrap(runner.CaseRun, "restore_changed", "mutation check")
    ph.wrap(runner, "_evaluate_backend", lambda name, *a, **k: name)
    ph.wrap(runner, "_float32", "float32")
    ph.wrap(runner, "_compare", "compare")
    ph.wrap(runner, "_referee", "referee")
    ph.wrap(runner, "_within_reach", "float64's reach")
    ph.wrap(runner, "_run_checks", "other checks")
    ph.wrap(runner, "_referee_deferred", "referee (deferred)")
    # Keep the case's state and the backends' results, to count the float64 parameter copies they hold.
    init, run_backends = runner.CaseRun.__init__, runner._run_backends

    def keep_init(self, *a, **k):
        seen["cr"] = self
        return init(self, *a, **k)

    def keep_runs(cr, *a, **k):
        seen["runs"] = run_backends(cr, *a, **k)
        seen["held_after_backends"] = _held(cr, seen["runs"])
        return seen["runs"]

    runner.CaseRun.__init__, runner._run_backends = keep_init, keep_runs
    snapshot = localise.snapshot
    snapshots = seen.setdefault("snapshots", [])
    localise.snapshot = lambda *a, **k: snapshots.append(snapshot(*a, **k)) or snapshots[-1]

    def _held(cr, runs) -> dict:
        """Bytes the case holds once every backend has run, by owner (each numpy buffer counted once)."""
        ids: set = set()
        out = {"float64 arguments": _nbytes_held(list(cr.leaves64.values()), ids),
               "float32 arguments": _nbytes_held([leaf.value for leaf in runner.all_leaves(cr.args32, cr.prefixes)]
                                                 if cr.args32 is not None else [], ids),
               "snapshots": _nbytes_held(snapshots[:2], ids)}
        for name, run in runs.items():
            for part in ("ev64", "ev32", "spread"):  # spread: a float per leaf (the second call, reduced)
                ev = getattr(run, part, None)
                if ev is not None:
                    out[f"{name} {part}"] = _nbytes_held([ev.value, ev.grads, ev.buffers, ev.leaves], ids)
        return out

    case = MODELS[point["model"]].case(seed=seed, batch=point["batch"], input_shape=tuple(point["input_shape"]),
                                       **point["options"])
    c0, w0 = time.process_time(), time.perf_counter()
    res = runner.run_case(case, runner.RunOptions())
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    ph._flush()
    cr = seen["cr"]
    params = res.params
    float_inputs = [v for p, v in cr.leaves64.items() if p.startswith("input") and np.asarray(v).dtype.kind == "f"]
    copy_mib = params * 8 / 2**20
    held = {k: v / 2**20 for k, v in seen.get("held_after_backends", {}).items()}
    return {
        "imports_s": imports_s, "rss_after_imports_mib": rss_imports, "wall_s": wall, "cpu_s": cpu,
        "verdict": res.verdict, "errors": res.errors, "notes": [n[:300] for n in res.notes],
        "params": params, "leaves": len(res.leaves), "leaves_compared": res.leaves_compared,
        "referee_passes": res.referee_passes,
        "activation_elements": int(cr.forward64_work.elements), "forward64_macs": int(cr.forward64_work.macs),
        "forward64_ops": int(cr.forward64_work.ops), "forward64_s": cr.forward64_s,
        "input_elements": int(sum(np.size(v) for v in float_inputs)),
        "timings": {b: dict(vars(t)) for b, t in res.timings.items()},
        "phases_self_s": {k: ph.self_s[k] for k in ph.order},
        "phases_peak_gain_mib": {k: ph.peak_gain_mib[k] for k in ph.order},
        "rss_after_phase_mib": ph.rss_after_mib, "peak_reached_in": getattr(ph, "peak_in", None),
        "held_after_backends_mib": held,
        "held_after_backends_float64_copies": sum(held.values()) / copy_mib if copy_mib else None,
        "peak_rss_self_mib": _peak_mib(), "gradcheck_tree": tree_state(),
    }


# ------------------------------------------------------------------ the parent
def _bare_cmd(point: dict, seed: int, threads: int, json_path: str) -> list[str]:
    cmd = [sys.executable, os.path.join(HERE, "bare_model.py"), point["model"], "--threads", str(threads),
           "--batch", str(point["batch"]), "--input-shape", "x".join(map(str, point["input_shape"])),
           "--seed", str(seed), "--json", json_path]
    for k, v in point["options"].items():
        cmd += ["--option", f"{k}={v}"]
    return cmd


def run_point(point: dict, seed: int, threads: int, env: dict) -> dict:
    """The point's bare process, then its gradcheck process."""
    row = dict(point, loadavg_before=_common._loadavg())
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bare.json")
        b = _common.run_child(_bare_cmd(point, seed, threads, out), env=env)
        if b["returncode"] != 0:
            row["bare"] = {"returncode": b["returncode"], "stderr": b["stderr"][-3000:]}
        else:
            with open(out, encoding="utf-8") as fh:
                row["bare"] = json.load(fh)
            row["bare"].update(process_wall_s=b["wall"], peak_rss_mib=b["peak_rss_mib"],
                               cpu_s=b["cpu_user"] + b["cpu_sys"])
    g = _common.run_child([sys.executable, os.path.abspath(__file__), "--child", json.dumps(point), "--seed",
                           str(seed), "--threads", str(threads)], env=env)
    lines = [line for line in g["stdout"].splitlines() if line.startswith("{")]
    row["gradcheck"] = json.loads(lines[-1]) if lines else {"stderr": g["stderr"][-3000:]}
    row["gradcheck"].update(returncode=g["returncode"], process_wall_s=g["wall"], peak_rss_mib=g["peak_rss_mib"],
                            process_cpu_s=g["cpu_user"] + g["cpu_sys"])
    return row


def tree_state() -> dict:
    """The commit measured, and the files under gradcheck/ that differ from it (the working tree is what runs)."""
    import subprocess

    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=_common.ROOT, capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return ""

    return {"commit": git("rev-parse", "HEAD").strip(),
            "changed": [line[3:] for line in git("status", "--porcelain", "gradcheck").splitlines()]}


def available_mib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=360.0,
                   help="a point whose gradcheck run takes longer ends its family's sweep (default 360)")
    p.add_argument("--resume", action="store_true", help="keep the finished points of --json and run the others")
    p.add_argument("--only", nargs="*", help="run only these points (names as in the JSON, e.g. 'resnet18')")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--figure-only", action="store_true", help="redraw the SVG and the analysis from --json")
    args = p.parse_args(argv)
    threads = _common.setup_threads()
    if args.child:
        print(json.dumps(gradcheck_child(json.loads(args.child), args.seed), default=_common._jsonable), flush=True)
        return 0
    svg = os.path.splitext(args.json)[0] + ".svg" if args.json else None
    if args.figure_only:
        if not args.json or not os.path.exists(args.json):
            print(f"--figure-only redraws from an existing --json file; got {args.json!r} (run the sweep with "
                  "--json PATH first)", file=sys.stderr)
            return 2
        with open(args.json, encoding="utf-8") as fh:
            result = json.load(fh)
        _finish(result, args.json, svg)
        return 0
    env = {**_common.thread_env(threads), "GRADCHECK_NO_CACHE": "1"}
    todo = sorted(points(), key=parameter_count)
    if args.only:
        unknown = set(args.only) - {pt["name"] for pt in todo}
        if unknown:
            print(f"no point named {', '.join(sorted(unknown))}; the points are: "
                  + ", ".join(pt["name"] for pt in todo), file=sys.stderr)
            return 2
        todo = [pt for pt in todo if pt["name"] in args.only]
    result = {"machine": _common.machine(), "threads": threads, "seed": args.seed, "gradcheck_tree": tree_state(),
              "points": [], "stopped": []}
    if args.resume and args.json and os.path.exists(args.json):
        with open(args.json, encoding="utf-8") as fh:
            kept = json.load(fh)
        result["points"] = [r for r in kept["points"] if "wall_s" in r["gradcheck"]]
        result["machine_before_resume"] = kept["machine"]
    done = {r["name"] for r in result["points"]}
    over = set()  # families with a point over --max-seconds: their larger points are skipped
    for pt in todo:
        if pt["name"] in done:
            continue
        if pt["family"] in over:
            result["stopped"].append(f"{pt['name']} not run: a smaller {pt['family']} point took over "
                                     f"{args.max_seconds:.0f} s")
            continue
        last = [r for r in result["points"] if r["family"] == pt["family"] and "wall_s" in r["gradcheck"]]
        room = available_mib()
        if last and room is not None:
            m_pred = last[-1]["gradcheck"]["peak_rss_mib"] * parameter_count(pt) / last[-1]["gradcheck"]["params"]
            if m_pred > room:
                over.add(pt["family"])
                result["stopped"].append(f"{pt['name']} not run: predicted {m_pred:.0f} MiB (linear in parameters "
                                         f"from {last[-1]['name']}), {room:.0f} MiB available")
                continue
        row = run_point(pt, args.seed, threads, env)
        result["points"].append(row)
        g, b = row["gradcheck"], row["bare"]
        print(f"{pt['name']:14s} params {g.get('params', 0) / 1e6:6.1f} M  bare fwd+bwd {b.get('fwd_bwd_s', 0):6.1f} s "
              f"(process {b.get('process_wall_s', 0):6.1f} s, {b.get('peak_rss_mib', 0):6.0f} MiB)  gradcheck "
              f"{g.get('wall_s', 0):6.1f} s (process {g.get('process_wall_s', 0):6.1f} s, "
              f"{g.get('peak_rss_mib', 0):6.0f} MiB)  {g.get('verdict')}  peak in {g.get('peak_reached_in')}  "
              f"load {_common._loadavg()}", file=sys.stderr, flush=True)
        if g.get("wall_s", 0) > args.max_seconds:
            over.add(pt["family"])
        _finish(result, args.json, svg)
    _finish(result, args.json, svg)
    return 0


# ------------------------------------------------------------------ the analysis
# The runner steps each recorded phase key (Phases, innermost step first) is summed into, for the table.
PHASE_GROUPS = {
    "build + reference forward": ("build case + reference forward",),
    "memory check": ("memory check",),
    # jax's tracing ahead of the eager backends, whose compilation then runs in a thread beside tape and torch
    # (runner._prepare_compiled): jax's own calls then only wait, and tape's and torch's share the cores with it.
    "jax prepare + set-up": ("backends", "backends/jax prepare"),
    "snapshots + mutation check": ("backends/snapshots", "backends/mutation check"),
    "tape float64": ("backends/tape",), "tape float32 x2": ("backends/tape/float32",),
    "torch float64": ("backends/torch",), "torch float32 x2": ("backends/torch/float32",),
    "jax float64": ("backends/jax",), "jax float32 x2": ("backends/jax/float32",),
    "compare leaves": ("compare",),
    "referee": ("compare/referee", "referee (deferred)"),
    "float64's reach": ("compare/float64's reach",),
    "other checks": ("other checks",),
}
MIB_PER_FLOAT64 = 8 / 2**20


def phase_split(g: dict) -> dict[str, float]:
    """Seconds per phase group of one gradcheck run; "rest" is what no wrapped step took."""
    own = g["phases_self_s"]
    out = {k: sum(own.get(key, 0.0) for key in keys) for k, keys in PHASE_GROUPS.items()}
    out["rest"] = g["wall_s"] - sum(out.values())
    return out


def _estimate_s(g: dict) -> float:
    from gradcheck.check import cost

    return cost.Work(g["forward64_macs"], g["activation_elements"], g["forward64_ops"]).seconds()


def table_row(r: dict) -> dict:
    g, b = r["gradcheck"], r["bare"]
    copy_mib = g["params"] * MIB_PER_FLOAT64
    torch64 = b["marks"]["torch eager forward+backward, float64"]
    return {
        "name": r["name"], "family": r["family"], "params": g["params"],
        "activation_elements": g["activation_elements"], "input_elements": g["input_elements"],
        "bare_fwd_bwd_s": b["fwd_bwd_s"], "bare_torch_float64_fwd_bwd_s": torch64,
        "bare_process_s": b["process_wall_s"], "bare_peak_rss_mib": b["peak_rss_mib"],
        "gradcheck_s": g["wall_s"], "gradcheck_cpu_s": g["cpu_s"], "gradcheck_process_s": g["process_wall_s"],
        "gradcheck_peak_rss_mib": g["peak_rss_mib"], "gradcheck_rss_after_imports_mib": g["rss_after_imports_mib"], "verdict": g["verdict"], "referee_passes": g["referee_passes"],
        "ratio_time": g["wall_s"] / b["fwd_bwd_s"], "ratio_process_time": g["process_wall_s"] / b["process_wall_s"],
        # CPU seconds of both whole processes (imports included): what the machine's load does not inflate.
        "bare_process_cpu_s": b["cpu_s"], "gradcheck_process_cpu_s": g["process_cpu_s"],
        "ratio_process_cpu": g["process_cpu_s"] / b["cpu_s"],
        "ratio_peak_rss": g["peak_rss_mib"] / b["peak_rss_mib"],
        "peak_reached_in": g["peak_reached_in"],
        # The referee's auto mode decides from the float64 forward's counted work at nominal rates
        # (gradcheck.check.cost); beside it, the forward's measured time and the referee's seconds per pass.
        "forward64_estimate_s": _estimate_s(g), "forward64_s": g["forward64_s"],
        "referee_s_per_pass": phase_split(g)["referee"] / g["referee_passes"] if g["referee_passes"] else None,
        # What the case adds over the interpreter with the frameworks imported, in float64 copies of the parameters.
        "float64_copies_at_peak": (g["peak_rss_mib"] - g["rss_after_imports_mib"]) / copy_mib,
        "float64_copies_held_after_backends": g["held_after_backends_float64_copies"],
        "phases_s": phase_split(g),
    }


def _slope(xs, ys) -> float | None:
    """Least-squares slope of log(y) on log(x) (the exponent of a power law); None with fewer than two points."""
    pairs = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(pairs) < 2:
        return None
    mx = sum(x for x, _ in pairs) / len(pairs)
    my = sum(y for _, y in pairs) / len(pairs)
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    return sum((x - mx) * (y - my) for x, y in pairs) / sxx if sxx else None


def growth(ok: list[dict]) -> dict:
    """Per family and phase: the exponent of its growth against parameters, against the bare fwd+bwd (torch and
    jax, compile included) and against torch's eager float64 fwd+bwd alone (the model's own cost, no compiling);
    the same for peak memory above the imported frameworks."""
    out = {}
    rows = [table_row(r) for r in ok]
    for family in sorted({r["family"] for r in rows}) + ["all"]:
        fr = [r for r in rows if family in ("all", r["family"])]
        if len(fr) < 2:
            continue
        params = [r["params"] for r in fr]
        bare = [r["bare_fwd_bwd_s"] for r in fr]
        torch64 = [r["bare_torch_float64_fwd_bwd_s"] for r in fr]
        series = {k: [r["phases_s"][k] for r in fr] for k in [*PHASE_GROUPS, "rest"]}
        series["gradcheck total"] = [r["gradcheck_s"] for r in fr]
        series["bare fwd+bwd"] = bare
        series["bare torch float64 fwd+bwd"] = torch64
        fam = {"points": [r["name"] for r in fr], "time": {}}
        for k, ys in series.items():
            fam["time"][k] = {"vs_params": _slope(params, ys), "vs_bare": _slope(bare, ys),
                              "vs_torch_float64": _slope(torch64, ys),
                              "share_of_gradcheck": [y / r["gradcheck_s"] for y, r in zip(ys, fr)],
                              "over_bare": [y / b for y, b in zip(ys, bare)]}
        fam["memory"] = {
            "gradcheck peak above imports": _slope(params, [r["gradcheck_peak_rss_mib"] - r["gradcheck_rss_after_imports_mib"]
                                                            for r in fr]),
            "gradcheck peak": _slope(params, [r["gradcheck_peak_rss_mib"] for r in fr]),
            "bare peak": _slope(params, [r["bare_peak_rss_mib"] for r in fr]),
            "float64 copies at peak": [r["float64_copies_at_peak"] for r in fr],
        }
        out[family] = fam
    return out


def _fit(rows: list[tuple[list[float], float]]) -> list[float] | None:
    """Least squares on relative error: coefficients c with sum(c * x) ~ y, each row weighted by 1/y."""
    import numpy as np

    if len(rows) < len(rows[0][0]):
        return None
    a = np.array([[v / y for v in x] for x, y in rows])
    return list(np.linalg.lstsq(a, np.ones(len(rows)), rcond=None)[0])


def memory_model(ok: list[dict]) -> dict:
    """Peak RSS (MiB) = base + k_p * (parameters + float inputs) * 8 B + k_a * activation elements * 8 B
    [+ k_o * forward ops], fitted on relative error over every point, for gradcheck and for the bare script; each
    point's prediction and error.  ``k_p`` is in float64 copies of the parameters held at once, ``k_a`` in float64
    copies of one forward's activations (the elements every op of the float64 reference forward wrote,
    ``cost.Work.elements``), ``k_o`` in MiB per op of that forward (``cost.Work.ops``: what jax compiles and the
    tape records; compiling a deeper model takes more memory)."""
    out = {}
    for who in ("gradcheck", "bare"):
        # Three forms: parameters and activations; with ops too; parameters and ops (activations left out: the
        # peak comes after the backends, when no backward's activations are alive).
        for variant, terms in (("", ("p", "a")), (" with ops", ("p", "a", "o")), (" params and ops", ("p", "o"))):
            with_ops = "o" in terms
            rows = []
            for r in ok:
                g = r["gradcheck"]
                x = {"p": (g["params"] + g["input_elements"]) * MIB_PER_FLOAT64,
                     "a": g["activation_elements"] * MIB_PER_FLOAT64, "o": float(g["forward64_ops"])}
                rows.append(([1.0] + [x[t] for t in terms], r[who]["peak_rss_mib"]))
            coef = _fit(rows) if rows else None
            if coef is None:
                continue
            per = []
            for r, (x, y) in zip(ok, rows):
                pred = sum(c * v for c, v in zip(coef, x))
                per.append({"name": r["name"], "measured_mib": y, "predicted_mib": pred, "error": (pred - y) / y})
            fit = {"formula": "peak_MiB = base + k_p * (params + float inputs) * 8 B"
                              + (" + k_a * activation elements * 8 B" if "a" in terms else "")
                              + (" + k_o * forward ops" if with_ops else ""),
                   "base_mib": coef[0], "max_abs_error": max(abs(p["error"]) for p in per), "points": per}
            names = {"p": "k_p_float64_copies", "a": "k_a_float64_copies", "o": "k_o_mib_per_op"}
            fit.update({names[t]: c for t, c in zip(terms, coef[1:])})
            out[f"{who}{variant}"] = fit
    return out


# ------------------------------------------------------------------ the figure
COLOURS = {"gradcheck": "#c0392b", "bare": "#2471a3"}
FAMILY_MARKS = {"resnet": "circle", "gpt d256": "square", "gpt d768": "triangle"}


def _marker(shape: str, x: float, y: float, colour: str) -> str:
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{colour}"/>'
    if shape == "square":
        return f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="{colour}"/>'
    return f'<polygon points="{x:.1f},{y - 5.5:.1f} {x - 5:.1f},{y + 4:.1f} {x + 5:.1f},{y + 4:.1f}" fill="{colour}"/>'


def _ticks(lo: float, hi: float, unit: str = "") -> list[float]:
    """1-2-5 ticks spanning [lo, hi] on a log axis; for memory (MiB), powers of two of a GiB."""
    if unit == "MiB":
        return [1024.0 * 2.0 ** e for e in range(-6, 12) if lo <= 1024.0 * 2.0 ** e <= hi]
    out = []
    for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = m * 10.0 ** e
            if lo <= v <= hi:
                out.append(v)
    return out


def _label(v: float, unit: str) -> str:
    if unit == "params":
        return f"{v / 1e6:g}M"
    if unit == "MiB":
        return f"{v / 1024:g} GiB"
    return f"{v:g}{' s' if unit == 's' else ' MiB' if unit == 'MiB' else ''}"


def _panel(ox: float, oy: float, w: float, h: float, title: str, unit: str, series: dict, xr, yr) -> list[str]:
    """One log-log panel: axes, 1-2-5 ticks with grid, and per (who, family) a line through its markers."""
    (x0, x1), (y0, y1) = xr, yr

    def px(v):
        return ox + (math.log(v) - math.log(x0)) / (math.log(x1) - math.log(x0)) * w

    def py(v):
        return oy + h - (math.log(v) - math.log(y0)) / (math.log(y1) - math.log(y0)) * h

    out = [f'<text x="{ox + w / 2:.0f}" y="{oy - 12:.0f}" text-anchor="middle" font-size="15" font-weight="bold">'
           f'{title}</text>',
           f'<rect x="{ox}" y="{oy}" width="{w}" height="{h}" fill="none" stroke="#333"/>']
    for v in _ticks(x0, x1):
        out.append(f'<line x1="{px(v):.1f}" y1="{oy}" x2="{px(v):.1f}" y2="{oy + h}" stroke="#ddd"/>')
        out.append(f'<text x="{px(v):.1f}" y="{oy + h + 16}" text-anchor="middle" font-size="11">'
                   f'{_label(v, "params")}</text>')
    for v in _ticks(y0, y1, unit):
        out.append(f'<line x1="{ox}" y1="{py(v):.1f}" x2="{ox + w}" y2="{py(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{ox - 6}" y="{py(v) + 4:.1f}" text-anchor="end" font-size="11">{_label(v, unit)}</text>')
    out.append(f'<text x="{ox + w / 2:.0f}" y="{oy + h + 36}" text-anchor="middle" font-size="12">'
               'parameters (log scale)</text>')
    ylab = "seconds (log scale)" if unit == "s" else "peak resident memory (log scale)"
    out.append(f'<text transform="translate({ox - 62},{oy + h / 2:.0f}) rotate(-90)" text-anchor="middle" '
               f'font-size="12">{ylab}</text>')
    for (who, family), pts in series.items():
        pts = sorted(pts)
        colour = COLOURS[who]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.6"/>')
        out.extend(_marker(FAMILY_MARKS.get(family, "circle"), px(x), py(y), colour) for x, y in pts)
    return out


def figure(ok: list[dict]) -> str:
    """Two panels (time, peak memory) against parameters, gradcheck against the bare frameworks, as SVG text."""
    time_s, mem = {}, {}
    for r in ok:
        g, b, fam = r["gradcheck"], r["bare"], r["family"]
        time_s.setdefault(("gradcheck", fam), []).append((g["params"], g["wall_s"]))
        time_s.setdefault(("bare", fam), []).append((g["params"], b["fwd_bwd_s"]))
        mem.setdefault(("gradcheck", fam), []).append((g["params"], g["peak_rss_mib"]))
        mem.setdefault(("bare", fam), []).append((g["params"], b["peak_rss_mib"]))

    def span(series):
        vals = [v for pts in series.values() for v in pts]
        xs, ys = [x for x, _ in vals], [y for _, y in vals]
        return (min(xs) / 1.3, max(xs) * 1.3), (min(ys) / 1.4, max(ys) * 1.4)

    width, height, w, h = 1040, 520, 370, 330
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="24" text-anchor="middle" font-size="16">One gradcheck case against the bare '
           'frameworks\' forward+backward, as the model grows</text>']
    xr, yr = span(time_s)
    out += _panel(90, 70, w, h, "Time", "s", time_s, xr, yr)
    xr, yr = span(mem)
    out += _panel(620, 70, w, h, "Peak memory (RSS)", "MiB", mem, xr, yr)
    ly = 70 + h + 58
    legend = [("gradcheck", "gradcheck: run_case, default options (tape, torch, jax; float64 + float32; referee auto)"),
              ("bare", "bare: torch eager + jax jit (compile included) forward+backward, float32 + float64")]
    for i, (who, text) in enumerate(legend):
        y = ly + 18 * i
        out.append(f'<line x1="90" y1="{y}" x2="120" y2="{y}" stroke="{COLOURS[who]}" stroke-width="2.5"/>')
        out.append(f'<text x="128" y="{y + 4}" font-size="12">{text}</text>')
    x = 720
    for i, (family, shape) in enumerate(FAMILY_MARKS.items()):
        y = ly + 18 * i - 4
        name = {"resnet": "ResNet-18/34/50, 1x3x224x224", "gpt d256": "GPT d_model 256, 2-12 blocks",
                "gpt d768": "GPT d_model 768, 2-12 blocks"}[family]
        out.append(_marker(shape, x, y, "#555"))
        out.append(f'<text x="{x + 12}" y="{y + 4}" font-size="12">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _finish(result: dict, json_path: str | None, svg_path: str | None) -> None:
    """The JSON with its table, growth and memory model, and the figure; an analysis that fails is said in the
    JSON and leaves the measurements written."""
    ok = [r for r in result["points"] if "wall_s" in r["gradcheck"] and "fwd_bwd_s" in r["bare"]]
    try:
        result["table"] = [table_row(r) for r in ok]
        result["growth"] = growth(ok)
        result["memory_model"] = memory_model(ok)
        result.pop("analysis_error", None)
    except Exception as exc:  # noqa: BLE001 - the measurements matter more than their summary
        result["analysis_error"] = repr(exc)
    _common.write(result, json_path)
    if svg_path and ok and "analysis_error" not in result:
        with open(svg_path, "w", encoding="utf-8") as fh:
            fh.write(figure(ok))


if __name__ == "__main__":
    sys.exit(main())

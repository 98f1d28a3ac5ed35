"""Shared helpers for the benchmark scripts: thread control, timing, the machine, JSON output.

Every script takes ``--threads N`` (default: all cores) and ``--json PATH``.
Thread limits are set through the environment *before* numpy, torch or jax
are imported (``setup_threads`` must be the first thing a script calls), and
again at run time where a library allows it, so every framework in one
process computes with the same number of threads.

Timings are wall-clock medians of several runs after warm-up; CPU time
(``time.process_time``, all threads of the process) is recorded beside
them, because on a shared machine the wall clock also measures the
neighbours.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def thread_env(threads: int) -> dict[str, str]:
    """Environment variables that limit numpy's BLAS, torch and XLA to ``threads`` threads."""
    env = {name: str(threads) for name in THREAD_VARS}
    if threads < cores():
        # XLA's CPU backend ignores OMP_NUM_THREADS; its Eigen pool is sized by these flags.
        flags = os.environ.get("XLA_FLAGS", "")
        env["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads={threads}".strip()
    return env


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--threads", type=int, default=cores(), help="threads for every framework (default: all cores)")
    p.add_argument("--json", help="write the results here as JSON")
    return p


def setup_threads(argv=None) -> int:
    """Read ``--threads`` and set the environment before any numerical library is imported."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=cores())
    threads = pre.parse_known_args(argv)[0].threads
    os.environ.update(thread_env(threads))
    return threads


def limit_loaded_libraries(threads: int) -> None:
    """Apply the limit to libraries already loaded (numpy's OpenBLAS, torch's intra-op pool)."""
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)
    except ImportError:  # the environment variables set before import still apply
        pass
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def time_phases(targets, phases: dict[str, float]) -> None:
    """Wrap each ``(module, function name, key)`` so that its calls add their wall seconds to ``phases[key]``:
    where a child process's time went, phase by phase (the runner's steps, the per-layer replay)."""
    for module, name, key in targets:
        inner = getattr(module, name)

        def wrapper(*args, _inner=inner, _key=key, **kwargs):
            t0 = time.perf_counter()
            try:
                return _inner(*args, **kwargs)
            finally:
                phases[_key] = phases.get(_key, 0.0) + time.perf_counter() - t0

        setattr(module, name, wrapper)


def measure(fn, runs: int = 7, warmup: int = 1) -> dict:
    """Median (and spread) of ``runs`` calls after ``warmup`` calls; wall and process CPU seconds."""
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(runs):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"median": statistics.median(wall), "min": min(wall), "max": max(wall), "runs": wall,
            "cpu_median": statistics.median(cpu)}


def measure_interleaved(fns: dict, runs: int = 7, warmup: int = 1) -> dict:
    """``measure`` for several functions, taking turns run by run.

    On a shared machine the load drifts over a benchmark; interleaving lets
    every variant see the same drift, so their ratios stay meaningful.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    return {k: {"median": statistics.median(wall[k]), "min": min(wall[k]), "max": max(wall[k]), "runs": wall[k],
                "cpu_median": statistics.median(cpu[k])} for k in fns}


def run_child(cmd: list[str], env: dict | None = None, cwd: str | None = None, stderr_lines: bool = False) -> dict:
    """Run a command; wall time, exit code, output, and the child's own peak RSS and CPU time (wait4).

    With ``stderr_lines`` each stderr line is returned with the wall time at
    which it arrived (progress lines give time against cases done).
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, cwd=cwd)
    lines = []
    if stderr_lines:
        for line in proc.stderr:
            lines.append((time.perf_counter() - t0, line.rstrip("\n")))
        err = "\n".join(text for _, text in lines)
    else:
        err = proc.stderr.read()
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "cmd": cmd, "wall": wall, "returncode": proc.returncode, "stdout": out, "stderr": err,
        "stderr_lines": lines,
        # ru_maxrss is in KiB on Linux.
        "peak_rss_mib": usage.ru_maxrss / 1024.0,
        "cpu_user": usage.ru_utime, "cpu_sys": usage.ru_stime,
    }


def slim(record: dict) -> dict:
    """A ``run_child`` record without the child's output and command: what a result file keeps."""
    return {k: v for k, v in record.items() if k not in ("stdout", "stderr", "stderr_lines", "cmd")}


def gradcheck_cli() -> list[str]:
    """The ``gradcheck`` command, run through this Python (the console script may not be on PATH)."""
    return [sys.executable, "-m", "gradcheck"]


def machine() -> dict:
    """Cores, CPU model, BLAS and framework versions: what a reader needs to compare numbers."""
    info = {"cores": cores(), "logical_cpus": os.cpu_count(), "python": sys.version.split()[0],
            "platform": f"{platform.system()} {platform.machine()}", "cpu_model": _cpu_model(),
            "loadavg": _loadavg()}
    import numpy as np

    info["numpy"] = np.__version__
    info["blas"] = _blas()
    for name in ("torch", "jax", "jaxlib", "scipy"):
        try:
            from importlib.metadata import version

            info[name] = version(name)
        except Exception:  # noqa: BLE001 - not installed is an answer
            info[name] = None
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _blas() -> str:
    try:
        import numpy  # noqa: F401 - loads its BLAS so threadpoolctl sees it
        from threadpoolctl import threadpool_info

        libs = [f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')} kernels, "
                f"{i.get('num_threads')} threads by default)"
                for i in threadpool_info() if i.get("user_api") == "blas"]
        if libs:
            return "; ".join(libs)
    except ImportError:
        pass
    import numpy as np

    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # noqa: BLE001 - older numpy: no dict mode
        return "unknown"


def command_line() -> str:
    """How this script was invoked, relative to the repository root (``--json PATH`` left out)."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    args, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a == "--json":
            skip = True
        elif not a.startswith("--json="):
            args.append(a)
    return " ".join(["python", script] + args)


def write(result: dict, path: str | None) -> None:
    result.setdefault("command", command_line())
    result.setdefault("loadavg_end", _loadavg())
    text = json.dumps(result, indent=1, default=_jsonable)
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        print(text)


def _jsonable(o):
    try:
        return o.item()
    except AttributeError:
        return str(o)


def model_setup(name: str, batch: int | None = None, input_shape=None, seed: int = 0, dtype: str = "float32"):
    """A zoo model as the runner builds it: ``(model, inputs, cotangent, f, args, prefixes)``.

    ``f`` is the runner's cross-check loss ``<r, model(x)>`` with a random
    cotangent ``r``, returning ``(loss, output)``.
    """
    import numpy as np

    from gradcheck import ops
    from gradcheck.case import cast_floats
    from gradcheck.check.runner import input_prefixes
    from gradcheck.layers.models import MODELS

    spec = MODELS[name]
    rng = np.random.default_rng(seed)
    model = cast_floats(spec.build(rng), dtype)
    model.train(True)
    inputs = cast_floats(spec.inputs(rng, batch, input_shape), dtype)
    # The output's shape, from a float64 copy (a forward in train mode updates the model's buffers).
    y = cast_floats(model, np.float64)(*cast_floats(inputs, np.float64))
    r = np.random.default_rng(seed + 1).standard_normal(np.shape(y)).astype(dtype)

    def f(m, *xs):
        out = m(*xs)
        return ops.sum(out * ops.asarray(r, like=out)), out

    args = (model,) + tuple(inputs)
    prefixes = ("",) + input_prefixes(len(inputs))
    return model, inputs, r, f, args, prefixes

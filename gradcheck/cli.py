"""The ``gradcheck`` command: run, list, report, diff.

Exit codes: 0 every case agrees, 1 any disagreement (or a structural,
non-finite, vacuous or errored case), 2 usage error (bad target, backend,
option or config), 3 internal error (a bug in gradcheck: please report it),
130 interrupted (every finished case is already on disk).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import traceback

EXIT_OK, EXIT_DISAGREE, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
DEFAULT_OUTPUT = "gradcheck-report"


class UsageError(Exception):
    """Bad input from the user: the message names the thing, the value and the fix."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gradcheck",
        description="Cross-check gradients across gradcheck's tape AD, PyTorch and JAX, "
        "with a float64 finite-difference referee.",
        epilog="exit codes: 0 all agree, 1 disagreement, 2 usage error, 3 internal error, 130 interrupted",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="check models, suites or your own cases",
                         description="TARGET is a model (resnet18), a suite (layers, models, smoke, fuzz), "
                         "a layer name (Conv2d: its cases from the layers suite) or package.module:function "
                         "returning a Case or a list of Cases.")
    run.add_argument("targets", nargs="+", metavar="TARGET")
    run.add_argument("--backends", help="comma-separated: tape,torch,jax (default: all three)")
    run.add_argument("--dtype", choices=["float32", "float64", "both"],
                     help="default: float32 for models, each case's own for suites and your cases")
    run.add_argument("--seed", type=int, help="seed for parameters, inputs and the loss cotangent (default 0)")
    run.add_argument("--batch", type=int, help="batch size for model targets")
    run.add_argument("--input-shape", help="per-example input shape for model targets, e.g. 3x224x224")
    run.add_argument("--mode", choices=["train", "eval"], help="train (batch statistics, dropout) or eval")
    run.add_argument("-k", dest="keyword", help="only cases whose name contains this (case-insensitive)")
    run.add_argument("--shard", help="I/N: run the I-th of N shards (1-based), for a CI matrix")
    run.add_argument("--rtol", type=float, help="relative tolerance for every leaf (overrides defaults)")
    run.add_argument("--atol", type=float, help="absolute tolerance for every leaf (added to the scaled one)")
    run.add_argument("--referee", choices=["auto", "leaves", "joint", "off"],
                     help="float64 finite differences: per leaf, joint, auto (per leaf when cheap), off")
    run.add_argument("--noise-probe", metavar="LIST",
                     help="backends whose float32 rounding noise is measured (each again in float64) to set "
                          "float32 tolerances: auto (default: tape, and torch if it runs, else jax) or a "
                          "comma-separated list, e.g. tape,torch,jax")
    run.add_argument("--config", help="TOML file with [tool.gradcheck] settings (default: ./pyproject.toml)")
    run.add_argument("--output", help=f"folder for reports (default ./{DEFAULT_OUTPUT})")
    for fmt in ("html", "json", "junit", "markdown"):
        run.add_argument(f"--{fmt}", metavar="PATH", help=f"write the {fmt} report here")
    run.add_argument("--results", metavar="PATH", help="stream results as JSON lines here (default in --output)")
    run.add_argument("--no-html", action="store_true", help="do not write the default HTML report")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress, only the summary")

    lst = sub.add_parser("list", help="models, layers, suites and backends")
    lst.add_argument("what", nargs="?", choices=["models", "layers", "suites", "backends"])

    rep = sub.add_parser("report", help="render reports from stored results (JSON or JSON lines)")
    rep.add_argument("results")
    for fmt in ("html", "json", "junit", "markdown"):
        rep.add_argument(f"--{fmt}", metavar="PATH")

    diff = sub.add_parser("diff", help="compare two stored runs: leaves whose verdict or error changed")
    diff.add_argument("base")
    diff.add_argument("new")
    diff.add_argument("--threshold", type=float, default=2.0,
                      help="flag an agreeing leaf whose headroom grew by this factor (default 2)")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return {"run": cmd_run, "list": cmd_list, "report": cmd_report, "diff": cmd_diff}[args.command](args)
    except UsageError as exc:
        print(f"gradcheck: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\ngradcheck: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:
        print("gradcheck: internal error (a bug in gradcheck; please report it with this traceback):",
              file=sys.stderr)
        traceback.print_exc()
        return EXIT_INTERNAL


# ---------------------------------------------------------------- run
def _settings(args):
    from gradcheck import config

    try:
        table, source = config.load(args.config)
    except config.ConfigError as exc:
        raise UsageError(str(exc)) from exc
    return table, source


def _backends(value) -> tuple[str, ...]:
    from gradcheck.backends import BACKENDS

    if value is None:
        return BACKENDS
    names = [b.strip() for b in (value.split(",") if isinstance(value, str) else value) if b.strip()]
    for b in names:
        if b not in BACKENDS:
            raise UsageError(f"unknown backend {b!r} in --backends; choose from {', '.join(BACKENDS)}")
    if not names:
        raise UsageError("--backends is empty; name at least one of tape, torch, jax")
    return tuple(dict.fromkeys(names))


def _noise_probe(value, where: str) -> tuple[str, ...] | None:
    """``auto`` (None: the runner's default) or the named backends, checked as the pytest plugin checks them."""
    from gradcheck.assertions import CheckSettings

    try:
        return CheckSettings.parse(where, noise_probe=value).noise_probe or None
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _shard(value):
    if value is None:
        return None
    try:
        i, n = (int(v) for v in value.split("/"))
    except ValueError:
        raise UsageError(f"--shard {value!r}: expected I/N, e.g. 2/4") from None
    if not 1 <= i <= n:
        raise UsageError(f"--shard {value!r}: I must be between 1 and N")
    return i, n


def _input_shape(value):
    if value is None:
        return None
    try:
        shape = tuple(int(v) for v in value.lower().replace(",", "x").split("x"))
    except ValueError:
        raise UsageError(f"--input-shape {value!r}: expected sizes joined by x, e.g. 3x224x224") from None
    if not shape or any(s <= 0 for s in shape):
        raise UsageError(f"--input-shape {value!r}: sizes must be positive")
    return shape


def cmd_run(args) -> int:
    from gradcheck import runner, targets
    from gradcheck.tolerance import ToleranceRules

    table, source = _settings(args)
    pick = lambda flag, key, default: flag if flag is not None else table.get(key, default)  # noqa: E731
    backends = _backends(pick(args.backends, "backends", None))
    dtype = pick(args.dtype, "dtype", None)
    if dtype not in (None, "float32", "float64", "both"):
        raise UsageError(f"{source or 'config'}: dtype = {dtype!r}; expected float32, float64 or both")
    seed = int(pick(args.seed, "seed", 0))
    mode = pick(args.mode, "mode", None)
    referee = pick(args.referee, "referee", "auto")
    if referee not in ("auto", "leaves", "joint", "off"):
        raise UsageError(f"{source or 'config'}: referee = {referee!r}; expected auto, leaves, joint or off")
    noise_probe = (_noise_probe(args.noise_probe, "gradcheck run") if args.noise_probe is not None
                   else _noise_probe(table.get("noise_probe"), source or "config"))
    try:
        rules = ToleranceRules.from_config(table.get("tolerance", {}), source or "config")
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    rules = rules.with_overrides(table.get("rtol"), table.get("atol"), name=f"{source}: rtol/atol")
    rules = rules.with_overrides(args.rtol, args.atol)

    request = targets.Request(dtype=dtype, seed=seed, batch=args.batch, input_shape=_input_shape(args.input_shape),
                              mode=mode)
    try:
        cases = targets.resolve(args.targets, request)
    except targets.TargetError as exc:
        raise UsageError(str(exc)) from exc
    cases = targets.select(cases, args.keyword, _shard(args.shard))
    if not cases:
        raise UsageError(f"no case matches -k {args.keyword!r} / --shard {args.shard} in {' '.join(args.targets)}")

    out_dir = pick(args.output, "output", DEFAULT_OUTPUT)
    results_path = args.results or os.path.join(out_dir, "results.jsonl")
    html_path = args.html or (None if args.no_html else os.path.join(out_dir, "report.html"))
    command = "gradcheck " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "gradcheck run"
    base_cmd = "gradcheck run " + " ".join(shlex.quote(t) for t in args.targets)
    flags = f" --seed {seed}" + (f" --backends {','.join(backends)}" if args.backends else "")
    flags += f" --noise-probe {','.join(noise_probe)}" if noise_probe else ""

    def replay(case):
        return f"{base_cmd}{flags} --dtype {case.dtype} -k {shlex.quote(case.name)}"


    options = runner.RunOptions(backends=backends, rules=rules, referee=referee, noise_probe=noise_probe,
                                referee_budget_s=float(table.get("referee_budget_s", 20.0)), replay=replay)
    env = runner.environment(seed=seed, command=command)
    progress = Progress(len(cases), quiet=args.quiet)
    started = time.perf_counter()
    interrupted = False
    result = None
    try:
        result = runner.run(cases, options, results_path=results_path, env=env,
                            on_case=progress.case_done, on_start=progress.case_start)
    except KeyboardInterrupt:
        interrupted = True
    progress.close()
    if result is None:  # interrupted: what finished is on disk
        from gradcheck import results as results_mod

        result = results_mod.load(results_path)
    result.env["wall_s"] = round(time.perf_counter() - started, 3)
    written = _write_reports(result, html=html_path, json_path=args.json, junit=args.junit, markdown=args.markdown)
    written.insert(0, ("results", results_path))
    _print_summary(result, written)
    if interrupted:
        print(f"gradcheck: interrupted after {len(result.cases)} case(s); they are in {results_path}",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_DISAGREE if result.failed else EXIT_OK


def _write_reports(result, html=None, json_path=None, junit=None, markdown=None):
    from gradcheck import reports

    written = []
    for path, writer, label in ((html, reports.write_html, "html"), (json_path, reports.write_json, "json"),
                                (junit, reports.write_junit, "junit")):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            writer(result, path)
            written.append((label, path))
    summary_target = markdown or os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_target:
        text = reports.render_markdown(result)
        mode = "w" if markdown else "a"  # GitHub's step summary is appended to
        with open(summary_target, mode, encoding="utf-8") as fh:
            fh.write(text)
        written.append(("markdown", summary_target))
    if os.environ.get("GITHUB_ACTIONS") == "true":
        for line in reports.github_annotations(result):
            print(line)
    return written


def _print_summary(result, written):
    from gradcheck import reports

    print(reports.render_summary(result, color=sys.stdout.isatty()))
    for label, path in written:
        print(f"{label:>9}: {path}")


class Progress:
    """A progress bar on a terminal; plain lines otherwise (CI logs)."""

    def __init__(self, total: int, quiet: bool = False, stream=None):
        self.total, self.quiet = total, quiet
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = time.perf_counter()

    def case_start(self, i, total, case):
        if self.quiet:
            return
        if self.tty:
            width = 24
            filled = int(width * i / max(total, 1))
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {i}/{total} {case.name[:50]:<50}")
            self.stream.flush()

    def case_done(self, i, total, result):
        if self.quiet:
            return
        elapsed = time.perf_counter() - self.t0
        line = f"[{i + 1}/{total}] {result.name}: {result.verdict} ({result.leaves_compared} leaves, {elapsed:.1f}s)"
        if self.tty:
            self.stream.write("\r" + " " * 90 + "\r")
        self.stream.write(line + "\n")
        self.stream.flush()

    def close(self):
        if self.tty and not self.quiet:
            self.stream.write("\r" + " " * 90 + "\r")
            self.stream.flush()


# ---------------------------------------------------------------- list, report, diff
def cmd_list(args) -> int:
    from gradcheck import targets
    from gradcheck.backends import BACKENDS, get_backend

    what = args.what
    if what in (None, "models"):
        print("models:")
        for name, summary in targets.model_summaries():
            print(f"  {name:<14} {summary}")
    if what in (None, "suites"):
        print("suites:")
        for name, summary in targets.suite_summaries():
            print(f"  {name:<14} {summary}")
    if what in (None, "layers"):
        print("layers:")
        print("  " + ", ".join(targets.layer_names()))
    if what in (None, "backends"):
        print("backends:")
        for name in BACKENDS:
            ok, why = get_backend(name).available()
            print(f"  {name:<6} {'available, ' + why if ok else 'UNAVAILABLE: ' + why}")
    return EXIT_OK


def _load(path):
    from gradcheck import results

    if not os.path.isfile(path):
        raise UsageError(f"results file {path!r} does not exist; pass the results.jsonl or JSON of a run")
    try:
        return results.load(path)
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path}: cannot read results ({exc})") from exc


def cmd_report(args) -> int:
    result = _load(args.results)
    if not any((args.html, args.json, args.junit, args.markdown)):
        args.html = os.path.join(os.path.dirname(os.path.abspath(args.results)), "report.html")
    written = _write_reports(result, html=args.html, json_path=args.json, junit=args.junit, markdown=args.markdown)
    _print_summary(result, written)
    return EXIT_DISAGREE if result.failed else EXIT_OK


def cmd_diff(args) -> int:
    from gradcheck import rundiff

    base, new = _load(args.base), _load(args.new)
    changes = rundiff.diff(base, new, threshold=args.threshold)
    print(rundiff.render(changes, args.base, args.new))
    return EXIT_DISAGREE if any(c.worse for c in changes) else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The ``gradcheck`` command: run, list, report, diff.

Exit codes: 0 every case agrees, 1 any disagreement (or a structural,
non-finite, vacuous or errored case), 2 usage error (bad target, backend,
option or config), 3 internal error (a bug in gradcheck: please report it),
130 interrupted (every finished case is already on disk), 141 the reader of
its output went away (``gradcheck list | head``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import shlex
import shutil
import sys
import time
import traceback

EXIT_OK, EXIT_DISAGREE, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 0, 1, 2, 3, 130, 141
DEFAULT_OUTPUT = "gradcheck-report"


class UsageError(Exception):
    """Bad input from the user: the message names the thing, the value and the fix."""


def build_parser() -> argparse.ArgumentParser:
    try:
        return _build_parser()
    except argparse.ArgumentError as exc:  # a registered report format whose flag another option already has
        from gradcheck.reports import formats

        taken = set(str(exc).rpartition(": ")[2].split(", "))  # "...: conflicting option string(s): --a, --b"
        clash = [f.name for f in formats.registered() if f"--{f.name}" in taken]
        if not clash:
            raise
        raise ValueError(f"report format {clash[0]!r}: its flag --{clash[0]} is already an option of gradcheck; "
                         "register the format under another name") from None


def _build_parser() -> argparse.ArgumentParser:
    from gradcheck.app.settings import KEYS

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
                         "returning a Case or a list of Cases (the current folder is importable).")
    run.add_argument("targets", nargs="+", metavar="TARGET")
    # Values are checked by gradcheck.app.settings, which says the same about them as the config file does.
    for name in ("backends", "dtype", "seed", "mode", "referee", "imprecise", "unavailable", "rtol", "atol", "output",
                 "order", "steps", "optimizer", "lr"):
        key = KEYS[name]
        run.add_argument(f"--{name}", metavar=key.metavar, help=key.help
                         + (f" {{{','.join(key.choices)}}}" if key.choices else ""))
    run.add_argument("--per-layer", action="store_true",
                     help="replay every layer alone on every backend even when the model agrees (a disagreeing "
                          "case is always replayed, to find the layer where it starts)")
    run.add_argument("--repro", metavar="DIR",
                     help="write a standalone reproducer (inputs, parameters, cotangent, one script per framework) "
                          "of each disagreement's origin layer here")
    run.add_argument("--batch", metavar="N", help="batch size for model targets")
    run.add_argument("--input-shape", help="per-example input shape for model targets, e.g. 3x224x224")
    run.add_argument("-k", dest="keyword", help="only cases whose name contains this (case-insensitive)")
    run.add_argument("--shard", help="I/N: run the I-th of N shards (1-based), for a CI matrix; "
                     "a shard with no case exits 0")
    run.add_argument("--jobs", metavar=KEYS["jobs"].metavar, help=KEYS["jobs"].help)
    run.add_argument("--config", help="TOML file with [tool.gradcheck] settings (default: ./pyproject.toml)")
    run.add_argument("--memory-limit", metavar=KEYS["memory_limit"].metavar, help=KEYS["memory_limit"].help)
    cache = run.add_mutually_exclusive_group()
    cache.add_argument("--cache-dir", metavar=KEYS["cache_dir"].metavar, help=KEYS["cache_dir"].help)
    cache.add_argument("--no-cache", action="store_true",
                       help="no persistent compilation cache: jax compiles everything, and stores nothing")
    _add_report_flags(run, with_help=True)
    run.add_argument("--results", metavar="PATH", help="stream results as JSON lines here (default in --output)")
    run.add_argument("--no-html", action="store_true", help="do not write the default HTML report")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress, only the summary")

    lst = sub.add_parser("list", help="models, layers, suites and backends")
    lst.add_argument("what", nargs="?", choices=["models", "layers", "suites", "backends"])

    rep = sub.add_parser("report", help="render reports from stored results (JSON or JSON lines)")
    rep.add_argument("results")
    _add_report_flags(rep, with_help=False)

    diff = sub.add_parser("diff", help="compare two stored runs: leaves whose verdict or error changed")
    diff.add_argument("base")
    diff.add_argument("new")
    diff.add_argument("--threshold", type=float, default=2.0,
                      help="flag an agreeing leaf whose headroom grew by this factor (default 2)")
    return p


def _add_report_flags(parser, with_help: bool) -> None:
    """One ``--NAME PATH`` flag per registered report format (``gradcheck.reports.formats``)."""
    from gradcheck.reports import formats

    for fmt in formats.registered():
        parser.add_argument(f"--{fmt.name}", dest=fmt.dest, metavar="PATH", help=fmt.help if with_help else None)


def _report_paths(args) -> dict:
    """``{format name: path or None}`` as the flags gave them, one entry per registered format."""
    from gradcheck.reports import formats

    return {fmt.name: getattr(args, fmt.dest) for fmt in formats.registered()}


def command() -> None:
    """The ``gradcheck`` console command: ``main``, then the process ends without interpreter teardown
    (``gradcheck.app.finish``)."""
    from gradcheck.app.finish import exit_now

    sys.exit(exit_now(main()))


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    from gradcheck.app.output import OutputError
    from gradcheck.app.settings import SettingsError
    from gradcheck.app.targets import TargetError

    try:
        return {"run": cmd_run, "list": cmd_list, "report": cmd_report, "diff": cmd_diff}[args.command](args)
    except (UsageError, SettingsError, TargetError, OutputError) as exc:
        print(f"gradcheck: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\ngradcheck: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of the output went away (``gradcheck list | head``): stop quietly, as a command killed by
        # SIGPIPE would, with nothing left to write at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception:
        print("gradcheck: internal error (a bug in gradcheck; please report it with this traceback):",
              file=sys.stderr)
        traceback.print_exc()
        return EXIT_INTERNAL


# ---------------------------------------------------------------- run
def run_settings(args):
    """The run's settings: defaults, then [tool.gradcheck] (or --config), then the flags."""
    from gradcheck.app import settings as S

    config, _ = S.from_config(args.config)
    values = {k: getattr(args, k) for k in S.VALUE_KEYS if k in vars(args)}
    if getattr(args, "no_cache", False):
        values["cache_dir"] = False
    flags = S.from_values(values, "gradcheck run", spell=S.spell_flag(), text=True, allowed=S.VALUE_KEYS,
                          rule_name="command line: --rtol/--atol")
    return flags.over(config)


def use_compile_cache(args, settings) -> None:
    """Hand the ``cache_dir`` setting to gradcheck's caches (jax's compilation cache, at the folder's top level,
    and from_torch's capture cache, in its ``torch-export`` subfolder: ``gradcheck.cache``); a folder that was
    asked for must be writable.  ``--no-cache`` turns both off."""
    from gradcheck.app import settings as S
    from gradcheck.app.output import OutputError, check_folder
    from gradcheck.backends.jax import driver as jax_driver

    if args.no_cache or args.cache_dir:
        where = "--no-cache" if args.no_cache else "--cache-dir"
    elif settings.cache_dir is not None:  # from the config file, spelled as the settings' own errors spell it
        where = f"{S.from_config(args.config)[1] or '[tool.gradcheck]'}: cache_dir ="
    else:
        where = "cache_dir"
    choice = jax_driver.cache_choice(settings.cache_dir, where)
    if choice.folder is not None and choice.source not in ("default", "jax"):  # those warn and run on, uncached
        try:
            check_folder(choice.folder, choice.source)
        except OutputError as exc:
            raise OutputError(f"{exc}, or run without the cache (--no-cache)") from None
    jax_driver.use_compile_cache(settings.cache_dir, where)


def run_request(args, settings):
    """The Request every target is resolved with (``gradcheck.app.targets``)."""
    from gradcheck.app import settings as S
    from gradcheck.app import targets

    return targets.Request(dtype=settings.dtype, seed=settings.seed, batch=S.parse_batch(args.batch),
                           input_shape=S.parse_input_shape(args.input_shape), mode=settings.mode)


def run_options(args, settings):
    """The runner's options of a run, with the command that re-runs each case alone."""
    from gradcheck.app import targets

    return dataclasses.replace(settings.run_options(replay=targets.replay(args.targets, settings)),
                               per_layer=args.per_layer, repro=args.repro)


def rebuild_run(args):
    """``(cases, options)`` of a run built again from its flags, as ``cmd_run`` builds them: what each
    ``--jobs`` worker process runs (``gradcheck.app.parallel``), with the same compilation cache."""
    from gradcheck.app import settings as S
    from gradcheck.app import targets

    settings = run_settings(args)
    use_compile_cache(args, settings)  # first: building from_torch cases reads the capture cache
    cases = targets.resolve(args.targets, run_request(args, settings))
    selected = targets.select(targets.select(cases, args.keyword), shard=S.parse_shard(args.shard))
    return selected, run_options(args, settings)


def cmd_run(args) -> int:
    from gradcheck.app import parallel, targets
    from gradcheck.app import settings as S
    from gradcheck.check import runner

    settings = run_settings(args)
    # The flags' own values first: a usage error names the flag, whatever backends this machine has.
    request = run_request(args, settings)
    shard = S.parse_shard(args.shard)
    use_compile_cache(args, settings)  # before the targets: building from_torch cases reads the capture cache
    cases = targets.resolve(args.targets, request)
    chosen = targets.select(cases, args.keyword)
    if not chosen:
        raise UsageError(f"-k {args.keyword!r}: no name of the {len(cases)} case(s) of {' '.join(args.targets)} "
                         "contains it; drop -k to run them all")
    selected = targets.select(chosen, shard=shard)
    if not selected:
        # A CI matrix sized for a larger suite: an empty shard has nothing to fail on.
        print(f"gradcheck: shard {args.shard} has no case ({len(chosen)} case(s) over {shard[1]} shards); "
              "nothing to run", file=sys.stderr)
        return EXIT_OK
    S.require_comparison(settings.backends_or_default(), settings.referee_or_default(), cli=True)

    paths, results_path = _output_paths(args, settings.output)
    if args.repro is not None:
        from gradcheck.app import output

        output.check_folder(args.repro, "--repro")
    command = "gradcheck " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "gradcheck run"
    options = run_options(args, settings)
    jobs = min(parallel.resolve_jobs(settings.jobs), len(selected))
    env = runner.environment(seed=settings.seed if settings.seed is not None else 0, command=command)
    progress = Progress(len(selected), quiet=args.quiet)
    started = time.perf_counter()
    interrupted = False
    result = None
    try:
        if jobs > 1:
            result = parallel.run(selected, options, setup=functools.partial(rebuild_run, args), jobs=jobs,
                                  results_path=results_path, env=env, on_case=progress.case_done,
                                  on_start=progress.case_start)
        else:
            result = runner.run(selected, options, results_path=results_path, env=env,
                                on_case=progress.case_done, on_start=progress.case_start)
    except KeyboardInterrupt:
        interrupted = True
    except parallel.WorkerSetupError as exc:
        if exc.usage:
            raise UsageError(str(exc)) from None
        raise
    progress.close()
    if result is None:  # interrupted: what finished is on disk (in the order it finished, under --jobs)
        result = _finished(results_path, env)
        planned = {c.name: k for k, c in enumerate(selected)}
        result.cases.sort(key=lambda c: planned.get(c.name, len(planned)))
    result.planned = len(selected)
    result.interrupted = interrupted
    result.env["wall_s"] = round(time.perf_counter() - started, 3)
    written = _write_reports(result, paths)
    written.insert(0, ("results", results_path))
    _print_summary(result, written)
    if interrupted:
        print(f"gradcheck: interrupted after {len(result.cases)} of {len(selected)} case(s); "
              f"they are in {results_path}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_DISAGREE if result.failed else EXIT_OK


def _output_paths(args, output: str | None):
    """``({format: path}, results path)``, each checked before the first case runs, not after the last."""
    from gradcheck.app.output import OutputError, check_file

    out_dir = output or DEFAULT_OUTPUT
    given = _report_paths(args)
    paths = dict(given)
    if paths["html"] is None and not args.no_html:
        paths["html"] = os.path.join(out_dir, "report.html")
    results_path = args.results or os.path.join(out_dir, "results.jsonl")
    in_out_dir = args.results is None or (args.html is None and not args.no_html)
    if in_out_dir and os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise OutputError(f"--output {out_dir}: is a file; --output takes a folder for the reports")
    check_file(results_path, "--results" if args.results else "--output")
    for fmt, path in paths.items():
        if path:
            check_file(path, f"--{fmt}" if given[fmt] else "--output")
    return paths, results_path


def _finished(results_path, env):
    """The cases an interrupted run finished, from its results file (none if it never got to write one)."""
    from gradcheck import results as results_mod

    if os.path.isfile(results_path):
        return results_mod.load(results_path)
    return results_mod.RunResult(env=env)


def _write_reports(result, paths: dict):
    from gradcheck import reports
    from gradcheck.app import output

    written = output.write_reports(result, paths, step_summary=os.environ.get("GITHUB_STEP_SUMMARY"))
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
    """A progress bar on a terminal; plain lines otherwise (CI logs).

    Case names come from user code: every line goes through the reports'
    ``clean_line``, so a newline or an escape byte in a name cannot start a
    CI command line (``::error ...``) or recolour the log.
    """

    def __init__(self, total: int, quiet: bool = False, stream=None):
        self.total, self.quiet = total, quiet
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = time.perf_counter()

    def _width(self) -> int:
        # One column short of the terminal: a line that fills it wraps on some terminals.
        return max(shutil.get_terminal_size((80, 24)).columns - 1, 20)

    def case_start(self, i, total, case):
        if self.quiet or not self.tty:
            return
        from gradcheck.reports.text import clean_line

        bar = 20
        filled = int(bar * i / max(total, 1))
        head = f"[{'#' * filled}{'.' * (bar - filled)}] {i}/{total} "
        room = max(self._width() - len(head), 0)
        self.stream.write("\r" + (head + clean_line(case.name)[:room]).ljust(self._width()))
        self.stream.flush()

    def case_done(self, i, total, result):
        if self.quiet:
            return
        from gradcheck.reports.text import clean_line

        elapsed = time.perf_counter() - self.t0
        line = clean_line(f"[{i + 1}/{total}] {result.name}: {result.verdict} "
                          f"({result.leaves_compared} leaves; {elapsed:.1f}s elapsed)")
        if self.tty:
            self.stream.write("\r" + " " * self._width() + "\r")
        self.stream.write(line + "\n")
        self.stream.flush()

    def close(self):
        if self.tty and not self.quiet:
            self.stream.write("\r" + " " * self._width() + "\r")
            self.stream.flush()


# ---------------------------------------------------------------- list, report, diff
def cmd_list(args) -> int:
    from gradcheck.app import targets
    from gradcheck.backends import get_backend
    from gradcheck.check.runner import DEFAULT_BACKENDS

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
        for name in DEFAULT_BACKENDS:
            ok, why = get_backend(name).available()
            print(f"  {name:<6} {'available, ' + why if ok else 'UNAVAILABLE: ' + why}")
    return EXIT_OK


def _load(path):
    """A stored run, or a usage error that names the file when it is not one."""
    from gradcheck import results

    if not os.path.isfile(path):
        what = "is a folder" if os.path.isdir(path) else "does not exist"
        raise UsageError(f"results file {path!r} {what}; pass the results.jsonl or JSON file of a run")
    try:
        run = results.load(path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{path}: not a gradcheck results file ({type(exc).__name__}: {exc}); pass the "
                         "results.jsonl or JSON file that gradcheck run or pytest --gradcheck-json wrote") from None
    # JSON lines that held neither a run header nor a case (any other text file) load as an empty run.
    if not run.cases and not run.env:
        raise UsageError(f"{path}: not a gradcheck results file (no run header and no case in it); pass the "
                         "results.jsonl or JSON file that gradcheck run or pytest --gradcheck-json wrote")
    return run


def cmd_report(args) -> int:
    from gradcheck.app.output import check_file

    result = _load(args.results)
    paths = _report_paths(args)
    if not any(paths.values()):
        paths["html"] = os.path.join(os.path.dirname(os.path.abspath(args.results)), "report.html")
    for fmt, path in paths.items():
        if path:
            check_file(path, f"--{fmt}")
    written = _write_reports(result, paths)
    _print_summary(result, written)
    return EXIT_DISAGREE if result.failed else EXIT_OK


def cmd_diff(args) -> int:
    from gradcheck.app import rundiff

    base, new = _load(args.base), _load(args.new)
    changes = rundiff.diff(base, new, threshold=args.threshold)
    print(rundiff.render(changes, args.base, args.new))
    return EXIT_DISAGREE if any(c.worse for c in changes) else EXIT_OK


if __name__ == "__main__":  # python -m gradcheck.app.cli, as python -m gradcheck
    sys.exit(main())

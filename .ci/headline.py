"""CI's end-to-end step: the claims the README and BENCHMARKS.md make, run as a user runs them.

* ``gradcheck run resnet18 --seed S`` for three seeds: the real ResNet-18 at 224x224 agrees on all 62
  trainable tensors (and its input) across tape, torch and jax;
* ``gradcheck run smoke layers models``: every case of the three suites agrees.

Each command must exit 0, run every case it planned, and every leaf of every case must agree (a vacuous leaf,
an error, a skipped backend or a missing one fails the step).  ``python .ci/headline.py [--only resnet18]``.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = [["resnet18", "--seed", str(seed)] for seed in (0, 1, 2)] + [["smoke", "layers", "models"]]
BACKENDS = ["tape", "torch", "jax"]


def problems_in(results_path: Path, planned_targets: list[str]) -> tuple[list[str], str]:
    """What is wrong with a run's results (nothing: every case and leaf agrees), and a one-line count."""
    from gradcheck import results

    run = results.load(results_path)
    wrong = []
    if not run.cases:
        wrong.append("no case ran")
    if run.planned is not None and len(run.cases) != run.planned:
        wrong.append(f"{len(run.cases)} of {run.planned} planned cases ran")
    leaves = 0
    for case in run.cases:
        if case.verdict != "agree":
            wrong.append(f"{case.name}: verdict {case.verdict} {dict(case.errors) or ''}".rstrip())
        if sorted(case.timings) != sorted(BACKENDS) or case.unavailable:
            wrong.append(f"{case.name}: ran on {sorted(case.timings)}, unavailable {case.unavailable}")
        for leaf in case.leaves:
            leaves += 1
            if leaf.verdict != "agree":
                wrong.append(f"{case.name} :: {leaf.path}: {leaf.verdict} {leaf.blame} {leaf.message[:200]}")
    return wrong, f"{len(run.cases)} case(s), {leaves} leaves, all agree" if not wrong else ""


def run_one(args: list[str]) -> list[str]:
    command = ["gradcheck", "run", *args]
    with tempfile.TemporaryDirectory(prefix="gradcheck-headline-") as out:
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "gradcheck", "run", *args, "--output", out, "--no-html"],
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
        line = shlex.join(command)
        wrong = [] if done.returncode == 0 else [f"exit {done.returncode} (expected 0)"]
        results_path = Path(out) / "results.jsonl"
        if results_path.is_file():
            found, counted = problems_in(results_path, args)
            wrong += found
        else:
            wrong.append("no results file was written")
            counted = ""
        if wrong:
            print(f"FAIL {line} ({wall:.0f} s):", file=sys.stderr)
            for w in wrong[:50]:
                print(f"  {w}", file=sys.stderr)
            print(done.stdout[-4000:], done.stderr[-4000:], sep="\n", file=sys.stderr)
        else:
            print(f"ok   {line}: exit 0, {counted} ({wall:.0f} s)", flush=True)
        return wrong


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="run only the commands whose first target is this (e.g. resnet18)")
    opts = p.parse_args(argv)
    failed = 0
    for args in COMMANDS:
        if opts.only and args[0] != opts.only:
            continue
        failed += bool(run_one(args))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

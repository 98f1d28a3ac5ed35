"""Figure 3: what the float64 finite-difference referee costs on ResNet-18, in forward passes.

Runs the ``resnet18`` case (the zoo default: batch 1, 3x224x224, float32)
in-process: with the default referee mode (``auto``: per leaf when that
fits the time budget, else one joint direction over all leaves), with
``referee="leaves"`` (every leaf on its own direction; tape only, the
referee does not need the other backends to count its passes), and the
latter again on the float64 case.  Each
``CaseResult`` counts the float64 forward passes it spent
(``referee_passes``).  Against that: a full finite-difference Jacobian, one
forward pass per scalar parameter.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

THREADS = _common.setup_threads()


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--skip-leaves", action="store_true", help="only the default (auto) mode")
    args = p.parse_args(argv)

    from gradcheck.check import runner
    from gradcheck.layers.models import MODELS

    _common.limit_loaded_libraries(THREADS)
    out = {"figure": 3, "threads": THREADS, "machine": _common.machine(), "model": args.model, "modes": {}}
    case = MODELS[args.model].case()
    modes = {"auto": (case, runner.RunOptions())}
    if not args.skip_leaves:
        per_leaf = runner.RunOptions(backends=("tape",), referee="leaves")
        modes["leaves"] = (case, per_leaf)
        # The same in float64: a leaf whose float32 gradient misses the finite difference by float32
        # rounding costs two more passes (the referee's stability retry); in float64 none should.
        modes["leaves, float64 case"] = (case.with_(dtype="float64"), per_leaf)
    for mode, (c, options) in modes.items():
        out["modes"][mode] = run_mode(runner, c, options)
    params = out["modes"]["auto"]["params"]
    # Seconds per float64 pass: measured over the most passes available (the first forward of a
    # process, CaseRun's, also pays for page faults and is not representative).
    per_pass = min((m["seconds_per_pass"] for m in out["modes"].values() if m["seconds_per_pass"]), default=None)
    out["full_jacobian"] = {"passes": params, "seconds_per_pass": per_pass,
                            "estimated_hours": params * per_pass / 3600.0 if per_pass else None}
    _common.write(out, args.json)


def run_mode(runner, case, options) -> dict:
    """One ``run_case`` with the referee's time and the float64 forward time recorded (by wrapping)."""
    spent = {}
    original_referee, original_init = runner._referee, runner.CaseRun.__init__

    def timed_referee(*a, **k):
        t0 = time.perf_counter()
        try:
            return original_referee(*a, **k)
        finally:
            spent["referee_s"] = time.perf_counter() - t0

    def init(self, *a, **k):
        original_init(self, *a, **k)
        spent["forward64_s"] = self.forward64_s
        spent["forward64_estimated_s"] = self.forward64_work.seconds()  # what auto mode decides by

    runner._referee, runner.CaseRun.__init__ = timed_referee, init
    try:
        result = runner.run_case(case, options)
    finally:
        runner._referee, runner.CaseRun.__init__ = original_referee, original_init
    trainable = sum(1 for leaf in result.leaves if leaf.role in ("param", "input"))
    return {
        "referee_passes": result.referee_passes, "trainable_leaves": trainable,
        "passes_per_leaf": result.referee_passes / trainable if trainable else None,
        "referee_s": spent.get("referee_s"), "forward64_s": spent.get("forward64_s"),
        "forward64_estimated_s": spent.get("forward64_estimated_s"),
        "verdict": result.verdict, "notes": [n for n in result.notes if n.startswith("referee")],
        "params": result.params,
        "seconds_per_pass": (spent["referee_s"] / result.referee_passes) if result.referee_passes else None,
        "disagreeing_leaves": [leaf.path for leaf in result.leaves if leaf.verdict == "disagree"],
    }


if __name__ == "__main__":
    main()

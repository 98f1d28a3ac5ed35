"""Figure 6: what the optional checks cost on ResNet-18 at 224x224, against the plain run, in one process.

Each variant is one ``run_case`` of the zoo's ``resnet18`` case (batch 1,
3x224x224, train mode, tape + torch + jax, float64 and float32), taking turns
round by round so that load from other processes falls on all of them alike:

* ``plain`` — the default check;
* ``per_layer`` — plus every layer replayed alone on every backend (``--per-layer``);
* ``order 2`` — plus Hessian-vector products per leaf (``--order 2``);
* ``steps 3`` — plus three Adam steps per backend (``--steps 3 --optimizer adam``);
* ``from_torch`` — the same ResNet-18 as a ``torch.nn.Module`` (``benchmarks/torch_models.py`` loaded with
  the zoo's parameters) through ``gradcheck.from_torch``: capture, decomposition and lowering included.

Each variant's first round pays jax's compilations; the median over rounds is reported, with the ratio
to ``plain``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

THREADS = _common.setup_threads()


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    import numpy as np  # noqa: F401
    import torch
    import torch_models

    from gradcheck import from_torch
    from gradcheck.case import materialise
    from gradcheck.check.runner import RunOptions, run_case
    from gradcheck.layers.models import MODELS

    _common.limit_loaded_libraries(THREADS)
    case = MODELS["resnet18"].case()

    def torch_case():
        model, (x,) = materialise(case)
        net = torch_models.build("resnet18", model).train()
        return from_torch(net, torch.from_numpy(np.asarray(x)), name="resnet18 (from_torch)")

    variants = {
        "plain": lambda: run_case(case, RunOptions()),
        "per_layer": lambda: run_case(case, RunOptions(per_layer=True)),
        "order 2": lambda: run_case(case, RunOptions(order=2)),
        "steps 3": lambda: run_case(case, RunOptions(steps=3, optimizer="adam")),
        "from_torch": lambda: run_case(torch_case(), RunOptions()),
    }
    times = {name: [] for name in variants}
    verdicts = {}
    for _ in range(args.rounds):
        for name, run in variants.items():
            t0 = time.perf_counter()
            result = run()
            times[name].append(time.perf_counter() - t0)
            verdicts[name] = result.verdict
    plain = statistics.median(times["plain"])
    out = {"figure": 6, "threads": THREADS, "machine": _common.machine(), "rounds": args.rounds,
           "command": "python benchmarks/bench_features.py",
           "variants": {name: {"runs": t, "median": statistics.median(t), "ratio": statistics.median(t) / plain,
                               "verdict": verdicts[name]} for name, t in times.items()}}
    _common.write(out, args.json)


if __name__ == "__main__":
    main()

"""What localising a disagreement costs: a failing ``from_torch`` ResNet-18 against the same model passing.

torchvision's ResNet-18 structure (``benchmarks/torch_models.py``), 224x224,
batch 1, train mode, through ``gradcheck.from_torch`` and ``run_case``.  The
failing variant has a ``torch.autograd.Function`` after ``layer3.1.conv2``
whose backward is 1 % too large: torch is wrong there, and every leaf before
it inherits the error.  Each run is a fresh process (imports, capture, jax
compilation with its persistent cache off, every check), the two variants
alternate pair by pair, and each child reports where its time went: the
backends' runs, the per-leaf referee, float64's reach, the per-layer replay.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_localise.py --pairs 2 \\
        --json benchmarks/results/localise.json

With ``--model zoo`` the case is gradcheck's own ``resnet18`` (what ``gradcheck
run resnet18`` checks), and the failing variant's wrong VJP is torch's
convolution in ``layer3.0.conv1`` (the one convolution with a 256x128x3x3
weight), its gradient with respect to its input 1 % too large.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import third_party  # noqa: E402

FACTOR = 1.01  # the wrong backward's factor


def _zoo_case(variant: str, seed: int):
    """gradcheck's own ResNet-18 as ``gradcheck run resnet18`` builds it; failing: torch's VJP of one conv wrong."""

    from gradcheck.app import targets
    from gradcheck.backends.torch import ops as torch_ops

    if variant == "failing":
        wrong = third_party.scaled_gradient("torch", FACTOR)
        original = torch_ops.conv

        def conv(x, w, *args, **kwargs):
            return original(wrong(x) if tuple(w.shape) == (256, 128, 3, 3) else x, w, *args, **kwargs)

        torch_ops.conv = conv
    return targets.resolve(["resnet18"], targets.Request(seed=seed))[0]


def child(variant: str, seed: int, model_name: str = "from_torch") -> dict:
    """One run in this process: the case's verdict, origin, and seconds per phase."""
    import torch
    from torch_models import ResNet18

    import gradcheck
    from gradcheck.check import localise, runner

    phases: dict[str, float] = {}
    _common.time_phases([(runner, "_run_backends", "backends"), (runner, "_referee", "referee"),
                         (runner, "_within_reach", "float64's reach"), (localise, "_localise", "localise"),
                         (runner, "_referee_deferred", "referee after localising")], phases)
    found = []
    inner_localise = localise.localise
    localise.localise = lambda *a, **k: found.append(inner_localise(*a, **k)) or found[-1]

    wrong = third_party.scaled_gradient("torch", FACTOR)

    class WrongBackward(torch.nn.Module):
        def forward(self, x):
            return wrong(x)

    if model_name == "zoo":
        c0, t0 = time.process_time(), time.perf_counter()  # building gradcheck's own case counts
        case = _zoo_case(variant, seed)
    else:
        torch.manual_seed(seed)
        model = ResNet18()
        if variant == "failing":
            model.layer3[1].conv2 = torch.nn.Sequential(model.layer3[1].conv2, WrongBackward())
        x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(seed))
        c0, t0 = time.process_time(), time.perf_counter()
        case = gradcheck.from_torch(model.train(), x, seed=seed)
    phases["capture"] = time.perf_counter() - t0
    res = runner.run_case(case, runner.RunOptions())
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"variant": variant, "wall": wall, "cpu": cpu, "verdict": res.verdict,
            "origin": res.origin.path if res.origin else None,
            "blame": res.origin.blame if res.origin else None,
            "inherited": sum(1 for leaf in res.leaves if leaf.inherited),
            "disagreeing": sum(1 for leaf in res.leaves if leaf.verdict == "disagree"),
            "referee_passes": res.referee_passes, "phases": phases,
            "localise": _localise_seconds(found[-1]) if found and found[-1] is not None else {}}


def _localise_seconds(loc) -> dict:
    """Where the per-layer replay's time went: its steps, and the replays' seconds per backend."""
    out = {f"step {k}": v for k, v in loc.seconds.items()}
    for c in loc.calls:
        for backend, s in c.seconds.items():
            out[f"replay {backend}"] = out.get(f"replay {backend}", 0.0) + s
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
        return
    threads = _common.setup_threads()
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", choices=("from_torch", "zoo"), default="from_torch",
                   help="from_torch: torchvision's ResNet-18 through from_torch; zoo: gradcheck run resnet18's case")
    args = p.parse_args()
    env = {**_common.thread_env(threads), "GRADCHECK_NO_CACHE": "1"}
    runs: dict[str, list[dict]] = {"plain": [], "failing": []}
    for i in range(args.pairs):
        for variant in runs:
            out = _common.run_child([sys.executable, __file__, "--child", variant, str(args.seed), args.model], env=env)
            if out["returncode"] != 0:
                sys.exit(f"{variant} run {i} failed:\n{out['stderr'][-3000:]}")
            got = json.loads(out["stdout"].strip().splitlines()[-1])
            got["process_wall"], got["peak_rss_mib"] = out["wall"], out["peak_rss_mib"]
            runs[variant].append(got)
            print(f"{variant:8s} wall {got['process_wall']:6.1f} s  case {got['wall']:6.1f} s  cpu {got['cpu']:6.1f} s"
                  f"  {got['verdict']}  origin {got['origin']}  blame {got['blame']}  inherited {got['inherited']}"
                  f"  referee passes {got['referee_passes']}  "
                  + ", ".join(f"{k} {v:.1f}" for k, v in {**got["phases"], **got["localise"]}.items()), flush=True)
    med = {v: {k: statistics.median(r[k] for r in rs) for k in ("process_wall", "wall", "cpu")}
           for v, rs in runs.items()}
    ratio = {k: med["failing"][k] / med["plain"][k] for k in ("process_wall", "wall", "cpu")}
    print(f"failing / plain: process wall {ratio['process_wall']:.2f}x, case wall {ratio['wall']:.2f}x, "
          f"case CPU {ratio['cpu']:.2f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"machine": _common.machine(), "threads": threads, "model": args.model, "runs": runs, "median": med,
                       "ratio": ratio}, fh, indent=1)


if __name__ == "__main__":
    main()

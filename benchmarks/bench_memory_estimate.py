"""The memory estimate of ``gradcheck.check.memory`` against each case's measured peak.

Each case runs through ``gradcheck.check.runner.run_case`` in a fresh process (every default backend,
repeat on, jax's persistent compilation cache off so that compiling is measured, the memory check off);
the parent reads the child's peak resident memory (``ru_maxrss``, ``os.wait4``).  The child records the
case's facts (``memory.facts_of``) where the runner hands the built case to the backends, so the estimate
is computed from what ``run_case`` itself would see.  One child imports and initialises the frameworks and
runs no case: the fixed part.

Cases: gradcheck's own models (``gradcheck list models``; the ResNets at 224x224, batch 1), the transformer
at a few sizes, a float64 case, a ``from_torch`` BERT-style encoder (``bench_bert_base.build_torch``, small)
and a ``from_jax`` flax block (``bench_from_jax``).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_memory_estimate.py \\
        --json benchmarks/results/memory_estimate.json

``--only NAME,...`` runs some of the cases (a quick try of the script).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

THREADS = _common.setup_threads()

CASES = {
    "mlp": "zoo:mlp",
    "lenet5": "zoo:lenet5",
    "unet_small": "zoo:unet_small",
    "transformer": "zoo:transformer",
    "transformer d256 L4": "zoo:transformer:d_model=256,n_layer=4,block_size=64",
    "transformer d512 L6 b4": "zoo:transformer:d_model=512,n_layer=6,n_head=8,block_size=128,batch=4",
    "transformer d512 L6 b4 float64": "zoo:transformer:d_model=512,n_layer=6,n_head=8,block_size=128,batch=4"
                                      "@float64",
    "resnet18": "zoo:resnet18",
    "resnet34": "zoo:resnet34",
    "resnet50": "zoo:resnet50",
    # Activations grow with the batch and the image, parameters do not: these two weigh the activation term.
    "resnet18 b4": "zoo:resnet18:batch=4",
    "unet_small 3x256x256 b8": "zoo:unet_small:input_shape=3x256x256,batch=8",
    "from_torch bert L2 H256": "bert:2,256,2,64",
    "from_jax transformer_block": "flax:transformer_block",
    "from_jax resnet_block": "flax:resnet_block",
}


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _case(spec: str):
    kind, _, rest = spec.partition(":")
    if kind == "zoo":
        from gradcheck.layers.models import MODELS

        name, _, opts = rest.partition(":")
        kw = {}
        for item in filter(None, opts.split(",")):
            k, v = item.split("=")
            kw[k] = tuple(int(n) for n in v.split("x")) if "x" in v else int(v)
        return MODELS[name].case(**kw)
    if kind == "bert":
        import bench_bert_base as bert
        import torch

        from gradcheck import from_torch

        layers, hidden, batch, seq = (int(v) for v in rest.split(","))
        ids, _ = bert.inputs(batch, seq, hidden)
        return from_torch(bert.build_torch(layers, hidden), torch.as_tensor(ids), name=f"bert L{layers} H{hidden}")
    if kind == "flax":
        import bench_from_jax as fj

        from gradcheck.frontends.jax import from_jax

        m, x = fj.native(rest)
        module, variables, xj, kwargs = fj.flax_model(rest, m, x)
        return from_jax(module, variables, xj, **kwargs, name=rest)
    raise ValueError(f"unknown case spec {spec!r}")


def child(spec: str) -> dict:
    """One case (or, for ``baseline``, the frameworks alone) in this fresh process."""
    os.environ["GRADCHECK_NO_CACHE"] = "1"
    import jax.numpy as jnp
    import torch

    _common.limit_loaded_libraries(THREADS)
    from gradcheck.check import memory, runner

    # What every case pays: the frameworks imported and each one's first computation done.
    jnp.zeros(3).block_until_ready()
    float(torch.ones(3).sum())
    if spec == "baseline":
        return {"peak_mib": _peak_mib()}
    spec, _, dtype = spec.partition("@")
    case = _case(spec)
    if dtype:
        case = case.with_(dtype=dtype)
    seen = {}
    inner = runner._run_backends

    def run_backends(cr, options, res):
        seen["facts"] = vars(memory.facts_of(cr))
        seen["rss_before_backends_mib"] = memory.resident() / 2**20
        return inner(cr, options, res)

    runner._run_backends = run_backends
    options = runner.RunOptions(memory_limit=float("inf"))  # measured, never refused
    res = runner.run_case(case, options)
    return {"peak_mib": _peak_mib(), "verdict": res.verdict, "errors": res.errors, "backends": list(res.timings),
            "params": res.params, **seen}


def main(argv=None) -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated names of CASES to run")
    p.add_argument("--child", help=argparse.SUPPRESS)  # one measurement, in the process the parent started
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return
    from gradcheck.check import memory

    names = args.only.split(",") if args.only else list(CASES)
    script = os.path.abspath(__file__)

    def measure(spec: str) -> dict:
        done = _common.run_child([sys.executable, script, "--threads", str(THREADS), "--child", spec])
        if done["returncode"] != 0:
            raise SystemExit(f"{spec}: child failed:\n{done['stderr'][-3000:]}")
        out = json.loads(done["stdout"].strip().splitlines()[-1])
        out["peak_rss_mib"] = done["peak_rss_mib"]  # the parent's view (wait4) of the same peak
        out["wall_s"] = done["wall"]
        return out

    result = {"machine": _common.machine(), "threads": THREADS, "baseline": measure("baseline"), "cases": {}}
    print(f"baseline (frameworks imported): {result['baseline']['peak_rss_mib']:.0f} MiB", file=sys.stderr)
    for name in names:
        out = measure(CASES[name])
        facts = memory.Facts(**out["facts"])
        est = memory.estimate(facts, len(out["backends"]))
        out["estimate_mib"] = est.total / 2**20
        out["terms_mib"] = {k: v / 2**20 for k, v in est.terms.items()}
        out["ratio"] = est.total / 2**20 / out["peak_rss_mib"]
        result["cases"][name] = out
        print(f"{name:<32} peak {out['peak_rss_mib']:8.0f} MiB  estimate {out['estimate_mib']:8.0f} MiB  "
              f"ratio {out['ratio']:.2f}  facts {out['facts']}  {out['verdict']} {out['wall_s']:.0f}s",
              file=sys.stderr)
    _common.write(result, args.json)


if __name__ == "__main__":
    main()

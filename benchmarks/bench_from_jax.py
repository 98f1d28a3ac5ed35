"""What a ``from_jax`` case costs against a native gradcheck case of the same model (issue 22: at most 1.5x).

Two models, each written twice with the same parameters and inputs:

* ``resnet_block``: ResNet-18's first BasicBlock (two bias-free 3x3 convolutions of 64 channels, BatchNorm
  in train mode, the residual and relus) on a 64x56x56 input, batch 1: ``gradcheck.layers`` ``BasicBlock``
  (NCHW, torch layouts) against a flax.linen block (NHWC, HWIO kernels, ``batch_stats`` mutable), the
  kernels transposed from the native ones and the input transposed;
* ``transformer_block``: the zoo transformer's pre-LayerNorm block (d_model 64, 4 heads, causal attention,
  a 4x exact-GELU MLP) on a (4, 32, 64) input: ``gradcheck.layers.models.transformer.Block`` against a
  flax.linen block (``LayerNorm``, ``MultiHeadDotProductAttention`` with a causal mask, ``Dense``), the
  projections reshaped from the native ones.

Each run is a fresh process that builds its case (``Case`` for the native model, ``gradcheck.from_jax`` for
the flax one: tracing, lowering and checking the jaxpr belong to its cost) and runs it through
``gradcheck.check.runner.run_case`` with default options, jax's persistent compilation cache off
(``GRADCHECK_NO_CACHE=1``).  The two variants of a model alternate, pair by pair, so that both see the
same load; the figures are medians over the pairs of the case's wall and CPU time (``time.process_time``,
all threads; numpy, torch and jax imported before the clock starts, in both variants) and of the whole
process's wall and CPU time (imports included: flax's and from_jax's own modules among them).  Each child also
reports where its time went (the backends' runs, the per-leaf referee, float64's reach) and its per-backend
timings.  Before the pairs, one untimed process per model checks that the flax model's float64 output is the
native one's (transposed back).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_from_jax.py --pairs 3 \\
        --json benchmarks/results/from_jax.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

MODELS = ("resnet_block", "transformer_block")
VARIANTS = ("native", "from_jax")
SEED = 0  # the native model's parameters and the input come from this numpy seed


# ---------------------------------------------------------------- the native models and their inputs
def native(model: str):
    """``(gradcheck module, input)``, float32, from SEED."""
    import numpy as np

    from gradcheck.case import cast_floats
    from gradcheck.layers.models.resnet import BasicBlock
    from gradcheck.layers.models.transformer import Block

    rng = np.random.default_rng(SEED)
    if model == "resnet_block":
        m, x = BasicBlock(64, 64, rng=rng), rng.standard_normal((1, 64, 56, 56))
    else:
        m, x = Block(64, 4, rng=rng), rng.standard_normal((4, 32, 64))
    return cast_floats(m, np.float32), x.astype(np.float32)


# ---------------------------------------------------------------- the same models in flax.linen
def flax_model(model: str, m, x):
    """``(linen module, variables, input, apply keywords)`` holding the native module ``m``'s parameters."""
    from functools import partial

    import flax.linen as nn
    import jax.numpy as jnp
    import numpy as np

    def a(v):
        return jnp.asarray(np.asarray(v))

    if model == "resnet_block":
        class BasicBlock(nn.Module):
            filters: int = 64

            @nn.compact
            def __call__(self, x, train: bool = True):
                norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5)
                y = nn.relu(norm(name="bn1")(nn.Conv(self.filters, (3, 3), use_bias=False, name="conv1")(x)))
                y = norm(name="bn2")(nn.Conv(self.filters, (3, 3), use_bias=False, name="conv2")(y))
                return nn.relu(y + x)

        def hwio(w):
            return a(np.transpose(np.asarray(w), (2, 3, 1, 0)))

        variables = {
            "params": {"conv1": {"kernel": hwio(m.conv1.weight)}, "conv2": {"kernel": hwio(m.conv2.weight)},
                       "bn1": {"scale": a(m.bn1.weight), "bias": a(m.bn1.bias)},
                       "bn2": {"scale": a(m.bn2.weight), "bias": a(m.bn2.bias)}},
            "batch_stats": {"bn1": {"mean": a(m.bn1.running_mean), "var": a(m.bn1.running_var)},
                            "bn2": {"mean": a(m.bn2.running_mean), "var": a(m.bn2.running_var)}},
        }
        return BasicBlock(), variables, a(np.transpose(x, (0, 2, 3, 1))), {"train": True, "mutable": ["batch_stats"]}

    E, H = 64, 4
    D = E // H

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm(epsilon=1e-5, name="ln_1")(x)
            mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
            x = x + nn.MultiHeadDotProductAttention(num_heads=H, name="attn")(h, h, mask=mask)
            h = nn.LayerNorm(epsilon=1e-5, name="ln_2")(x)
            h = nn.Dense(4 * E, name="fc")(h)
            return x + nn.Dense(E, name="proj")(nn.gelu(h, approximate=False))

    w, b = np.asarray(m.attn.in_proj_weight), np.asarray(m.attn.in_proj_bias)
    attn = {n: {"kernel": a(w[i * E:(i + 1) * E].T.reshape(E, H, D)), "bias": a(b[i * E:(i + 1) * E].reshape(H, D))}
            for i, n in enumerate(("query", "key", "value"))}
    attn["out"] = {"kernel": a(np.asarray(m.attn.out_proj.weight).T.reshape(H, D, E)), "bias": a(m.attn.out_proj.bias)}
    fc, proj = m.mlp.layers[0], m.mlp.layers[2]
    params = {"ln_1": {"scale": a(m.ln_1.weight), "bias": a(m.ln_1.bias)}, "attn": attn,
              "ln_2": {"scale": a(m.ln_2.weight), "bias": a(m.ln_2.bias)},
              "fc": {"kernel": a(np.asarray(fc.weight).T), "bias": a(fc.bias)},
              "proj": {"kernel": a(np.asarray(proj.weight).T), "bias": a(proj.bias)}}
    return Block(), {"params": params}, a(x), {}


def same_output(model: str, m, x, module, variables, xj, kwargs) -> float:
    """Max relative difference of the two models' float64 outputs (the flax one transposed back)."""
    import jax
    import numpy as np

    from gradcheck.case import cast_floats

    y = np.asarray(cast_floats(m, np.float64)(x.astype(np.float64)))
    v64 = jax.tree_util.tree_map(lambda t: np.asarray(t, np.float64), variables)
    out = module.apply(v64, np.asarray(xj, np.float64), **kwargs)
    out = np.asarray(out[0] if isinstance(out, tuple) else out)
    if model == "resnet_block":
        out = np.transpose(out, (0, 3, 1, 2))
    return float(np.max(np.abs(out - y)) / np.max(np.abs(y)))


# ---------------------------------------------------------------- one run
def child(model: str, variant: str) -> dict:
    """One case in this process: its verdict and seconds, whole and per phase."""
    import numpy as np

    from gradcheck.case import Case
    from gradcheck.check import runner

    phases: dict[str, float] = {}
    _common.time_phases([(runner, name, key) for name, key in (
        ("_run_backends", "backends"), ("_referee", "referee"), ("_within_reach", "float64's reach"))], phases)
    # Both variants import the frameworks before the clock starts: the case's figures are the case's work alone
    # (the process's figures hold the imports, flax and from_jax's modules among them for the flax variant).
    import jax  # noqa: F401
    import torch  # noqa: F401

    m, x = native(model)
    if variant == "from_jax":
        from gradcheck.frontends.jax import from_jax

        module, variables, xj, kwargs = flax_model(model, m, x)
        c0, t0 = time.process_time(), time.perf_counter()
        case = from_jax(module, variables, xj, **kwargs, name=model)
        phases["from_jax"] = time.perf_counter() - t0
    else:
        c0, t0 = time.process_time(), time.perf_counter()
        case = Case(name=model, build=lambda rng: m, inputs=lambda rng: (x,), dtype="float32", mode="train",
                    seed=0, model=type(m).__name__)
    res = runner.run_case(case, runner.RunOptions())
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"model": model, "variant": variant, "wall": wall, "cpu": cpu, "verdict": res.verdict,
            "leaves_compared": res.leaves_compared, "referee_passes": res.referee_passes,
            "timings": {b: {"first": t.first, "second": t.second, "float64": t.float64} for b, t in res.timings.items()},
            "phases": phases, "parameters": int(sum(np.size(v) for _, v in m.named_parameters()))}


def sanity(model: str) -> dict:
    """The two models are one: their float64 outputs (run once, in a process of its own, never timed)."""
    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)  # as from_jax does: float64 is float64 on jax too
    m, x = native(model)
    module, variables, xj, kwargs = flax_model(model, m, x)
    return {"model": model, "same_output_max_rel": same_output(model, m, x, module, variables, xj, kwargs),
            "parameters": int(sum(np.size(v) for _, v in m.named_parameters())), "blas": _common._blas()}


# ---------------------------------------------------------------- the side-by-side runs
def _git() -> dict:
    def out(*cmd):
        return subprocess.run(cmd, cwd=_common.ROOT, capture_output=True, text=True).stdout.strip()

    return {"commit": out("git", "rev-parse", "HEAD"),
            "uncommitted_in_gradcheck": out("git", "status", "--short", "--", "gradcheck").splitlines()}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        threads = _common.setup_threads(sys.argv[4:])
        import numpy  # noqa: F401 - after setup_threads

        _common.limit_loaded_libraries(threads)
        print(json.dumps(sanity(sys.argv[2]) if sys.argv[3] == "sanity" else child(sys.argv[2], sys.argv[3])))
        return
    threads = _common.setup_threads()
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    args = p.parse_args()
    env = {**_common.thread_env(threads), "GRADCHECK_NO_CACHE": "1"}
    models = args.models.split(",")
    runs: dict[str, dict[str, list[dict]]] = {m: {v: [] for v in VARIANTS} for m in models}
    same = {}
    for model in models:
        out = _common.run_child([sys.executable, __file__, "--child", model, "sanity", "--threads", str(threads)],
                                env=env)
        if out["returncode"] != 0:
            sys.exit(f"{model}: the sanity check failed:\n{out['stderr'][-3000:]}")
        same[model] = json.loads(out["stdout"].strip().splitlines()[-1])
        print(f"{model}: {same[model]['parameters']} parameters; flax's float64 output against the native one: max "
              f"relative difference {same[model]['same_output_max_rel']:.2g}", flush=True)
    for i in range(args.pairs):
        for model in models:
            # Which variant goes first alternates too: neither always follows the other.
            for variant in (VARIANTS if i % 2 == 0 else VARIANTS[::-1]):
                out = _common.run_child([sys.executable, __file__, "--child", model, variant,
                                         "--threads", str(threads)], env=env)
                if out["returncode"] != 0:
                    sys.exit(f"{model} {variant} run {i} failed:\n{out['stderr'][-3000:]}")
                got = json.loads(out["stdout"].strip().splitlines()[-1])
                got["process_wall"], got["peak_rss_mib"] = out["wall"], out["peak_rss_mib"]
                got["process_cpu"] = out["cpu_user"] + out["cpu_sys"]
                runs[model][variant].append(got)
                print(f"{model:17s} {variant:8s} process {got['process_wall']:6.1f} s  case wall {got['wall']:6.1f} s"
                      f"  case cpu {got['cpu']:6.1f} s  {got['verdict']}  "
                      + ", ".join(f"{k} {v:.1f}" for k, v in got["phases"].items()), flush=True)
    keys = ("wall", "cpu", "process_wall", "process_cpu")
    median = {m: {v: {k: statistics.median(r[k] for r in rs) for k in keys} for v, rs in vs.items()}
              for m, vs in runs.items()}
    least = {m: {v: {k: min(r[k] for r in rs) for k in keys} for v, rs in vs.items()} for m, vs in runs.items()}
    ratio = {m: {k: median[m]["from_jax"][k] / median[m]["native"][k] for k in keys} for m in models}
    ratio_min = {m: {k: least[m]["from_jax"][k] / least[m]["native"][k] for k in keys} for m in models}
    for m in models:
        print(f"{m}: from_jax / native, medians: case wall {ratio[m]['wall']:.2f}x, case CPU {ratio[m]['cpu']:.2f}x, "
              f"process wall {ratio[m]['process_wall']:.2f}x, process CPU {ratio[m]['process_cpu']:.2f}x; minima: "
              f"case wall {ratio_min[m]['wall']:.2f}x, case CPU {ratio_min[m]['cpu']:.2f}x")
    result = {"machine": _common.machine(), "threads": threads, "git": _git(), "same_model": same, "runs": runs,
              "median": median, "min": least, "ratio": ratio, "ratio_of_minima": ratio_min}
    _common.write(result, args.json)


if __name__ == "__main__":
    main()

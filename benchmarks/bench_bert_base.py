"""A BERT-base-sized encoder through ``from_torch``, next to the bare torch and jax forward and backward of it.

The model is BERT-base as Hugging Face writes it, in plain ``torch.nn`` (no
transformers): word, position and token-type embeddings (vocabulary 30522),
12 post-norm layers of hidden size 768, 12 heads, a 3072-wide GELU
feed-forward, dropout 0.1 (attention dropout inside
``F.scaled_dot_product_attention``), 109 M parameters; input ids of batch 2
and sequence 128; train mode.  Each measurement is a fresh process, whose
peak resident memory (``ru_maxrss``) is read by the parent:

* ``gradcheck``: ``gradcheck.from_torch(model, ids)`` then ``run_case`` on the
  tape, torch and jax, as a user runs it (float32 case: every backend in
  float32 and float64, the reference forward, the referee; jax's compilation
  cache off);
* ``torch-float32`` / ``torch-float64``: the module's forward and
  ``backward()`` of ``<r, model(ids)>`` in eager torch;
* ``jax-float32`` / ``jax-float64``: the same function written in jax
  (``jax.nn.dot_product_attention``, ``jax.random`` dropout masks) with the
  same parameters, ``jax.jit(jax.value_and_grad)``: its first call
  (tracing and compiling) and its steady-state call.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_bert_base.py \\
        --json benchmarks/results/bert_base.json

``--layers``, ``--hidden``, ``--seq`` make it smaller (a quick try of the script).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

THREADS = _common.setup_threads()
VOCAB, POSITIONS, TYPES = 30522, 512, 2


def build_torch(layers: int, hidden: int, seed: int = 0):
    """BERT-base's encoder in plain torch.nn (post-norm, GELU, dropout 0.1), returning ``last_hidden_state``."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = hidden // 64
            self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
            self.attn_out = nn.Linear(hidden, hidden)
            self.attn_norm = nn.LayerNorm(hidden, eps=1e-12)
            self.intermediate = nn.Linear(hidden, 4 * hidden)
            self.output = nn.Linear(4 * hidden, hidden)
            self.out_norm = nn.LayerNorm(hidden, eps=1e-12)
            self.dropout = nn.Dropout(0.1)

        def forward(self, x):
            b, s, _ = x.shape

            def heads(t):
                return t.view(b, s, self.heads, -1).transpose(1, 2)

            q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
            a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0)
            a = a.transpose(1, 2).reshape(b, s, -1)
            x = self.attn_norm(x + self.dropout(self.attn_out(a)))
            h = self.output(F.gelu(self.intermediate(x)))
            return self.out_norm(x + self.dropout(h))

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.word = nn.Embedding(VOCAB, hidden, padding_idx=0)
            self.position = nn.Embedding(POSITIONS, hidden)
            self.token_type = nn.Embedding(TYPES, hidden)
            self.norm = nn.LayerNorm(hidden, eps=1e-12)
            self.dropout = nn.Dropout(0.1)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))

        def forward(self, ids):
            positions = torch.arange(ids.shape[1], device=ids.device)
            x = self.word(ids) + self.position(positions) + self.token_type(torch.zeros_like(ids))
            x = self.dropout(self.norm(x))
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(seed)
    model = Encoder()
    with torch.no_grad():  # BERT's initialisation: normal(0, 0.02) weights, zero biases
        for name, p in model.named_parameters():
            if "norm" in name:
                continue
            if name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02)
    return model.train()


def inputs(batch: int, seq: int, hidden: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed + 1)
    ids = rng.integers(1, VOCAB, size=(batch, seq))
    r = rng.standard_normal((batch, seq, hidden))
    return ids, r


def jax_forward(params: dict, ids, key, layers: int, hidden: int, rate: float = 0.1):
    """The torch model's function in jax: the same parameters (torch's names), dropout masks from ``key``."""
    import jax
    import jax.numpy as jnp

    def norm(x, prefix):
        mean = jnp.mean(x, -1, keepdims=True)
        var = jnp.mean((x - mean) ** 2, -1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-12) * params[prefix + ".weight"] + params[prefix + ".bias"]

    def linear(x, prefix):
        return x @ params[prefix + ".weight"].T + params[prefix + ".bias"]

    keys = iter(jax.random.split(key, 3 * layers + 1))

    def dropout(x):
        keep = jax.random.bernoulli(next(keys), 1.0 - rate, x.shape)
        return jnp.where(keep, x / (1.0 - rate), 0.0)

    b, s = ids.shape
    x = params["word.weight"][ids] + params["position.weight"][:s] + params["token_type.weight"][0]
    x = dropout(norm(x, "norm"))
    heads = hidden // 64
    for i in range(layers):
        p = f"layers.{i}."
        q, k, v = (linear(x, p + n).reshape(b, s, heads, -1) for n in ("query", "key", "value"))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hidden // heads)
        weights = dropout(jax.nn.softmax(scores, -1))
        a = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, s, hidden)
        x = norm(x + dropout(linear(a, p + "attn_out")), p + "attn_norm")
        h = linear(jax.nn.gelu(linear(x, p + "intermediate"), approximate=False), p + "output")
        x = norm(x + dropout(h), p + "out_norm")
    return x


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def child(what: str, args) -> dict:
    """One measurement in this (fresh) process."""
    import numpy as np
    import torch

    _common.limit_loaded_libraries(THREADS)
    t0 = time.perf_counter()
    model = build_torch(args.layers, args.hidden)
    ids, r = inputs(args.batch, args.seq, args.hidden)
    out = {"what": what, "params": sum(p.numel() for p in model.parameters()), "build_s": time.perf_counter() - t0}
    if what == "gradcheck":
        os.environ["GRADCHECK_NO_CACHE"] = "1"
        import gradcheck
        from gradcheck.check.runner import RunOptions, run_case

        c0, t0 = time.process_time(), time.perf_counter()
        case = gradcheck.from_torch(model, torch.as_tensor(ids))
        out["capture_s"] = time.perf_counter() - t0
        res = run_case(case, RunOptions(backends=("tape", "torch", "jax")))
        out.update(wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0, verdict=res.verdict,
                   float32=res.float32, compared=res.compared, agreeing=res.agreeing, leaves=len(res.leaves),
                   unavailable=res.unavailable, errors=res.errors, notes=res.notes, referee_passes=res.referee_passes,
                   timings={b: vars(t) for b, t in res.timings.items()},
                   not_agreeing=[(leaf.path, leaf.verdict, leaf.message[:300]) for leaf in res.leaves
                                 if leaf.verdict != "agree"][:20])
    elif what.startswith("torch-"):
        dtype = {"torch-float32": torch.float32, "torch-float64": torch.float64}[what]
        net = model.to(dtype)
        tids, tr = torch.as_tensor(ids), torch.as_tensor(r, dtype=dtype)

        def step():
            net.zero_grad(set_to_none=True)
            loss = (net(tids) * tr).sum()
            loss.backward()

        c0, t0 = time.process_time(), time.perf_counter()
        step()
        out["first_s"], out["first_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
        out["steady"] = _common.measure(step, runs=args.runs, warmup=0)
    elif what.startswith("jax-"):
        import jax

        double = what == "jax-float64"
        jax.config.update("jax_enable_x64", double)
        jax.config.update("jax_compilation_cache_dir", None)
        import jax.numpy as jnp

        dt = np.float64 if double else np.float32
        params = {n: jnp.asarray(p.detach().numpy().astype(dt)) for n, p in model.named_parameters()}
        del model
        jids, jr = jnp.asarray(ids), jnp.asarray(r.astype(dt))
        key = jax.random.PRNGKey(0)

        def loss(params):
            return jnp.sum(jax_forward(params, jids, key, args.layers, args.hidden) * jr)

        grad = jax.jit(jax.value_and_grad(loss))

        def step():
            value, g = grad(params)
            jax.block_until_ready(g)

        c0, t0 = time.process_time(), time.perf_counter()
        step()
        out["first_s"], out["first_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
        out["steady"] = _common.measure(step, runs=args.runs, warmup=0)
    else:
        raise SystemExit(f"unknown measurement {what!r}")
    out["peak_rss_self_mib"] = _peak_mib()
    return out


WHAT = ("torch-float32", "torch-float64", "jax-float32", "jax-float64", "gradcheck")


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--runs", type=int, default=3, help="steady-state calls timed per bare measurement")
    p.add_argument("--only", nargs="*", choices=WHAT, default=list(WHAT))
    p.add_argument("--child", choices=WHAT, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args), default=_common._jsonable), flush=True)
        return 0
    result = {"machine": _common.machine(), "threads": THREADS,
              "model": {"layers": args.layers, "hidden": args.hidden, "seq": args.seq, "batch": args.batch,
                        "vocab": VOCAB}, "runs": {}}
    for what in args.only:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", what, "--threads", str(THREADS),
               "--layers", str(args.layers), "--hidden", str(args.hidden), "--seq", str(args.seq),
               "--batch", str(args.batch), "--runs", str(args.runs)]
        run = _common.run_child(cmd)
        row = {"peak_rss_mib": run["peak_rss_mib"], "cpu_user_s": run["cpu_user"], "cpu_sys_s": run["cpu_sys"],
               "process_wall_s": run["wall"], "returncode": run["returncode"]}
        lines = [line for line in run["stdout"].splitlines() if line.startswith("{")]
        if lines:
            row.update(json.loads(lines[-1]))
        else:
            row["stderr"] = run["stderr"][-4000:]
        result["runs"][what] = row
        print(f"{what}: rc {run['returncode']}, {run['wall']:.1f} s wall, peak RSS {run['peak_rss_mib']:.0f} MiB",
              file=sys.stderr, flush=True)
    _common.write(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The bare frameworks' forward+backward of a zoo model (ResNet-18/34/50, the GPT-style transformer), as a plain script.

"Bare" means the model written the usual way in each framework, with no
gradcheck code on the forward or backward path: ``torch.nn`` modules run
eagerly, and plain ``jax.numpy``/``jax.lax`` functions under
``jax.jit(jax.value_and_grad(...))`` (compilation included: gradcheck pays
it too).  Both are loaded with the exact parameters gradcheck's case draws
from its seed (``gradcheck.case.materialise``), matched by path, and take the
gradient of the same loss ``<r, model(x)>`` with respect to every parameter
and the float input, in train mode, in float32 and in float64: the least
work that yields what gradcheck compares.

BatchNorm normalises with the batch's statistics (train mode) on both; the
jax version does not update the running statistics (they do not enter the
gradient).  The transformer has no dropout (the zoo's default, 0.0).

    python benchmarks/bare_model.py resnet50 --json out.json
    python benchmarks/bare_model.py transformer --option d_model=256 --option n_layer=4 \\
        --option block_size=64 --option vocab_size=512 --option n_head=4 --batch 2

Prints (and with ``--json`` writes) the seconds of each step and the
process's peak resident memory.  ``--verify`` also compares both
frameworks' float64 loss with gradcheck's own float64 forward (numpy), to
show the bare models compute the same function.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

THREADS = _common.setup_threads()
RESNET_BLOCKS = {"resnet18": ("basic", (2, 2, 2, 2)), "resnet34": ("basic", (3, 4, 6, 3)),
                 "resnet50": ("bottleneck", (3, 4, 6, 3))}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def current_rss_mib() -> float:
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# ------------------------------------------------------------------ torch.nn
def torch_resnet(kind: str, blocks: tuple, num_classes: int):
    """torchvision's ResNet structure and names (BasicBlock or the v1.5 Bottleneck), torchvision not needed."""
    from torch import nn

    def bn_conv(cin, cout, k, stride):
        return nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)

    class Block(nn.Module):
        def __init__(self, inplanes, planes, stride):
            super().__init__()
            expansion = 4 if kind == "bottleneck" else 1
            if kind == "bottleneck":
                self.conv1, self.bn1 = bn_conv(inplanes, planes, 1, 1)
                self.conv2, self.bn2 = bn_conv(planes, planes, 3, stride)
                self.conv3, self.bn3 = bn_conv(planes, planes * 4, 1, 1)
            else:
                self.conv1, self.bn1 = bn_conv(inplanes, planes, 3, stride)
                self.conv2, self.bn2 = bn_conv(planes, planes, 3, 1)
            self.downsample = None
            if stride != 1 or inplanes != planes * expansion:
                self.downsample = nn.Sequential(*bn_conv(inplanes, planes * expansion, 1, stride))

        def forward(self, x):
            out = self.bn1(self.conv1(x)).relu()
            out = self.bn2(self.conv2(out))
            if kind == "bottleneck":
                out = self.bn3(self.conv3(out.relu()))
            return (out + (x if self.downsample is None else self.downsample(x))).relu()

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            expansion = 4 if kind == "bottleneck" else 1
            self.conv1, self.bn1 = bn_conv(3, 64, 7, 2)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            inplanes, stages = 64, []
            for planes, n, stride in zip((64, 128, 256, 512), blocks, (1, 2, 2, 2)):
                stage = [Block(inplanes, planes, stride)]
                inplanes = planes * expansion
                stage += [Block(inplanes, planes, 1) for _ in range(1, n)]
                stages.append(nn.Sequential(*stage))
            self.layer1, self.layer2, self.layer3, self.layer4 = stages
            self.fc = nn.Linear(512 * expansion, num_classes)

        def forward(self, x):
            x = self.maxpool(self.bn1(self.conv1(x)).relu())
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(x.mean((2, 3)))

    return ResNet()


def torch_gpt(vocab_size, block_size, d_model, n_head, n_layer):
    """The zoo's GPT in torch.nn: pre-LayerNorm blocks, causal attention (``scaled_dot_product_attention``)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.in_proj_weight = nn.Parameter(torch.empty(3 * d_model, d_model))
            self.in_proj_bias = nn.Parameter(torch.empty(3 * d_model))
            self.out_proj = nn.Linear(d_model, d_model)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (h.view(b, t, n_head, -1).transpose(1, 2)
                       for h in F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, -1))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out_proj(a.transpose(1, 2).reshape(b, t, d_model))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(d_model), Attention(), nn.LayerNorm(d_model)
            self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_emb, self.pos_emb = nn.Embedding(vocab_size, d_model), nn.Embedding(block_size, d_model)
            self.blocks = nn.Sequential(*(Block() for _ in range(n_layer)))
            self.ln_f = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab_size, bias=False)

        def forward(self, ids):
            x = self.tok_emb(ids) + self.pos_emb.weight[: ids.shape[1]]
            return self.head(self.ln_f(self.blocks(x)))

    return GPT()


def torch_model(name: str, options: dict, state: dict):
    """The torch.nn model loaded with ``state`` (path -> numpy array) by name, every name used (strict)."""
    import torch

    if name in RESNET_BLOCKS:
        net = torch_resnet(*RESNET_BLOCKS[name], options.get("num_classes", 1000))
    else:
        net = torch_gpt(*(options[k] for k in ("vocab_size", "block_size", "d_model", "n_head", "n_layer")))
    net.load_state_dict({p: torch.from_numpy(v.copy()) for p, v in state.items()}, strict=True)
    return net.train()


# ------------------------------------------------------------------ plain jax
def jax_resnet(p: dict, x, kind: str, blocks: tuple):
    """ResNet's train-mode forward in jax.lax: NCHW, OIHW weights, BatchNorm on the batch's statistics."""
    import jax.numpy as jnp
    from jax import lax

    def conv(x, w, stride):
        k = w.shape[-1] // 2
        return lax.conv_general_dilated(x, w, (stride, stride), [(k, k), (k, k)],
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=lax.Precision.HIGHEST)

    def bn(x, prefix):
        mean = jnp.mean(x, (0, 2, 3), keepdims=True)
        var = jnp.mean((x - mean) ** 2, (0, 2, 3), keepdims=True)
        shape = (1, -1, 1, 1)
        return ((x - mean) / jnp.sqrt(var + 1e-5) * p[prefix + ".weight"].reshape(shape)
                + p[prefix + ".bias"].reshape(shape))

    relu = lambda t: jnp.maximum(t, 0)  # noqa: E731
    x = relu(bn(conv(x, p["conv1.weight"], 2), "bn1"))
    x = lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2), [(0, 0), (0, 0), (1, 1), (1, 1)])
    for s, n in enumerate(blocks):
        for i in range(n):
            q = f"layer{s + 1}.{i}."
            stride = 2 if (i == 0 and s > 0) else 1
            if kind == "bottleneck":
                out = relu(bn(conv(x, p[q + "conv1.weight"], 1), q + "bn1"))
                out = relu(bn(conv(out, p[q + "conv2.weight"], stride), q + "bn2"))
                out = bn(conv(out, p[q + "conv3.weight"], 1), q + "bn3")
            else:
                out = relu(bn(conv(x, p[q + "conv1.weight"], stride), q + "bn1"))
                out = bn(conv(out, p[q + "conv2.weight"], 1), q + "bn2")
            if q + "downsample.0.weight" in p:
                x = bn(conv(x, p[q + "downsample.0.weight"], stride), q + "downsample.1")
            x = relu(out + x)
    return jnp.dot(jnp.mean(x, (2, 3)), p["fc.weight"].T, precision=lax.Precision.HIGHEST) + p["fc.bias"]


def jax_gpt(p: dict, ids, n_head: int, n_layer: int):
    """The zoo's GPT in jax.numpy: the same function as ``torch_gpt``."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    hi = lax.Precision.HIGHEST

    def ln(x, prefix):
        mean = jnp.mean(x, -1, keepdims=True)
        var = jnp.mean((x - mean) ** 2, -1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * p[prefix + ".weight"] + p[prefix + ".bias"]

    def linear(x, w, b=None):
        y = jnp.matmul(x, w.T, precision=hi)
        return y if b is None else y + b

    b, t = ids.shape
    x = p["tok_emb.weight"][ids] + p["pos_emb.weight"][:t]
    d = x.shape[-1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    for i in range(n_layer):
        q_ = f"blocks.{i}."
        h = linear(ln(x, q_ + "ln_1"), p[q_ + "attn.in_proj_weight"], p[q_ + "attn.in_proj_bias"])
        q, k, v = (a.reshape(b, t, n_head, -1) for a in jnp.split(h, 3, -1))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=hi) / math.sqrt(d // n_head)
        w = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), -1)
        a = jnp.einsum("bhqk,bkhd->bqhd", w, v, precision=hi).reshape(b, t, d)
        x = x + linear(a, p[q_ + "attn.out_proj.weight"], p[q_ + "attn.out_proj.bias"])
        h = jax.nn.gelu(linear(ln(x, q_ + "ln_2"), p[q_ + "mlp.0.weight"], p[q_ + "mlp.0.bias"]), approximate=False)
        x = x + linear(h, p[q_ + "mlp.2.weight"], p[q_ + "mlp.2.bias"])
    return linear(ln(x, "ln_f"), p["head.weight"])


# ------------------------------------------------------------------ the run
def parse_options(pairs: list[str]) -> dict:
    """``--option key=value`` pairs, values read as ints where they are."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            print(f"--option {pair!r}: expected key=value, e.g. --option n_layer=4", file=sys.stderr)
            sys.exit(2)
        try:
            out[key] = int(value)
        except ValueError:
            out[key] = value
    return out


def gradcheck_case(name: str, options: dict, batch: int | None, input_shape, seed: int):
    """The zoo case gradcheck would run, and its materialised model and inputs (the case's seed)."""
    from gradcheck.case import materialise
    from gradcheck.layers.models import MODELS

    try:
        case = MODELS[name].case(seed=seed, batch=batch, input_shape=input_shape, **options)
    except ValueError as exc:  # an option the model does not have: the spec's message names the ones it has
        print(f"bare_model.py {name}: {exc}", file=sys.stderr)
        sys.exit(2)
    model, inputs = materialise(case)
    return case, model, inputs


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("model", choices=[*RESNET_BLOCKS, "transformer"])
    p.add_argument("--option", action="append", default=[], help="a model option, key=value (repeatable)")
    p.add_argument("--batch", type=int, help="default: the zoo's")
    p.add_argument("--input-shape", type=lambda s: tuple(int(v) for v in s.split("x")), help="e.g. 3x224x224")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verify", action="store_true", help="compare the float64 losses with gradcheck's numpy forward")
    args = p.parse_args(argv)
    from gradcheck.layers.models import MODELS

    options = {**MODELS[args.model].options, **parse_options(args.option)}  # the zoo's defaults, then the overrides
    marks, rss = {}, {}

    t = time.perf_counter()
    import jax
    import numpy as np
    import torch

    _common.limit_loaded_libraries(THREADS)
    torch.backends.cudnn.allow_tf32 = False
    jax.config.update("jax_enable_x64", True)  # float64 available; each call's dtype is its arrays'
    jax.config.update("jax_compilation_cache_dir", None)  # cold, as gradcheck's benchmarks run it
    marks["import numpy, torch, jax"] = time.perf_counter() - t
    rss["after imports"] = current_rss_mib()

    t = time.perf_counter()
    _, model, inputs = gradcheck_case(args.model, options, args.batch, args.input_shape, args.seed)
    state = {path: np.asarray(v) for path, v, _ in model.named_arrays()}
    x = inputs[0]
    out_shape = (x.shape[0], options.get("num_classes", 1000)) if args.model in RESNET_BLOCKS else \
        x.shape + (options["vocab_size"],)
    r = np.random.default_rng(args.seed + 1).standard_normal(out_shape)
    float_input = x.dtype.kind == "f"
    params = int(sum(v.size for path, v, kind in model.named_arrays() if kind == "param"))
    marks["build parameters (numpy)"] = time.perf_counter() - t
    losses = {}

    for dtype in (torch.float32, torch.float64):
        t = time.perf_counter()
        net = torch_model(args.model, options, state).to(dtype)
        xt = torch.from_numpy(x.copy())
        xt = xt.to(dtype).requires_grad_(True) if float_input else xt
        wrt = list(net.parameters()) + ([xt] if float_input else [])
        loss = (net(xt) * torch.from_numpy(r).to(dtype)).sum()
        grads = torch.autograd.grad(loss, wrt)
        assert len(grads) == len(wrt)
        losses[f"torch {str(dtype)[6:]}"] = float(loss.detach())
        marks[f"torch eager forward+backward, {str(dtype)[6:]}"] = time.perf_counter() - t
        del net, xt, wrt, loss, grads

    for dtype in (np.float32, np.float64):
        t = time.perf_counter()
        trainable = {path: jax.numpy.asarray(v.astype(dtype)) for path, v, kind in model.named_arrays()
                     if kind == "param"}
        xj = jax.numpy.asarray(x.astype(dtype) if float_input else x)
        rj = jax.numpy.asarray(r.astype(dtype))
        if args.model in RESNET_BLOCKS:
            def loss(ps, x, kind=RESNET_BLOCKS[args.model], rj=rj):
                return jax.numpy.sum(jax_resnet(ps, x, *kind) * rj)
        else:
            def loss(ps, ids, rj=rj):
                return jax.numpy.sum(jax_gpt(ps, ids, options["n_head"], options["n_layer"]) * rj)
        value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1) if float_input else 0))(trainable, xj)
        jax.block_until_ready(grads)
        losses[f"jax {np.dtype(dtype).name}"] = float(value)
        marks[f"jax jit compile + forward+backward, {np.dtype(dtype).name}"] = time.perf_counter() - t
        del trainable, xj, value, grads

    if args.verify:
        from gradcheck.case import cast_floats

        y = cast_floats(model, np.float64)(*cast_floats(inputs, np.float64))
        losses["gradcheck numpy float64"] = float(np.sum(np.asarray(y) * r))

    fwd_bwd = sum(v for k, v in marks.items() if "forward+backward" in k)
    result = {"model": args.model, "options": options, "batch": int(x.shape[0]), "input_shape": list(x.shape[1:]),
              "seed": args.seed, "threads": THREADS, "params": params, "marks": marks, "fwd_bwd_s": fwd_bwd,
              "losses": losses, "rss_mib": rss, "peak_rss_mib": peak_rss_mib(),
              "process_s": time.perf_counter() - T_START}
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(text)
    print(text)


if __name__ == "__main__":
    main()

"""Third-party JAX models through ``from_jax``: equimo's equinox vision models and flaxmodels' flax.linen ResNet.

Not a test and not a dependency: it needs ``equimo`` and ``flaxmodels`` (and equinox, flax, jax and torch),
which the project does not install.  Each model is built with random initialisation from
``jax.random.key(seed)`` (nothing is downloaded) and 10 classes, at a small configuration of its own
constructor or its smallest registered variant, with float32 parameters, as a user builds them:

* equimo's models are called as equimo calls them: one image at a time (channels, height, width), under
  ``jax.vmap`` over a batch of 2, in training mode (``inference=False``: dropout and stochastic depth on where
  the model has them) with one key per image split from the case's key;
* flaxmodels' ResNet-18 (``pretrained=None``) on a batch of 2 NHWC images, ``train=True`` with its
  ``batch_stats`` updated (``mutable=["batch_stats"]``).

Each case is checked on the tape, torch and jax through ``third_party.py``, the harness it shares with
``timm_models.py`` and ``hf_models.py``: one fresh process per (model, seed), one JSON line per run appended to
``--out``.  The seed is the initialisation's, the image's (``1000 + seed``) and the case's.

    python benchmarks/jax_libraries.py --seeds 0 1 --out jax_libraries.jsonl
    python benchmarks/jax_libraries.py --models vit convnext --seeds 3
    python benchmarks/jax_libraries.py --table jax_libraries.jsonl
"""

from __future__ import annotations

import json
import os
import sys
import time

import third_party

BATCH = 2
# name: (equimo.models attribute, constructor arguments, image size)
MODELS = {
    "vit": ("VisionTransformer", dict(img_size=32, in_channels=3, dim=64, patch_size=4, num_heads=4, depths=[2]), 32),
    "convnext": ("ConvNeXt", dict(in_channels=3, depths=[1, 1, 1, 1], dims=[16, 32, 64, 128]), 64),
    "mobilenetv3_small": ("mobilenetv3_small", {}, 64),
    "iformer_t": ("iformer_t", {}, 64),
    "reduceformer": ("ReduceFormer", dict(in_channels=3, widths=[8, 16, 32, 64], depths=[1, 1, 1, 1],
                                          block_types=["conv", "conv", "attention", "attention"], head_dim=8), 64),
    "lowformer": ("LowFormer", dict(in_channels=3, widths=[8, 16, 32, 64], depths=[1, 1, 1, 1],
                                    att_strides=[1, 1, 1, 1], block_types=["conv", "conv", "attention", "attention"],
                                    attention_type="softmax"), 64),
    "mlla": ("Mlla", dict(img_size=32, in_channels=3, dim=16, depths=[1, 1], num_heads=[1, 2]), 32),
    "vssd": ("Vssd", dict(img_size=32, in_channels=3, dim=16, d_state=8, depths=[1, 1], num_heads=[1, 2],
                          attentions_layers=("mamba2mixer", "attention")), 32),
    "flaxmodels_resnet18": ("ResNet18", dict(output="logits", pretrained=None, normalize=False), 32),
}


def child(name: str, seed: int) -> dict:
    """One model at one seed, in this process: built, traced, checked."""
    import jax

    t0 = time.perf_counter()
    case, model = (_flaxmodels if name.startswith("flaxmodels_") else _equimo)(name, seed)
    row = {"model": name, "seed": seed, "class": type(model).__name__, "image": MODELS[name][2],
           "capture_s": round(time.perf_counter() - t0, 2), "float64_computes_in": case.float64_computes_in}
    row["params"] = int(sum(v.size for v in jax.tree_util.tree_leaves(model) if hasattr(v, "dtype")
                            and jax.numpy.issubdtype(v.dtype, jax.numpy.inexact)))
    third_party.check_case(case, row)
    row["wall_s"] = round(time.perf_counter() - t0, 2)
    return row


def _equimo(name: str, seed: int):
    import equimo.models
    import jax
    import jax.random as jr

    import gradcheck

    attr, kwargs, size = MODELS[name]
    model = getattr(equimo.models, attr)(**kwargs, num_classes=10, key=jr.key(seed))
    x = jr.normal(jr.key(1000 + seed), (BATCH, 3, size, size))

    def call(model, state, x, key):
        keys = jr.split(key, x.shape[0])
        return jax.vmap(lambda xi, k: model(xi, key=k, inference=False))(x, keys)

    return gradcheck.from_jax(model, x, call=call, name=name, seed=seed), model


def _flaxmodels(name: str, seed: int):
    import flaxmodels
    import jax.random as jr

    import gradcheck

    attr, kwargs, size = MODELS[name]
    model = getattr(flaxmodels, attr)(**kwargs, num_classes=10)
    x = jr.normal(jr.key(1000 + seed), (BATCH, size, size, 3))
    variables = model.init(jr.key(seed), x, train=True)
    case = gradcheck.from_jax(model, variables, x, train=True, mutable=["batch_stats"], name=name, seed=seed)
    return case, variables["params"]


def main(argv=None):
    args = third_party.parser(__doc__.split("\n\n")[0], MODELS, "jax_libraries.jsonl").parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1])), default=str), flush=True)
        return 0
    if args.table:
        third_party.print_table(args.table)
        return 0
    return third_party.sweep(os.path.abspath(__file__), args, [])


if __name__ == "__main__":
    sys.exit(main())

"""Third-party JAX models through ``from_jax``: equimo's, flaxmodels', haiku's and vitax's.

Not a test and not a dependency: it needs ``equimo``, ``flaxmodels``, ``dm-haiku`` and ``vitax`` (and equinox,
flax, jax and torch), which the project does not install.  Each model is built with random initialisation from
``jax.random.key(seed)`` (nothing is downloaded) and 10 classes, at a small configuration of its own
constructor or its smallest registered variant, with float32 parameters, as a user builds them:

* equimo's models are called as equimo calls them: one image at a time (channels, height, width), under
  ``jax.vmap`` over a batch of 2, in training mode (``inference=False``: dropout and stochastic depth on where
  the model has them) with one key per image split from the case's key;
* flaxmodels' ResNet-18 (``pretrained=None``) on a batch of 2 NHWC images, ``train=True`` with its
  ``batch_stats`` updated (``mutable=["batch_stats"]``);
* haiku's (``hk.transform_with_state``, checked in the plain jax form ``fn(params, state, *inputs, key=)``):
  ``hk.nets.ResNet18`` and ``hk.nets.MobileNetV1`` on a batch of 2 NHWC images with ``is_training=True`` (their
  BatchNorm state updated; parameters haiku initialises to zeros, the ResNet's logits among them, get small random
  values, ``_unzeroed``), and a two-block pre-norm transformer encoder written from haiku's own modules
  (``hk.Embed``, ``hk.MultiHeadAttention``, ``hk.LayerNorm``, ``hk.nets.MLP`` with gelu, ``hk.dropout`` at 0.1)
  on a batch of 2 sequences of 16 token ids;
* vitax's flax.nnx ``VisionTransformer`` (``pip install --no-deps vitax``; its model module is loaded alone, as its
  package imports transformers' Flax ViT, gone in transformers 5) at 2 blocks, hidden 32, on a batch of 2 NHWC
  32x32 images, in ``train()`` mode: dropout 0.1 in the embeddings, the attention and the MLP, drawn from the
  module's own ``Rngs``.

Each case is checked on the tape, torch and jax through ``third_party.py``, the harness it shares with
``timm_models.py`` and ``hf_models.py``: one fresh process per (model, seed), one JSON line per run appended to
``--out``.  The seed is the initialisation's, the image's (``1000 + seed``) and the case's.

    python benchmarks/jax_libraries.py --seeds 0 1 --out jax_libraries.jsonl
    python benchmarks/jax_libraries.py --models vit convnext --seeds 3
    python benchmarks/jax_libraries.py --table jax_libraries.jsonl

``--fault BACKEND`` is the negative control (``third_party.faulty``): that backend's gradient of every ``add`` is
made 1 % too large (the tape's and torch's lowering of jax's ``add`` pass their result through an identity whose
gradient is scaled, jax's own rule for ``add`` scales its tangent), so every run must disagree, blamed on that
backend, with an origin (``origin`` in the row: the module the replay found it in).
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
    "haiku_resnet18": ("ResNet18", {}, 32),
    "haiku_mobilenetv1": ("MobileNetV1", {}, 32),
    "haiku_transformer": ("", dict(vocab=50, length=16, width=64, heads=4, blocks=2), 16),
    "vitax_vit": ("VisionTransformer", dict(img_size=32, patch_size=8, num_layers=2, num_heads=2, mlp_dim=64,
                                            hidden_size=32, dropout_rate=0.1, fsdp=False), 32),
}


def child(name: str, seed: int, fault: str | None = None) -> dict:
    """One model at one seed, in this process: built, traced, checked (with ``fault`` injected first)."""
    import jax

    t0 = time.perf_counter()
    build = {"flaxmodels": _flaxmodels, "haiku": _haiku, "vitax": _vitax}.get(name.split("_")[0], _equimo)
    case, model = build(name, seed)
    row = {"model": name, "seed": seed, "fault": fault, "class": type(model).__name__, "image": MODELS[name][2],
           "capture_s": round(time.perf_counter() - t0, 2), "float64_computes_in": case.float64_computes_in}
    row["params"] = int(sum(v.size for v in jax.tree_util.tree_leaves(model) if hasattr(v, "dtype")
                            and jax.numpy.issubdtype(v.dtype, jax.numpy.inexact)))
    with third_party.faulty(fault, "jax"):
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


def _vitax(name: str, seed: int):
    import importlib.util
    import pathlib

    import jax.random as jr
    from flax import nnx

    import gradcheck

    # vitax's package __init__ imports transformers' Flax ViT, which transformers 5 no longer has; the model's own
    # module imports only jax and flax, so it is loaded alone.
    spec = importlib.util.find_spec("vitax")
    if spec is None:
        raise ImportError("vitax is not installed (pip install --no-deps vitax)")
    path = pathlib.Path(spec.submodule_search_locations[0]) / "models" / "vit.py"
    loaded = importlib.util.spec_from_file_location("vitax_models_vit", path)
    vit = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(vit)
    attr, kwargs, size = MODELS[name]
    model = getattr(vit, attr)(**kwargs, num_classes=10, rngs=nnx.Rngs(seed))
    model.train()  # dropout on, drawn from the model's own Rngs
    x = jr.normal(jr.key(1000 + seed), (BATCH, size, size, 3))
    return gradcheck.from_jax(model, x, name=name, seed=seed), nnx.state(model, nnx.Param)


def _haiku(name: str, seed: int):
    import haiku as hk
    import jax.random as jr

    import gradcheck

    attr, kwargs, size = MODELS[name]
    if name == "haiku_transformer":
        net = _haiku_transformer(**kwargs)
        x = jr.randint(jr.key(1000 + seed), (BATCH, kwargs["length"]), 0, kwargs["vocab"])
    else:
        def net(x, is_training):
            return getattr(hk.nets, attr)(num_classes=10)(x, is_training=is_training)

        x = jr.normal(jr.key(1000 + seed), (BATCH, size, size, 3))
    model = hk.transform_with_state(net)
    params, state = model.init(jr.key(seed), x, is_training=True)
    params = _unzeroed(params, seed)

    def apply(params, state, x, key):
        return model.apply(params, state, key, x, is_training=True)

    apply.__qualname__ = apply.__name__ = name
    case = gradcheck.from_jax(apply, params, x, state=state, name=name, seed=seed)
    return case, params


def _unzeroed(params, seed: int):
    """Every all-zero parameter array (haiku's ResNet initialises its logits and each block's last BatchNorm scale to
    zeros; biases start at zero) given small random values: with a zero classifier every gradient before it is
    exactly 0 and the check is vacuous there; a trained network has none such."""
    import jax
    import numpy as np

    rng = np.random.default_rng(2000 + seed)

    def fill(v):
        if hasattr(v, "dtype") and jax.numpy.issubdtype(v.dtype, jax.numpy.inexact) and not np.asarray(v).any():
            return jax.numpy.asarray(0.02 * rng.standard_normal(v.shape), v.dtype)
        return v

    return jax.tree_util.tree_map(fill, params)


def _haiku_transformer(vocab: int, length: int, width: int, heads: int, blocks: int):
    """A pre-norm transformer encoder from haiku's modules: token and position embeddings, ``blocks`` blocks of
    attention and a gelu MLP with dropout, mean-pooled into 10 logits."""
    import haiku as hk
    import jax

    def net(tokens, is_training):
        rate = 0.1 if is_training else 0.0
        h = hk.Embed(vocab, width)(tokens)
        h = h + hk.get_parameter("position", (length, width), init=hk.initializers.TruncatedNormal(0.02))
        for _ in range(blocks):
            a = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(h)
            a = hk.MultiHeadAttention(num_heads=heads, key_size=width // heads,
                                      w_init=hk.initializers.VarianceScaling(1.0))(a, a, a)
            h = h + hk.dropout(hk.next_rng_key(), rate, a)
            m = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(h)
            m = hk.nets.MLP([4 * width, width], activation=jax.nn.gelu)(m)
            h = h + hk.dropout(hk.next_rng_key(), rate, m)
        h = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(h)
        return hk.Linear(10)(h.mean(axis=1))

    return net


def main(argv=None):
    p = third_party.parser(__doc__.split("\n\n")[0], MODELS, "jax_libraries.jsonl")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.fault), default=str), flush=True)
        return 0
    if args.table:
        third_party.print_table(args.table)
        return 0
    return third_party.sweep(os.path.abspath(__file__), args, [])


if __name__ == "__main__":
    sys.exit(main())

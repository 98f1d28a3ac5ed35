"""Third-party models through ``from_torch``: timm architectures, each as ``timm.create_model`` builds it.

Not a test and not a dependency: it needs ``timm`` (and torch and jax), which the project does not install.
Each model is created with random initialisation (``pretrained=False``; nothing is downloaded) and 10 classes,
at its smallest variant, on a batch of 2 images: 64x64 for the convolutional networks (they downsample 32
times; at 32x32 their last stages are 1x1, where a batch-statistics BatchNorm over 2 values leaves no
gradient) and for MLP-Mixer (its own patches of 16), 32x32 for the vision transformers, which are built for it
(``img_size=32``, patches of 4).  It is put in train mode (dropout and BatchNorm batch statistics on), called
on the images, and its logits are checked on the tape, torch and jax through ``third_party.py``, the harness
it shares with ``hf_models.py``: one fresh process per (model, seed), one JSON line per run appended to
``--out``.  The seed is both torch's initialisation seed and the case seed.

    python benchmarks/timm_models.py --seeds 0 1 --out timm_models.jsonl
    python benchmarks/timm_models.py --models resnet18 vit_tiny --seeds 3
    python benchmarks/timm_models.py --checkpointing --drop 0.1   # set_grad_checkpointing(), drop_path/drop 0.1
    python benchmarks/timm_models.py --table timm_models.jsonl

``--checkpointing`` calls ``set_grad_checkpointing(True)`` on every model that supports it, so torch
recomputes its blocks inside the backward; ``--drop P`` gives ``drop_rate`` and ``drop_path_rate`` P to every
model that takes them (stochastic depth's and dropout's draws, repeated by each recompute).
"""

from __future__ import annotations

import json
import os
import sys
import time

import third_party

BATCH = 2
# name: (timm model name, image size, extra create_model arguments)
_VIT32 = dict(img_size=32, patch_size=4)
# zero_init_last=False: timm zeroes each residual block's last BatchNorm weight, so every leaf before it in the
# block would have a gradient of exactly 0 (vacuous); a trained network has none such.
MODELS = {
    "resnet18": ("resnet18", 64, dict(zero_init_last=False)),
    "resnet50d": ("resnet50d", 64, dict(zero_init_last=False)),
    "convnext_atto": ("convnext_atto", 64, {}),
    "regnetx_002": ("regnetx_002", 64, dict(zero_init_last=False)),
    "efficientnet_b0": ("efficientnet_b0", 64, {}),
    "mobilenetv3_small": ("mobilenetv3_small_050", 64, {}),
    "densenet121": ("densenet121", 64, {}),
    "ghostnet": ("ghostnet_050", 64, {}),
    "xception41": ("xception41", 64, {}),
    "inception_v3": ("inception_v3", 96, {}),
    "hrnet_w18_small": ("hrnet_w18_small", 64, {}),
    "mobileone_s0": ("mobileone_s0", 64, {}),
    "hgnetv2_b0": ("hgnetv2_b0", 64, {}),
    "edgenext_xx_small": ("edgenext_xx_small", 64, {}),
    "poolformer_s12": ("poolformer_s12", 64, {}),
    "mobilevitv2": ("mobilevitv2_050", 64, {}),
    "vit_tiny": ("vit_tiny_patch16_224", 32, _VIT32),
    "deit_tiny_distilled": ("deit_tiny_distilled_patch16_224", 32, _VIT32),
    "beit": ("beit_base_patch16_224", 32, dict(_VIT32, embed_dim=64, depth=2, num_heads=4)),
    "eva02_tiny": ("eva02_tiny_patch14_224", 32, dict(_VIT32, depth=2)),
    "mixer": ("mixer_s16_224", 64, dict(img_size=64)),  # its own patches of 16: 16 tokens
    "swin": ("swin_tiny_patch4_window7_224", 32, dict(img_size=32, window_size=4, embed_dim=32,
                                                        depths=(2, 2), num_heads=(2, 4))),
}


def child(name: str, seed: int, checkpointing: bool = False, drop: float = 0.0, fault: str | None = None) -> dict:
    """One model at one seed, in this process: created, captured, checked (with ``fault`` while it runs)."""
    import timm
    import torch

    torch.manual_seed(seed)
    t0 = time.perf_counter()
    arch, size, kwargs = MODELS[name]
    kwargs = dict(kwargs, num_classes=10)
    if drop:
        kwargs.update(drop_rate=drop, drop_path_rate=drop)
    try:
        model = timm.create_model(arch, pretrained=False, **kwargs)
    except TypeError:  # a family that takes no drop_path_rate (densenet121): dropout alone
        kwargs.pop("drop_path_rate", None)
        model = timm.create_model(arch, pretrained=False, **kwargs)
    checkpointed = False
    if checkpointing:
        try:
            model.set_grad_checkpointing(True)
            checkpointed = True
        except (AssertionError, NotImplementedError, AttributeError):  # the family does not support it
            pass
    _unzero_classifier(model, seed)
    model.train()
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(BATCH, 3, size, size, generator=g)
    row = {"model": name, "seed": seed, "class": type(model).__name__, "arch": arch, "image": size,
           "checkpointing": checkpointed, "drop": drop, "drop_path": "drop_path_rate" in kwargs and drop,
           "fault": fault}
    third_party.check(model, (x,), None, name=name, seed=seed, row=row, fault=fault)
    row["wall_s"] = round(time.perf_counter() - t0, 2)
    return row


def _unzero_classifier(model, seed: int) -> None:
    """A classifier timm initialises to zeros (MLP-Mixer's head) gets small random weights: with a zero head every
    gradient before it is exactly 0 and every leaf but the head's is vacuous; a trained network has none such."""
    import torch

    head = model.get_classifier() if hasattr(model, "get_classifier") else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor) and not weight.detach().any():
        with torch.no_grad():
            weight.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(2000 + seed))


def main(argv=None):
    p = third_party.parser(__doc__.split("\n\n")[0], MODELS, "timm_models.jsonl")
    p.add_argument("--checkpointing", action="store_true", help="set_grad_checkpointing(True) where supported")
    p.add_argument("--drop", type=float, default=0.0, help="drop_rate and drop_path_rate for every model")
    args = p.parse_args(argv)
    if args.child:
        row = child(args.child[0], int(args.child[1]), args.checkpointing, args.drop, args.fault)
        print(json.dumps(row, default=str), flush=True)
        return 0
    if args.table:
        third_party.print_table(args.table)
        return 0
    extra = ["--drop", str(args.drop)] + (["--checkpointing"] if args.checkpointing else [])
    return third_party.sweep(os.path.abspath(__file__), args, extra)


if __name__ == "__main__":
    sys.exit(main())

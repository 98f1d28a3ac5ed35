"""The model zoo: named factories the CLI and the suites build by name.

``MODELS[name]`` is a ``ModelSpec``: ``build(rng, **options)``, the default
input (``default_input_shape()`` per example, ``batch``), ``inputs(rng, batch,
input_shape)`` drawing them, ``small`` (the size the ``models`` suite uses)
and ``case(...)`` making a ``gradcheck.case.Case``.

=============  ==========================  =====================================
name           default input (per example)  notes
=============  ==========================  =====================================
mlp            (32,) float, batch 8        Linear-relu-Linear-relu-Linear
lenet5         (1, 28, 28) float, batch 2  conv-relu-maxpool x2, three Linear
resnet18       (3, 224, 224), batch 1      torchvision names; 11,689,512 params
resnet34       (3, 224, 224), batch 1      torchvision names; 21,797,672 params
resnet50       (3, 224, 224), batch 1      Bottleneck; 25,557,032 params
transformer    (32,) int token ids, b. 2   GPT-style, 2 pre-LN blocks, d=64
lstm_lm        (16,) int token ids, b. 2   Embedding, LSTM, Linear head
unet_small     (3, 32, 32) float, batch 2  2-level U-Net, ConvTranspose2d up
=============  ==========================  =====================================
"""

from __future__ import annotations

from gradcheck.layers.models.resnet import (
    BasicBlock,
    Bottleneck,
    ResNet,
    normal_inputs,
    resnet18,
    resnet34,
    resnet50,
)
from gradcheck.layers.models.small import (
    LeNet5,
    LSTMLanguageModel,
    UNetSmall,
    lenet5,
    lstm_lm,
    mlp,
    unet_small,
)
from gradcheck.layers.models.spec import ModelSpec
from gradcheck.layers.models.transformer import GPT, transformer


def _tokens(rng, batch, input_shape, vocab_size, **_):
    return (rng.integers(0, vocab_size, size=(batch,) + tuple(input_shape), dtype="int64"),)


_RESNET_OPTIONS = {"num_classes": 1000, "zero_init_residual": False}
# 64x64 leaves layer4 a 2x2 map, so its train-mode BatchNorms see 8 values per channel
# at batch 2.  At 32x32 they would see 2: the output is then +-1 whatever the input, the
# gradients grow to ~1e11 and float32 backends disagree on an ill-posed problem.
_RESNET_SMALL = {"input_shape": (3, 64, 64), "batch": 2}

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec(
            "mlp", mlp, normal_inputs, lambda in_features, **_: (in_features,), 8,
            "MLP 32-64-64-10 with relu; input (8, 32) features",
            options={"in_features": 32, "hidden": (64, 64), "out_features": 10, "activation": "relu"},
            small={"in_features": 8, "hidden": (16, 16), "out_features": 4, "batch": 4},
        ),
        ModelSpec(
            "lenet5", lenet5, normal_inputs, lambda in_channels, **_: (in_channels, 28, 28), 2,
            "LeNet-5 (relu, max-pool) on (2, 1, 28, 28) digits",
            options={"num_classes": 10, "in_channels": 1},
            small={"batch": 2},
        ),
        ModelSpec(
            "resnet18", resnet18, normal_inputs, (3, 224, 224), 1,
            "torchvision ResNet-18 (BasicBlock [2,2,2,2]) on (1, 3, 224, 224) images",
            options=dict(_RESNET_OPTIONS), small=_RESNET_SMALL,
        ),
        ModelSpec(
            "resnet34", resnet34, normal_inputs, (3, 224, 224), 1,
            "torchvision ResNet-34 (BasicBlock [3,4,6,3]) on (1, 3, 224, 224) images",
            options=dict(_RESNET_OPTIONS), small=_RESNET_SMALL,
        ),
        ModelSpec(
            "resnet50", resnet50, normal_inputs, (3, 224, 224), 1,
            "torchvision ResNet-50 (Bottleneck [3,4,6,3]) on (1, 3, 224, 224) images",
            options=dict(_RESNET_OPTIONS), small=_RESNET_SMALL,
        ),
        ModelSpec(
            "transformer", transformer, _tokens, lambda block_size, **_: (block_size,), 2,
            "GPT-style decoder (vocab 128, 32 positions, d=64, 4 heads, 2 blocks) on (2, 32) token ids",
            options={"vocab_size": 128, "block_size": 32, "d_model": 64, "n_head": 4, "n_layer": 2, "dropout": 0.0},
            small={"vocab_size": 16, "block_size": 8, "d_model": 16, "n_head": 2, "n_layer": 2, "batch": 2},
            input_kind="int",
        ),
        ModelSpec(
            "lstm_lm", lstm_lm, _tokens, (16,), 2,
            "LSTM language model (vocab 64, embed 32, hidden 64) on (2, 16) token ids",
            options={"vocab_size": 64, "embed_dim": 32, "hidden_size": 64, "num_layers": 1},
            small={"vocab_size": 16, "embed_dim": 8, "hidden_size": 12, "input_shape": (6,), "batch": 2},
            input_kind="int",
        ),
        ModelSpec(
            "unet_small", unet_small, normal_inputs, (3, 32, 32), 2,
            "two-level U-Net (base 8 channels) on (2, 3, 32, 32) images",
            options={"in_channels": 3, "out_channels": 2, "base": 8},
            small={"base": 4, "input_shape": (3, 16, 16), "batch": 2},
        ),
    ]
}


def get_model(name: str) -> ModelSpec:
    """The spec of a named model, or an error listing the names there are."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"no model named {name!r}; choose from {', '.join(MODELS)}") from None


__all__ = [
    "GPT", "MODELS", "BasicBlock", "Bottleneck", "LSTMLanguageModel", "LeNet5", "ModelSpec", "ResNet",
    "UNetSmall", "get_model", "lenet5", "lstm_lm", "mlp", "resnet18", "resnet34", "resnet50",
    "transformer", "unet_small",
]

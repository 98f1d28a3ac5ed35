"""Small classic models: an MLP, LeNet-5, a small U-Net and an LSTM language model."""

from __future__ import annotations

from typing import Any

from gradcheck import ops
from gradcheck.layers import init
from gradcheck.layers.activations import ACTIVATIONS, ReLU
from gradcheck.layers.conv import Conv2d, ConvTranspose2d
from gradcheck.layers.core import Chain, Linear, concat_channels
from gradcheck.layers.embedding import Embedding
from gradcheck.layers.recurrent import LSTM
from gradcheck.module import Module, child


def mlp(in_features=32, hidden=(64, 64), out_features=10, activation="relu", rng=None):
    """Linear layers with an activation between them; paths ``0.weight``, ``2.weight``, ... as nn.Sequential."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"mlp: activation={activation!r}; choose from {sorted(ACTIVATIONS)}")
    rng = init.get_rng(rng)
    layer_cls = ACTIVATIONS[activation][1]
    sizes = (in_features,) + tuple(hidden)
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [Linear(a, b, rng=rng), layer_cls()]
    return Chain(*layers, Linear(sizes[-1], out_features, rng=rng))


class LeNet5(Module):
    """LeNet-5 for 1x28x28 digits, as in the PyTorch tutorials: 5x5 convs (the first padded), relu, max-pool."""

    conv1: Any = child()
    conv2: Any = child()
    fc1: Any = child()
    fc2: Any = child()
    fc3: Any = child()

    def __init__(self, num_classes=10, in_channels=1, rng=None):
        rng = init.get_rng(rng)
        self.conv1 = Conv2d(in_channels, 6, 5, padding=2, rng=rng)
        self.conv2 = Conv2d(6, 16, 5, rng=rng)
        self.fc1 = Linear(16 * 5 * 5, 120, rng=rng)
        self.fc2 = Linear(120, 84, rng=rng)
        self.fc3 = Linear(84, num_classes, rng=rng)

    def __call__(self, x):
        shape = ops.shape_of(x)
        if len(shape) != 4 or shape[2:] != (28, 28):
            raise ValueError(f"LeNet5: input of shape {shape}; expected (N, C, 28, 28)")
        x = ops.max_pool2d(ops.relu(self.conv1(x)), 2)
        x = ops.max_pool2d(ops.relu(self.conv2(x)), 2)
        x = ops.flatten(x, 1)
        return self.fc3(ops.relu(self.fc2(ops.relu(self.fc1(x)))))


def lenet5(num_classes=10, in_channels=1, rng=None):
    return LeNet5(num_classes, in_channels, rng=rng)


def double_conv(cin, cout, rng):
    return Chain(Conv2d(cin, cout, 3, padding=1, rng=rng), ReLU(), Conv2d(cout, cout, 3, padding=1, rng=rng), ReLU())


class UNetSmall(Module):
    """A two-level U-Net: conv encoder with max-pool, ConvTranspose2d decoder, skip concatenation.

    Height and width must be multiples of 4 (two halvings and two doublings).
    """

    enc1: Any = child()
    enc2: Any = child()
    bottleneck: Any = child()
    up2: Any = child()
    dec2: Any = child()
    up1: Any = child()
    dec1: Any = child()
    head: Any = child()

    def __init__(self, in_channels=3, out_channels=2, base=8, rng=None):
        rng = init.get_rng(rng)
        b = base
        self.enc1 = double_conv(in_channels, b, rng)
        self.enc2 = double_conv(b, 2 * b, rng)
        self.bottleneck = double_conv(2 * b, 4 * b, rng)
        self.up2 = ConvTranspose2d(4 * b, 2 * b, 2, stride=2, rng=rng)
        self.dec2 = double_conv(4 * b, 2 * b, rng)
        self.up1 = ConvTranspose2d(2 * b, b, 2, stride=2, rng=rng)
        self.dec1 = double_conv(2 * b, b, rng)
        self.head = Conv2d(b, out_channels, 1, rng=rng)

    def __call__(self, x):
        h, w = ops.shape_of(x)[2:]
        if h % 4 or w % 4:
            raise ValueError(f"UNetSmall: input height and width {(h, w)} must be multiples of 4")
        e1 = self.enc1(x)
        e2 = self.enc2(ops.max_pool2d(e1, 2))
        mid = self.bottleneck(ops.max_pool2d(e2, 2))
        d2 = self.dec2(concat_channels(self.up2(mid), e2))
        d1 = self.dec1(concat_channels(self.up1(d2), e1))
        return self.head(d1)


def unet_small(in_channels=3, out_channels=2, base=8, rng=None):
    return UNetSmall(in_channels, out_channels, base, rng=rng)


class LSTMLanguageModel(Module):
    """Token ids (N, L) -> Embedding -> LSTM (batch first) -> Linear head: logits (N, L, vocab)."""

    embedding: Any = child()
    lstm: Any = child()
    head: Any = child()

    def __init__(self, vocab_size=64, embed_dim=32, hidden_size=64, num_layers=1, rng=None):
        rng = init.get_rng(rng)
        self.embedding = Embedding(vocab_size, embed_dim, rng=rng)
        self.lstm = LSTM(embed_dim, hidden_size, num_layers=num_layers, batch_first=True, rng=rng)
        self.head = Linear(hidden_size, vocab_size, rng=rng)

    def __call__(self, ids):
        out, _ = self.lstm(self.embedding(ids))
        return self.head(out)


def lstm_lm(vocab_size=64, embed_dim=32, hidden_size=64, num_layers=1, rng=None):
    return LSTMLanguageModel(vocab_size, embed_dim, hidden_size, num_layers, rng=rng)

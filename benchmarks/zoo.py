"""A 24-architecture zoo as one target: ``gradcheck run benchmarks.zoo:cases`` (from the repository root).

Six of gradcheck's own models at their small sizes (those of the ``models``
suite; ResNet-34 and -50 left out) and eighteen models written in plain
``torch.nn`` as a user writes them, checked through ``from_torch``.  Each is a
different architecture, small enough to check in seconds; together their
costs spread over about two orders of magnitude, which is what ``--jobs``
must balance (``benchmarks/bench_zoo.py``).

Every module is built from ``torch.manual_seed`` so a ``--jobs`` worker,
which calls ``cases()`` again, gets the same parameters and inputs.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from gradcheck import from_torch
from gradcheck.layers.models import MODELS

OWN = ("mlp", "lenet5", "resnet18", "transformer", "lstm_lm", "unet_small")


# ---------------------------------------------------------------- plain torch.nn models
class SmallCNN(nn.Module):
    """conv-BatchNorm-ReLU twice, max pool, linear head."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.body(x))


class Encoder(nn.Module):
    """Two post-norm nn.TransformerEncoderLayers over a linear embedding."""

    def __init__(self, d=16):
        super().__init__()
        self.embed = nn.Linear(6, d)
        layer = nn.TransformerEncoderLayer(d, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x)).mean(1))


class GRUClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(5, 12, batch_first=True)
        self.head = nn.Linear(12, 4)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out[:, -1])


class LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(5, 10, num_layers=2, batch_first=True)
        self.head = nn.Linear(10, 3)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out.mean(1))


class MixerBlock(nn.Module):
    def __init__(self, tokens, channels):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(channels, 2 * channels), nn.GELU(),
                                         nn.Linear(2 * channels, channels))

    def forward(self, x):
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MLPMixer(nn.Module):
    """Patch embedding by a strided conv, two mixer blocks, mean-pooled head."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 12, 4, stride=4)
        self.blocks = nn.Sequential(MixerBlock(16, 12), MixerBlock(16, 12))
        self.head = nn.Linear(12, 5)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        return self.head(self.blocks(x).mean(1))


class SeparableNet(nn.Module):
    """Depthwise-separable convolutions (MobileNet v1 style) with ReLU6."""

    def __init__(self):
        super().__init__()

        def separable(cin, cout, stride):
            return nn.Sequential(nn.Conv2d(cin, cin, 3, stride, 1, groups=cin), nn.BatchNorm2d(cin), nn.ReLU6(),
                                 nn.Conv2d(cin, cout, 1), nn.BatchNorm2d(cout), nn.ReLU6())

        self.stem = nn.Conv2d(3, 8, 3, 2, 1)
        self.blocks = nn.Sequential(separable(8, 16, 1), separable(16, 24, 2))
        self.head = nn.Linear(24, 6)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class TinyUNet(nn.Module):
    """Two levels: max-pool down, bilinear up, skip concatenation."""

    def __init__(self):
        super().__init__()
        self.down1 = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU())
        self.down2 = nn.Sequential(nn.Conv2d(6, 12, 3, padding=1), nn.ReLU())
        self.up = nn.Sequential(nn.Conv2d(18, 6, 3, padding=1), nn.ReLU())
        self.out = nn.Conv2d(6, 2, 1)

    def forward(self, x):
        a = self.down1(x)
        b = self.down2(F.max_pool2d(a, 2))
        b = F.interpolate(b, scale_factor=2, mode="bilinear", align_corners=False)
        return self.out(self.up(torch.cat([a, b], 1)))


class AttentionBlock(nn.Module):
    """Pre-norm nn.MultiheadAttention with a causal mask, and a feed-forward."""

    def __init__(self, d=16):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))

    def forward(self, x):
        n = x.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.ff(self.norm2(x))


class EmbeddingBagOfWords(nn.Module):
    """Token embedding, LayerNorm, mean over the sequence, two-layer head: the text classifier baseline."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(40, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, ids):
        return self.head(self.norm(self.embed(ids)).mean(1))


class TemporalConvNet(nn.Module):
    """Dilated causal Conv1d stack with residuals (a TCN)."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv1d(6, 6, 3, dilation=d) for d in (1, 2, 4)])
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        for conv, d in zip(self.convs, (1, 2, 4)):
            x = x + torch.relu(conv(F.pad(x, (2 * d, 0))))
        return self.head(x[:, :, -1])


class ConvAutoencoder(nn.Module):
    """Strided convs down, ConvTranspose2d up, sigmoid output."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 4, 3, 2, 1), nn.ELU(), nn.Conv2d(4, 8, 3, 2, 1), nn.ELU())
        self.dec = nn.Sequential(nn.ConvTranspose2d(8, 4, 3, 2, 1, output_padding=1), nn.ELU(),
                                 nn.ConvTranspose2d(4, 1, 3, 2, 1, output_padding=1))

    def forward(self, x):
        return torch.sigmoid(self.dec(self.enc(x)))


class GroupNormResBlock(nn.Module):
    """GroupNorm-SiLU-conv twice with a residual (a diffusion U-Net's block)."""

    def __init__(self, c=8):
        super().__init__()
        self.n1, self.n2 = nn.GroupNorm(2, c), nn.GroupNorm(2, c)
        self.c1, self.c2 = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        h = self.c1(F.silu(self.n1(x)))
        return x + self.c2(F.silu(self.n2(h)))


class SqueezeExcite(nn.Module):
    """A conv followed by squeeze-and-excitation channel gating."""

    def __init__(self, c=12):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(c, c // 4), nn.Linear(c // 4, c)

    def forward(self, x):
        h = F.relu(self.conv(x))
        gate = torch.sigmoid(self.fc2(F.relu(self.fc1(h.mean((2, 3))))))
        return h * gate[:, :, None, None]


class TinyVGG(nn.Module):
    """conv-conv-pool twice, dropout, two Linear layers."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                                      nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 12, 3, padding=1), nn.ReLU(),
                                      nn.AvgPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(12 * 4 * 4, 16), nn.ReLU(),
                                        nn.Linear(16, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


class GatedMLP(nn.Module):
    """GLU feed-forward blocks with RMSNorm (a Llama MLP)."""

    def __init__(self, d=12):
        super().__init__()
        self.norm = nn.RMSNorm(d)
        self.gate, self.up, self.down = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False), \
            nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    """One nn.TransformerDecoderLayer: causal self-attention and cross-attention to a memory."""

    def __init__(self, d=16):
        super().__init__()
        self.layer = nn.TransformerDecoderLayer(d, nhead=2, dim_feedforward=24, dropout=0.0, batch_first=True)

    def forward(self, tgt, memory):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.layer(tgt, memory, tgt_mask=mask)


class Conv3dNet(nn.Module):
    """A video-style 3-d convolution, InstanceNorm3d, pooled head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(2, 4, 3, padding=1)
        self.norm = nn.InstanceNorm3d(4, affine=True)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(F.leaky_relu(self.norm(self.conv(x)), 0.1).mean((2, 3, 4)))


def _torch_resnet18():
    from benchmarks.torch_models import ResNet18

    return ResNet18(num_classes=10)


# name -> (module factory, example inputs factory, mode)
TORCH_MODELS = {
    "torch_resnet18": (_torch_resnet18, lambda: (torch.randn(2, 3, 64, 64),), "eval"),
    "small_cnn_bn": (SmallCNN, lambda: (torch.randn(4, 3, 12, 12),), "train"),
    "transformer_encoder": (Encoder, lambda: (torch.randn(2, 6, 6),), "train"),
    "gru_classifier": (GRUClassifier, lambda: (torch.randn(3, 5, 5),), "train"),
    "lstm_classifier": (LSTMClassifier, lambda: (torch.randn(2, 4, 5),), "train"),
    "mlp_mixer": (MLPMixer, lambda: (torch.randn(2, 3, 16, 16),), "train"),
    "separable_convnet": (SeparableNet, lambda: (torch.randn(4, 3, 16, 16),), "train"),
    "tiny_unet": (TinyUNet, lambda: (torch.randn(2, 3, 12, 12),), "train"),
    "mha_block": (AttentionBlock, lambda: (torch.randn(2, 5, 16),), "train"),
    "embedding_bag": (EmbeddingBagOfWords, lambda: (torch.randint(0, 40, (3, 7)),), "train"),
    "tcn": (TemporalConvNet, lambda: (torch.randn(2, 6, 12),), "train"),
    "conv_autoencoder": (ConvAutoencoder, lambda: (torch.randn(2, 1, 12, 12),), "train"),
    "groupnorm_resblock": (GroupNormResBlock, lambda: (torch.randn(2, 8, 8, 8),), "train"),
    "squeeze_excite": (SqueezeExcite, lambda: (torch.randn(2, 3, 8, 8),), "train"),
    "tiny_vgg": (TinyVGG, lambda: (torch.randn(2, 3, 16, 16),), "train"),
    "gated_mlp": (GatedMLP, lambda: (torch.randn(3, 4, 12),), "train"),
    "transformer_decoder": (Decoder, lambda: (torch.randn(2, 4, 16), torch.randn(2, 5, 16)), "train"),
    "conv3d_instancenorm": (Conv3dNet, lambda: (torch.randn(2, 2, 4, 6, 6),), "train"),
}


def torch_case(name: str):
    make, inputs, mode = TORCH_MODELS[name]
    torch.manual_seed(0)
    module = make()
    return from_torch(module, *inputs(), name=name, mode=mode)


def cases(seed: int = 0):
    """The zoo: gradcheck's own models at their small sizes, then the torch.nn ones."""
    out = [MODELS[name].case(seed=seed, size="small") for name in OWN]
    return out + [torch_case(name) for name in TORCH_MODELS]

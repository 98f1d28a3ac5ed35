"""Plain ``torch.nn`` models of the families ``gradcheck.from_torch`` must handle, written as a library would.

Nothing here knows about gradcheck: these are the modules a user hands over.
Each ``make_*`` function returns ``(module, inputs)`` at a small size, the
form ``gradcheck run pkg.mod:fn`` takes; the tests check them through
``from_torch`` and the runner.
"""

from __future__ import annotations

import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "benchmarks"))
import torch_models  # noqa: E402


def _seeded(seed: int = 0) -> torch.Generator:
    torch.manual_seed(seed)  # parameter initialisation draws from the global generator
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- plain layers
def make_plain():
    """Linear / Conv / BatchNorm / ReLU / pooling / flatten, the usual small CNN."""
    g = _seeded(0)
    model = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AvgPool2d(2), nn.Flatten(), nn.Linear(8, 5), nn.Tanh(), nn.Linear(5, 3),
    )
    return model, (torch.randn(2, 3, 8, 8, generator=g),)


# ---------------------------------------------------------------- ResNet blocks
# The benchmarks' torchvision-style ResNet BasicBlock: one definition of it in the project.
BasicBlock = torch_models.BasicBlock


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        width = planes
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes * self.expansion:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes * self.expansion, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes * self.expansion))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


def make_basic_block():
    g = _seeded(1)
    return BasicBlock(4, 6, stride=2), (torch.randn(2, 4, 6, 6, generator=g),)


def make_bottleneck():
    g = _seeded(2)
    return Bottleneck(6, 3, stride=2), (torch.randn(2, 6, 6, 6, generator=g),)


# ---------------------------------------------------------------- GPT
class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, dropout, fused):
        super().__init__()
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.heads, self.dim, self.dropout, self.fused = heads, dim, dropout, fused

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(self.dim, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                               is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))
            att = att.masked_fill(~mask, float("-inf"))
            att = self.attn_dropout(F.softmax(att, dim=-1))
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, dim, dropout, approximate):
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.gelu = nn.GELU(approximate=approximate)
        self.c_proj = nn.Linear(4 * dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, dim, heads, dropout, fused, approximate):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout, fused)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, dropout, approximate)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's structure and names: ``transformer.{wte,wpe,drop,h,ln_f}`` and an ``lm_head`` tied to ``wte``."""

    def __init__(self, vocab=11, block_size=8, dim=12, heads=2, layers=2, dropout=0.1, fused=True,
                 approximate="none"):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, dim),
            wpe=nn.Embedding(block_size, dim),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(dim, heads, dropout, fused, approximate if i == 0 else "tanh")
                             for i in range(layers)]),
            ln_f=nn.LayerNorm(dim),
        ))
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def make_gpt(fused=True, dropout=0.1, approximate="none"):
    g = _seeded(3)
    model = GPT(fused=fused, dropout=dropout, approximate=approximate)
    return model, (torch.randint(0, 11, (2, 6), generator=g),)


# ---------------------------------------------------------------- ViT
class EncoderBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.heads = heads

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, image=8, patch=4, channels=3, dim=12, heads=2, depth=1, classes=5):
        super().__init__()
        self.patch_embed = nn.Conv2d(channels, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[EncoderBlock(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def make_vit():
    g = _seeded(4)
    return ViT(), (torch.randn(2, 3, 8, 8, generator=g),)


# ---------------------------------------------------------------- MobileNetV3
class SqueezeExcite(nn.Module):
    def __init__(self, channels, squeeze):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.relu = nn.ReLU()
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, x):
        return x * self.scale_activation(self.fc2(self.relu(self.fc1(self.avgpool(x)))))


class InvertedResidual(nn.Module):
    """torchvision's MobileNetV3 block: expand, depthwise, squeeze-and-excite, project."""

    def __init__(self, cin=4, expanded=8, cout=4, kernel=3, stride=1):
        super().__init__()
        self.block = nn.Sequential(
            nn.Sequential(nn.Conv2d(cin, expanded, 1, bias=False), nn.BatchNorm2d(expanded), nn.Hardswish()),
            nn.Sequential(nn.Conv2d(expanded, expanded, kernel, stride, kernel // 2, groups=expanded, bias=False),
                          nn.BatchNorm2d(expanded), nn.Hardswish()),
            SqueezeExcite(expanded, 4),
            nn.Sequential(nn.Conv2d(expanded, cout, 1, bias=False), nn.BatchNorm2d(cout)),
        )
        self.use_res = stride == 1 and cin == cout
        self.pool = nn.AdaptiveAvgPool2d((2, 3))

    def forward(self, x):
        y = self.block(x)
        return self.pool(x + y if self.use_res else y)


def make_mobilenet_block():
    g = _seeded(5)
    return InvertedResidual(), (torch.randn(2, 4, 7, 7, generator=g) * 3,)  # * 3 reaches hardswish's flat parts


# ---------------------------------------------------------------- ConvNeXt
class ConvNeXtBlock(nn.Module):
    def __init__(self, dim=6, layer_scale=1e-1):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(layer_scale * torch.ones(dim))

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.gamma * self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


def make_convnext_block():
    g = _seeded(6)
    return ConvNeXtBlock(), (torch.randn(2, 6, 7, 7, generator=g),)


# ---------------------------------------------------------------- U-Net
class DoubleConv(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """Two levels: a transposed-convolution up path, and nearest / bilinear upsampling on the skips."""

    def __init__(self, cin=2, width=4, classes=3):
        super().__init__()
        self.inc = DoubleConv(cin, width)
        self.down1 = nn.Sequential(nn.MaxPool2d(2), DoubleConv(width, 2 * width))
        self.down2 = nn.Sequential(nn.MaxPool2d(2), DoubleConv(2 * width, 2 * width))
        self.up1 = nn.ConvTranspose2d(2 * width, 2 * width, 2, stride=2)
        self.conv1 = DoubleConv(4 * width, width)
        self.conv2 = DoubleConv(2 * width + width, width)
        self.outc = nn.Conv2d(width, classes, 1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        y = self.conv1(torch.cat([x2, self.up1(x3)], dim=1))
        up = F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)
        skip = F.interpolate(x3, size=x1.shape[-2:], mode="nearest")
        return self.outc(self.conv2(torch.cat([x1 + up, skip], dim=1)))


def make_unet():
    g = _seeded(7)
    return UNet(), (torch.randn(2, 2, 8, 8, generator=g),)


# ---------------------------------------------------------------- recurrent language models
class RNNLM(nn.Module):
    def __init__(self, kind="lstm", vocab=9, dim=6, hidden=5, layers=1):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids):
        out, _ = self.rnn(self.embed(ids))
        return self.head(out)


def make_lstm_lm():
    g = _seeded(8)
    return RNNLM("lstm"), (torch.randint(0, 9, (2, 5), generator=g),)


def make_gru_lm():
    g = _seeded(9)
    return RNNLM("gru"), (torch.randint(0, 9, (2, 5), generator=g),)


FAMILIES = {
    "plain": make_plain,
    "basic_block": make_basic_block,
    "bottleneck": make_bottleneck,
    "gpt_sdpa": make_gpt,
    "gpt_softmax": lambda: make_gpt(fused=False, approximate="tanh"),
    "vit": make_vit,
    "mobilenet_block": make_mobilenet_block,
    "convnext_block": make_convnext_block,
    "unet": make_unet,
    "lstm_lm": make_lstm_lm,
    "gru_lm": make_gru_lm,
}

"""``torch.nn`` as a library user writes it, handed to ``from_torch``: every module is checked on all three backends.

Each row is a stock module (or a one-line forward of torch functions) at a
small size.  The case must agree, in float64 and float32, with the tape and
jax running the exported graph and nothing unavailable: a lowering missing, a
lowering that is wrong, or a graph that differs from the module would each
fail a row.  The rows below the table are the mechanisms those rows needed,
each with a control that fails without it.
"""

from __future__ import annotations

import contextlib
import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

from lowering_checks import Fn  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from gradcheck import ops  # noqa: E402
from gradcheck.check.runner import RunOptions, run_case  # noqa: E402
from gradcheck.frontends.torch import aten, from_torch, interpreter  # noqa: E402

ALL = ("tape", "torch", "jax")


class OverlappingChunks(nn.Module):
    """Longformer's ``_chunk``: overlapping windows by ``as_strided`` with the strides of a transposed tensor,
    which address its storage (row-major in the untransposed order), not its row-major values."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):  # (B, L, D)
        h = self.lin(x).transpose(1, 2)  # (B, D, L), not stored row-major
        s0, s1, s2 = h.stride()
        n = h.size(2) // 2 - 1  # windows of 4 overlapping by 2
        return h.as_strided((h.size(0), h.size(1), n, 4), (s0, s1, 2 * s2, s2)) * torch.arange(1.0, 5.0)


class PaddedSelfAttention(nn.Module):
    """Self-attention over a batch whose second sequence has two padding positions."""

    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
        self.register_buffer("padding", torch.tensor([[False] * 5, [False] * 3 + [True] * 2]))

    def forward(self, x):
        return self.mha(x, x, x, key_padding_mask=self.padding)[0]


class Float32Statistics(nn.Module):
    """An RMSNorm as T5's and Llama's are written: the statistic computed in ``.to(torch.float32)``."""

    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, n))

    def forward(self, x):
        var = x.to(torch.float32).pow(2).mean(-1, keepdim=True) + x.float().mean(-1, keepdim=True) ** 2
        return self.weight * (x * torch.rsqrt(var + 1e-6)).to(x.dtype)


class DropPathBlock(nn.Module):
    """A residual block with dropout and timm's DropPath: a per-sample keep mask from ``bernoulli_``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        keep = 0.7
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x + self.drop(torch.tanh(self.fc(x))) * mask / keep


class PositionIds(nn.Module):
    """Position ids from an attention mask, as every Hugging Face causal LM computes them: an integer cumsum."""

    def __init__(self):
        super().__init__()
        self.positions = nn.Embedding(6, 4)

    def forward(self, x, attention_mask):
        ids = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
        return x + self.positions(ids)


class RecurrentDropout(nn.Module):
    """Stacked recurrent layers with dropout between them (each layer's output but the last), in training."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 4, 3, dropout=0.3, batch_first=True)
        self.gru = nn.GRU(4, 3, 2, dropout=0.4, bidirectional=True, batch_first=True)

    def forward(self, x):
        return self.gru(self.lstm(x)[0])[0]


def _assigned(x, index, value, accumulate=False):
    """``x[index] = value`` (``+=``) on a copy, as a model writes into a buffer it made."""
    y = x * 1.0
    if accumulate:
        y[index] += value
    else:
        y[index] = value
    return y


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _with_zeros(x, *where):
    """``x`` with exact zeros at ``where``: prod's gradient there is the product of the others."""
    x = x.clone()
    for i in where:
        x[i] = 0.0
    return x


MASK = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]])
SAMPLES2 = torch.rand(2, 3, 2, generator=torch.Generator().manual_seed(1))
SAMPLES3 = torch.rand(1, 2, 3, generator=torch.Generator().manual_seed(2))


MODULES = [
    ("RMSNorm", lambda: nn.RMSNorm(6), lambda: (_x(2, 3, 6),)),
    ("SELU", lambda: nn.SELU(), lambda: (_x(2, 5),)),
    ("CELU", lambda: nn.CELU(0.7), lambda: (_x(2, 5),)),
    ("AdaptiveMaxPool2d", lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.AdaptiveMaxPool2d(1)), lambda: (_x(2, 2, 6, 6),)),
    ("MaxPool2d ceil_mode", lambda: nn.Sequential(nn.Conv2d(2, 3, 1), nn.MaxPool2d(2, ceil_mode=True)),
     lambda: (_x(2, 2, 5, 5),)),
    ("MaxPool2d ceil_mode, stride 2 of 3", lambda: nn.MaxPool2d(3, 2, padding=1, ceil_mode=True),
     lambda: (_x(1, 2, 6, 6),)),
    ("LPPool2d", lambda: nn.LPPool2d(2, 2), lambda: (_x(2, 3, 4, 4),)),
    ("F.normalize", lambda: Fn(lambda x: F.normalize(x, dim=-1)), lambda: (_x(3, 5),)),
    ("cosine_similarity", lambda: Fn(lambda a, b: F.cosine_similarity(a, b)), lambda: (_x(3, 5), _x(3, 5, seed=1))),
    ("vector_norm ord 1, 3, inf", lambda: Fn(lambda x: torch.linalg.vector_norm(x, 1, dim=1)
                                              + torch.linalg.vector_norm(x, 3, dim=1)
                                              + torch.linalg.vector_norm(x, float("inf"), dim=1)),
     lambda: (_x(3, 5),)),
    ("cumsum", lambda: Fn(lambda x: torch.cumsum(x, dim=1)), lambda: (_x(2, 5),)),
    ("roll", lambda: Fn(lambda x: torch.roll(x, 2, dims=1)), lambda: (_x(2, 5),)),
    ("gather", lambda: Fn(lambda x: torch.gather(x, 1, torch.tensor([[0, 2, 2], [4, 1, 0]]))), lambda: (_x(2, 5),)),
    ("cross_entropy in forward", lambda: nn.Sequential(nn.Linear(4, 5), Fn(lambda z: F.cross_entropy(
        z, torch.tensor([1, 3, 0]), label_smoothing=0.1))), lambda: (_x(3, 4),)),
    ("nll_loss in forward", lambda: Fn(lambda z: F.nll_loss(F.log_softmax(z, -1), torch.tensor([1, 3]))),
     lambda: (_x(2, 5),)),
    ("kl_div", lambda: Fn(lambda a, b: F.kl_div(F.log_softmax(a, -1), F.softmax(b, -1), reduction="batchmean")),
     lambda: (_x(2, 5), _x(2, 5, seed=1))),
    ("einsum with ellipsis", lambda: Fn(lambda a, b: torch.einsum("...ij,...jk->...ik", a, b)),
     lambda: (_x(2, 3, 4), _x(4, 5, seed=1))),
    ("einsum, implicit output", lambda: Fn(lambda a, b: torch.einsum("bij,bjk", a, b)),
     lambda: (_x(2, 3, 4), _x(2, 4, 5, seed=1))),
    ("MultiheadAttention, key padding mask", lambda: PaddedSelfAttention(), lambda: (_x(2, 5, 8),)),
    ("TransformerEncoderLayer, norm first, gelu", lambda: nn.TransformerEncoderLayer(
        8, 2, 16, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"), lambda: (_x(2, 5, 8),)),
    ("a cast to float32 in forward (T5, Llama)", lambda: Float32Statistics(6), lambda: (_x(2, 3, 6),)),
    ("BatchNorm after a 1x1 convolution of a BatchNorm", lambda: nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8)),
     lambda: (_x(4, 3, 6, 6),)),
    ("as_strided windows (overlapping)", lambda: Fn(lambda x: x.as_strided((4, 3), (1, 1)) * torch.arange(3.0)),
     lambda: (_x(6),)),
    # Uninitialised memory is only a shape: the lowering's zeros and torch's garbage are not compared.
    ("new_empty then fill", lambda: Fn(lambda x: x * x.new_empty(x.shape).fill_(2.0)), lambda: (_x(2, 3),)),
    ("empty_like then copy", lambda: Fn(lambda x: torch.empty_like(x).copy_(x) * x), lambda: (_x(2, 3),)),
    ("DropPath and dropout in training (the case's masks)", lambda: DropPathBlock(), lambda: (_x(8, 6),)),
    ("scatter_add (repeated positions)", lambda: Fn(lambda x, y: y.scatter_add(
        1, torch.tensor([[0, 2, 2, 1], [1, 3, 4, 4]]), x)), lambda: (_x(2, 4), _x(2, 5, seed=1))),
    ("scatter_add, an index narrower than self", lambda: Fn(lambda x, y: y.scatter_add(
        0, torch.tensor([[1, 0], [1, 2]]), x)), lambda: (_x(2, 2), _x(3, 4, seed=1))),
    ("a float constant made in forward", lambda: Fn(lambda x: x @ torch.ones(5, 3) + torch.zeros(3)),
     lambda: (_x(2, 5),)),
    # -- issue 20: dtypes and rounding
    ("position ids from an integer cumsum (HF causal LMs)", lambda: PositionIds(), lambda: (_x(2, 5, 4), MASK)),
    ("BatchNorm whose batch mean is rounding noise (a linear bottleneck)", lambda: nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU6(), nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16),
        nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8)), lambda: (_x(4, 3, 6, 6),)),
    # -- issue 20: convolutions and pools in 3-d, unbatched, and every form of pooling
    ("Conv3d, stride, padding, dilation", lambda: nn.Conv3d(3, 4, (2, 3, 2), stride=(2, 1, 1), padding=(1, 0, 1),
                                                             dilation=(2, 1, 1)), lambda: (_x(2, 3, 6, 5, 5),)),
    ("Conv3d, groups, no bias", lambda: nn.Conv3d(4, 6, 2, groups=2, bias=False), lambda: (_x(1, 4, 4, 4, 4),)),
    ("ConvTranspose3d, stride, output_padding, dilation", lambda: nn.ConvTranspose3d(
        3, 4, (2, 3, 2), stride=(2, 1, 2), padding=(1, 0, 1), output_padding=(1, 0, 1), dilation=(1, 1, 2)),
     lambda: (_x(2, 3, 3, 4, 3),)),
    ("ConvTranspose3d, groups, stride 3", lambda: nn.ConvTranspose3d(4, 6, 2, groups=2, stride=3),
     lambda: (_x(1, 4, 2, 3, 3),)),
    ("Conv2d, unbatched (C, H, W)", lambda: nn.Conv2d(3, 4, 3), lambda: (_x(3, 6, 6),)),
    ("Conv1d and ConvTranspose1d, unbatched", lambda: nn.Sequential(nn.Conv1d(3, 4, 3), nn.ConvTranspose1d(4, 2, 3, 2)),
     lambda: (_x(3, 6),)),
    ("MaxPool2d and AvgPool2d, unbatched", lambda: nn.Sequential(nn.MaxPool2d(2), nn.AvgPool2d(2, 1)),
     lambda: (_x(3, 6, 6),)),
    ("MaxPool3d, padding, stride", lambda: nn.MaxPool3d((2, 3, 2), stride=(1, 2, 1), padding=(1, 1, 0)),
     lambda: (_x(2, 2, 5, 6, 5),)),
    ("MaxPool3d, dilation, ceil_mode", lambda: nn.MaxPool3d(2, stride=2, dilation=(2, 1, 2), ceil_mode=True),
     lambda: (_x(1, 2, 7, 6, 7),)),
    ("MaxPool2d, dilation 2", lambda: nn.MaxPool2d(3, stride=2, padding=1, dilation=2), lambda: (_x(2, 3, 9, 8),)),
    ("MaxPool2d, dilation 2, stride 3, ceil_mode", lambda: nn.MaxPool2d(2, stride=3, dilation=2, ceil_mode=True),
     lambda: (_x(1, 2, 9, 10),)),
    ("MaxPool2d return_indices into MaxUnpool2d", lambda: Fn(
        lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2)), lambda: (_x(2, 3, 6, 6),)),
    ("MaxPool1d return_indices", lambda: nn.MaxPool1d(3, 2, return_indices=True), lambda: (_x(2, 3, 9),)),
    ("AvgPool3d, padding, stride", lambda: nn.AvgPool3d((2, 3, 2), stride=(1, 2, 1), padding=(1, 1, 0)),
     lambda: (_x(2, 2, 5, 6, 5),)),
    ("AvgPool3d, ceil_mode, count_include_pad=False", lambda: nn.AvgPool3d(
        3, stride=2, padding=1, ceil_mode=True, count_include_pad=False), lambda: (_x(1, 2, 6, 7, 6),)),
    ("AvgPool2d, divisor_override", lambda: nn.AvgPool2d(3, 2, padding=1, divisor_override=5),
     lambda: (_x(2, 3, 6, 6),)),
    ("AvgPool2d, ceil_mode, both counts", lambda: Fn(lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True) + F.avg_pool2d(
        x, 3, 2, 1, ceil_mode=True, count_include_pad=False)), lambda: (_x(2, 3, 6, 6),)),
    ("AdaptiveAvgPool3d", lambda: nn.AdaptiveAvgPool3d((2, 3, None)), lambda: (_x(2, 2, 5, 7, 4),)),
    ("AdaptiveMaxPool2d that does not divide, return_indices", lambda: nn.AdaptiveMaxPool2d((3, 4), True),
     lambda: (_x(2, 2, 7, 9),)),
    ("AdaptiveMaxPool3d that does not divide", lambda: nn.AdaptiveMaxPool3d((2, 3, 2)), lambda: (_x(2, 2, 5, 7, 4),)),
    # Sizes whose windows move with the samples in every dim (not when (size - k) / (out - 1) is an integer).
    ("FractionalMaxPool2d, given samples", lambda: nn.FractionalMaxPool2d(2, (4, 3), _random_samples=SAMPLES2),
     lambda: (_x(2, 3, 7, 7),)),
    ("FractionalMaxPool3d, given samples, unbatched", lambda: nn.FractionalMaxPool3d(
        2, (3, 4, 4), _random_samples=SAMPLES3), lambda: (_x(2, 7, 9, 7),)),
    # -- issue 20: writes, selections, products, steps
    ("slice assignment (slice_scatter)", lambda: Fn(lambda x, v: _assigned(x, (slice(None), slice(1, 3)), v)),
     lambda: (_x(3, 4), _x(3, 2, seed=1))),
    ("strided slice and select assignment", lambda: Fn(lambda x, v: _assigned(
        _assigned(x, (slice(None), slice(0, 4, 2)), v), (slice(None), 1), v[:, 0])), lambda: (_x(3, 4), _x(3, 2, seed=1))),
    ("item assignment at an index array (index_put)", lambda: Fn(lambda x, v: _assigned(x, torch.tensor([0, 2]), v)),
     lambda: (_x(3, 4), _x(2, 4, seed=1))),
    ("index_add_ with a repeated index", lambda: Fn(lambda x, v: x.index_add(0, torch.tensor([0, 1, 0]), v)),
     lambda: (_x(3, 4), _x(3, 4, seed=1))),
    ("a boolean mask assignment", lambda: Fn(lambda x: _assigned(x, x > 0.5, 0.0)), lambda: (_x(3, 4),)),
    ("scatter of src", lambda: Fn(lambda x, v: x.scatter(1, torch.tensor([[0, 2], [1, 3], [3, 0]]), v)),
     lambda: (_x(3, 4), _x(3, 2, seed=1))),
    ("CircularPad2d and a cropping pad", lambda: Fn(lambda x: F.pad(nn.CircularPad2d((1, 2, 0, 1))(x), (-1, 2, 1, -1))),
     lambda: (_x(2, 3, 4, 5),)),
    ("topk, sort and max's indices", lambda: Fn(lambda x: x.topk(2, dim=1).values.sum(1) + x.sort(0, descending=True)
                                             .values[:, 1] + x.gather(1, x.max(1, keepdim=True).indices)[:, 0]),
     lambda: (_x(3, 5),)),
    ("prod, with zeros", lambda: Fn(lambda x: x.prod(-1).sum(-1) + x[0].prod()),
     lambda: (_with_zeros(_x(2, 3, 4), (0, 1, 2), (1, 0, 0), (1, 0, 3)),)),
    ("atan", lambda: Fn(torch.atan), lambda: (_x(3, 4) * 2,)),
    ("floor, ceil, round, trunc (zero gradient)", lambda: Fn(lambda x: x * (x.floor() + x.ceil() + x.round() + x.trunc()
                                                                          + x.round(decimals=1))),
     lambda: (_x(2, 3, 4) * 3,)),
    ("nn.Bilinear (_trilinear)", lambda: nn.Bilinear(3, 4, 5), lambda: (_x(2, 3), _x(2, 4, seed=1))),
    ("EmbeddingBag sum with per_sample_weights", lambda: Fn(lambda w, psw: F.embedding_bag(
        torch.tensor([1, 2, 4, 4, 3, 2]), w, torch.tensor([0, 2, 2]), mode="sum", per_sample_weights=psw)),
     lambda: (_x(10, 3), _x(6, seed=1))),
    ("EmbeddingBag mean with padding_idx, max", lambda: Fn(lambda w: F.embedding_bag(
        torch.tensor([1, 2, 4, 4, 3, 2, 2]), w, torch.tensor([0, 3, 5]), mode="mean", padding_idx=2) + F.embedding_bag(
        torch.tensor([[1, 2, 4], [4, 3, 2]]), w, mode="max")[[0, 1, 0]]), lambda: (_x(10, 3),)),
    ("softmax and log_softmax over a 0-d tensor", lambda: Fn(lambda x: torch.softmax(x.sum(), 0) * x + torch.log_softmax(
        x[0, 0], 0)), lambda: (_x(2, 3),)),
    ("LinearCrossEntropyLoss, chunked (options)", lambda: nn.LinearCrossEntropyLoss(
        5, 4, bias=True, weight=torch.tensor([0.5, 1.0, 2.0, 1.5]), ignore_index=3,
        options=nn.LinearCrossEntropyOptions(batch_chunk_size=3)), lambda: (_x(8, 5), torch.tensor([0, 3, 1, 2, 3, 0, 1, 2]))),
    ("einsum '...ik, ...j -> ij' (the '...' dims summed)", lambda: Fn(lambda a, b: torch.einsum("...ik, ...j -> ij", a, b)),
     lambda: (_x(2, 3, 4), _x(2, 5, seed=1))),
    ("scaled_dot_product_attention, enable_gqa", lambda: Fn(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, enable_gqa=True)), lambda: (_x(2, 4, 3, 5), _x(2, 2, 6, 5, seed=1), _x(2, 2, 6, 5, seed=2))),
    ("vector_norm ord 0 and -2.5", lambda: Fn(lambda x: x * torch.linalg.vector_norm(x, 0) + torch.linalg.vector_norm(
        x, -2.5, dim=1, keepdim=True)), lambda: (_x(2, 3),)),
    # -- found by tests/test_nn_sweep.py
    ("F.grid_sample bilinear, reflection, and its grid", lambda: Fn(lambda x, g: F.grid_sample(
        x, g, padding_mode="reflection", align_corners=False)), lambda: (_x(2, 3, 6, 6), _x(2, 4, 5, 2, seed=1) * 1.3)),
    ("F.grid_sample nearest, border", lambda: Fn(lambda x, g: F.grid_sample(
        x, g, mode="nearest", padding_mode="border", align_corners=True) + F.grid_sample(x, g)), lambda: (
        _x(2, 3, 6, 6), _x(2, 4, 5, 2, seed=1) * 1.3)),
    ("F.interpolate bilinear, antialias", lambda: Fn(lambda x: F.interpolate(x, (4, 3), mode="bilinear", antialias=True)),
     lambda: (_x(2, 3, 9, 7),)),
    ("F.conv_tbc", lambda: Fn(lambda x, w, b: F.conv_tbc(x, w, b, 1)), lambda: (_x(6, 2, 3), _x(3, 3, 4, seed=1),
                                                                             _x(4, seed=2))),
    ("F.pdist", lambda: Fn(lambda x: F.pdist(x, 1.5)), lambda: (_x(3, 5),)),
    ("F.rrelu in evaluation", lambda: Fn(lambda x: F.rrelu(x, 0.1, 0.3, training=False)), lambda: (_x(3, 5),)),
    ("rounded division and remainders of values with gradients", lambda: Fn(lambda x: torch.div(
        x, 0.3, rounding_mode="floor") * x + torch.remainder(x, 0.7) + torch.fmod(x, 0.4)), lambda: (_x(3, 4),)),
    # -- issue 20: what the sweep listed as known
    ("LSTM and GRU with dropout between layers, in training", lambda: RecurrentDropout(), lambda: (_x(2, 5, 3),)),
    ("a loss whose float target torch does not differentiate (SoftMarginLoss)", lambda: nn.SoftMarginLoss(),
     lambda: (_x(3, 5), torch.sign(_x(3, 5, seed=1)))),
    # -- third-party models: what Longformer's attention needed
    ("as_strided windows of a transposed tensor (Longformer's chunks)", lambda: OverlappingChunks(),
     lambda: (_x(2, 8, 3),)),
    ("a rounded division of sizes, an integer (Longformer's chunk count)",
     lambda: Fn(lambda x: x * (torch.div(x.size(1), 2, rounding_mode="trunc") - 1)), lambda: (_x(2, 6),)),
    ("the largest and smallest element (Nystromformer's scaling)",
     lambda: Fn(lambda x: x / torch.max(x.abs()) + torch.min(x) * x), lambda: (_x(3, 4),)),
    ("a scatter of one value (Mixtral's routing weights)",
     lambda: Fn(lambda x: x * torch.zeros(3, 4).scatter(1, torch.tensor([[0], [2], [1]]), 2.0) + x),
     lambda: (_x(3, 4),)),
    ("overlapping windows by Tensor.unfold (PatchTST's patches)",
     lambda: Fn(lambda x: x.unfold(1, 4, 2) * torch.arange(1.0, 5.0) + x.unfold(-1, 2, 3).sum()),
     lambda: (_x(2, 9, 3),)),
]


@pytest.mark.parametrize("name, make, inputs", MODULES, ids=[m[0] for m in MODULES])
def test_the_module_agrees_on_every_backend(name, make, inputs):
    torch.manual_seed(0)
    r = run_case(from_torch(make(), *inputs(), name=name), RunOptions(backends=ALL))
    assert not r.unavailable and not r.errors, (r.unavailable, r.errors)
    assert r.verdict == "agree" and r.float32 == "ok", [(x.path, x.verdict, x.message) for x in r.leaves]


# ---------------------------------------------------------------- the mechanisms the rows needed
def test_a_graph_that_differs_from_its_module_is_not_run_and_torch_is_not_blamed():
    # decompose="core" breaks F.rms_norm into ops traced in float32, with float32's machine epsilon as a
    # constant; the module, run in float64, uses float64's.  Each node still matches torch's op.
    torch.manual_seed(0)
    r = run_case(from_torch(nn.RMSNorm(6), _x(2, 3, 6), decompose="core"), RunOptions(backends=ALL))
    assert set(r.unavailable) == {"tape", "jax"}
    assert all("float64 forward differs from the module's" in why for why in r.unavailable.values())
    assert r.verdict == "agree" and not any(leaf.blame for leaf in r.leaves)  # torch against the referee
    # The control: the fused graph keeps rms_norm whole, so the graph is the module and all three run.
    assert not run_case(from_torch(nn.RMSNorm(6), _x(2, 3, 6)), RunOptions(backends=ALL)).unavailable


def test_the_lowering_check_reads_nan_and_infinities_by_position():
    from gradcheck.frontends.torch.interpreter import _differ

    assert _differ(torch.tensor([np.nan, np.inf, 1.0]), np.array([np.nan, np.inf, 1.0])) is None
    assert _differ(torch.tensor([np.nan, np.inf]), np.array([np.nan, -np.inf])) == "NaN or infinite entries differ"
    assert _differ(torch.tensor([np.nan, 1.0]), np.array([1.0, np.nan])) == "NaN or infinite entries differ"


@pytest.mark.parametrize("size, k, s, p", [(5, 2, 2, 0), (6, 3, 2, 1), (7, 3, 3, 1), (4, 2, 2, 0), (9, 4, 3, 2)])
def test_max_pool_ceil_mode_is_torchs(size, k, s, p):
    from gradcheck.frontends.torch.aten import max_pool2d_ceil

    x = np.random.default_rng(size).standard_normal((1, 2, size, size + 1))
    want = F.max_pool2d(torch.from_numpy(x), k, s, p, ceil_mode=True).numpy()
    for backend_x in (x, torch.from_numpy(x)):
        got = np.asarray(max_pool2d_ceil(backend_x, k, s, p, True))
        np.testing.assert_array_equal(got, want)
    floor = F.max_pool2d(torch.from_numpy(x), k, s, p).numpy()
    if floor.shape != want.shape:  # the control: floor mode is what the padding changes
        assert np.asarray(max_pool2d_ceil(x, k, s, p, False)).shape == floor.shape


# ---------------------------------------------------------------- a wrong lowering is caught, row by row
def _mutated(op, **change):
    """``op``'s lowering with some arguments changed (a value, or a function of the old one): a plausible bug."""
    original = aten.LOWERINGS[op]
    signature = inspect.signature(original.__wrapped__)

    def wrong(ctx, *args, **kwargs):
        bound = signature.bind(ctx, *args, **kwargs)
        bound.apply_defaults()
        for name, new in change.items():
            bound.arguments[name] = new(bound.arguments[name]) if callable(new) else new
        return original(*bound.args, **bound.kwargs)

    return wrong


def _row_major_as_strided(ctx, self, size, stride, storage_offset=None):
    """``as_strided`` of the value as if it were stored row-major (the lowering before Longformer)."""
    index = np.asarray(storage_offset or 0) + sum(
        np.arange(n).reshape((1,) * k + (n,) + (1,) * (len(size) - k - 1)) * s for k, (n, s) in enumerate(zip(size, stride)))
    return ops.take(ops.reshape(self, (-1,)), index, axis=0)


def _output_changed(op, k, change):
    """``op``'s lowering with its output ``k`` changed."""
    original = aten.LOWERINGS[op]

    def wrong(ctx, *args, **kwargs):
        out = list(original(ctx, *args, **kwargs))
        out[k] = change(out[k])
        return tuple(out)

    return wrong


def _flipped(axis):
    return lambda x: ops.getitem(x, (slice(None),) * (axis % len(ops.shape_of(x))) + (slice(None, None, -1),))


def _negated(x):
    return ops.neg(x)


def _repeat_heads_tiled(t, heads):
    """Grouped-query heads tiled (h0 h1 h0 h1), where torch repeats each (h0 h0 h1 h1)."""
    return ops.concatenate([t] * (heads // ops.shape_of(t)[-3]), axis=-3)


# (row of MODULES, the op whose lowering goes wrong, how): each new lowering gets one.
WRONG = [
    ("position ids from an integer cumsum (HF causal LMs)", "aten.cumsum.default",
     lambda: _mutated("aten.cumsum.default", self=lambda m: m * 2)),
    ("Conv3d, stride, padding, dilation", "aten.convolution.default",
     lambda: _mutated("aten.convolution.default", weight=_flipped(2))),
    ("ConvTranspose3d, stride, output_padding, dilation", "aten.convolution.default",
     lambda: _mutated("aten.convolution.default", weight=_flipped(2))),
    ("Conv2d, unbatched (C, H, W)", "aten.conv2d.default", lambda: _mutated("aten.conv2d.default", bias=None)),
    ("MaxPool3d, padding, stride", "aten.max_pool3d_with_indices.default",
     lambda: _mutated("aten.max_pool3d_with_indices.default", self=_flipped(-1))),
    ("MaxPool3d, dilation, ceil_mode", "aten.max_pool3d_with_indices.default",
     lambda: _mutated("aten.max_pool3d_with_indices.default", self=_flipped(-1))),
    ("MaxPool2d, dilation 2", "aten.max_pool2d_with_indices.default",
     lambda: _mutated("aten.max_pool2d_with_indices.default", self=_flipped(-1))),
    ("MaxPool2d return_indices into MaxUnpool2d", "aten.max_pool2d_with_indices.default",
     lambda: _output_changed("aten.max_pool2d_with_indices.default", 1, lambda i: (i + 1) % 36)),
    ("AvgPool3d, padding, stride", "aten.avg_pool3d.default",
     lambda: _mutated("aten.avg_pool3d.default", count_include_pad=lambda c: not c)),
    ("AvgPool3d, ceil_mode, count_include_pad=False", "aten.avg_pool3d.default",
     lambda: _mutated("aten.avg_pool3d.default", count_include_pad=lambda c: not c)),
    ("AvgPool2d, divisor_override", "aten.avg_pool2d.default",
     lambda: _mutated("aten.avg_pool2d.default", divisor_override=None)),
    ("AvgPool2d, ceil_mode, both counts", "aten.avg_pool2d.default",
     lambda: _mutated("aten.avg_pool2d.default", count_include_pad=lambda c: not c)),
    ("AdaptiveAvgPool3d", "aten._adaptive_avg_pool3d.default",
     lambda: _mutated("aten._adaptive_avg_pool3d.default", self=_flipped(-1))),
    ("AdaptiveMaxPool2d that does not divide, return_indices", "aten.adaptive_max_pool2d.default",
     lambda: _mutated("aten.adaptive_max_pool2d.default", self=_flipped(-1))),
    ("AdaptiveMaxPool3d that does not divide", "aten.adaptive_max_pool3d.default",
     lambda: _mutated("aten.adaptive_max_pool3d.default", self=_flipped(-1))),
    ("FractionalMaxPool2d, given samples", "aten.fractional_max_pool2d.default",
     lambda: _mutated("aten.fractional_max_pool2d.default", random_samples=_flipped(-1))),  # the dims' swapped
    ("FractionalMaxPool3d, given samples, unbatched", "aten.fractional_max_pool3d.default",
     lambda: _mutated("aten.fractional_max_pool3d.default", random_samples=_flipped(-1))),
    ("slice assignment (slice_scatter)", "aten.slice_scatter.default",
     lambda: _mutated("aten.slice_scatter.default", start=lambda s: s - 1, end=lambda e: e - 1)),
    ("strided slice and select assignment", "aten.slice_scatter.default",
     lambda: _mutated("aten.slice_scatter.default", step=1, end=lambda e: 2)),
    ("item assignment at an index array (index_put)", "aten.index_put.default",
     lambda: _mutated("aten.index_put.default", accumulate=True)),
    ("index_add_ with a repeated index", "aten.index_put.default",
     lambda: _mutated("aten.index_put.default", values=_negated)),
    ("a boolean mask assignment", "aten.index_put.default",
     lambda: _mutated("aten.index_put.default", values=lambda v: ops.add(v, 1.0))),
    ("scatter of src", "aten.scatter.src", lambda: _mutated("aten.scatter.src", src=_negated)),
    ("CircularPad2d and a cropping pad", "aten.slice_scatter.default",
     lambda: _mutated("aten.slice_scatter.default", src=_negated)),
    ("CircularPad2d and a cropping pad", "aten.constant_pad_nd.default",
     lambda: _mutated("aten.constant_pad_nd.default", value=1.0)),
    ("topk, sort and max's indices", "aten.topk.default",
     lambda: _mutated("aten.topk.default", largest=lambda b: not b)),
    ("topk, sort and max's indices", "aten.sort.default",
     lambda: _mutated("aten.sort.default", descending=lambda b: not b)),
    ("topk, sort and max's indices", "aten.max.dim",
     lambda: _output_changed("aten.max.dim", 1, lambda i: (i + 1) % 5)),
    ("prod, with zeros", "aten.prod.dim_int", lambda: _mutated("aten.prod.dim_int", self=ops.abs)),
    ("atan", "aten.atan.default", lambda: _mutated("aten.atan.default", self=lambda x: ops.mul(x, 1.01))),
    ("floor, ceil, round, trunc (zero gradient)", "aten.floor.default",
     lambda: _mutated("aten.floor.default", self=lambda x: ops.add(x, 0.5))),
    ("nn.Bilinear (_trilinear)", "aten._trilinear.default", lambda: _mutated("aten._trilinear.default", i2=_flipped(0))),
    ("EmbeddingBag sum with per_sample_weights", "aten._embedding_bag_forward_only.default",
     lambda: _mutated("aten._embedding_bag_forward_only.default", per_sample_weights=None)),
    ("EmbeddingBag mean with padding_idx, max", "aten._embedding_bag_forward_only.default",
     lambda: _mutated("aten._embedding_bag_forward_only.default", mode=0)),
    ("softmax and log_softmax over a 0-d tensor", "aten._softmax.default",
     lambda: lambda ctx, self, dim, half_to_float=False: self),
    ("LinearCrossEntropyLoss, chunked (options)", "torch_nn._linear_cross_entropy_batch_chunked.default",
     lambda: _mutated("torch_nn._linear_cross_entropy_batch_chunked.default", target=lambda t: (t + 1) % 4)),
    ("vector_norm ord 0 and -2.5", "aten.linalg_vector_norm.default",
     lambda: _mutated("aten.linalg_vector_norm.default", ord=lambda p: 1 if p == 0 else p)),
    ("F.grid_sample bilinear, reflection, and its grid", "aten.grid_sampler_2d.default",
     lambda: _mutated("aten.grid_sampler_2d.default", align_corners=lambda a: not a)),
    ("F.grid_sample nearest, border", "aten.grid_sampler_2d.default",
     lambda: _mutated("aten.grid_sampler_2d.default", padding_mode=0)),
    ("F.interpolate bilinear, antialias", "aten._upsample_bilinear2d_aa.default",
     lambda: _mutated("aten._upsample_bilinear2d_aa.default", align_corners=True)),
    ("F.conv_tbc", "aten.conv_tbc.default", lambda: _mutated("aten.conv_tbc.default", bias=_negated)),
    ("F.pdist", "aten._pdist_forward.default", lambda: _mutated("aten._pdist_forward.default", p=2.0)),
    ("F.rrelu in evaluation", "aten.rrelu_with_noise_functional.default",
     lambda: _mutated("aten.rrelu_with_noise_functional.default", lower=0.0)),
    ("rounded division and remainders of values with gradients", "aten.div.Tensor_mode",
     lambda: _mutated("aten.div.Tensor_mode", rounding_mode="trunc")),
    ("rounded division and remainders of values with gradients", "aten.fmod.Scalar",
     lambda: _mutated("aten.fmod.Scalar", other=lambda b: b * 1.01)),
    ("rounded division and remainders of values with gradients", "aten.remainder.Scalar",
     lambda: _mutated("aten.remainder.Scalar", other=lambda b: b * 1.01)),
    # Before: the windows read the tensor's values row-major, as if it were stored so.
    ("as_strided windows of a transposed tensor (Longformer's chunks)", "aten.as_strided.default",
     lambda: _row_major_as_strided),
    ("the largest and smallest element (Nystromformer's scaling)", "aten.max.default",
     lambda: lambda ctx, x: ops.min(x, axis=None)),
    ("overlapping windows by Tensor.unfold (PatchTST's patches)", "aten.unfold.default",
     lambda: _mutated("aten.unfold.default", step=lambda k: k + 1)),
    # Before: the quotient of two integers as a float.
    ("a rounded division of sizes, an integer (Longformer's chunk count)", "aten.div.Tensor_mode",
     lambda: lambda ctx, a, b, rounding_mode=None: np.trunc(np.true_divide(a, b))),
]
ROWS = {name: (make, inputs) for name, make, inputs in MODULES}


def _caught(name, op):
    """The row's case with a wrong lowering of ``op``: the tape and jax do not run it, and torch is not blamed."""
    make, inputs = ROWS[name]
    torch.manual_seed(0)
    r = run_case(from_torch(make(), *inputs(), name=name), RunOptions(backends=ALL))
    assert set(r.unavailable) == {"tape", "jax"}, (r.unavailable, r.errors)
    for why in r.unavailable.values():
        assert f"the lowering of {op} disagrees with torch's {op}" in why, why
        # torch's reference decomposition sides with its kernel where it can, and leaves it open where it cannot;
        # a wrong lowering is never taken for a wrong kernel (third_opinion).
        assert ("so this is a bug in gradcheck/frontends/torch/aten.py" in why
                or "either the lowering in gradcheck/frontends/torch/aten.py or torch's kernel" in why), why
        assert "the likely one at fault" not in why, why
    assert not any("torch" in leaf.blame for leaf in r.leaves)


@pytest.mark.parametrize("name, op, wrong", WRONG, ids=[f"{w[0]} / {w[1]}" for w in WRONG])
def test_a_wrong_lowering_is_caught_before_torch_is_blamed(name, op, wrong, monkeypatch):
    mutated, calls = wrong(), []

    def counted(*args, **kwargs):
        calls.append(op)
        return mutated(*args, **kwargs)

    monkeypatch.setitem(aten.LOWERINGS, op, counted)
    try:
        _caught(name, op)  # the clean row agrees on all three backends: test_the_module_agrees_on_every_backend
    except AssertionError:
        if not calls:  # torch 2.14's default decompositions take linalg_vector_norm apart before any lowering
            pytest.skip(f"torch {torch.__version__} decomposes {op} in this row's graph: no node runs its lowering")
        raise


def test_grouped_query_heads_repeated_in_the_wrong_order_are_caught(monkeypatch):
    monkeypatch.setattr(aten, "_repeat_heads", _repeat_heads_tiled)
    _caught("scaled_dot_product_attention, enable_gqa", "aten.scaled_dot_product_attention.default")


# ---------------------------------------------------------------- dtypes, rounding and honest messages
def test_an_integer_result_keeps_torchs_dtype():
    from gradcheck.frontends.torch.interpreter import _differ

    # The node-by-node check holds integer results to torch's dtype exactly, not only to being integers.
    assert _differ(torch.tensor([1, 2]), np.array([1, 2], np.int32)) == "dtype int32, torch's int64"
    assert _differ(torch.tensor([1, 2]), np.array([1.0, 2.0])) == "dtype float64, torch's int64"
    assert _differ(torch.tensor([True]), np.array([True])) is None


def test_a_numpy_scalar_result_takes_the_nodes_dtype_and_integer_quotients_are_exact():
    from types import SimpleNamespace

    # numpy's arithmetic on 0-d values gives a scalar, and a float64 scalar is a Python float: it used to pass
    # as a plain number, so an integer node's value stayed float (Longformer's chunk count).
    ctx = SimpleNamespace(floats=np.float64)
    out = aten._graph_dtypes(ctx, np.float64(3.0), torch.tensor(3))
    assert isinstance(out, np.ndarray) and out.dtype == np.int64 and out == 3
    # trunc division of integers in integers: through a float quotient, 2**53 + 1 would round.
    big = 2**53 + 1
    assert aten._quotient(np.int64(big), 1, "trunc") == big
    assert [int(aten._quotient(a, 2, "trunc")) for a in (7, -7)] == [3, -3]
    assert [int(aten._quotient(a, 2, "floor")) for a in (7, -7)] == [3, -4]


@pytest.mark.parametrize("view, size, stride, offset", [
    (lambda b: b.transpose(1, 2), (2, 4, 2, 2), (12, 1, 4, 4), None),  # Longformer's overlapping chunks
    (lambda b: b.transpose(0, 2), (4, 3), (1, 4), 0),
    (lambda b: b, (3, 4), (4, 1), 5),
    (lambda b: b[:, 1:], (2, 2, 4), (12, 4, 1), 4),  # a slice: its storage has gaps the view does not read
    (lambda b: b[:, 1:], (2, 2, 4), (12, 4, 1), None),  # ... and its own offset when none is given
])
def test_as_strided_reads_the_storage_torch_laid_out(view, size, stride, offset):
    from types import SimpleNamespace

    t = view(torch.arange(24.0).reshape(2, 3, 4))
    want = t.as_strided(size, stride) if offset is None else t.as_strided(size, stride, offset)
    ctx = SimpleNamespace(node=SimpleNamespace(args=[SimpleNamespace(meta={"val": t})]), floats=np.float64)
    got = aten.LOWERINGS["aten.as_strided.default"].__wrapped__(ctx, t.contiguous().numpy(), size, stride, offset)
    np.testing.assert_array_equal(got, want.numpy())


def test_as_strided_refuses_storage_outside_the_tensor():
    from types import SimpleNamespace

    t = torch.arange(24.0).reshape(2, 3, 4)[:, 1:]  # storage positions 0-3 and 12-15 are not its elements
    ctx = SimpleNamespace(node=SimpleNamespace(args=[SimpleNamespace(meta={"val": t})]), floats=np.float64)
    with pytest.raises(aten.LoweringError, match="reads storage that is not the tensor's own elements"):
        aten.LOWERINGS["aten.as_strided.default"].__wrapped__(ctx, t.contiguous().numpy(), (4,), (1,), 0)


def _float_cumsum(ctx, self, dim, dtype=None):
    """The cumsum lowering before issue 20: a float matmul, whatever the input's dtype."""
    n = ops.shape_of(self)[dim]
    return ops.matmul(ops.astype(self, np.float64), np.triu(np.ones((n, n))))


def test_a_lowering_that_loses_an_integer_dtype_is_cast_back_and_caught_without(monkeypatch):
    # Registered through lower(), a lowering's result takes the dtype torch's node has: integer position ids.
    monkeypatch.setitem(aten.LOWERINGS, "aten.cumsum.default", aten._keeps_graph_dtypes(_float_cumsum))
    torch.manual_seed(0)
    make, inputs = ROWS["position ids from an integer cumsum (HF causal LMs)"]
    r = run_case(from_torch(make(), *inputs()), RunOptions(backends=ALL))
    assert not r.unavailable and r.verdict == "agree", r.unavailable
    # The control: the same function put in the table as it is gives float64 ids, and the check says so.
    monkeypatch.setitem(aten.LOWERINGS, "aten.cumsum.default", _float_cumsum)
    r = run_case(from_torch(make(), *inputs()), RunOptions(backends=ALL))
    assert set(r.unavailable) == {"tape", "jax"}
    assert all("(dtype float64, torch's int64)" in why for why in r.unavailable.values())


def test_rounding_noise_at_the_inputs_scale_does_not_reject_a_lowering():
    from gradcheck.frontends.torch.interpreter import _differ

    # Measured on MobileViT: BatchNorm's running mean of an input whose batch mean is cancellation noise.
    t = torch.tensor([9.92e-15, -3.1e-15], dtype=torch.float64)
    lowered = np.array([9.92e-15 + 1.26e-22, -3.1e-15])
    assert _differ(t, lowered) == "max |difference| 1.26e-22 where max |torch| is 9.92e-15"
    assert _differ(t, lowered, floor=1.0) is None  # the inputs were of size 1
    assert _differ(t, lowered + 1e-7, floor=1.0).startswith("max |difference| 1e-07 where max |torch| is 9.92e-15")


def test_a_mask_sentinel_is_not_the_scale_of_its_input():
    # finfo.min, -1e9 or -1e4 added to attention scores would make every error in the scores look small.
    # The median magnitude of 0.3 ... 2.0 is 0.8: a float's extreme (a mask filled with finfo.min) is left out
    # whatever its share, a smaller sentinel (-1e9, -1e4) moves the median only while it masks under half.
    data = np.array([0.3, -1.2, 0.7, -0.5, 2.0, 0.9])
    for sentinel in (np.finfo(np.float32).min, np.finfo(np.float64).min):
        scores = np.concatenate([data, np.full(20, sentinel), [np.inf, np.nan, 0.0]])
        assert interpreter._typical_magnitude(scores) == 0.8
    for sentinel in (-1e9, -1e4):
        assert 0.3 <= interpreter._typical_magnitude(np.concatenate([data, np.full(5, sentinel)])) <= 2.0
    assert interpreter._typical_magnitude(np.array([0.0, 0.0])) == 0.0


class MaskedAttention(nn.Module):
    """Scores masked with finfo.min before the softmax, as Hugging Face's eager attention masks them."""

    def forward(self, q, k):
        scores = (q @ k.transpose(-1, -2)).masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1),
                                                       torch.finfo(q.dtype).min)
        return torch.softmax(scores, -1) @ k


def test_a_wrong_softmax_behind_a_mask_sentinel_is_still_caught(monkeypatch):
    inputs = (_x(2, 4, 3), _x(2, 4, 3, seed=1))
    torch.manual_seed(0)
    assert not run_case(from_torch(MaskedAttention(), *inputs), RunOptions(backends=ALL)).unavailable
    original = aten.LOWERINGS["aten._softmax.default"]
    monkeypatch.setitem(aten.LOWERINGS, "aten._softmax.default",
                        lambda ctx, x, dim, half: ops.mul(original(ctx, x, dim, half), 1.0 + 1e-6))
    r = run_case(from_torch(MaskedAttention(), *inputs), RunOptions(backends=ALL))
    assert set(r.unavailable) == {"tape", "jax"}
    assert all("the lowering of aten._softmax.default disagrees" in why for why in r.unavailable.values())


def test_the_rounding_floor_is_what_lets_a_linear_bottleneck_run(monkeypatch):
    name = "BatchNorm whose batch mean is rounding noise (a linear bottleneck)"
    make, inputs = ROWS[name]
    # The control: held to its own scale, the third BatchNorm's running mean (1e-17, cancellation noise)
    # rejects a right lowering over 1e-18 of rounding, on every seed tried (0 to 11).
    monkeypatch.setattr(interpreter, "_input_scale", lambda node, tenv: 0.0)
    torch.manual_seed(0)
    r = run_case(from_torch(make(), *inputs()), RunOptions(backends=ALL))
    assert set(r.unavailable) == {"tape", "jax"}
    assert all("output 3: max |difference|" in why for why in r.unavailable.values())


def test_the_rounding_floor_does_not_hide_a_wrong_batch_norm(monkeypatch):
    # A running mean with the wrong momentum: wrong by 1e-3 where the batch mean is not noise (the first
    # BatchNorm), and caught there although the floor lets the noise of the third through.
    monkeypatch.setitem(aten.LOWERINGS, "aten._native_batch_norm_legit_functional.default", _mutated(
        "aten._native_batch_norm_legit_functional.default", momentum=lambda m: m * 1.01))
    _caught("BatchNorm whose batch mean is rounding noise (a linear bottleneck)",
            "aten._native_batch_norm_legit_functional.default")


def test_an_unsupported_form_is_named_and_a_raising_lowering_is_a_bug(monkeypatch):
    # Two different rows written at one index: torch keeps one of them, and which one it does not define.
    torch.manual_seed(0)
    r = run_case(from_torch(Fn(lambda x, v: _assigned(x, torch.tensor([0, 0]), v)), _x(3, 4), _x(2, 4, seed=1)),
                 RunOptions(backends=ALL))
    assert set(r.unavailable) == {"tape", "jax"}
    for why in r.unavailable.values():
        assert why.startswith("aten.index_put.default with different values written at one position is not lowered: "
                              "torch keeps one of them, and which one is not defined")
        # The public ways out, never a file inside the package.
        assert "references={'aten::index_put': fn}" in why and "@gradcheck.frontends.torch.lowering('aten::index_put')" in why
        assert why.endswith("or give from_torch a forward= that avoids it") and "gradcheck/export" not in why
        assert "bug" not in why

    def broken(ctx, self, other):
        raise KeyError("a lookup the lowering got wrong")

    monkeypatch.setitem(aten.LOWERINGS, "aten.mul.Tensor", broken)
    r = run_case(from_torch(Fn(lambda x: x * x), _x(2, 4)), RunOptions(backends=ALL))
    assert set(r.unavailable) == {"tape", "jax"}
    for why in r.unavailable.values():
        assert why.startswith("the lowering of aten.mul.Tensor raised KeyError: 'a lookup the lowering got wrong', on "
                              "arguments torch's aten.mul.Tensor takes")
        assert why.endswith("this is a bug in gradcheck/frontends/torch/aten.py")


def test_nonzero_is_lowered_for_known_values_and_counts_and_refused_for_traced_ones():
    from gradcheck.frontends.torch.interpreter import Context

    mask = np.array([[True, False, True], [False, False, True]])
    lowering = aten.LOWERINGS["aten.nonzero.default"]
    np.testing.assert_array_equal(lowering(Context(np.float64, None), mask), torch.nonzero(torch.from_numpy(mask)))
    import jax

    with pytest.raises(aten.LoweringError, match="aten.nonzero with an input traced by jax is not lowered"):
        jax.jit(lambda m: lowering(Context(np.float64, None), m))(mask)
    # A graph traced at the example inputs recorded the number of positions (a real value, not a symbol): jax
    # takes that many, as the example has.
    from types import SimpleNamespace

    ctx = Context(np.float64, None)
    ctx.node = SimpleNamespace(meta={"val": torch.nonzero(torch.from_numpy(mask))})
    np.testing.assert_array_equal(jax.jit(lambda m: lowering(ctx, m))(mask), torch.nonzero(torch.from_numpy(mask)))


def test_the_einsum_rule_takes_what_torch_takes():
    a, b = np.random.default_rng(0).standard_normal((2, 3, 4)), np.random.default_rng(1).standard_normal((2, 5))
    want = torch.einsum("...ik, ...j -> ij", torch.from_numpy(a), torch.from_numpy(b)).numpy()
    np.testing.assert_allclose(ops.einsum("...ik, ...j -> ij", a, b), want, rtol=1e-13)
    from gradcheck.backends.tape.tape import Tensor

    np.testing.assert_allclose(ops.einsum("...ik,...j->ij", Tensor(a), Tensor(b)).value, want, rtol=1e-13)


# ---------------------------------------------------------------- what torch's own capture leaves out or refuses
def test_recurrent_dropout_between_layers_is_drawn_in_the_graph_as_the_module_draws_it(monkeypatch):
    from gradcheck.frontends.torch import capture

    name = "LSTM and GRU with dropout between layers, in training"
    make, inputs = ROWS[name]
    torch.manual_seed(0)
    case = from_torch(make(), *inputs(), name=name)
    # LSTM: 3 layers, 2 dropped outputs; GRU: 2 layers, 1; each the module's bernoulli_ and the graph's dropout.
    assert any(note.startswith("3 random draws (dropout x3)") for note in case.notes), case.notes
    assert run_case(case, RunOptions(backends=ALL)).verdict == "agree"  # and the row agrees in float32 too
    # The control: torch's decomposition as it is draws nothing between the layers, where the module draws.
    monkeypatch.setattr(capture, "_recurrent_dropout", contextlib.nullcontext)
    torch.manual_seed(0)
    r = run_case(from_torch(make(), *inputs(), name=name), RunOptions(backends=ALL))
    assert r.verdict == "error" and "random draw #1" in r.errors["case"] and "graph has 0" in r.errors["case"]


def test_a_float_target_torch_does_not_differentiate_is_held_on_every_backend(monkeypatch):
    from gradcheck.frontends.torch import capture

    x, target = _x(3, 5).double(), torch.sign(_x(3, 5, seed=1)).double()
    r = run_case(from_torch(nn.SoftMarginLoss(), x, target), RunOptions(backends=ALL))
    assert r.verdict == "agree" and not r.unavailable and not r.errors
    leaves = {leaf.path: leaf for leaf in r.leaves}
    assert leaves["input.0"].verdict == "agree"  # the input is checked
    assert leaves["input.1"].verdict == "vacuous"  # the target: held, no gradient on any backend
    # The note names the held input and why, and does not count it among the forward's own detaches.
    assert any(note.startswith("input 1 is soft_margin_loss's target, which torch declares not differentiable:")
               for note in r.notes), r.notes
    assert not any("the forward detaches" in note for note in r.notes), r.notes
    # A weight of binary_cross_entropy given as an input is held the same way; the input is still checked.
    bce = Fn(lambda z, w: F.binary_cross_entropy(torch.sigmoid(z), (z > 0).to(z.dtype), weight=w))
    r = run_case(from_torch(bce, x, target.abs() + 0.5), RunOptions(backends=ALL))
    assert r.verdict == "agree" and {leaf.path: leaf.verdict for leaf in r.leaves}["input.0"] == "agree"
    # The control: differentiated like any float input, the target makes torch refuse the module's forward.
    monkeypatch.setattr(capture, "hold_undifferentiable", lambda *args: None)
    r = run_case(from_torch(nn.SoftMarginLoss(), x, target), RunOptions(backends=ALL))
    assert r.verdict == "error" and "not differentiable with respect to argument 'target'" in r.errors["torch"]


class LinearBottleneck(nn.Module):
    """MobileNetV2's and EfficientNet's linear bottleneck: a BatchNorm, a 1x1 convolution, and a BatchNorm of that.

    The second BatchNorm's input has a batch mean that is zero in exact arithmetic (a linear map of centred
    channels): its running mean is rounding noise, 3e-17 in float64 and 1e-9 to 1e-8 in float32, where the
    values it averages are of size 1.
    """

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU6())
        self.project = nn.Sequential(nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16))
        self.expand = nn.Sequential(nn.Conv2d(16, 48, 1, bias=False), nn.BatchNorm2d(48))

    def forward(self, x):
        return self.expand(self.project(self.stem(x)))


def test_a_running_mean_of_centred_values_is_not_float32_imprecise():
    torch.manual_seed(0)
    r = run_case(from_torch(LinearBottleneck(), _x(2, 3, 34, 34)), RunOptions(backends=ALL))
    assert r.verdict == "agree" and not r.unavailable
    off = [(leaf.path, leaf.float32.message) for leaf in r.leaves
           if leaf.float32 is not None and leaf.float32.verdict == "imprecise"]
    assert not off, off

"""``torch.nn`` as a library user writes it, handed to ``from_torch``: every module is checked on all three backends.

Each row is a stock module (or a one-line forward of torch functions) at a
small size.  The case must agree, in float64 and float32, with the tape and
jax running the exported graph and nothing unavailable: a lowering missing, a
lowering that is wrong, or a graph that differs from the module would each
fail a row.  The rows below the table are the mechanisms those rows needed,
each with a control that fails without it.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from gradcheck.export import from_torch  # noqa: E402
from gradcheck.runner import RunOptions, run_case  # noqa: E402

ALL = ("tape", "torch", "jax")


class Fn(nn.Module):
    """A forward of torch functions, as a model's own ``forward`` would call them."""

    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, *xs):
        return self.f(*xs)


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


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


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
    from gradcheck.export.interpreter import _differ

    assert _differ(torch.tensor([np.nan, np.inf, 1.0]), np.array([np.nan, np.inf, 1.0])) is None
    assert _differ(torch.tensor([np.nan, np.inf]), np.array([np.nan, -np.inf])) == "NaN or infinite entries differ"
    assert _differ(torch.tensor([np.nan, 1.0]), np.array([1.0, np.nan])) == "NaN or infinite entries differ"


@pytest.mark.parametrize("size, k, s, p", [(5, 2, 2, 0), (6, 3, 2, 1), (7, 3, 3, 1), (4, 2, 2, 0), (9, 4, 3, 2)])
def test_max_pool_ceil_mode_is_torchs(size, k, s, p):
    from gradcheck.export.aten import max_pool2d_ceil

    x = np.random.default_rng(size).standard_normal((1, 2, size, size + 1))
    want = F.max_pool2d(torch.from_numpy(x), k, s, p, ceil_mode=True).numpy()
    for backend_x in (x, torch.from_numpy(x)):
        got = np.asarray(max_pool2d_ceil(backend_x, k, s, p, True))
        np.testing.assert_array_equal(got, want)
    floor = F.max_pool2d(torch.from_numpy(x), k, s, p).numpy()
    if floor.shape != want.shape:  # the control: floor mode is what the padding changes
        assert np.asarray(max_pool2d_ceil(x, k, s, p, False)).shape == floor.shape

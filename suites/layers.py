"""The ``layers`` suite: every layer in several configurations, float32 and float64, small shapes.

Layers with a kink (relu family, max-pool, softplus's threshold) get
kink-free inputs (``suites/inputs.py``); the case notes say so.  Eval-mode
BatchNorm gets random running statistics, so eval is more than an identity.
"""

from __future__ import annotations

import numpy as np

from gradcheck import layers as L
from gradcheck.suites.inputs import positive
from gradcheck.suites.table import (
    NOTE_KINK_FREE,
    Row,
    cases,
    constant,
    make,
    normal,
    several,
    smooth_free,
    token_ids,
)

KF = (NOTE_KINK_FREE,)


def with_stats(bn_cls, *args, **kwargs):
    """A BatchNorm with random running statistics and affine parameters (for eval mode)."""

    def build(rng):
        bn = bn_cls(*args, rng=rng, **kwargs)
        c = bn.num_features
        bn.running_mean = rng.standard_normal(c).astype(np.float32)
        bn.running_var = positive(rng, c).astype(np.float32)
        if bn.weight is not None:
            bn.weight = positive(rng, c).astype(np.float32)
            bn.bias = rng.standard_normal(c).astype(np.float32)
        return bn

    return build


def randomised(cls, *args, **kwargs):
    """A norm layer with its affine weight/bias drawn away from the 1/0 init."""

    def build(rng):
        layer = cls(*args, rng=rng, **kwargs)
        for name in ("weight", "bias"):
            value = getattr(layer, name, None)
            if value is not None:
                setattr(layer, name, (1.0 + 0.5 * rng.standard_normal(value.shape)).astype(np.float32))
        return layer

    return build


def lstm_flat(m, *xs):
    """LSTM returns (output, (h_n, c_n)); the runner projects a flat tuple of arrays."""
    out, (h, c) = m(xs[0], None if len(xs) == 1 else (xs[1], xs[2]))
    return out, h, c


def gru_flat(m, *xs):
    out, h = m(xs[0], None if len(xs) == 1 else xs[1])
    return out, h


# A fixed boolean mask (True = do not attend, torch's MultiheadAttention convention)
# that leaves every query at least one key.
MHA_MASK = ~np.tril(np.ones((4, 4), dtype=bool)) ^ np.eye(4, k=-2, dtype=bool)
PADDING = np.array([[False, False, False, True], [True, False, False, False]])
SDPA_KEEP = np.array([[1, 0, 1, 1, 0, 1], [1, 1, 0, 0, 1, 1], [0, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 1]], dtype=bool)


def _rows_linear_conv():
    return [
        Row("Linear", "in4,out3", make(L.Linear, 4, 3), normal(3, 4)),
        Row("Linear", "in4,out3,nobias", make(L.Linear, 4, 3, bias=False), normal(3, 4)),
        Row("Linear", "in4,out3,3d", make(L.Linear, 4, 3), normal(2, 3, 4)),
        Row("Conv1d", "k3", make(L.Conv1d, 3, 4, 3), normal(2, 3, 8)),
        Row("Conv1d", "k3,s2,p1", make(L.Conv1d, 3, 4, 3, stride=2, padding=1), normal(2, 3, 9)),
        Row("Conv1d", "k3,d2,p2", make(L.Conv1d, 3, 4, 3, dilation=2, padding=2), normal(2, 3, 8)),
        Row("Conv1d", "k4,same", make(L.Conv1d, 3, 2, 4, padding="same"), normal(2, 3, 7)),
        Row("Conv1d", "k3,g3,depthwise", make(L.Conv1d, 3, 6, 3, groups=3), normal(2, 3, 6)),
        Row("Conv1d", "k3,nobias", make(L.Conv1d, 3, 4, 3, bias=False), normal(2, 3, 6)),
        Row("Conv2d", "k3,p1", make(L.Conv2d, 3, 4, 3, padding=1), normal(2, 3, 6, 6)),
        Row("Conv2d", "k3,s2,p1,g2", make(L.Conv2d, 4, 6, 3, stride=2, padding=1, groups=2), normal(2, 4, 7, 7)),
        Row("Conv2d", "k3,d2,p2", make(L.Conv2d, 3, 4, 3, dilation=2, padding=2), normal(2, 3, 6, 6)),
        Row("Conv2d", "k3,same", make(L.Conv2d, 3, 4, 3, padding="same"), normal(2, 3, 5, 6)),
        Row("Conv2d", "k4,same", make(L.Conv2d, 2, 3, 4, padding="same"), normal(1, 2, 6, 5)),
        Row("Conv2d", "k3,g4,depthwise", make(L.Conv2d, 4, 4, 3, groups=4, padding=1), normal(2, 4, 5, 5)),
        Row("Conv2d", "k1", make(L.Conv2d, 3, 5, 1), normal(2, 3, 4, 4)),
        Row("Conv2d", "k(2,3),s(2,1),p(1,0)", make(L.Conv2d, 3, 2, (2, 3), stride=(2, 1), padding=(1, 0)),
            normal(2, 3, 6, 5)),
        Row("Conv2d", "k3,s2,nobias", make(L.Conv2d, 3, 4, 3, stride=2, bias=False), normal(2, 3, 7, 7)),
        Row("ConvTranspose2d", "k3,s2,p1,op1",
            make(L.ConvTranspose2d, 4, 3, 3, stride=2, padding=1, output_padding=1), normal(2, 4, 4, 4)),
        Row("ConvTranspose2d", "k2,s2", make(L.ConvTranspose2d, 3, 2, 2, stride=2), normal(2, 3, 3, 4)),
        Row("ConvTranspose2d", "k3,g2", make(L.ConvTranspose2d, 4, 6, 3, groups=2), normal(2, 4, 3, 3)),
        Row("ConvTranspose2d", "k3,d2", make(L.ConvTranspose2d, 3, 2, 3, dilation=2), normal(1, 3, 4, 4)),
        Row("ConvTranspose2d", "k3,s2,nobias", make(L.ConvTranspose2d, 3, 2, 3, stride=2, bias=False),
            normal(2, 3, 3, 3)),
        Row("ConvTranspose1d", "k3,s2", make(L.ConvTranspose1d, 3, 2, 3, stride=2), normal(2, 3, 5)),
    ]


def _rows_norm():
    return [
        Row("BatchNorm2d", "train", make(L.BatchNorm2d, 3), normal(4, 3, 3, 3)),
        Row("BatchNorm2d", "train,noaffine", make(L.BatchNorm2d, 3, affine=False), normal(4, 3, 3, 3)),
        Row("BatchNorm2d", "train,m0.3,eps1e-3", make(L.BatchNorm2d, 3, eps=1e-3, momentum=0.3), normal(2, 3, 4, 2)),
        Row("BatchNorm2d", "train,momentum=None", make(L.BatchNorm2d, 3, momentum=None), normal(2, 3, 2, 3)),
        Row("BatchNorm2d", "eval", with_stats(L.BatchNorm2d, 3), normal(2, 3, 3, 3), mode="eval"),
        Row("BatchNorm2d", "eval,noaffine", with_stats(L.BatchNorm2d, 3, affine=False), normal(2, 3, 3, 3), mode="eval"),
        Row("BatchNorm2d", "no-running-stats", make(L.BatchNorm2d, 3, track_running_stats=False), normal(3, 3, 2, 2)),
        Row("BatchNorm1d", "train,NC", make(L.BatchNorm1d, 5), normal(6, 5)),
        Row("BatchNorm1d", "train,NCL", make(L.BatchNorm1d, 4), normal(3, 4, 5)),
        Row("BatchNorm1d", "eval", with_stats(L.BatchNorm1d, 4), normal(3, 4), mode="eval"),
        Row("LayerNorm", "8", randomised(L.LayerNorm, 8), normal(2, 3, 8)),
        Row("LayerNorm", "(3,4)", randomised(L.LayerNorm, (3, 4)), normal(2, 3, 4)),
        Row("LayerNorm", "8,noaffine", make(L.LayerNorm, 8, elementwise_affine=False), normal(3, 8)),
        Row("LayerNorm", "8,nobias", randomised(L.LayerNorm, 8, bias=False), normal(3, 8)),
        Row("GroupNorm", "2,6", randomised(L.GroupNorm, 2, 6), normal(2, 6, 3, 3)),
        Row("GroupNorm", "1,4", randomised(L.GroupNorm, 1, 4), normal(2, 4, 3)),
        Row("GroupNorm", "6,6", randomised(L.GroupNorm, 6, 6), normal(2, 6, 2, 2)),
        Row("GroupNorm", "2,4,noaffine", make(L.GroupNorm, 2, 4, affine=False), normal(2, 4, 3, 3)),
        Row("RMSNorm", "8", randomised(L.RMSNorm, 8), normal(2, 3, 8)),
        Row("RMSNorm", "(3,4),eps1e-5", randomised(L.RMSNorm, (3, 4), eps=1e-5), normal(2, 3, 4)),
        Row("RMSNorm", "5,noaffine", make(L.RMSNorm, 5, elementwise_affine=False), normal(3, 5)),
    ]


def _rows_pool_misc():
    return [
        Row("Dropout", "p0.3", make(L.Dropout, 0.3), normal(4, 6)),
        Row("Dropout", "p0.3,eval", make(L.Dropout, 0.3), normal(4, 6), mode="eval"),
        Row("Dropout", "p0.8,4d", make(L.Dropout, 0.8), normal(2, 3, 4, 4)),
        Row("MaxPool2d", "k2", make(L.MaxPool2d, 2), smooth_free(2, 3, 6, 6), notes=KF),
        Row("MaxPool2d", "k3,s2,p1", make(L.MaxPool2d, 3, 2, 1), smooth_free(2, 2, 7, 7), notes=KF),
        Row("MaxPool2d", "k3,s1", make(L.MaxPool2d, 3, 1), smooth_free(1, 2, 5, 5), notes=KF),
        Row("MaxPool2d", "k(2,3)", make(L.MaxPool2d, (2, 3)), smooth_free(2, 2, 4, 6), notes=KF),
        Row("AvgPool2d", "k2", make(L.AvgPool2d, 2), normal(2, 3, 6, 6)),
        Row("AvgPool2d", "k3,s2,p1", make(L.AvgPool2d, 3, 2, 1), normal(2, 2, 7, 7)),
        Row("AvgPool2d", "k3,s2,p1,exclude_pad", make(L.AvgPool2d, 3, 2, 1, count_include_pad=False),
            normal(2, 2, 7, 7)),
        Row("AdaptiveAvgPool2d", "1", make(L.AdaptiveAvgPool2d, 1), normal(2, 3, 5, 5)),
        Row("AdaptiveAvgPool2d", "(2,3)", make(L.AdaptiveAvgPool2d, (2, 3)), normal(2, 3, 5, 7)),
        Row("AdaptiveAvgPool2d", "3,from7", make(L.AdaptiveAvgPool2d, 3), normal(1, 2, 7, 7)),
        Row("Flatten", "", make(L.Flatten), normal(2, 3, 2, 2)),
        Row("Flatten", "1,2", make(L.Flatten, 1, 2), normal(2, 3, 2, 2)),
        Row("Embedding", "10x4", make(L.Embedding, 10, 4), token_ids(3, 5, high=10)),
        Row("Embedding", "7x3,padding_idx0", make(L.Embedding, 7, 3, padding_idx=0),
            constant(np.array([[0, 1, 2, 0], [3, 0, 6, 6]]))),
    ]


def _rows_attention_recurrent():
    sdpa = L.scaled_dot_product_attention
    qkv = normal(2, 2, 4, 6), normal(2, 2, 6, 6), normal(2, 2, 6, 3)
    self_attn = normal(2, 4, 8)
    return [
        Row("scaled_dot_product_attention", "plain", make(L.Lambda, sdpa), several(*qkv)),
        Row("scaled_dot_product_attention", "causal", make(L.Lambda, sdpa, is_causal=True), several(*qkv)),
        Row("scaled_dot_product_attention", "bool-mask", make(L.Lambda, sdpa, attn_mask=SDPA_KEEP), several(*qkv)),
        Row("scaled_dot_product_attention", "float-mask",
            make(L.Lambda, sdpa, attn_mask=np.linspace(-1, 1, 24).reshape(4, 6)), several(*qkv)),
        Row("scaled_dot_product_attention", "scale0.3", make(L.Lambda, sdpa, scale=0.3), several(*qkv)),
        Row("MultiheadAttention", "E8,h2", make(L.MultiheadAttention, 8, 2), self_attn),
        Row("MultiheadAttention", "E8,h2,causal", make(L.MultiheadAttention, 8, 2, causal=True), self_attn),
        Row("MultiheadAttention", "E8,h4,nobias", make(L.MultiheadAttention, 8, 4, bias=False), self_attn),
        Row("MultiheadAttention", "E6,h2,kdim5,vdim3", make(L.MultiheadAttention, 6, 2, kdim=5, vdim=3),
            several(normal(2, 3, 6), normal(2, 4, 5), normal(2, 4, 3))),
        Row("MultiheadAttention", "E8,h2,attn_mask", make(L.MultiheadAttention, 8, 2), self_attn,
            forward=lambda m, x: m(x, attn_mask=MHA_MASK)),
        Row("MultiheadAttention", "E8,h2,key_padding_mask", make(L.MultiheadAttention, 8, 2), self_attn,
            forward=lambda m, x: m(x, key_padding_mask=PADDING)),
        Row("MultiheadAttention", "E8,h2,dropout0.2", make(L.MultiheadAttention, 8, 2, dropout=0.2), self_attn),
        Row("MultiheadAttention", "E8,h2,need_weights", make(L.MultiheadAttention, 8, 2), self_attn,
            forward=lambda m, x: m(x, need_weights=True)),
        Row("MultiheadAttention", "E8,h2,seq_first", make(L.MultiheadAttention, 8, 2, batch_first=False),
            normal(4, 2, 8)),
        Row("LSTM", "in3,h4", make(L.LSTM, 3, 4), normal(5, 2, 3), forward=lstm_flat),
        Row("LSTM", "in3,h4,batch_first", make(L.LSTM, 3, 4, batch_first=True), normal(2, 5, 3), forward=lstm_flat),
        Row("LSTM", "in3,h4,layers2", make(L.LSTM, 3, 4, num_layers=2), normal(4, 2, 3), forward=lstm_flat),
        Row("LSTM", "in3,h2,nobias", make(L.LSTM, 3, 2, bias=False), normal(4, 2, 3), forward=lstm_flat),
        Row("LSTM", "in3,h4,h0c0", make(L.LSTM, 3, 4), several(normal(4, 2, 3), normal(1, 2, 4), normal(1, 2, 4)),
            forward=lstm_flat),
        Row("GRU", "in3,h4", make(L.GRU, 3, 4), normal(5, 2, 3), forward=gru_flat),
        Row("GRU", "in3,h4,batch_first", make(L.GRU, 3, 4, batch_first=True), normal(2, 5, 3), forward=gru_flat),
        Row("GRU", "in3,h4,layers2", make(L.GRU, 3, 4, num_layers=2), normal(4, 2, 3), forward=gru_flat),
        Row("GRU", "in3,h2,nobias", make(L.GRU, 3, 2, bias=False), normal(4, 2, 3), forward=gru_flat),
        Row("GRU", "in3,h4,h0", make(L.GRU, 3, 4), several(normal(4, 2, 3), normal(1, 2, 4)), forward=gru_flat),
    ]


def _rows_activations():
    return [
        Row("ReLU", "", make(L.ReLU), smooth_free(3, 8), notes=KF),
        Row("LeakyReLU", "0.1", make(L.LeakyReLU, 0.1), smooth_free(3, 8), notes=KF),
        Row("ELU", "1.0", make(L.ELU), smooth_free(3, 8), notes=KF),
        Row("ELU", "0.5", make(L.ELU, 0.5), smooth_free(3, 8), notes=KF),
        Row("GELU", "", make(L.GELU), normal(3, 8, scale=2.0)),
        Row("GELU", "tanh", make(L.GELU, "tanh"), normal(3, 8, scale=2.0)),
        Row("SiLU", "", make(L.SiLU), normal(3, 8, scale=2.0)),
        Row("Tanh", "", make(L.Tanh), normal(3, 8)),
        Row("Sigmoid", "", make(L.Sigmoid), normal(3, 8, scale=2.0)),
        Row("Softplus", "", make(L.Softplus), normal(3, 8, scale=3.0)),
        # beta x > threshold switches to the identity: a kink at x = 1.5, kept clear of.
        Row("Softplus", "beta2,th3", make(L.Softplus, 2.0, 3.0), smooth_free(3, 8, scale=2.0, shift=1.5),
            notes=("inputs kept clear of the threshold x = threshold / beta",)),
        Row("Softmax", "dim1", make(L.Softmax, 1), normal(3, 4, 2)),
        Row("LogSoftmax", "dim-1", make(L.LogSoftmax, -1), normal(3, 5)),
    ]


def _rows_losses():
    logits_labels = lambda n, c: several(normal(n, c), token_ids(n, high=c))  # noqa: E731
    return [
        Row("mse_loss", "mean", make(L.Lambda, L.mse_loss), several(normal(3, 4), normal(3, 4))),
        Row("mse_loss", "sum", make(L.Lambda, L.mse_loss, reduction="sum"), several(normal(3, 4), normal(3, 4))),
        Row("cross_entropy", "mean", make(L.Lambda, L.cross_entropy), logits_labels(5, 4)),
        Row("cross_entropy", "NCd,sum", make(L.Lambda, L.cross_entropy, reduction="sum"),
            several(normal(2, 4, 3), token_ids(2, 3, high=4))),
        Row("cross_entropy", "ignore_index,smoothing0.1",
            make(L.Lambda, L.cross_entropy, ignore_index=1, label_smoothing=0.1),
            several(normal(6, 3), constant(np.array([0, 1, 2, 1, 2, 0])))),
        Row("cross_entropy", "weight", make(L.Lambda, L.cross_entropy, weight=np.array([0.2, 1.0, 3.0])),
            logits_labels(4, 3)),
        Row("cross_entropy", "probabilities",
            make(L.Lambda, L.cross_entropy), several(normal(4, 3), lambda rng: (rng.dirichlet(np.ones(3), size=4),))),
        Row("binary_cross_entropy_with_logits", "mean", make(L.Lambda, L.binary_cross_entropy_with_logits),
            several(normal(3, 4, scale=3.0), lambda rng: (rng.random((3, 4)),))),
        Row("binary_cross_entropy_with_logits", "pos_weight,sum",
            make(L.Lambda, L.binary_cross_entropy_with_logits, reduction="sum", pos_weight=np.array([1.0, 2.0, 0.5])),
            several(normal(4, 3), lambda rng: ((rng.random((4, 3)) > 0.5).astype(float),))),
    ]


def _rows_combinators():
    def chain(rng):
        return L.Chain(L.Linear(4, 5, rng=rng), L.Tanh(), L.Linear(5, 3, rng=rng))

    def parallel(combine):
        return lambda rng: L.Parallel(L.Linear(4, 3, rng=rng), L.Chain(L.Linear(4, 3, rng=rng), L.Tanh()),
                                      combine=combine)

    return [
        Row("Chain", "Linear,Tanh,Linear", chain, normal(3, 4)),
        Row("Parallel", "add", parallel(L.add_all), normal(3, 4)),
        Row("Parallel", "concat", parallel(L.concat_channels), normal(3, 4)),
        Row("SkipConnection", "Linear", lambda rng: L.SkipConnection(L.Linear(4, 4, rng=rng)), normal(3, 4)),
        Row("SkipConnection", "Conv2d,mul",
            lambda rng: L.SkipConnection(L.Conv2d(2, 2, 3, padding=1, rng=rng), lambda y, x: y * x), normal(2, 2, 4, 4)),
    ]


def rows() -> list[Row]:
    """Every configuration of the layers suite."""
    return (_rows_linear_conv() + _rows_norm() + _rows_pool_misc() + _rows_attention_recurrent()
            + _rows_activations() + _rows_losses() + _rows_combinators())


def layer_cases(seed: int = 0, dtype: str | None = None):
    """Every layer in several configurations (strides, paddings, groups, train/eval, masks), float32 and float64."""
    return cases(rows(), seed=seed, dtype=dtype)

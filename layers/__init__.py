"""Framework-neutral layers, written once against ``gradcheck.ops``.

Names, parameter layouts and default initialisation follow torch.nn, so a
report's paths (``layer1.0.conv1.weight``) read like torch code.  Every layer
takes ``rng`` (a numpy Generator or an int seed; default: the generator
``init.seed`` resets).  The model zoo is ``gradcheck.layers.models``.
"""

from gradcheck.layers.activations import (
    ACTIVATIONS,
    ELU,
    GELU,
    LeakyReLU,
    LogSoftmax,
    ReLU,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Tanh,
    elu,
    gelu,
    leaky_relu,
    log_softmax,
    relu,
    sigmoid,
    silu,
    softmax,
    softplus,
    tanh,
)
from gradcheck.layers.attention import MultiheadAttention, causal_mask, scaled_dot_product_attention
from gradcheck.layers.conv import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d
from gradcheck.layers.core import (
    Chain,
    Dense,
    Flatten,
    Identity,
    Lambda,
    Linear,
    Parallel,
    Residual,
    Sequential,
    SkipConnection,
    add_all,
    concat_channels,
)
from gradcheck.layers.dropout import Dropout, dropout
from gradcheck.layers.embedding import Embedding, one_hot
from gradcheck.layers.losses import (
    binary_cross_entropy_with_logits,
    cross_entropy,
    mse_loss,
    nll_loss,
)
from gradcheck.layers.norm import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm, RMSNorm
from gradcheck.layers.pool import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from gradcheck.layers.recurrent import GRU, LSTM

__all__ = [
    "ACTIVATIONS", "AdaptiveAvgPool2d", "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "Chain", "Conv1d",
    "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "Dense", "Dropout", "ELU", "Embedding", "Flatten",
    "GELU", "GRU", "GroupNorm", "Identity", "LSTM", "Lambda", "LayerNorm", "LeakyReLU", "Linear",
    "LogSoftmax", "MaxPool2d", "MultiheadAttention", "Parallel", "RMSNorm", "ReLU", "Residual",
    "Sequential", "SiLU", "Sigmoid", "SkipConnection", "Softmax", "Softplus", "Tanh", "add_all",
    "binary_cross_entropy_with_logits", "causal_mask", "concat_channels", "cross_entropy", "dropout",
    "elu", "gelu", "leaky_relu", "log_softmax", "mse_loss", "nll_loss", "one_hot", "relu",
    "scaled_dot_product_attention", "sigmoid", "silu", "softmax", "softplus", "tanh",
]

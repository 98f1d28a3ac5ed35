"""Hypothesis strategies for gradient checks: layer configurations, compatible inputs, safe arrays.

::

    from hypothesis import given
    import gradcheck
    from gradcheck import strategies as gst

    @given(gst.layer_cases(kinds=("conv2d",)))
    def test_conv_gradients(drawn):
        gradcheck.assert_gradients_agree(drawn.model(), *drawn.inputs(), backends=("tape", "torch"))

* ``dense_configs``, ``conv2d_configs``, ``norm_configs``, ``pool_configs``
  draw layer configurations that are valid by construction (channels
  divisible by ``groups``, padding at most half the window, ...).
* ``input_shapes(config)`` draws an input shape the layer accepts.
* ``arrays(shape)`` draws float32-exact arrays that avoid kinks by default:
  every value is a distinct multiple of a power-of-two step, at least one
  step from 0 (relu, leaky_relu, abs) and from every other value (no ties in
  a max-pool window).  Kinks *inside* a model (a pre-activation that lands
  on 0) cannot be steered from the input and are improbable, not excluded.
* ``layer_cases`` draws a layer, its input shape and the seeds of its
  parameters and input, and ``note()``-s a Python snippet that rebuilds the
  exact model and input: hypothesis prints it with the falsifying example.
* The ``gradcheck-ci`` settings profile (registered on import):
  derandomized, few examples, no deadline.  Load it with
  ``pytest --hypothesis-profile gradcheck-ci`` (the pytest plugin registers
  it in time) or ``settings.load_profile("gradcheck-ci")``.

Arrays are generated from a drawn seed, so hypothesis shrinks shapes and
configurations (what matters for a readable failure) and the seed, not the
individual values; the seed in the replay reproduces the values exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st

settings.register_profile(
    "gradcheck-ci",
    derandomize=True,  # the same examples on every CI run: a red build is reproducible
    max_examples=25,
    deadline=None,  # the first call of a backend compiles; timing says nothing here
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("gradcheck-dev", max_examples=200, deadline=None)

ACTIVATIONS = ("tanh", "sigmoid", "relu", "gelu", "silu", "softplus", "elu", "leaky_relu")
KINKED = ("relu", "leaky_relu", "elu")  # not differentiable at 0 (elu: second derivative only)


# ---------------------------------------------------------------- arrays
def make_array(shape, seed: int = 0, kink_free: bool = True, scale: float = 1.0, min_gap: float | None = None,
               dtype: str = "float32") -> np.ndarray:
    """The array ``arrays()`` draws for ``seed``: deterministic, so a replay can rebuild it.

    With ``kink_free`` the values are ``±k * step`` for a shuffled
    ``k = 1..n``: distinct, exactly representable in float32, at least
    ``step`` from 0 and from each other, within ``[-scale, scale]``.
    ``step`` is the largest power of two not above ``scale / n`` (or
    ``min_gap``, when that is larger; the range then grows past ``scale``).
    Without it: standard normal values times ``scale``.
    """
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape)
    rng = np.random.default_rng(seed)
    if not kink_free:
        return (rng.standard_normal(shape) * scale).astype(dtype)
    step = 2.0 ** math.floor(math.log2(scale / max(n, 1)))
    if min_gap is not None and min_gap > step:
        step = 2.0 ** math.ceil(math.log2(min_gap))
    magnitudes = (rng.permutation(n) + 1) * step
    signs = rng.choice(np.array([-1.0, 1.0]), size=n)
    return (signs * magnitudes).reshape(shape).astype(dtype)


@st.composite
def arrays(draw, shape, kink_free: bool = True, scale: float = 1.0, min_gap: float | None = None,
           dtype: str = "float32"):
    """A float array of ``shape`` (a tuple or a strategy of tuples); see ``make_array``."""
    if isinstance(shape, st.SearchStrategy):
        shape = draw(shape)
    seed = draw(st.integers(0, 2**32 - 1), label="array seed")
    return make_array(shape, seed, kink_free=kink_free, scale=scale, min_gap=min_gap, dtype=dtype)


# ---------------------------------------------------------------- layer configurations
@dataclass(frozen=True)
class LayerConfig:
    """A layer of ``gradcheck.layers`` and the arguments that build it.

    ``min_spatial`` is the smallest height/width (conv, pool) the layer
    accepts; ``features`` the size of the dimension the layer reads (Dense:
    the last one; conv and norm: channels in dim 1).
    """

    layer: str
    args: tuple = ()
    kwargs: tuple = ()  # (name, value) pairs: hashable, in a stable order
    rank: int = 2  # input rank, batch included
    features: int = 1
    min_spatial: tuple = ()  # per spatial dim
    min_batch: int = 1

    def build(self, rng=0):
        """The layer, its parameters drawn from ``rng`` (an int seed or a numpy Generator)."""
        import gradcheck.layers as L

        kwargs = dict(self.kwargs)
        if "activation" in kwargs and isinstance(kwargs["activation"], str):
            kwargs["activation"] = getattr(L, kwargs["activation"])
        return getattr(L, self.layer)(*self.args, **kwargs, rng=rng)

    def code(self, rng=0) -> str:
        """Python that builds the same layer (``import gradcheck.layers as L``)."""
        parts = [repr(a) for a in self.args]
        for k, v in self.kwargs:
            parts.append(f"{k}=L.{v}" if k == "activation" and isinstance(v, str) else f"{k}={v!r}")
        parts.append(f"rng={rng!r}")
        return f"L.{self.layer}({', '.join(parts)})"

    def __str__(self):
        return self.code().replace(", rng=0", "")


def _pair(draw, elements, label):
    return (draw(elements, label=f"{label} h"), draw(elements, label=f"{label} w"))


@st.composite
def dense_configs(draw, max_features: int = 8, activations=(None,) + ACTIVATIONS, kinks: bool = True):
    """``Dense(in, out, activation=..., bias=...)``; ``kinks=False`` leaves out relu-like activations."""
    acts = [a for a in activations if kinks or a not in KINKED]
    n_in = draw(st.integers(1, max_features), label="in_features")
    n_out = draw(st.integers(1, max_features), label="out_features")
    activation = draw(st.sampled_from(acts), label="activation")
    bias = draw(st.booleans(), label="bias")
    kwargs = (("activation", activation),) if activation else ()
    return LayerConfig("Dense", (n_in, n_out), kwargs + (("bias", bias),), rank=2, features=n_in)


@st.composite
def conv2d_configs(draw, max_channels: int = 6, max_kernel: int = 3, max_stride: int = 2, max_dilation: int = 2,
                   max_groups: int = 3):
    """``Conv2d`` with compatible channels/groups and padding no larger than half the dilated kernel."""
    groups = draw(st.integers(1, max(1, min(max_groups, max_channels))), label="groups")
    per_group = max(1, max_channels // groups)
    c_in = groups * draw(st.integers(1, per_group), label="in_channels / groups")
    c_out = groups * draw(st.integers(1, per_group), label="out_channels / groups")
    kernel = _pair(draw, st.integers(1, max_kernel), "kernel")
    stride = _pair(draw, st.integers(1, max_stride), "stride")
    dilation = _pair(draw, st.integers(1, max_dilation), "dilation")
    padding = tuple(draw(st.integers(0, (d * (k - 1)) // 2), label="padding")
                    for k, d in zip(kernel, dilation, strict=True))
    bias = draw(st.booleans(), label="bias")
    # At least the dilated kernel: smaller inputs with padding can leave every tap of a
    # weight on padded zeros (kernel 2, dilation 2, padding 1, one pixel), a check of nothing.
    min_spatial = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True))
    return LayerConfig("Conv2d", (c_in, c_out, kernel),
                       (("stride", stride), ("padding", padding), ("dilation", dilation), ("groups", groups),
                        ("bias", bias)),
                       rank=4, features=c_in, min_spatial=min_spatial)


@st.composite
def norm_configs(draw, max_channels: int = 6, kinds=("BatchNorm2d", "LayerNorm", "GroupNorm")):
    """BatchNorm2d, LayerNorm over the last one or two dims, or GroupNorm with divisible channels.

    Train-mode BatchNorm needs two values per channel in the batch, so its
    ``min_batch`` is 2 (a variance of one value is zero and its gradient degenerate).
    """
    kind = draw(st.sampled_from(kinds), label="norm")
    if kind == "BatchNorm2d":
        c = draw(st.integers(1, max_channels), label="channels")
        return LayerConfig("BatchNorm2d", (c,), rank=4, features=c, min_spatial=(1, 1), min_batch=2)
    if kind == "GroupNorm":
        groups = draw(st.integers(1, max_channels), label="groups")
        c = groups * draw(st.integers(1, max(1, max_channels // groups)), label="channels / group")
        # One value per group would have zero variance: at least 2 spatial values.
        return LayerConfig("GroupNorm", (groups, c), rank=4, features=c, min_spatial=(1, 2))
    dims = draw(st.integers(1, 2), label="normalized dims")
    shape = tuple(draw(st.integers(2, max_channels), label="normalized size") for _ in range(dims))
    return LayerConfig("LayerNorm", (shape if dims > 1 else shape[0],), rank=1 + dims,
                       features=shape[0], min_spatial=shape[1:])


@st.composite
def pool_configs(draw, max_kernel: int = 3, kinds=("MaxPool2d", "AvgPool2d")):
    """MaxPool2d / AvgPool2d with padding at most half the kernel (as torch requires)."""
    kind = draw(st.sampled_from(kinds), label="pool")
    k = draw(st.integers(1, max_kernel), label="kernel_size")
    stride = draw(st.integers(1, k), label="stride")
    padding = draw(st.integers(0, k // 2), label="padding")
    c = draw(st.integers(1, 3), label="channels")
    m = max(1, k - 2 * padding)
    return LayerConfig(kind, (k,), (("stride", stride), ("padding", padding)), rank=4, features=c,
                       min_spatial=(m, m))


KINDS = {"dense": dense_configs, "conv2d": conv2d_configs, "norm": norm_configs, "pool": pool_configs}


def layer_configs(kinds=tuple(KINDS)):
    """Any of the configurations above (``kinds``: dense, conv2d, norm, pool)."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"layer_configs: unknown kind(s) {sorted(unknown)}; choose from {', '.join(KINDS)}")
    return st.one_of(*(KINDS[k]() for k in kinds))


@st.composite
def input_shapes(draw, config: LayerConfig, max_batch: int = 3, max_extra: int = 3):
    """An input shape ``config`` accepts: batch, then features/channels, then spatial dims."""
    batch = draw(st.integers(config.min_batch, max(config.min_batch, max_batch)), label="batch")
    if config.layer == "LayerNorm":
        return (batch, config.features) + tuple(config.min_spatial)
    if config.rank == 2:
        return (batch, config.features)
    spatial = tuple(draw(st.integers(m, m + max_extra), label="spatial") for m in config.min_spatial)
    return (batch, config.features) + spatial


# ---------------------------------------------------------------- drawn checks
@dataclass(frozen=True)
class DrawnLayer:
    """A drawn layer with its input: build it, feed it, or print how to rebuild it."""

    config: LayerConfig
    input_shape: tuple
    param_seed: int = 0
    input_seed: int = 0
    kink_free: bool = True
    dtype: str = "float32"

    def model(self):
        return self.config.build(self.param_seed)

    def inputs(self) -> tuple:
        return (make_array(self.input_shape, self.input_seed, kink_free=self.kink_free, dtype=self.dtype),)

    def case(self, name: str | None = None):
        """A :class:`gradcheck.case.Case` of this layer (for ``gradcheck.check.runner.run``)."""
        from gradcheck.case import Case

        return Case(name or f"{self.config.layer}{self.input_shape}", lambda rng: self.model(),
                    lambda rng: self.inputs(), dtype=self.dtype, model=self.config.layer)

    def replay(self, **check_kwargs) -> str:
        """A Python snippet that rebuilds this model and input and runs the check."""
        extra = "".join(f", {k}={v!r}" for k, v in check_kwargs.items())
        return "\n".join([
            "import gradcheck, gradcheck.layers as L",
            "from gradcheck.strategies import make_array",
            f"model = {self.config.code(self.param_seed)}",
            f"x = make_array({self.input_shape!r}, seed={self.input_seed}, kink_free={self.kink_free}, "
            f"dtype={self.dtype!r})",
            f"gradcheck.assert_gradients_agree(model, x{extra})",
        ])


@st.composite
def layer_cases(draw, kinds=tuple(KINDS), configs=None, max_batch: int = 3, kink_free: bool = True,
                dtype: str = "float32", check_kwargs: dict | None = None):
    """A :class:`DrawnLayer`: configuration (from ``configs`` or ``kinds``), input shape, seeds.

    Notes the replay snippet (``check_kwargs`` are written into its
    ``assert_gradients_agree`` call), so a falsifying example prints it.
    """
    config = draw(configs if configs is not None else layer_configs(kinds), label="layer")
    shape = draw(input_shapes(config, max_batch=max_batch), label="input shape")
    drawn = DrawnLayer(config, shape, draw(st.integers(0, 2**16), label="param seed"),
                       draw(st.integers(0, 2**16), label="input seed"), kink_free=kink_free, dtype=dtype)
    note("replay this example:\n" + drawn.replay(**(check_kwargs or {})))
    return drawn

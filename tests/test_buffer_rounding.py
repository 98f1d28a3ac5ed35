"""A running statistic is as precise as the values it summarises, at their scale, not at its own.

EfficientNet-B0 at 32x32 with a batch of two normalises two values per channel in its last
BatchNorms.  Its float64 forward amplifies rounding: the values entering ``blocks.6.0.bn2`` differ
across correct backends by up to 1.6e-7 of their root mean square in a few channels (6e-15 in the
median one).  Where a channel's two values nearly cancel, its running mean ``0.1 * mean(x)``
inherits that error at the scale of ``x``, not of the mean, and its relative tolerance
(``rtol * |b|``) does not cover it.  At one initialisation this failed
``blocks.5.3.bn2.running_mean``, 1.35e-8 off (2.36x its tolerance), and blamed torch.  Averaging
two values is not the cause: each kernel's mean of two numbers is one rounding of the mean itself
(``test_the_kernels_average_identical_values_alike``).

``compare.statistic_scales`` holds each updated buffer relative to the update's operands as well as
its own value, and a running mean also relative to its channel's spread (the square root of its
running variance).  The disagreement is built here at that point, with each backend's own
BatchNorm kernel: a small model does not amplify rounding that far, and where one was made to (a
1e8 offset that BatchNorm removes), the float64 reach probe held the buffer and failed its
gradients.  A small torch model (1x1 spatial, batch 2, values that nearly cancel, a pretrained
running mean meeting a batch of the other sign) agrees on ten seeds through ``from_torch``, its
running means judged at their statistics' scale.  It agreed before as well, at 1e-7 of its
tolerance: it is well conditioned.  A running mean 1e-4 wrong on any one backend, with nothing
else wrong, is still caught and blamed on that backend.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradcheck import ops
from gradcheck.backends import reference_rank
from gradcheck.check import verdict
from gradcheck.check.compare import compare_leaf, statistic_scales
from gradcheck.check.runner import RunOptions, run_case
from gradcheck.check.tolerance import IMPRECISE_FACTOR, IMPRECISE_FLOOR, ToleranceRules
from gradcheck.frontends.torch import from_torch

MOMENTUM = 0.1
WRONG = 1e-4  # a running mean this much too large, relatively: a small error, outside any rounding


# ---------------------------------------------------------------- the mechanism, at the point
def _cancelling_batch(seed: int, channels: int = 64) -> np.ndarray:
    """Two values per channel (batch 2, 1x1 spatial); in half the channels their mean is 1e-3 of their size."""
    rng = np.random.default_rng(seed)
    x0, x1 = rng.standard_normal(channels), rng.standard_normal(channels) + 0.5
    half = np.arange(channels) % 2 == 0
    x1 = np.where(half, -x0 * (1 + 2e-3 * rng.standard_normal(channels)), x1)
    return np.stack([x0, x1]).reshape(2, channels, 1, 1)


def _with_rounding(x: np.ndarray, seed: int, rel: float) -> np.ndarray:
    """``x`` as one backend receives it: each value off by ``rel`` of its channel's root mean square (the
    amplified float64 rounding measured on EfficientNet-B0, where it reached 1.6e-7)."""
    rng = np.random.default_rng([seed, 7])
    rms = np.sqrt(np.mean(x ** 2, axis=(0, 2, 3), keepdims=True))
    return x + rel * rms * rng.standard_normal(x.shape)


def _kernel_stats(backend: str, x: np.ndarray, mean0: np.ndarray, var0: np.ndarray):
    """The updated running mean and variance from that backend's own BatchNorm kernel, as numpy."""
    if backend == "torch":
        torch = pytest.importorskip("torch")
        conv = torch.tensor
    elif backend == "jax":
        pytest.importorskip("jax")
        from gradcheck.backends.jax.driver import configure_jax

        conv = configure_jax().numpy.asarray  # float64 on
    else:
        conv = np.asarray  # the tape's forward kernels are numpy's
    _, mean, var = ops.batch_norm(conv(x), conv(mean0), conv(var0), training=True, momentum=MOMENTUM)
    return np.asarray(mean, np.float64), np.asarray(var, np.float64)


BACKENDS = ("tape", "torch", "jax")


def _updated(seed: int, rel: float, mean0=None, var0=None, wrong: dict | None = None):
    x = _cancelling_batch(seed)
    c = x.shape[1]
    mean0 = np.zeros(c) if mean0 is None else mean0
    var0 = np.ones(c) if var0 is None else var0
    after = {}
    for i, b in enumerate(BACKENDS):
        mean, var = _kernel_stats(b, _with_rounding(x, seed * 10 + i, rel), mean0, var0)
        after[b] = {"bn.running_mean": mean * (wrong or {}).get(b, 1.0), "bn.running_var": var}
    return {"bn.running_mean": mean0, "bn.running_var": var0}, after


def _judged(before, after, path, scales=True):
    """The leaf as the runner judges an updated buffer: the case floor, and (``scales``) each statistic's scale."""
    floor = float(np.median([max(float(np.max(np.abs(v))) for v in bufs.values()) for bufs in after.values()]))
    scale = statistic_scales(before, after).get(path) if scales else None
    leaf = compare_leaf(path, "buffer", {b: after[b][path] for b in after}, dtype="float64", rules=ToleranceRules(),
                        case_scale=floor, value_scale=scale)
    verdict.decide(leaf, sorted(after, key=reference_rank), None)
    return leaf


def test_the_kernels_average_identical_values_alike():
    # The running mean of two values is one rounding of the mean: on the same values the three kernels agree to
    # a unit roundoff of the mean itself, however the values cancel.  The reduction order is not the cause.
    x = _cancelling_batch(0)
    mean0, var0 = np.zeros(x.shape[1]), np.ones(x.shape[1])
    means = [_kernel_stats(b, x, mean0, var0)[0] for b in BACKENDS]
    for m in means[1:]:
        assert np.all(np.abs(m - means[0]) <= 4 * np.finfo(float).eps * np.abs(means[0]))


@pytest.mark.parametrize("seed", range(5))
def test_a_running_mean_inherits_its_values_rounding_at_their_scale(seed):
    # Each backend's values off by 3e-8 of their scale, a fifth of what EfficientNet-B0 showed: the running mean
    # of a cancelling channel differs by ~3e-9, beyond rtol * |b| + 1e-9 * the largest buffer (the old floor).
    before, after = _updated(seed, rel=3e-8)
    old = _judged(before, after, "bn.running_mean", scales=False)
    assert old.verdict == "disagree", "the constructed point no longer shows the old false disagreement"
    new = _judged(before, after, "bn.running_mean")
    assert new.verdict == "agree", new.message
    assert max(p.headroom for p in new.pairs) < 0.2
    assert "the statistic's scale" in new.tolerance.rule
    # The variance's two terms, ``(1 - m) v`` and ``m var(x)``, are both >= 0: it cannot cancel, and agrees.
    assert _judged(before, after, "bn.running_var").verdict == "agree"


def test_a_pretrained_running_mean_that_the_update_cancels_is_held_to_the_update_operands():
    # A pretrained running mean meeting a batch mean of the other sign: b' = 0.9 b + 0.1 mean(x) ~ 0.  Its
    # rounding is at the scale of b, which b' no longer shows.
    x = _cancelling_batch(1)
    mu = np.mean(x, axis=(0, 2, 3))
    mean0 = -MOMENTUM / (1 - MOMENTUM) * mu * (1 + 1e-6)
    scales = statistic_scales({"ema.mean": mean0}, {"tape": {"ema.mean": 0.9 * mean0 + 0.1 * mu}})
    assert np.allclose(scales["ema.mean"], np.abs(mean0), rtol=1e-4)


def test_the_scales_come_from_the_case_values_and_the_median():
    before = {"bn.running_mean": np.zeros(3), "bn.running_var": np.ones(3), "fc.seen": np.zeros(3)}
    after = {b: {"bn.running_mean": np.array([0.01, -0.02, 0.0]), "bn.running_var": np.array([0.9, 1.6, 4.0]),
                 "fc.seen": np.array([1.0, 2.0, 3.0])} for b in BACKENDS}
    after["jax"]["bn.running_var"] = after["jax"]["bn.running_var"] * 100  # one backend's wrong variance
    scales = statistic_scales(before, after)
    np.testing.assert_allclose(scales["bn.running_mean"], np.sqrt([0.9, 1.6, 4.0]))  # not widened by jax's
    # A variance that shrank from 1 to 0.9 may have had 1 - m of 1 in it: 0.1 beyond |b'|; one that grew, nothing.
    np.testing.assert_allclose(scales["bn.running_var"], [0.1, 0.0, 0.0], atol=1e-15)
    assert "fc.seen" not in scales  # grew from 0: nothing beyond |b'|
    # flax names them mean and var; a mean with no variance beside it has only its update's operands.
    flax = statistic_scales({"batch_stats/BatchNorm_0/mean": np.zeros(2), "batch_stats/BatchNorm_0/var": np.ones(2)},
                            {"jax": {"batch_stats/BatchNorm_0/mean": np.ones(2), "batch_stats/BatchNorm_0/var": 4 * np.ones(2)}})
    np.testing.assert_allclose(flax["batch_stats/BatchNorm_0/mean"], [2.0, 2.0])
    assert statistic_scales({"m.running_mean": np.zeros(2)}, {"tape": {"m.running_mean": np.ones(2)}}) == {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_wrong_running_mean_at_that_point_is_still_caught(backend):
    before, after = _updated(0, rel=3e-8, wrong={backend: 1 + WRONG})
    leaf = _judged(before, after, "bn.running_mean")
    assert leaf.verdict == "disagree" and leaf.blame == [backend], leaf.message


# ---------------------------------------------------------------- a torch model through from_torch
def _model(seed: int, factor: float = 1.0):
    """Convolutions down to 1x1 spatial at batch 2: a BatchNorm there normalises two values per channel, and the next
    one sees values whose mean is a few hundredths of their size (a nearly odd function of the first's output).
    At odd seeds the statistics are pretrained: a running mean that the batch's pulls the other way.  Each
    BatchNorm's running mean comes out ``factor`` times too large when torch runs the module itself (the exported
    graph, which the tape and jax run, has it right): a fault of torch's alone."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class DriftingBatchNorm(nn.BatchNorm2d):
        def forward(self, x):
            y = super().forward(x)
            if self.training and factor != 1.0 and not torch.compiler.is_exporting():
                # Through .data: autograd saved the buffer, and its version must not move.
                self.running_mean.data.mul_(factor)
            return y

    class OneByOne(nn.Module):
        def __init__(self, c=24):
            super().__init__()
            self.stem = nn.Conv2d(3, c, 3, stride=2)
            self.reduce = nn.Conv2d(c, c, 3)
            self.bn1 = DriftingBatchNorm(c)
            self.mix = nn.Conv2d(c, c, 1, bias=False)
            self.bn2 = DriftingBatchNorm(c)
            self.head = nn.Linear(c, 5)

        def forward(self, x):
            x = self.bn1(self.reduce(torch.tanh(self.stem(x))))
            x = x + 0.05 * x * x  # nearly odd: the two values of a channel nearly cancel in the next BatchNorm
            x = self.bn2(self.mix(x))
            return self.head(x.flatten(1))

    torch.manual_seed(seed)
    model = OneByOne()
    if seed % 2:
        with torch.no_grad():
            for bn in (model.bn1, model.bn2):
                bn.running_mean.normal_(0.0, 0.5)
                bn.running_var.uniform_(0.5, 2.0)
    return model, torch.randn(2, 3, 7, 7)


def _run(seed: int, factor: float = 1.0):
    pytest.importorskip("jax")
    model, x = _model(seed, factor)
    return run_case(from_torch(model, x, seed=seed), RunOptions())


def _failing(res) -> str:
    return "\n".join(f"{leaf.path} [{leaf.role}] {leaf.verdict} blame={leaf.blame}: {leaf.message}"
                     for leaf in res.leaves if leaf.verdict not in ("agree", "vacuous"))


@pytest.mark.parametrize("seed", range(10))
def test_a_batchnorm_at_one_by_one_agrees(seed):
    res = _run(seed)
    assert not res.errors and not res.unavailable, (res.errors, res.unavailable)
    assert res.verdict == "agree", _failing(res)
    means = [leaf for leaf in res.leaves if leaf.path.endswith("running_mean")]
    assert [leaf.path for leaf in means] == ["bn1.running_mean", "bn2.running_mean"]
    assert all("the statistic's scale" in leaf.tolerance.rule for leaf in means)


def _wrong_on_tape(monkeypatch):
    from gradcheck.backends.tape import ops as tape_ops

    derived = ops.batch_norm.__wrapped__  # the op's own body: the tape has no kernel of its own for it

    def batch_norm(*args, **kwargs):
        y, mean, var = derived(*args, **kwargs)
        return y, (None if mean is None else ops.mul(mean, 1 + WRONG)), var

    monkeypatch.setattr(tape_ops, "batch_norm", batch_norm, raising=False)


def _wrong_on_jax(monkeypatch):
    pytest.importorskip("jax")
    from gradcheck.backends.jax import ops as jax_ops

    original = jax_ops.batch_norm

    def batch_norm(*args, **kwargs):
        y, mean, var = original(*args, **kwargs)
        return y, (None if mean is None else mean * (1 + WRONG)), var

    monkeypatch.setattr(jax_ops, "batch_norm", batch_norm)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_running_mean_wrong_on_one_backend_is_caught_and_blamed_on_it(monkeypatch, backend):
    factor = 1.0
    if backend == "tape":
        _wrong_on_tape(monkeypatch)
    elif backend == "jax":
        _wrong_on_jax(monkeypatch)
    else:
        factor = 1 + WRONG
    res = _run(0, factor)
    assert not res.errors and not res.unavailable, (res.errors, res.unavailable)
    bad = {leaf.path: leaf for leaf in res.leaves if leaf.verdict != "agree" and leaf.verdict != "vacuous"}
    assert set(bad) == {"bn1.running_mean", "bn2.running_mean"}, _failing(res)
    assert all(leaf.verdict == "disagree" and leaf.blame == [backend] for leaf in bad.values()), _failing(res)


# ---------------------------------------------------------------- float32 measured at the statistic's scale
def _centred_running_mean(rng, errors: dict[str, float]):
    """A running mean of centred values (~1e-17 in float64, channel spread ~1) and each backend's float32 result
    ``errors[name]`` of the spread away from it."""
    a64 = rng.standard_normal(16) * 1e-17
    spread = np.full(16, 1.0)
    a32 = {name: (a64 + e * rng.standard_normal(16) / 4).astype(np.float32) for name, e in errors.items()}
    return a32, {name: a64 for name in errors}, spread


@pytest.mark.parametrize("seed", range(5))
def test_float32_rounding_of_a_centred_running_mean_is_not_imprecise(seed):
    # torch's CPU batch_norm accumulates in double (error ~1e-9), the tape and jax in float32 (~1e-7): against
    # the 1e-17 mean alone both are ~1e9 and torch looks "100x better"; at the spread's scale all are rounding.
    a32, a64, spread = _centred_running_mean(np.random.default_rng(seed), {"tape": 1e-7, "torch": 1e-9, "jax": 1e-7})
    without = verdict.float32_part(a32, a64, factor=IMPRECISE_FACTOR, floor=IMPRECISE_FLOOR)
    assert without.verdict == "imprecise"  # what the statistic's own value alone says
    got = verdict.float32_part(a32, a64, factor=IMPRECISE_FACTOR, floor=IMPRECISE_FLOOR, value_scale=spread)
    assert got.verdict != "imprecise", got.message
    assert max(got.errors.values()) < 1e-6


@pytest.mark.parametrize("wrong", ["tape", "torch", "jax"])
def test_a_float32_running_mean_off_by_a_hundredth_of_its_spread_is_still_imprecise(wrong):
    errors = {"tape": 1e-7, "torch": 1e-7, "jax": 1e-7, wrong: 1e-2}
    a32, a64, spread = _centred_running_mean(np.random.default_rng(0), errors)
    got = verdict.float32_part(a32, a64, factor=IMPRECISE_FACTOR, floor=IMPRECISE_FLOOR, value_scale=spread)
    assert got.verdict == "imprecise" and got.imprecise == [wrong], got.message

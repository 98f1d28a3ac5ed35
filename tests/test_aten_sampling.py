"""The sampling lowerings of ``gradcheck/frontends/torch/aten.py`` that the nn sweep found missing.

Bicubic grid sampling, volumetric (3-d) grid sampling and antialiased
bicubic resizing, each through ``from_torch`` on all three backends, in every
padding mode and both corner conventions, at grid points past [-1, 1] so
that the padding is read: each must agree.  Each has a control, a plausibly
wrong lowering put in the table, which the node-by-node check must catch
(the tape and jax unavailable, naming the op) without blaming torch.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

from lowering_checks import Fn, assert_agree, assert_caught, checked  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from gradcheck import ops  # noqa: E402
from gradcheck.frontends.torch import aten  # noqa: E402

PADDINGS = (("zeros", False), ("border", True), ("reflection", False), ("reflection", True))


def t(*shape, seed=0, scale=1.0, low=None):
    """A float64 tensor: standard normal, or uniform in [low, low + scale) when ``low`` is given."""
    g = torch.Generator().manual_seed(seed)
    if low is not None:
        return torch.rand(*shape, generator=g, dtype=torch.float64) * scale + low
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


def _every_padding(mode):
    """``F.grid_sample`` in ``mode`` in each padding mode (both corner conventions for reflection), summed."""
    return Fn(lambda x, g: sum(F.grid_sample(x, g, mode=mode, padding_mode=p, align_corners=a) for p, a in PADDINGS))


def _shifted_one_pixel(right, width):
    """The right 3-d sampler reading every tap one pixel further along x (corners not aligned): an off-by-one."""
    step = np.array([2.0 / width, 0.0, 0.0])

    def wrong(ctx, input, grid, *args):  # noqa: A002
        return right(ctx, input, ops.add(grid, step), *args)

    return wrong


# ---------------------------------------------------------------- F.grid_sample, bicubic
@pytest.mark.parametrize("wrong", [False, True], ids=["right", "a=-0.5"])
def test_bicubic_grid_sampling_agrees_in_every_padding_mode(monkeypatch, wrong):
    op = "aten.grid_sampler_2d.default"
    if wrong:  # Keys' a = -0.5 (antialiased resizing's) where torch's grid sampler takes -0.75
        monkeypatch.setitem(aten.LOWERINGS, op, lambda ctx, x, g, mode, padding, corners: aten._grid_sample_bicubic(
            x, g, padding, corners, a=-0.5))
    res = checked(monkeypatch, _every_padding("bicubic"), t(1, 2, 4, 5), t(1, 3, 4, 2, seed=1, low=-1.6, scale=3.2))
    if wrong:
        assert_caught(res, op)
    else:
        assert_agree(res)


# ---------------------------------------------------------------- F.grid_sample, 3-d
@pytest.mark.parametrize("wrong", [False, True], ids=["right", "taps one pixel off"])
def test_volumetric_grid_sampling_agrees_in_every_padding_mode(monkeypatch, wrong):
    op = "aten.grid_sampler_3d.default"
    if wrong:
        monkeypatch.setitem(aten.LOWERINGS, op, _shifted_one_pixel(aten.LOWERINGS[op], 5))
    fixed = t(1, 2, 2, 3, 3, seed=2, low=-1.5, scale=3.0)  # nearest has no gradient in the grid: a constant one
    trilinear = _every_padding("bilinear")
    module = Fn(lambda x, g: trilinear(x, g).sum((2, 3, 4)) + F.grid_sample(
        x, fixed, mode="nearest", padding_mode="reflection", align_corners=True).sum((2, 3, 4)))
    res = checked(monkeypatch, module, t(1, 2, 3, 4, 5), t(1, 2, 3, 2, 3, seed=1, low=-1.6, scale=3.2))
    if wrong:
        assert_caught(res, op)
    else:
        assert_agree(res)


# ---------------------------------------------------------------- F.interpolate, bicubic with antialiasing
def _resized(x):
    """Down, up with corners aligned, and by scale factors (down in one dim, up in the other), flattened."""
    ys = (F.interpolate(x, (4, 3), mode="bicubic", antialias=True),
          F.interpolate(x, (9, 8), mode="bicubic", antialias=True, align_corners=True),
          F.interpolate(x, scale_factor=(0.6, 1.5), mode="bicubic", antialias=True))
    return torch.cat([y.flatten() for y in ys])


@pytest.mark.parametrize("wrong", [False, True], ids=["right", "bilinear filter"])
def test_antialiased_bicubic_resizing_agrees_down_and_up(monkeypatch, wrong):
    op = "aten._upsample_bicubic2d_aa.default"
    if wrong:  # the triangle filter, two taps wide, where torch's is the cubic one, four wide
        monkeypatch.setitem(aten.LOWERINGS, op, aten.LOWERINGS["aten._upsample_bilinear2d_aa.default"])
    res = checked(monkeypatch, Fn(_resized), t(1, 2, 7, 6))
    if wrong:
        assert_caught(res, op)
    else:
        assert_agree(res)

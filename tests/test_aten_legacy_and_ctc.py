"""Two lowerings of ``gradcheck/frontends/torch/aten.py`` that the nn sweep found missing: resizing and CTC.

``resize_``/``resize_as_`` reach a graph from a legacy ``autograd.Function``
(no ``setup_context``) traced as written (``nn.CrossMapLRN2d`` makes its
outputs so); ``aten._ctc_loss`` is ``F.ctc_loss``'s dynamic program.  Each
goes through ``from_torch`` on all three backends and must agree, and each
has a control: a plausibly wrong lowering put in the table, which the
node-by-node check must catch (the tape and jax unavailable, naming the op)
without blaming torch.  The CTC forward is also held to torch's kernel
directly, ``log_alpha`` included.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

from lowering_checks import assert_agree, assert_caught, checked  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from gradcheck import ops  # noqa: E402
from gradcheck.frontends.torch import aten  # noqa: E402


def t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ---------------------------------------------------------------- resize_, resize_as_
class _Grown(torch.autograd.Function):
    """A legacy Function: ``x * 2`` (2, 3) grown to (2, 4), its six values kept in row-major order, the two new
    elements (uninitialised in torch) filled before they are read; then times ``template``.  Grown by
    ``resize_as_`` or by ``resize_``."""

    @staticmethod
    def forward(ctx, x, template, how):
        ctx.save_for_backward(x, template)
        buf = x * 2.0
        if how == "resize_as_":
            buf.resize_as_(template)
        else:
            buf.resize_(2, 4)
        buf.view(-1).narrow(0, 6, 2).fill_(0.5)
        return buf * template

    @staticmethod
    def backward(ctx, g):
        x, template = ctx.saved_tensors
        grown = torch.cat([2.0 * x.reshape(-1), torch.full((2,), 0.5, dtype=x.dtype)]).reshape(2, 4)
        return 2.0 * (g * template).reshape(-1)[:6].reshape(2, 3), g * grown, None


class Grown(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how

    def forward(self, x, template):
        return _Grown.apply(x, template, self.how)


def _keeps_the_last(ctx, self, size, memory_format=None):
    """A wrong resize: the source's last elements kept (rotated by one) where torch keeps its first."""
    flat = ops.reshape(self, (-1,))
    have, n = ops.shape_of(flat)[0], int(np.prod(size))
    flat = ops.concatenate([ops.getitem(flat, slice(1, have)), ops.getitem(flat, slice(0, 1))])
    return ops.reshape(ops.concatenate([flat, ops.asarray(np.zeros(n - have), like=flat)]), tuple(size))


@pytest.mark.parametrize("wrong", [False, True], ids=["right", "keeps the wrong elements"])
@pytest.mark.parametrize("how, op", [("resize_as_", "aten.resize_as.default"), ("resize_", "aten.resize.default")])
def test_a_tensor_grown_by_resize_in_a_legacy_function_is_lowered_and_checked(monkeypatch, how, op, wrong):
    if wrong:
        if op == "aten.resize.default":
            monkeypatch.setitem(aten.LOWERINGS, op, _keeps_the_last)
        else:
            monkeypatch.setitem(aten.LOWERINGS, op, lambda ctx, self, template, memory_format=None: _keeps_the_last(
                ctx, self, ops.shape_of(template)))
    res = checked(monkeypatch, Grown(how), t(2, 3), t(2, 4, seed=1))
    if wrong:
        assert_caught(res, op)
    else:
        assert_agree(res)


# ---------------------------------------------------------------- aten._ctc_loss
# Sample 0 repeats a label (1, 1: the blank between is required); sample 1's input is shorter than the padded T.
TARGETS = torch.tensor([[1, 1, 2, 0], [3, 0, 0, 0], [2, 3, 2, 0]])
INPUT_LENGTHS, TARGET_LENGTHS = torch.tensor([7, 4, 6]), torch.tensor([3, 1, 3])


class CTC(nn.Module):
    """``F.ctc_loss`` of log-probabilities made in the module (torch's backward is the gradient through the
    log_softmax: ``tests/test_nn_sweep.py``'s CTCLoss case), in each reduction, with targets padded and
    concatenated, and with the blank last; the lengths as tensors (``_ctc_loss.Tensor``) and then as lists
    (``_ctc_loss.default``)."""

    def forward(self, z):
        lp = torch.log_softmax(z, 2)
        concatenated = torch.cat([TARGETS[i, :n] for i, n in enumerate(TARGET_LENGTHS.tolist())])
        losses = [F.ctc_loss(lp, TARGETS, INPUT_LENGTHS, TARGET_LENGTHS, reduction=r).reshape(-1)
                  for r in ("mean", "sum", "none")]
        losses.append(F.ctc_loss(lp, concatenated, INPUT_LENGTHS, TARGET_LENGTHS, reduction="none"))
        losses.append(F.ctc_loss(lp, TARGETS - 1 + (TARGETS == 0).long() * 4, INPUT_LENGTHS, TARGET_LENGTHS,
                                 blank=4, reduction="none"))
        losses.append(F.ctc_loss(lp, TARGETS, INPUT_LENGTHS.tolist(), TARGET_LENGTHS.tolist(), reduction="none"))
        return torch.cat(losses)


def _blank_off_by_one(right):
    def wrong(ctx, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
        blank = (blank + 1) % ops.shape_of(log_probs)[2]
        return right(ctx, log_probs, targets, input_lengths, target_lengths, blank, zero_infinity)

    return wrong


def _without_skips(right):
    """The recursion without the transition from s-2 over a blank: only repeats of a state and steps by one."""
    def wrong(ctx, *args, **kwargs):
        labels = aten._ctc_labels
        aten._ctc_labels = lambda *a: (labels(*a)[0], np.zeros_like(labels(*a)[1]))
        try:
            return right(ctx, *args, **kwargs)
        finally:
            aten._ctc_labels = labels

    return wrong


@pytest.mark.parametrize("wrong", [None, _blank_off_by_one, _without_skips],
                         ids=["right", "blank off by one", "no skip over a blank"])
def test_ctc_loss_is_lowered_and_agrees_in_every_reduction_and_target_form(monkeypatch, wrong):
    op = "aten._ctc_loss.Tensor"
    if wrong is not None:
        monkeypatch.setitem(aten.LOWERINGS, op, wrong(aten.LOWERINGS[op]))
    res = checked(monkeypatch, CTC(), t(7, 3, 5))
    if wrong is not None:
        assert_caught(res, op)
    else:
        assert_agree(res)


class _Ctx:
    floats, node, op = np.dtype(np.float64), None, "aten._ctc_loss.Tensor"


@pytest.mark.parametrize("targets, input_lengths, target_lengths, blank", [
    (TARGETS, INPUT_LENGTHS, TARGET_LENGTHS, 0),
    (torch.tensor([1, 1, 2, 3, 2, 3, 2]), INPUT_LENGTHS, TARGET_LENGTHS, 0),  # concatenated
    (torch.tensor([[1, 2, 0], [3, 3, 3], [1, 0, 0]]), torch.tensor([7, 3, 0]), torch.tensor([2, 3, 0]), 4),
    (torch.tensor([[1, 2], [3, 0]]), torch.tensor([5, 6]), torch.tensor([0, 1]), 2),
], ids=["padded", "concatenated", "infeasible and empty input", "empty target"])
def test_ctc_loss_forward_and_log_alpha_are_torchs(targets, input_lengths, target_lengths, blank):
    """The lowering on numpy against torch's kernel in float64: the losses (inf where no alignment fits, 0 for an
    empty input and target), and log_alpha's shape, its -inf states and its values where torch writes them."""
    lp = torch.log_softmax(t(7, len(input_lengths), 5, seed=3), 2)
    nll_t, la_t = aten._ctc_defined(None, (lp, targets, input_lengths, target_lengths),
                                    torch.ops.aten._ctc_loss.Tensor(lp, targets, input_lengths, target_lengths, blank))
    nll, la = aten.ctc_loss(_Ctx(), lp.numpy(), targets.numpy(), input_lengths.numpy(), target_lengths.numpy(), blank)
    np.testing.assert_allclose(nll, nll_t.numpy(), rtol=1e-12, atol=0)
    assert la.shape == tuple(la_t.shape)
    np.testing.assert_array_equal(np.isneginf(la), np.isneginf(la_t.numpy()))
    finite = np.isfinite(la_t.numpy())
    np.testing.assert_allclose(la[finite], la_t.numpy()[finite], rtol=1e-12, atol=0)

"""Lowerings of matrix bookkeeping found missing by torch's OpInfo samples (``benchmarks/opinfo_sweep.py``):
``diagonal`` (every offset and pair of dims), ``addmv`` and ``addbmm``.  Each agrees on the tape, torch and jax, and
a wrong form of each (the diagonal one off, the batch not summed) is caught by the node-by-node check, the tape and
jax reported unavailable and torch not blamed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

from lowering_checks import ALL, assert_agree, assert_caught  # noqa: E402
from torch import nn  # noqa: E402

from gradcheck import ops  # noqa: E402
from gradcheck.check.runner import RunOptions, run_case  # noqa: E402
from gradcheck.frontends.torch import aten, from_torch  # noqa: E402


class _Matrices(nn.Module):
    def forward(self, x, m, v, b1, b2, s):
        return (torch.diagonal(x, 1, 0, 2) * 1.0, torch.diagonal(x, -1, 2, 1) * 1.0, torch.trace(x[0]) * 1.0,
                torch.addmv(v[:3], m, v, beta=0.5, alpha=2.0), torch.addbmm(s, b1, b2, beta=0.3, alpha=1.5))


def _inputs():
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 4, 5), (3, 4), (4,), (2, 3, 4), (2, 4, 2), (3, 2)]
    return [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]


def _off_by_one_diagonal(ctx, self, offset=0, dim1=0, dim2=1):
    return aten.diagonal(ctx, self, offset + 1, dim1, dim2)


def _batch_not_summed(ctx, self, batch1, batch2, beta=1, alpha=1):
    return aten.addmm(ctx, self, ops.getitem(batch1, 0), ops.getitem(batch2, 0), beta, alpha)


@pytest.mark.parametrize("wrong", [None, ("aten.diagonal.default", _off_by_one_diagonal),
                                   ("aten.addbmm.default", _batch_not_summed)],
                         ids=["right", "control: diagonal one off", "control: batch not summed"])
def test_matrix_bookkeeping_is_lowered_and_checked(monkeypatch, wrong):
    monkeypatch.setenv("GRADCHECK_NO_CACHE", "1")
    if wrong is not None:
        monkeypatch.setitem(aten.LOWERINGS, *wrong)
    res = run_case(from_torch(_Matrices(), *_inputs(), mode="eval"), RunOptions(backends=ALL))
    assert not res.errors, res.errors
    if wrong is None:
        assert_agree(res)
        return
    assert_caught(res, wrong[0])

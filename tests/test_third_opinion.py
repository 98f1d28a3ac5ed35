"""Where a node's lowering and torch's kernel disagree, torch's own reference decomposition says which is wrong.

``third_opinion.consult``: the lowering check runs every node by torch's kernel and by gradcheck's lowering; when
they differ, torch's decomposition of the op (``torch._decomp``), where it does not call a kernel of the same name,
sides with one of them.  Checked here, end to end through ``from_torch`` on a small GELU network, on three seeds:

* a torch kernel replaced through ``torch.library`` with a wrong one (``aten::gelu`` on CPU, 1 % off): the message
  names torch's kernel as the likely one at fault and never calls it a bug of gradcheck, and torch's gradients,
  which no longer match its own forward, are blamed on torch by the referee;
* the clean control: the same network with torch's own kernel agrees on all three backends, nothing unavailable;
* the negative control: a wrong lowering of the same op is named as a bug in gradcheck's lowering table, with the
  decomposition siding with torch's kernel;
* where the decomposition cannot tell (none, or one that calls the op's own kernel), the message says either may
  be wrong.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

from torch import nn  # noqa: E402

from gradcheck import ops  # noqa: E402
from gradcheck.check.runner import RunOptions, run_case  # noqa: E402
from gradcheck.frontends.torch import aten, from_torch, third_opinion  # noqa: E402

ALL = ("tape", "torch", "jax")
LIKELY_KERNEL = "so torch's kernel of aten.gelu.default is the likely one at fault"
GRADCHECK_BUG = "so this is a bug in gradcheck/frontends/torch/aten.py"


def _gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def _gelu_derivative(x):
    return 0.5 * (1 + torch.erf(x / math.sqrt(2))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


@pytest.fixture(params=["forward only", "forward and backward"])
def wrong_gelu_kernel(request):
    """torch's CPU kernel of aten::gelu replaced by one 1 % off; "forward and backward" replaces gelu_backward's
    to match, so that torch's gradients are its own forward's and only the cross-check can find it."""
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # torch warns, once per process, that a registered kernel is overridden
        warnings.simplefilter("ignore")
        lib.impl("gelu", lambda x, approximate="none": _gelu(x) * 1.01, "CPU")
        if request.param == "forward and backward":
            lib.impl("gelu_backward", lambda g, x, approximate="none": g * _gelu_derivative(x) * 1.01, "CPU")
    yield request.param
    lib._destroy()


def _run(seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3))
    return run_case(from_torch(model, torch.randn(4, 6), name="gelu mlp", seed=seed), RunOptions(backends=ALL))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_wrong_torch_kernel_is_named_as_torchs_and_blamed_on_torch(wrong_gelu_kernel, seed):
    r = _run(seed)
    # The tape and jax run the graph as the op's decomposition computes it: the full cross-check.
    assert not r.unavailable and not r.errors and sorted(r.timings) == sorted(ALL), (r.unavailable, r.errors)
    (note,) = [n for n in r.notes if n.startswith("torch's own kernel is likely wrong")]
    assert "the lowering of aten.gelu.default disagrees with torch's aten.gelu.default" in note, note
    assert "agrees with the lowering, not with torch's kernel" in note and LIKELY_KERNEL in note, note
    assert "bug in gradcheck" not in note and "module 1 (GELU)" in note, note
    wrong = [leaf for leaf in r.leaves if leaf.verdict == "disagree"]
    assert r.verdict == "disagree", [(x.path, x.verdict, x.message) for x in r.leaves]
    # The output (by majority) and the second Linear's weight, whose gradient reads the GELU's values (by the
    # referee); the leaves before the GELU only see its backward, which is torch's own in "forward only".
    assert {"output", "2.weight"} <= {leaf.path for leaf in wrong}
    assert all(leaf.blame == ["torch"] for leaf in wrong)
    o = r.origin
    assert (o.path, o.layer, o.kind, o.blame, o.op) == ("1", "GELU", "forward", ["torch"], "aten.gelu.default"), o


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_clean_control_agrees_on_all_three_backends(seed):
    r = _run(seed)
    assert r.verdict == "agree" and not r.unavailable and not r.errors, (r.unavailable, r.errors)
    assert sorted(r.timings) == sorted(ALL)


def test_a_wrong_lowering_is_named_as_gradchecks_with_the_decomposition_siding_with_torch(monkeypatch):
    monkeypatch.setitem(aten.LOWERINGS, "aten.gelu.default", lambda ctx, x, approximate="none": ops.gelu(x, "tanh"))
    r = _run(0)
    assert set(r.unavailable) == {"tape", "jax"}, (r.unavailable, r.errors)
    for why in r.unavailable.values():
        assert "agrees with torch's kernel" in why and GRADCHECK_BUG in why, why
        assert "likely one at fault" not in why, why
    assert not any("torch" in leaf.blame for leaf in r.leaves)


def _differ(t, lo):
    return None if np.allclose(t.detach().numpy(), lo, rtol=1e-12, atol=0) else "differ"


def test_the_decomposition_sides_with_whichever_it_agrees_with_and_only_when_independent():
    x = torch.randn(3, 5, dtype=torch.float64)
    right = torch.ops.aten.gelu.default(x).numpy()
    off = right * 1.01
    consult = third_opinion.consult
    gelu = torch.ops.aten.gelu.default
    assert consult(gelu, (x,), {}, right, off, _differ).side == third_opinion.LOWERING_WRONG
    assert consult(gelu, (x,), {}, off, right, _differ).side == third_opinion.KERNEL_WRONG
    assert consult(gelu, (x,), {}, off, off * 1.01, _differ).side == third_opinion.OPEN  # neither
    assert consult(gelu, (x,), {}, right, right, _differ).side == third_opinion.OPEN  # both
    # exp's decomposition calls prims.exp, which runs torch's exp kernel: no independent opinion.
    e = consult(torch.ops.aten.exp.default, (x,), {}, np.exp(x.numpy()) * 1.01, np.exp(x.numpy()), _differ)
    assert e.side == third_opinion.OPEN and "calls the same op's kernel" in e.why
    # convolution has no decomposition at all.
    w = torch.randn(2, 1, 3, dtype=torch.float64)
    args = (x[None, :1], w, None, [1], [0], [1], False, [0], 1)
    out = torch.ops.aten.convolution.default(*args).numpy()
    c = consult(torch.ops.aten.convolution.default, args, {}, out, out * 2, _differ)
    assert c.side == third_opinion.OPEN and "no reference decomposition" in c.why

"""Where a node's lowering and torch's kernel disagree, torch's own reference decomposition says which is wrong.

``third_opinion.consult``: the lowering check runs every node by torch's kernel and by gradcheck's lowering; when
they differ, torch's decomposition of the op (``torch._decomp``, as deep as the table goes), where it runs none of
the kernels torch's op runs, sides with one of them.  Checked here, end to end through ``from_torch`` on a small
network (Linear, LayerNorm, GELU, Linear), on three seeds:

* torch kernels replaced through ``torch.library`` with wrong ones, 1 % off (``aten::gelu``'s forward; its
  forward and backward together, which torch alone against the referee cannot see; ``native_layer_norm``'s
  forward, under the graph's composite ``layer_norm``): the case is cross-checked in full, its notes name torch's
  kernel as the likely fault and never call it a bug of gradcheck, torch is blamed, and the origin is the
  module of the wrong kernel, a forward divergence;
* the clean control: the same network with torch's own kernels agrees on all three backends, nothing unavailable;
* the negative control: a wrong lowering is named as a bug in gradcheck's lowering table, with the decomposition
  siding with torch's kernel;
* where the decomposition cannot tell (none, or one that runs the op's own kernel), it says so.
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
GRADCHECK_BUG = "so this is a bug in gradcheck/frontends/torch/aten.py"


def _gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def _gelu_derivative(x):
    return 0.5 * (1 + torch.erf(x / math.sqrt(2))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _layer_norm(x, shape, weight, bias, eps):
    dims = tuple(range(-len(shape), 0))
    mean = x.mean(dims, keepdim=True)
    rstd = torch.rsqrt(((x - mean) ** 2).mean(dims, keepdim=True) + eps)
    return (x - mean) * rstd * 1.01 * weight + bias, mean, rstd


# Each wrong kernel: what is replaced, and the node, module and op the check must name.
#  * gelu's forward alone: torch's backward (gelu_backward) is still right;
#  * gelu's forward and backward together, 1 % off: torch's gradients are its own forward's, so only the
#    cross-check can find it (torch alone against the referee on its own forward passed it);
#  * native_layer_norm's forward, under the captured graph's aten.layer_norm (a composite op, which has no
#    decomposition of its own and runs native_layer_norm's kernel): the decomposition is taken one level deeper.
KERNELS = {
    "gelu forward": ({"gelu": lambda x, approximate="none": _gelu(x) * 1.01}, "2", "GELU", "aten.gelu.default"),
    "gelu forward and backward": ({"gelu": lambda x, approximate="none": _gelu(x) * 1.01,
                                   "gelu_backward": lambda g, x, approximate="none": g * _gelu_derivative(x) * 1.01},
                                  "2", "GELU", "aten.gelu.default"),
    "native_layer_norm forward": ({"native_layer_norm": _layer_norm}, "1", "LayerNorm", "aten.layer_norm.default"),
}


@pytest.fixture(params=sorted(KERNELS))
def wrong_kernel(request):
    """torch's CPU kernels replaced through torch.library (restored after the test)."""
    kernels, *named = KERNELS[request.param]
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # torch warns, once per process, that a registered kernel is overridden
        warnings.simplefilter("ignore")
        for op, fn in kernels.items():
            lib.impl(op, fn, "CPU")
    yield named
    lib._destroy()


def _run(seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 3))
    return run_case(from_torch(model, torch.randn(4, 6), name="mlp", seed=seed), RunOptions(backends=ALL))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_wrong_torch_kernel_is_named_as_torchs_and_blamed_on_torch(wrong_kernel, seed):
    path, layer, op = wrong_kernel
    r = _run(seed)
    # The tape and jax run the graph as the op's decomposition computes it: the full cross-check.
    assert not r.unavailable and not r.errors and sorted(r.timings) == sorted(ALL), (r.unavailable, r.errors)
    (note,) = [n for n in r.notes if n.startswith("torch's own kernel is likely wrong")]
    assert f"the lowering of {op} disagrees with torch's {op}" in note, note
    assert "agrees with the lowering, not with torch's kernel" in note, note
    assert f"so torch's kernel of {op} is the likely one at fault" in note, note
    assert "bug in gradcheck" not in note and f"module {path} ({layer})" in note, note
    wrong = [leaf for leaf in r.leaves if leaf.verdict == "disagree"]
    assert r.verdict == "disagree", [(x.path, x.verdict, x.message) for x in r.leaves]
    # The output (by majority) and the last Linear's weight, whose gradient reads the wrong kernel's values (by
    # the referee); the leaves before it see torch's backward, which "forward" alone leaves right.
    assert {"output", "3.weight"} <= {leaf.path for leaf in wrong}
    assert all(leaf.blame == ["torch"] for leaf in wrong)
    o = r.origin
    assert (o.path, o.layer, o.kind, o.blame, o.op) == (path, layer, "forward", ["torch"], op), o


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
    assert e.side == third_opinion.OPEN and "runs the kernel its op runs (exp)" in e.why
    # layer_norm, a composite op, has no decomposition of its own; native_layer_norm, whose kernel it runs, has.
    shape = [5]
    ln = torch.ops.aten.layer_norm.default
    right_ln = ln(x, shape).numpy()
    assert consult(ln, (x, shape), {}, right_ln * 1.01, right_ln, _differ).side == third_opinion.KERNEL_WRONG
    assert consult(ln, (x, shape), {}, right_ln, right_ln * 1.01, _differ).side == third_opinion.LOWERING_WRONG
    # convolution has no decomposition at all.
    w = torch.randn(2, 1, 3, dtype=torch.float64)
    args = (x[None, :1], w, None, [1], [0], [1], False, [0], 1)
    out = torch.ops.aten.convolution.default(*args).numpy()
    c = consult(torch.ops.aten.convolution.default, args, {}, out, out * 2, _differ)
    assert c.side == third_opinion.OPEN and "no reference decomposition" in c.why

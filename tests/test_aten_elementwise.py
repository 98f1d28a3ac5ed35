"""Elementwise math ops composed from ``gradcheck.ops`` (asin, atan2, fmax, ...): lowered, run and checked.

Each op runs in a tiny module through ``from_torch`` on the tape, torch and
jax, in float64, at inputs inside its domain and away from its kinks; the
node-by-node check holds each lowering's value to torch's and the referee
the gradients.  The controls swap in a plausibly wrong lowering (the natural
log for log2, atan2 without its quadrant, sinh with a sign flipped): the
node-by-node check catches it and does not blame torch.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

from lowering_checks import ALL, assert_agree, assert_caught  # noqa: E402
from torch import nn  # noqa: E402

from gradcheck import ops  # noqa: E402
from gradcheck.check.runner import RunOptions, run_case  # noqa: E402
from gradcheck.frontends.torch import aten, from_torch  # noqa: E402


class _Op(nn.Module):
    """``op(*inputs) * 1.0``; ``consts`` are buffers handed to the op after the inputs (not differentiated)."""

    def __init__(self, op, consts=()):
        super().__init__()
        self.op = op
        for i, c in enumerate(consts):
            self.register_buffer(f"c{i}", torch.tensor(c, dtype=torch.float64))
        self.n_consts = len(consts)

    def forward(self, *xs):
        consts = [getattr(self, f"c{i}") for i in range(self.n_consts)]
        return self.op(*xs, *consts) * 1.0


def _t(values):
    return torch.tensor(values, dtype=torch.float64)


# Inside each domain, away from its kinks and edges: small and large magnitudes, negative values, near the ends.
UNIT = [-0.97, -0.5, -1e-3, 2e-4, 0.3, 0.9]  # asin, acos, atanh: inside (-1, 1)
WIDE = [-30.0, -2.5, -1e-4, 3e-3, 0.7, 12.0]
POSITIVE = [1e-3, 0.2, 1.0 + 1e-6, 8.0, 50.0, 1e5]  # 8 = 2^3: log2's exact value
Y_QUADRANTS = [0.8, 1.5, -0.4, -2.0, 1.0, -3.0]  # atan2: all four quadrants, and x = 0 both ways
X_QUADRANTS = [1.2, -0.3, -1.7, 0.6, 0.0, 0.0]
CASES = {
    "asin": (torch.asin, [UNIT]),
    "acos": (torch.acos, [UNIT]),
    "atanh": (torch.atanh, [UNIT]),
    "acosh": (torch.acosh, [[1.05, 1.2, 1.5, 4.0, 300.0, 1e6]]),  # the referee's probes step ~1% off 1
    "asinh": (torch.asinh, [WIDE]),
    "sinh": (torch.sinh, [WIDE]),
    "cosh": (torch.cosh, [WIDE]),
    "tan": (torch.tan, [[-1.5, -0.7, -1e-3, 0.4, 1.45, 3.0]]),
    "log2": (torch.log2, [POSITIVE]),
    "log10": (torch.log10, [POSITIVE]),
    "exp2": (torch.exp2, [[-40.0, -3.5, -1e-3, 0.5, 7.0, 60.0]]),
    "atan2": (torch.atan2, [Y_QUADRANTS, X_QUADRANTS]),
    "copysign": (torch.copysign, [[-2.0, -0.3, 1e-3, 0.5, 4.0, -7.0], [1.0, -2.0, -0.5, 3.0, -1e-3, 0.25]]),
    "fmax": (torch.fmax, [[-2.0, -0.3, 1e-3, 0.5, 4.0, -7.0], [1.0, -2.0, -0.5, 3.0, -1e-3, 0.25]]),
    "fmin": (torch.fmin, [[-2.0, -0.3, 1e-3, 0.5, 4.0, -7.0], [1.0, -2.0, -0.5, 3.0, -1e-3, 0.25]]),
    "ldexp": (torch.ldexp, [[-2.0, -0.3, 1e-3, 0.5, 4.0, -7.0], [3.0, -2.0, 0.0, 5.0, -10.0, 1.0]]),
    # No gradient of their own: the op acts on constants, its result scales the input.
    "nextafter": (lambda x, a, b: x * torch.nextafter(a, b), [WIDE], [[1.0, -1.0, 0.0, 2.5, -3.0, 1e-3], WIDE]),
    # Its gradient in self is 1 (self moved by one ulp): torch's OpInfo samples found the lowering giving 0.
    "nextafter, differentiated": (lambda x, b: torch.nextafter(x, b), [WIDE], [[1.0, -1.0, 0.0, 2.5, -3.0, 1e-3]]),
    "isinf": (lambda x, a: x * torch.isinf(torch.exp(a)), [WIDE], [[800.0, 1.0, 750.0, 0.0, -3.0, 710.0]]),  # inf
}


def _case(name):
    op, inputs, *consts = CASES[name]
    return from_torch(_Op(op, *consts), *(_t(v) for v in inputs), seed=0)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # isinf's infinities, made by exp
@pytest.mark.parametrize("name", sorted(CASES))
def test_an_elementwise_op_is_lowered_and_agrees_on_every_backend(monkeypatch, name):
    monkeypatch.setenv("GRADCHECK_NO_CACHE", "1")
    assert_agree(run_case(_case(name), RunOptions(backends=ALL)))


# Plausible bugs: each computes something smooth and finite, so only the node-by-node comparison finds it.
WRONG = {
    "aten.log2.default": lambda ctx, self: ops.log(self),  # the natural log
    "aten.atan2.default": lambda ctx, self, other: ops.atan(ops.div(self, other)),  # no quadrant correction
    "aten.sinh.default": lambda ctx, self: ops.mul(ops.add(ops.exp(self), ops.exp(ops.neg(self))), 0.5),  # a sign
}


@pytest.mark.filterwarnings("ignore:divide by zero encountered")  # the wrong atan2's y / x at x = 0
@pytest.mark.parametrize("op", sorted(WRONG), ids=lambda op: op.split(".")[1])
def test_a_wrong_lowering_is_caught_by_the_node_check_and_torch_is_not_blamed(monkeypatch, op):
    monkeypatch.setitem(aten.LOWERINGS, op, WRONG[op])
    monkeypatch.setenv("GRADCHECK_NO_CACHE", "1")
    assert_caught(run_case(_case(op.split(".")[1]), RunOptions(backends=ALL)), op)


class _LdexpInt(nn.Module):
    """torch.ldexp with an integer exponent held as a buffer, negative ones included."""

    def __init__(self):
        super().__init__()
        self.register_buffer("e", torch.tensor([3, -2, 0, -1]))

    def forward(self, x):
        return torch.ldexp(x, self.e) * 1.0


def test_torchs_ldexp_gradient_with_integer_exponents_is_held_to_the_referee(monkeypatch):
    """torch 2.13's backward of ldexp with an integer exponent computes 2**e in integers, 0 for e < 0, where the
    forward scales by 0.25: the referee, the tape and jax agree against torch's gradient.  Decided by what torch
    computes here, so the test holds on a torch that mends it (then every backend agrees)."""
    monkeypatch.setenv("GRADCHECK_NO_CACHE", "1")
    x = _t([0.5, -1.0, 2.0, 3.0])
    probe = x.clone().requires_grad_()
    torch.ldexp(probe, torch.tensor([3, -2, 0, -1])).sum().backward()
    torch_wrong = not torch.allclose(probe.grad, _t([8.0, 0.25, 1.0, 0.5]))
    res = run_case(from_torch(_LdexpInt(), x, mode="eval"), RunOptions(backends=ALL))
    assert not res.errors and not res.unavailable, (res.errors, res.unavailable)
    if not torch_wrong:
        assert res.verdict == "agree"
        return
    (bad,) = [leaf for leaf in res.leaves if leaf.verdict != "agree"]
    assert bad.path == "input" and bad.verdict == "disagree" and bad.blame == ["torch"], bad.message

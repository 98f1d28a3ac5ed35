"""A float64 pass that moves a few leaves of a from_torch graph recomputes only what they reach, and is exact.

``gradcheck.frontends.torch.reuse``: a pass made under the reference forward's
recording takes the reference's values for the nodes no moved leaf reaches.
The tests hold that to a full pass: the same loss to the bit and the same
count of crossed kink decisions for every leaf moved alone (far enough to cross
relu and max-pool kinks), the same case results, and with a wrong gradient
injected on each backend the same blame, with the reuse shown to have happened
each time.  The full pass is the same code with nothing kept
(``reuse.LIMIT_BYTES = 0``).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import torch_families  # noqa: E402
from test_own_torch_model import _mlp_case, _wrong_jax, _wrong_tape  # noqa: E402

from gradcheck.check.runner import CaseRun, RunOptions, run_case  # noqa: E402
from gradcheck.frontends.torch import from_torch, reuse  # noqa: E402
from gradcheck.results import to_dict  # noqa: E402


@pytest.fixture
def reused(monkeypatch):
    """How many nodes the passes took from the reference, per pass."""
    counts = []
    real = reuse.Kept.reusable

    def counted(self, values):
        names = real(self, values)
        counts.append(len(names))
        return names

    monkeypatch.setattr(reuse.Kept, "reusable", counted)
    return counts


def _full(monkeypatch):
    monkeypatch.setattr(reuse, "LIMIT_BYTES", 0)


@pytest.mark.parametrize("family", ["plain", "gpt_sdpa", "lstm_lm"])
def test_each_leaf_moved_alone_gives_the_full_pass_loss_and_kink_count(family, monkeypatch, reused):
    module, inputs = torch_families.FAMILIES[family]()
    case = from_torch(module, *inputs, seed=0)
    fast = CaseRun(case)
    with monkeypatch.context() as m:
        _full(m)
        full = CaseRun(case)
    rng = np.random.default_rng(0)
    crossed = 0
    for path, value in fast.float_leaves().items():
        for step in (1e-6, 0.5):  # a referee's step, and a move far enough to cross kinks
            moved = {path: value + step * rng.standard_normal(np.shape(value)) * max(1.0, float(np.max(np.abs(value))))}
            a, b = fast.loss64(moved), full.loss64(moved)
            assert a == b, (path, step, a, b)
            crossed += a[1]
    assert sum(reused) > 0, "no pass reused a node"
    if family == "plain":
        assert crossed > 0  # the large moves crossed relu and max-pool kinks, and both passes counted them alike


def _summary(res):
    return ([(leaf.path, leaf.verdict, tuple(leaf.blame), leaf.inherited, [to_dict(r) for r in leaf.referee])
             for leaf in res.leaves], res.verdict, res.referee_passes, res.notes, res.errors)


@pytest.mark.parametrize("family", ["plain", "gpt_sdpa", "unet"])
def test_a_case_refereed_leaf_by_leaf_decides_what_the_full_passes_decide(family, monkeypatch, reused):
    module, inputs = torch_families.FAMILIES[family]()
    options = RunOptions(backends=("tape", "torch"), referee="leaves")
    fast = _summary(run_case(from_torch(module, *inputs, seed=1), options))
    assert sum(reused) > 0
    with monkeypatch.context() as m:
        _full(m)
        full = _summary(run_case(from_torch(module, *inputs, seed=1), options))
    assert fast == full
    # each refereed leaf took its passes: two where the referee confirmed backends that agree (referee.check)
    assert fast[1] == "agree" and fast[2] >= 2 * len([leaf for leaf in fast[0] if leaf[-1]])


@pytest.mark.parametrize("wrong, blame", [(lambda mp: "wrong", "torch"), (_wrong_tape, "tape"), (_wrong_jax, "jax"),
                                          (lambda mp: "tanh", None)], ids=["torch", "tape", "jax", "clean"])
def test_a_wrong_gradient_on_each_backend_is_blamed_with_the_passes_reused(wrong, blame, monkeypatch, reused):
    res = run_case(_mlp_case(kind=wrong(monkeypatch)), RunOptions(referee="leaves"))
    assert sum(reused) > 0
    if blame is None:
        assert res.verdict == "agree" and not res.errors, res.notes
        return
    assert res.verdict == "disagree"
    off = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert off and all(leaf.blame == [blame] for leaf in off), [(leaf.path, leaf.blame) for leaf in off]
    # Some leaf's own finite difference, taken with the reused passes, holds the blamed backend alone wrong.
    assert any(leaf.referee and all(r.agrees != (r.backend == blame) for r in leaf.referee) for leaf in off)

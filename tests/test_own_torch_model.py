"""A user's own torch model, first class: localised inside it, its randomness, its conventions, its custom kernels.

Every behaviour has its negative control: a fault injected on the backend
the test names (torch through the module's own code, the tape and jax through
their op modules), with the clean model beside it, asserting the origin and
the blame exactly.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

from lowering_checks import ALL, assert_agree, assert_caught, failing  # noqa: E402
from own_models import CachedDecoder, ResidualMLP  # noqa: E402
from torch import nn  # noqa: E402

from gradcheck import ops  # noqa: E402
from gradcheck.backends.tape import ops as tape_ops  # noqa: E402
from gradcheck.check.runner import AHEAD_OF_LOCALISING, RunOptions, run_case  # noqa: E402
from gradcheck.frontends.torch import aten, capture, from_torch, lowering  # noqa: E402


# ---------------------------------------------------------------- localised inside the user's module
def _mlp_case(odd=3, kind="silu", seed=0):
    torch.manual_seed(seed)
    return from_torch(ResidualMLP(odd, kind), torch.randn(5, 12), seed=seed)


def _assert_origin(res, path, blame):
    assert res.verdict == "disagree", failing(res)
    assert res.origin is not None, failing(res)
    assert res.origin.path == path and res.origin.layer == "Act" and res.origin.kind == "vjp", res.origin
    assert res.origin.blame == [blame], res.origin
    off = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    upstream = [leaf for leaf in off if leaf.path.startswith(("blocks.0.", "blocks.1.", "blocks.2."))]
    assert upstream and all(leaf.inherited and leaf.blame == [blame] for leaf in upstream), failing(res)
    downstream = [leaf for leaf in res.leaves if leaf.path.startswith(("blocks.4.", "blocks.5.", "head."))
                  and leaf.role == "param"]
    assert downstream and all(leaf.verdict in ("agree", "vacuous") for leaf in downstream), failing(res)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_wrong_autograd_function_is_found_in_its_submodule_and_blamed_on_torch(seed):
    res = run_case(_mlp_case(kind="wrong", seed=seed))
    _assert_origin(res, "blocks.3.act", "torch")
    assert "blocks.3.act (Act)" in res.origin.message and "own_models.py:" in res.origin.message
    assert any("per-layer replay:" in n and "origin vjp at blocks.3.act" in n for n in res.notes)


def test_the_same_model_with_a_correct_function_agrees_submodule_by_submodule():
    res = run_case(_mlp_case(kind="silu"), RunOptions(per_layer=True))
    assert_agree(res)
    assert res.origin is None
    replay = [n for n in res.notes if n.startswith("per-layer replay:")]
    assert replay and "every layer's own backward and forward agree" in replay[0], res.notes


def test_a_wrong_tape_vjp_inside_one_submodule_is_found_there_and_blamed_on_the_tape(monkeypatch):
    res = run_case(_mlp_case(kind=_wrong_tape(monkeypatch)))
    _assert_origin(res, "blocks.3.act", "tape")


def test_a_wrong_jax_gradient_inside_one_submodule_is_found_there_and_blamed_on_jax(monkeypatch):
    res = run_case(_mlp_case(kind=_wrong_jax(monkeypatch)))
    _assert_origin(res, "blocks.3.act", "jax")


# With the referee over its budget (every large model), the disagreeing leaves wait for localisation: the two
# nearest the output are refereed at once, the origin's replay is refereed on the layer alone, and the leaves
# that only inherit its error take its blame.  The first pass replays the blamed backend and one other.
OVER_BUDGET = RunOptions(referee_budget_s=0.0)


def _wrong_tape(monkeypatch):
    original = tape_ops.tanh.vjps[0]
    monkeypatch.setitem(tape_ops.tanh.vjps, 0, lambda g, ans, x: ops.mul(original(g, ans, x), 1.001))
    return "tanh"


def _wrong_jax(monkeypatch):
    import jax

    from gradcheck.backends.jax import ops as jax_ops

    @jax.custom_vjp
    def tanh(x):
        return jax.numpy.tanh(x)

    tanh.defvjp(lambda x: (jax.numpy.tanh(x), jax.numpy.tanh(x)), lambda y, g: (g * (1 - y * y) * 1.001,))
    monkeypatch.setattr(jax_ops, "tanh", tanh)
    return "tanh"


@pytest.mark.parametrize("wrong, blame", [(lambda mp: "wrong", "torch"), (_wrong_tape, "tape"), (_wrong_jax, "jax")],
                         ids=["torch", "tape", "jax"])
def test_over_the_referee_budget_the_inherited_leaves_wait_for_the_origin_and_take_its_blame(monkeypatch, wrong,
                                                                                              blame):
    res = run_case(_mlp_case(kind=wrong(monkeypatch)), OVER_BUDGET)
    _assert_origin(res, "blocks.3.act", blame)
    waited = [n for n in res.notes if "were not refereed apart" in n]
    assert waited and "blocks.3.act (Act)" in waited[0], res.notes
    # Only the leaves nearest the output were refereed before localising; every other inherited leaf waited.
    inherited = [leaf for leaf in res.leaves if leaf.inherited]
    assert sum(1 for leaf in inherited if leaf.referee) <= AHEAD_OF_LOCALISING < len(inherited), failing(res)
    assert all(leaf.blame == [blame] for leaf in inherited), failing(res)
    first = [n for n in res.notes if n.startswith("per-layer replay: every layer on")]
    assert first and f"blames {blame}" in first[0] and "only where they disagree" in first[0], res.notes


def test_with_two_backends_the_inherited_leaves_are_blamed_through_the_origin():
    # No majority between two backends: without the origin, nobody could be blamed for the inherited leaves.
    res = run_case(_mlp_case(kind="wrong"), RunOptions(backends=("tape", "torch"), referee_budget_s=0.0))
    assert res.origin is not None and res.origin.blame == ["torch"], failing(res)
    waited = [leaf for leaf in res.leaves if leaf.inherited and not leaf.referee]
    assert waited and all(leaf.blame == ["torch"] and "inherits the error of blocks.3.act" in leaf.message
                          for leaf in waited), failing(res)


def test_over_the_referee_budget_a_correct_model_still_agrees():
    res = run_case(_mlp_case(kind="silu"), OVER_BUDGET)
    assert_agree(res)
    assert not any("were not refereed apart" in n for n in res.notes), res.notes


def test_the_root_is_never_named_when_nothing_was_replayed(monkeypatch):
    from gradcheck.frontends.torch import units

    monkeypatch.setattr(units, "record", lambda program, cr: ([], ["per-submodule replay: (test) none recorded"]))
    res = run_case(_mlp_case(kind="wrong"))
    assert res.verdict == "disagree"
    assert res.origin is None
    assert any("no layer could be replayed alone" in n for n in res.notes), res.notes


def test_a_reproducer_of_a_torch_origin_replays_it_with_torch_alone(tmp_path):
    res = run_case(_mlp_case(kind="wrong"), RunOptions(repro=str(tmp_path)))
    assert res.origin is not None and res.origin.path == "blocks.3.act"
    folder = tmp_path / "ResidualMLP" / "blocks.3.act"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "call.pt", "layer.npz", "meta.json",
                                                         "module.pt", "repro_torch.py"]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))
    # gradcheck cannot be imported where the script runs: it needs torch, numpy and the model's own module.
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "gradcheck.py").write_text("raise ImportError('the reproducer must not import gradcheck')\n")
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), os.path.dirname(__file__)])
    run = subprocess.run([sys.executable, str(folder / "repro_torch.py")], capture_output=True, text=True, env=env,
                         cwd=str(tmp_path), timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr  # torch's backward disagrees with the reference now
    assert "RESULT input.0 disagree" in run.stdout, run.stdout
    assert "reference from jax" in run.stdout or "reference from tape" in run.stdout, run.stdout


# ---------------------------------------------------------------- a custom kernel and its reference
@torch.library.custom_op("gctest::fused_gelu", mutates_args=())
def fused_gelu(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.gelu(x, approximate="tanh")


fused_gelu.register_fake(lambda x: torch.empty_like(x))
_KERNEL_ERROR = {"factor": 1.0}  # the kernel's backward is off by this factor


def _fused_gelu_backward(ctx, g):
    (x,) = ctx.saved_tensors
    with torch.enable_grad():
        xx = x.detach().requires_grad_(True)
        (gx,) = torch.autograd.grad(nn.functional.gelu(xx, approximate="tanh"), xx, g)
    return gx * _KERNEL_ERROR["factor"]


fused_gelu.register_autograd(_fused_gelu_backward,
                             setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))


class FusedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(6, 10)
        self.down = nn.Linear(10, 3)

    def forward(self, x):
        return self.down(fused_gelu(self.up(x)))


def _gelu_reference(x):
    return nn.functional.gelu(x, approximate="tanh")


@pytest.mark.parametrize("error,blamed", [(1.0, None), (1.001, "torch")])
def test_a_custom_op_runs_its_reference_on_the_tape_and_jax_and_a_wrong_backward_is_torchs(monkeypatch, error,
                                                                                           blamed):
    monkeypatch.setitem(_KERNEL_ERROR, "factor", error)
    case = from_torch(FusedMLP(), torch.randn(4, 6), references={"gctest::fused_gelu": _gelu_reference})
    res = run_case(case)
    if blamed is None:
        assert_agree(res)
        return
    assert sorted(res.timings) == sorted(ALL) and not res.unavailable, res.unavailable  # the tape and jax ran
    off = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert off and all(leaf.blame == ["torch"] for leaf in off), failing(res)
    assert {leaf.path for leaf in off} == {"up.weight", "up.bias", "input"}, failing(res)
    assert res.origin is not None and res.origin.op == "gctest::fused_gelu", res.origin
    assert res.origin.path == "" or res.origin.blame == ["torch"]


def test_a_reference_that_computes_something_else_is_caught_before_torch_is_blamed():
    case = from_torch(FusedMLP(), torch.randn(4, 6),
                      references={"gctest::fused_gelu": lambda x: nn.functional.gelu(x)})  # exact, not tanh
    res = run_case(case)
    why = res.unavailable.get("tape", "")
    assert "the lowering of gctest.fused_gelu.default disagrees with torch's" in why, res.unavailable
    assert all(leaf.blame == [] for leaf in res.leaves if leaf.verdict != "agree"), failing(res)


def test_an_op_lowered_with_the_public_decorator_runs_on_the_tape_and_jax(monkeypatch):
    monkeypatch.setitem(_KERNEL_ERROR, "factor", 1.0)
    monkeypatch.setattr(aten, "LOWERINGS", dict(aten.LOWERINGS))
    from gradcheck.frontends.torch import capture, interpreter

    monkeypatch.setattr(capture, "LOWERINGS", aten.LOWERINGS)
    monkeypatch.setattr(interpreter, "LOWERINGS", aten.LOWERINGS)

    @lowering("gctest::fused_gelu")
    def _(x):
        return ops.gelu(x, approximate="tanh")

    assert_agree(run_case(from_torch(FusedMLP(), torch.randn(4, 6))))


# ---------------------------------------------------------------- conventions torch declares
class Tokens(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(10, 6, **kw)
        with torch.no_grad():
            self.emb.weight.normal_()  # the padding row too: the convention, not a zero row, must hold it
        self.lin = nn.Linear(6, 3)

    def forward(self, ids):
        return torch.tanh(self.lin(self.emb(ids)))


IDS = torch.tensor([[1, 2, 2, 3, 1], [4, 1, 5, 2, 9]])


@pytest.mark.parametrize("kw,note", [
    ({"padding_idx": 1}, "row 1 of emb.weight is torch's padding_idx: its gradient is held at zero by convention"),
    ({"scale_grad_by_freq": True}, "emb.weight: scale_grad_by_freq divides each row's gradient"),
    ({"padding_idx": 2, "scale_grad_by_freq": True}, "row 2 of emb.weight is torch's padding_idx"),
    ({"max_norm": 1.0}, "emb.weight: max_norm=1.0 renormalises the rows the batch looks up"),
    ({"sparse": True}, None),
])
def test_an_embedding_convention_is_followed_by_every_backend_and_stated(kw, note):
    case = from_torch(Tokens(**kw), IDS)
    if note:
        assert any(n.startswith(note) for n in case.notes), case.notes
    assert_agree(run_case(case))


def test_a_tape_that_lets_a_gradient_through_the_padding_row_is_blamed_on_the_tape(monkeypatch):
    # The tape's stop_gradient passes the gradient on: the padding row gets one there alone.
    monkeypatch.setattr(tape_ops, "stop_gradient", lambda x: ops.add(x, 0.0))
    res = run_case(from_torch(Tokens(padding_idx=1), IDS))
    leaf = next(x for x in res.leaves if x.path == "emb.weight")
    assert leaf.verdict == "disagree" and leaf.blame == ["tape"], failing(res)
    # The referee holds the padding row fixed: it sides with torch and jax, which follow the convention.
    assert {c.backend for c in leaf.referee if c.stable and c.agrees} == {"torch", "jax"}, leaf.referee


class StraightThrough(nn.Module):
    """A straight-through estimator: the forward rounds, the gradient passes as if it did not."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(5, 5)

    def forward(self, x):
        y = self.lin(x)
        return y + (torch.round(y * 4) / 4 - y).detach()


def test_a_detached_value_is_held_fixed_by_the_referee_too():
    case = from_torch(StraightThrough(), torch.randn(3, 5))
    assert any("the forward detaches" in n for n in case.notes), case.notes
    assert_agree(run_case(case))


def test_without_holding_the_detached_value_the_referee_would_measure_another_function(monkeypatch):
    from gradcheck.check import kinks

    monkeypatch.setattr(kinks, "_held", lambda state, run, args, kwargs: run(*args, **kwargs))
    res = run_case(from_torch(StraightThrough(), torch.randn(3, 5)))
    assert res.verdict != "agree"  # the mechanism is what makes the previous test agree


class BranchingStraightThrough(StraightThrough):
    """The straight-through estimator behind a branch on a value, which torch.export refuses: traced at the example."""

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            y = torch.tanh(y)
        return y + (torch.round(y * 4) / 4 - y).detach()


def test_a_detached_value_stays_detached_where_the_module_is_traced_at_the_example(monkeypatch):
    """The trace at the example is made twice (``capture._functional``); make_fx, given no decomposition table,
    rewrites a detach to an alias from torch 2.14 on, and the tape and jax would then differentiate the stopped
    term.  The graph keeps the detach on every torch, and the three backends agree."""
    case = from_torch(BranchingStraightThrough(), torch.randn(3, 5, generator=torch.Generator().manual_seed(0)))
    assert any("traced at the example inputs instead" in n for n in case.notes), case.notes
    assert any("the forward detaches 1 value" in n for n in case.notes), case.notes
    assert_agree(run_case(case))


# ---------------------------------------------------------------- the case's randomness
class DropPath(nn.Module):
    """timm's DropPath (``drop_path``): ``keep + torch.rand(...)``, floored, per sample."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        keep = 1 - self.p
        mask = keep + torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype, device=x.device)
        mask.floor_()
        return x.div(keep) * mask


class DropPathBlock(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.2)
        self.path = DropPath(0.5)

    def forward(self, x):
        return x + self.path(self.drop(torch.tanh(self.lin(x))))


def test_droppath_with_torch_rand_agrees_in_train_mode_and_says_what_was_drawn():
    case = from_torch(DropPathBlock(), torch.randn(6, 8))
    assert any("random draws (dropout, rand) come from the case seed" in n for n in case.notes), case.notes
    res = run_case(case)
    assert_agree(res)
    assert not any(leaf.nondeterministic for leaf in res.leaves)


def test_without_the_case_draws_torch_draws_its_own_and_the_other_backends_cannot_follow(monkeypatch):
    from gradcheck.frontends.torch import randomness

    # Every draw torch's run makes is its own generator's (which each forward starts at one state, so the run
    # repeats itself): the graph's draws are the case's, and the lowering check stops the tape and jax.
    monkeypatch.setattr(randomness, "torch_value", lambda func, args, kwargs, draw: func(*args, **kwargs))
    res = run_case(from_torch(DropPathBlock(), torch.randn(6, 8)))
    assert sorted(res.unavailable) == ["jax", "tape"], failing(res)
    assert all("disagrees with torch's aten.native_dropout" in why for why in res.unavailable.values())


class EveryDraw(nn.Module):
    """One of each random op a forward may make; each draw's value reaches the output."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        x = self.lin(x)
        y = x + torch.randn_like(x) + torch.rand_like(x) + torch.rand(x.shape) + torch.randn(x.shape)
        z = torch.empty_like(x).normal_(0, 2) + torch.empty_like(x).uniform_(-1, 1)
        z = z + torch.empty_like(x).exponential_(2.0)
        b = torch.bernoulli(torch.sigmoid(x).detach()) + x.new_empty(x.shape).bernoulli_(0.7)
        i = torch.randint(0, 4, (3,))
        p = torch.randperm(4)
        m1 = torch.multinomial(torch.softmax(x[0].detach(), -1), 2)
        m2 = torch.multinomial(torch.softmax(x.detach(), -1), 3, replacement=True)
        n = torch.normal(x, 0.5)
        return y + z * x + b * x + n + x[:, p] + x[:, i].sum() + x[:, m1].sum() + x[:, m2[0]].sum()


def test_every_random_op_is_drawn_once_from_the_case_seed():
    case = from_torch(EveryDraw(), torch.randn(2, 4))
    assert any(n.startswith("14 random draws") for n in case.notes), case.notes
    res = run_case(case)
    assert_agree(res)
    other = run_case(from_torch(EveryDraw(), torch.randn(2, 4), seed=1))
    assert_agree(other)
    assert not np.isclose(res.leaves[0].referee[0].numeric if res.leaves[0].referee else 0.0, 1e9)


def test_the_graph_and_torch_get_the_same_draws():
    case = from_torch(EveryDraw(), torch.randn(2, 4))
    model = case.build(np.random.default_rng(0))
    x = case.inputs(np.random.default_rng(0))[0].astype(np.float64)
    from gradcheck.case import cast_floats
    from gradcheck.tree import map_leaves

    model64 = cast_floats(model, np.float64)
    graph_out = np.asarray(model64(x))
    torch_tree = map_leaves(model64, lambda path, v, kind: torch.from_numpy(np.array(v, copy=True)))
    torch_out = model._program.call(torch_tree, (torch.from_numpy(x),)).detach().numpy()
    np.testing.assert_allclose(graph_out, torch_out, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- captured at the example point
class GaussianHead(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)
        self.loss = nn.GaussianNLLLoss()

    def forward(self, x, target, var):
        return self.loss(self.lin(x), target, var)


@pytest.mark.parametrize("name", ["batch_norm_momentum_none", "gaussian_nll_loss"])
def test_what_torch_export_refuses_is_traced_at_the_example_and_checked_on_every_backend(name):
    torch.manual_seed(0)
    if name == "batch_norm_momentum_none":
        module, inputs = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=None)), (
            torch.randn(2, 3, 6, 6),)
    else:
        module, inputs = GaussianHead(), (torch.randn(3, 4), torch.randn(3, 4), torch.rand(3, 4) + 0.1)
    case = from_torch(module, *inputs)
    note = next(n for n in case.notes if n.startswith("torch.export refused"))
    assert "traced at the example inputs instead" in note
    assert ("batchnorm.py" if name.startswith("batch") else "functional.py") in note  # torch's line that branches
    assert_agree(run_case(case))


class _BranchingMLP(ResidualMLP):
    """``ResidualMLP`` with a branch on a value, which torch.export refuses: traced at the example instead."""

    def forward(self, x):
        if x.abs().sum() > 0:
            x = x * 1.0
        return super().forward(x)


def _traced_case(kind):
    torch.manual_seed(0)
    case = from_torch(_BranchingMLP(3, kind), torch.randn(5, 12), seed=0)
    assert any(n.startswith("torch.export refused") for n in case.notes), case.notes
    return case


@pytest.mark.parametrize("wrong, blame", [(lambda mp: "wrong", "torch"), (_wrong_tape, "tape"), (_wrong_jax, "jax")],
                         ids=["torch", "tape", "jax"])
def test_a_model_traced_at_the_example_is_localised_inside_it_too(monkeypatch, wrong, blame):
    # The trace records the module calls each node was made in, as torch.export does; without them no
    # submodule could be replayed and no origin was named (transformers' wav2vec2, Longformer, Mixtral).
    res = run_case(_traced_case(wrong(monkeypatch)))
    _assert_origin(res, "blocks.3.act", blame)


def test_a_function_without_setup_context_is_traced_as_written_where_functionalisation_refuses_it(monkeypatch):
    # the control: traced only through functorch's functionalize, the hand-written kernel cannot be captured
    from gradcheck.frontends.torch import capture

    monkeypatch.setattr(capture, "_as_written", _refused)
    monkeypatch.setenv("GRADCHECK_NO_CACHE", "1")
    torch.manual_seed(0)
    with pytest.raises(capture.CaptureError, match="setup_context"):
        from_torch(_BranchingMLP(3, "wrong"), torch.randn(5, 12), seed=0)


class _Doubled(torch.autograd.Function):
    """A right hand-written kernel, without setup_context."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class _SelectWriter(nn.Module):
    """Branches on a value (torch.export refuses), applies a hand-written kernel (functionalize refuses) and writes
    one column: traced as written, the write is a ``select_scatter``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if x.abs().sum() > 0:
            x = x * 1.0
        y = _Doubled.apply(self.lin(x))
        z = y * 1.0
        z[:, 1] = torch.tanh(y[:, 2])
        return z


@pytest.mark.parametrize("wrong", [False, True], ids=["right", "index off by one"])
def test_a_write_in_a_model_traced_as_written_is_lowered_and_checked(monkeypatch, wrong):
    op = "aten.select_scatter.default"
    if wrong:  # the control: a plausible bug in the lowering is caught by the node-by-node check, not blamed on torch
        right = aten.LOWERINGS[op]
        monkeypatch.setitem(aten.LOWERINGS, op, lambda ctx, self, src, dim, index: right(ctx, self, src, dim, index + 1))
    monkeypatch.setenv("GRADCHECK_NO_CACHE", "1")
    torch.manual_seed(0)
    res = run_case(from_torch(_SelectWriter(), torch.randn(3, 4), seed=0), RunOptions(backends=ALL))
    if not wrong:
        assert_agree(res)
        return
    assert_caught(res, op)


def test_a_model_traced_at_the_example_agrees_submodule_by_submodule_when_right():
    res = run_case(_traced_case("silu"), RunOptions(per_layer=True))
    assert_agree(res)
    assert res.origin is None
    replay = [n for n in res.notes if n.startswith("per-layer replay:")]
    assert replay and "every layer's own backward and forward agree" in replay[0], res.notes


def _cached_case(kind="silu"):
    torch.manual_seed(0)
    return from_torch(CachedDecoder(1, kind), torch.randn(5, 12), seed=0)


def test_a_model_handing_cache_objects_to_its_submodules_agrees_layer_by_layer():
    res = run_case(_cached_case(), RunOptions(per_layer=True))
    assert_agree(res)
    assert res.origin is None
    replay = [n for n in res.notes if n.startswith("per-layer replay:")]
    assert replay and "every layer's own backward and forward agree" in replay[0], res.notes


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "control"])
def test_a_call_that_fills_a_cache_object_is_replayed_with_the_object_as_it_was_handed(monkeypatch, fresh):
    # Each submodule call is replayed with its stateful arguments as they were when it was made.  The control:
    # handed the cache the forward filled, torch's replay of a gate takes its keys from it instead of computing
    # (and differentiating) them, and the gate was named the origin, blamed on torch (Whisper's cross-attention).
    from gradcheck.frontends.torch import units

    if not fresh:
        monkeypatch.setattr(units, "_fresh", lambda x: x)
    res = run_case(_cached_case(_wrong_tape(monkeypatch)))
    assert res.verdict == "disagree", failing(res)
    assert res.origin is not None, failing(res)
    if fresh:
        assert (res.origin.path, res.origin.blame) == ("blocks.1.act", ["tape"]), (res.origin, res.notes)
    else:
        assert res.origin.path.endswith(".cross") and res.origin.blame == ["torch"], (res.origin, res.notes)


class _Attention(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)

    def forward(self, h):
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        a = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.2 if self.training else 0.0)
        return h + torch.tanh(self.out(a))


class SpeechLike(nn.Module):
    """What wav2vec2 does in training, in small: the four things its capture needed.

    Its feature encoder sets ``requires_grad`` on a view of the input; its time
    mask is drawn with numpy's global generator; each layer is dropped when
    ``torch.rand([])`` falls below ``layerdrop``, a branch on a random value
    that torch.export refuses (the graph is traced at the example); and its
    attention drops out inside ``scaled_dot_product_attention``, which the
    trace decomposes into in-place draws.
    """

    def __init__(self, layerdrop=0.4, width=8):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(4, width)
        self.layers = nn.ModuleList([_Attention(width) for _ in range(4)])
        self.mask_embed = nn.Parameter(torch.rand(width))
        self.layerdrop = layerdrop

    def forward(self, x):
        h = x[:, None]
        if self.training:
            h.requires_grad = True
        h = self.proj(h[:, 0])
        if self.training:
            masked = torch.from_numpy(np.random.rand(*h.shape[:2]) < 0.3)
            h = torch.where(masked[..., None], self.mask_embed, h)
        for layer in self.layers:
            if self.training and torch.rand([]) < self.layerdrop:
                continue
            h = layer(h)
        return h


def _speech_case(seed, model=None):
    x = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(seed))
    return from_torch(model or SpeechLike().train(), x, seed=seed)


def test_a_speech_model_in_training_is_checked_on_every_backend_at_every_seed():
    layers = []
    for seed in (0, 1, 2):
        case = _speech_case(seed)
        notes = "\n".join(case.notes)
        assert "traced at the example inputs instead" in notes
        assert "input 0 is one the module sets requires_grad on itself" in notes
        assert "numpy's or Python's global random generator" in notes
        assert "decides a branch of the graph traced at the example inputs" in notes
        res = run_case(case, RunOptions(backends=ALL))
        assert_agree(res)
        assert res.float32 == "ok", failing(res)
        # The layers LayerDrop keeps have gradients; the dropped ones have none, on every backend.
        kept = {leaf.path.split(".")[1] for leaf in res.leaves
                if leaf.path.startswith("layers.") and leaf.verdict == "agree"}
        dropped = {leaf.path.split(".")[1] for leaf in res.leaves
                   if leaf.path.startswith("layers.") and leaf.verdict == "vacuous"}
        assert kept and dropped and not kept & dropped, failing(res)
        layers.append((kept, dropped))
    assert layers[0] == layers[1] == layers[2]  # the coins are the capture's, whatever the case seed


def test_without_the_captures_coins_torch_takes_other_branches_on_some_seed(monkeypatch):
    from gradcheck.frontends.torch import randomness

    monkeypatch.setattr(randomness, "_deciding", lambda nodes: set())  # every draw from the case seed
    outcomes = []
    for seed in (0, 1, 2):
        res = run_case(_speech_case(seed), RunOptions(backends=ALL))
        outcomes.append(bool(res.errors) or res.verdict != "agree")
    assert any(outcomes)


def test_without_fixing_numpys_generator_torch_is_nondeterministic(monkeypatch):
    import contextlib

    from gradcheck.frontends.torch import randomness

    monkeypatch.setattr(randomness, "host_generators", lambda on_draw=None: contextlib.nullcontext())
    res = run_case(_speech_case(0), RunOptions(backends=ALL))
    assert res.verdict != "agree" and any(leaf.verdict == "nondeterministic" and leaf.blame == ["torch"]
                                          for leaf in res.leaves), failing(res)


class _WrongAttention(_Attention):
    """A gradient hook that scales what flows back (torch's gradient only: a graph holds no hooks).  Not an
    autograd.Function: a graph traced at the example is functionalised by torch.func, which takes none."""

    def forward(self, h):
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        a = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.2 if self.training else 0.0)
        out = self.out(a)
        if out.requires_grad:
            out.register_hook(lambda g: g * 1.01)
        return h + torch.tanh(out)


def _speech_with_wrong_torch():
    model = SpeechLike()
    model.layers = nn.ModuleList([_WrongAttention(8) for _ in range(4)])
    torch.manual_seed(0)
    model.layers.load_state_dict(SpeechLike().layers.state_dict())
    return model.train()


@pytest.mark.parametrize("backend", ["torch", "tape", "jax"])
def test_a_wrong_gradient_in_the_speech_model_is_blamed_on_its_backend(backend, monkeypatch):
    if backend == "torch":
        model = _speech_with_wrong_torch()
    else:
        model = None
        if backend == "tape":
            _wrong_tape(monkeypatch)
        else:
            _wrong_jax(monkeypatch)
    res = run_case(_speech_case(0, model), RunOptions(backends=ALL))
    assert not res.errors and not res.unavailable, failing(res)
    off = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert off and all(leaf.blame == [backend] for leaf in off), failing(res)


class TinyMoE(nn.Module):
    """Mixtral's sparse experts as transformers writes them (its eager path): routing by top-k, a loop over the
    experts hit (``nonzero``, a branch torch.export refuses), ``torch.where`` for each one's tokens, and
    ``index_add_`` of their weighted outputs."""

    def __init__(self, width=6, experts=4, top_k=2):
        super().__init__()
        torch.manual_seed(0)
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList([nn.Sequential(nn.Linear(width, 8), nn.SiLU(), nn.Linear(8, width))
                                      for _ in range(experts)])
        self.top_k, self.n = top_k, experts

    def forward(self, x):
        weights, chosen = torch.topk(torch.softmax(self.router(x), -1), self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        mask = nn.functional.one_hot(chosen, self.n).permute(2, 1, 0)
        for e in (mask.sum(dim=(-1, -2)) > 0).nonzero():
            slot, token = torch.where(mask[e[0]])
            out.index_add_(0, token, self.experts[e[0]](x[token]) * weights[token, slot, None])
        return out


@pytest.mark.parametrize("seed", [0, 1])
def test_sparse_experts_are_checked_on_every_backend(seed):
    x = torch.randn(7, 6, generator=torch.Generator().manual_seed(seed))
    case = from_torch(TinyMoE(), x, seed=seed)
    assert any("traced at the example inputs instead" in note for note in case.notes)
    res = run_case(case, RunOptions(backends=ALL))
    assert_agree(res)
    assert res.float32 == "ok", failing(res)


def test_a_wrong_expert_gradient_on_jax_is_blamed_on_jax(monkeypatch):
    import jax

    from gradcheck.backends.jax import ops as jax_ops

    @jax.custom_vjp
    def silu(x):
        return jax.nn.silu(x)

    silu.defvjp(lambda x: (jax.nn.silu(x), x), lambda x, g: (g * jax.grad(lambda v: jax.nn.silu(v).sum())(x) * 1.01,))
    monkeypatch.setattr(jax_ops, "silu", silu)
    res = run_case(from_torch(TinyMoE(), torch.randn(7, 6, generator=torch.Generator().manual_seed(0))),
                   RunOptions(backends=ALL))
    off = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert off and all(leaf.blame == ["jax"] for leaf in off), failing(res)


# ---------------------------------------------------------------- gradient checkpointing
class _CheckpointedBlock(nn.Module):
    def __init__(self, hook=None):
        super().__init__()
        self.lin, self.mix = nn.Linear(8, 8), nn.Linear(8, 8)
        self.drop = nn.Dropout(0.25)
        self.hook = hook  # a gradient hook: torch's gradient alone (a graph holds no hooks)

    def forward(self, x):
        h = torch.relu(self.lin(x)).float()  # an RMSNorm's cast: float64 in a float64 run
        h = torch.tanh(self.mix(h))
        if self.hook is not None and h.requires_grad:
            h.register_hook(self.hook)
        return x + self.drop(h)


class Checkpointed(nn.Module):
    """Residual blocks run through ``torch.utils.checkpoint``, as transformers' ``gradient_checkpointing_enable()``
    and timm's ``set_grad_checkpointing()`` run theirs: torch recomputes each block's forward inside the backward,
    its dropout draws, its relu (a kink a pinned float32 run takes the reference's side of) and its cast too."""

    def __init__(self, reentrant=False, preserve_rng_state=True, hook=None, checkpointing=True):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([_CheckpointedBlock(hook) for _ in range(3)])
        self.head = nn.Linear(8, 3)
        self.reentrant, self.preserve, self.checkpointing = reentrant, preserve_rng_state, checkpointing

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        for block in self.blocks:
            x = (checkpoint(block, x, use_reentrant=self.reentrant, preserve_rng_state=self.preserve)
                 if self.checkpointing else block(x))
        return self.head(x)


def _checkpointed_case(seed=0, **kw):
    return from_torch(Checkpointed(**kw), torch.randn(5, 8, generator=torch.Generator().manual_seed(seed)), seed=seed)


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")  # the referee's runs: no gradient there
@pytest.mark.parametrize("reentrant, seed", [(False, 0), (False, 1), (True, 2)])
def test_a_checkpointed_model_is_checked_on_every_backend(reentrant, seed):
    res = run_case(_checkpointed_case(seed, reentrant=reentrant), RunOptions(backends=ALL))
    assert_agree(res)
    assert res.float32 == "ok" and not res.unpinned, failing(res)  # the recompute took the pinned kinks again
    assert any("3 random draws (dropout x3) come from the case seed" in n for n in res.notes), res.notes


def _close_now(monkeypatch):
    from gradcheck.frontends.torch import eager

    monkeypatch.setattr(eager, "hold", lambda setup: setup.close())


def _no_function_mode_in_backward(monkeypatch):
    from gradcheck.frontends.torch import eager

    monkeypatch.setattr(eager, "_backward_under", lambda functions: contextlib.nullcontext())


def _no_replay(monkeypatch):
    from gradcheck.frontends.torch import randomness

    monkeypatch.setattr(randomness.CaseRandom, "_position", lambda self: (self.k, False))  # every draw a new one


def _autograd_grad_only(monkeypatch):
    from gradcheck.backends.torch import driver

    monkeypatch.setattr(driver, "_custom_function", lambda loss: False)


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
@pytest.mark.parametrize("without, reentrant, says", [
    (_close_now, False, "must have the same dtype"),  # the recompute meets the module's own float32 parameters
    (_no_function_mode_in_backward, False, "must have the same dtype"),  # its cast makes float32 there
    (_autograd_grad_only, True, "incompatible with .grad()"),
])
def test_without_each_part_of_the_held_call_torchs_recompute_fails(without, reentrant, says, monkeypatch):
    without(monkeypatch)
    res = run_case(_checkpointed_case(0, reentrant=reentrant), RunOptions(backends=ALL))
    assert res.verdict == "error" and any(says in str(e) for e in res.errors.values()), failing(res)


@pytest.mark.parametrize("backend", ["torch", "tape", "jax"])
def test_a_wrong_gradient_in_a_checkpointed_model_is_blamed_on_its_backend(backend, monkeypatch):
    hook = None
    if backend == "torch":
        hook = lambda g: g * 1.01  # noqa: E731
    elif backend == "tape":
        _wrong_tape(monkeypatch)
    else:
        _wrong_jax(monkeypatch)
    res = run_case(_checkpointed_case(1, hook=hook), RunOptions(backends=ALL))
    assert not res.errors and not res.unavailable, failing(res)
    off = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert off and all(leaf.blame == [backend] for leaf in off), failing(res)


class FromCounts(nn.Module):
    """Features made from integer counts (no gradient flows into them), then a checkpointed segment."""

    def __init__(self, reentrant):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.head = nn.Linear(8, 8), nn.Linear(8, 2)
        self.reentrant = reentrant

    def forward(self, counts):
        from torch.utils.checkpoint import checkpoint

        h = counts.to(torch.get_default_dtype()) / 5.0
        return self.head(checkpoint(lambda t: torch.tanh(self.lin(t)), h, use_reentrant=self.reentrant))


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
@pytest.mark.parametrize("reentrant", [True, False])
def test_a_reentrant_segment_whose_inputs_need_no_gradient_gives_none_and_torch_is_blamed(reentrant):
    counts = torch.randint(0, 10, (4, 8), generator=torch.Generator().manual_seed(0))
    res = run_case(from_torch(FromCounts(reentrant), counts), RunOptions(backends=ALL))
    if not reentrant:  # the control: torch's recommended checkpoint gives the segment's parameters their gradient
        assert_agree(res)
        return
    off = sorted(leaf.path for leaf in res.leaves if leaf.verdict == "disagree")
    assert off == ["lin.bias", "lin.weight"], failing(res)
    assert all(leaf.blame == ["torch"] for leaf in res.leaves if leaf.verdict == "disagree"), failing(res)
    assert "use_reentrant=True" in res.origin.message and "enable_input_require_grads" in res.origin.message


def _assert_recompute_drew_anew(res):
    """torch's recompute computed with other numbers than its forward: torch is blamed, and the notes say why."""
    assert not res.errors and not res.unavailable, failing(res)
    off = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert off and all(leaf.blame == ["torch"] for leaf in off), failing(res)
    assert any("it computes with other random numbers than the forward, so torch's gradient is not the forward's"
               in n for n in res.notes), res.notes


@pytest.mark.parametrize("without", [None, _no_replay])
def test_a_recompute_that_draws_anew_is_blamed_on_torch_and_told(without, monkeypatch):
    if without is None:  # torch's own way to it: checkpointing that does not put the generator back
        case = _checkpointed_case(0, preserve_rng_state=False)
    else:  # the replay off: every draw of the recompute is a new one
        without(monkeypatch)
        case = _checkpointed_case(0)
    _assert_recompute_drew_anew(run_case(case, RunOptions(backends=ALL)))


def _two_calls_in_one_backward(model):
    """The gradient of two torch calls of ``model`` (other inputs, other case seeds) held to one backward."""
    from gradcheck.backends.torch import driver
    from gradcheck.frontends.torch.eager import TorchFacts, call_torch

    draws = [("dropout", "uniform", (5, 8))] * 3
    state = {k: v.detach().double().requires_grad_() for k, v in model.state_dict().items()}
    x = torch.randn(5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with driver._held_to_backward():
        first = call_torch(model, state, (x,), {}, True, TorchFacts(0, draws))
        second = call_torch(model, state, (x * 0.5,), {}, True, TorchFacts(1, draws))
        return torch.autograd.grad((first * second).sum(), list(state.values()))


def test_segments_of_two_calls_recomputed_in_one_backward_repeat_their_own_calls_draws(monkeypatch):
    plain = _two_calls_in_one_backward(Checkpointed(checkpointing=False))
    for got, want in zip(_two_calls_in_one_backward(Checkpointed()), plain, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # the control: every draw taken as the innermost call's, the first call's recompute has no draw left to repeat
    from gradcheck.frontends.torch import randomness

    monkeypatch.setattr(randomness.CaseRandom, "_owner", lambda self: self)
    with pytest.raises(RuntimeError, match="torch's backward recomputes part of the forward"):
        _two_calls_in_one_backward(Checkpointed())



class _Reversible(torch.autograd.Function):
    """Reformer's reversible layer in small: no activations kept; its backward seeds torch as its forward did,
    recomputes the sublayer (its dropout included) and accumulates the sublayer's ``.grad`` itself."""

    @staticmethod
    def forward(ctx, x, layer, seed, *params):
        ctx.layer, ctx.seed = layer, seed
        with torch.no_grad():
            torch.manual_seed(seed)
            y = x + layer(x)
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            torch.manual_seed(ctx.seed)
            torch.autograd.backward(x + ctx.layer(x), g)
        return (x.grad, None, None) + (None,) * len(list(ctx.layer.parameters()))


class ReversibleLike(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Dropout(0.3))  # a pinned kink, then a draw
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(_Reversible.apply(x, self.layer, 1234, *self.layer.parameters()))


def _no_seeded_replay(monkeypatch):
    from gradcheck.frontends.torch import randomness

    monkeypatch.setattr(randomness.CaseRandom, "_owner", lambda self: self)
    monkeypatch.setattr(randomness.CaseRandom, "_position", lambda self: (self.k, False))


def _no_seeded_kinks(monkeypatch):
    from gradcheck.frontends.torch import eager

    monkeypatch.setattr(eager, "_seeded_kinks", lambda state: {})


@pytest.mark.parametrize("without", [None, _autograd_grad_only, _no_seeded_replay, _no_seeded_kinks])
def test_a_reversible_layer_that_seeds_torch_and_accumulates_its_own_grads_is_checked(without, monkeypatch):
    if without is not None:
        without(monkeypatch)
    res = run_case(from_torch(ReversibleLike(), torch.randn(4, 8, generator=torch.Generator().manual_seed(1)), seed=1),
                   RunOptions(backends=ALL))
    if without is None:
        assert_agree(res)
        assert not res.unpinned, res.notes  # its backward's relu repeats the forward's pinned decision
    elif without is _no_seeded_kinks:  # the backward's relu taken as a kink call the reference never made
        assert_agree(res)
        assert res.unpinned == ["torch"] and any("not pinned" in n for n in res.notes), res.notes
    elif without is _autograd_grad_only:  # autograd.grad takes none of the .grad the layer's backward accumulates
        off = sorted(leaf.path for leaf in res.leaves if leaf.verdict == "disagree")
        assert off == ["layer.0.bias", "layer.0.weight"] and res.origin.blame == ["torch"], failing(res)
    else:  # its recompute's draw taken as a new one
        _assert_recompute_drew_anew(res)


class _MixedPrecisionRMSNorm(torch.autograd.Function):
    """A fused RMSNorm's Python fallback, as mixed-precision libraries write it: the statistics in float32
    (``.float()``) whatever the input's dtype, and a hand-written backward that computes in float32 too."""

    @staticmethod
    def forward(ctx, x, weight, eps, wrong):
        xf = x.float()
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, r)
        ctx.wrong = wrong
        return (xf * r).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, g):
        x, weight, r = ctx.saved_tensors
        gf, n = (g * weight).float(), x.float() * r
        dx = r * (gf - n * (gf * n).mean(-1, keepdim=True)) * ctx.wrong
        return dx.to(x.dtype), (g * n.to(x.dtype)).sum(0), None, None


class MixedPrecisionNorm(nn.Module):
    def __init__(self, wrong=1.0):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.head = nn.Linear(8, 8), nn.Linear(8, 2)
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(8))
        self.wrong = wrong

    def forward(self, x):
        return self.head(torch.tanh(_MixedPrecisionRMSNorm.apply(self.lin(x), self.weight, 1e-6, self.wrong)))


def _mixed_precision_case(seed, wrong=1.0):
    return from_torch(MixedPrecisionNorm(wrong), torch.randn(4, 8, generator=torch.Generator().manual_seed(seed)),
                      seed=seed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_custom_function_whose_backward_computes_in_float32_is_run_in_float64_and_agrees(seed):
    """torch's function modes do not reach into a backward: without ``_backward_under`` the hand-written backward's
    ``.float()`` rounds torch's float64 run to float32, and a right backward is blamed for it (the control)."""
    res = run_case(_mixed_precision_case(seed), RunOptions(backends=ALL))
    assert_agree(res)
    assert res.float32 == "ok" and not res.unpinned, failing(res)


def test_without_the_function_mode_in_the_backward_a_right_custom_backward_is_blamed(monkeypatch):
    _no_function_mode_in_backward(monkeypatch)
    res = run_case(_mixed_precision_case(1), RunOptions(backends=ALL))
    off = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert off and all(leaf.blame == ["torch"] for leaf in off), failing(res)
    assert all(leaf.pairs and max(p.rel_err_norm for p in leaf.pairs) < 1e-5 for leaf in off)  # float32's rounding


@pytest.mark.parametrize("backend", ["torch", "tape", "jax"])
def test_a_wrong_gradient_beside_a_custom_function_is_blamed_on_its_backend(backend, monkeypatch):
    if backend == "tape":
        _wrong_tape(monkeypatch)
    elif backend == "jax":
        _wrong_jax(monkeypatch)
    res = run_case(_mixed_precision_case(2, wrong=1.001 if backend == "torch" else 1.0), RunOptions(backends=ALL))
    assert not res.errors and not res.unavailable, failing(res)
    off = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert off and all(leaf.blame == [backend] for leaf in off), failing(res)


class CheckpointedNorm(nn.Module):
    def __init__(self, checkpointing):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.bn, self.head = nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)
        self.checkpointing = checkpointing

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        def segment(t):
            return torch.tanh(self.bn(self.lin(t)))

        return self.head(checkpoint(segment, x, use_reentrant=False) if self.checkpointing else segment(x))


@pytest.mark.parametrize("checkpointing", [True, False])
def test_a_batchnorm_recomputed_in_the_backward_updates_its_statistics_twice_and_is_told(checkpointing):
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(2))
    res = run_case(from_torch(CheckpointedNorm(checkpointing), x), RunOptions(backends=ALL))
    told = [n for n in res.notes if "writes the buffers" in n and "bn.running_mean" in n and "bn.running_var" in n]
    if not checkpointing:  # the control: one update, as the forward says
        assert_agree(res)
        assert not told, res.notes
        return
    off = sorted(leaf.path for leaf in res.leaves if leaf.verdict == "disagree")
    assert off == ["bn.running_mean", "bn.running_var"], failing(res)  # the gradients agree
    assert all(leaf.blame == ["torch"] for leaf in res.leaves if leaf.verdict == "disagree"), failing(res)
    assert told, res.notes


class HookedEmbeddings(nn.Module):
    """transformers' ``enable_input_require_grads()`` (``gradient_checkpointing_enable()`` calls it): a hook on the
    input embeddings runs ``output.requires_grad_(True)``; and a branch torch.export refuses, so the module is
    traced at the example, under functionalisation."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.lin = nn.Embedding(10, 8), nn.Linear(8, 2)
        self.emb.register_forward_hook(lambda module, args, output: output.requires_grad_(True))

    def forward(self, ids):
        h = self.emb(ids)
        if h.sum() > 0:
            h = torch.tanh(h)
        return self.lin(h)


def test_requires_grad_set_in_a_hook_is_traced_at_the_example_and_checked(monkeypatch):
    ids = torch.randint(0, 10, (3, 5), generator=torch.Generator().manual_seed(0))
    case = from_torch(HookedEmbeddings(), ids)
    assert any("traced at the example inputs instead" in note for note in case.notes), case.notes
    assert_agree(run_case(case, RunOptions(backends=ALL)))
    # the control: with the call traced as written, functionalisation refuses it
    from gradcheck.frontends.torch import capture

    monkeypatch.setattr(capture, "_requires_grad_unchanged", contextlib.nullcontext)
    monkeypatch.setattr(capture, "_as_written", _refused)  # not traced again without functionalisation either
    monkeypatch.setenv("GRADCHECK_NO_CACHE", "1")  # captured again, not read back
    with pytest.raises(capture.CaptureError, match="requires_grad_"):
        from_torch(HookedEmbeddings(), ids)


def _refused(trace, f, refused):
    raise refused


# ---------------------------------------------------------------- torch alone, at points the graph cannot run
class _Atan2(torch.autograd.Function):
    """torch.atan2 with its gradient in x scaled by ``factor`` (1: right)."""

    @staticmethod
    def forward(x, y, factor):
        return torch.atan2(x, y)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:2])
        ctx.factor = inputs[2]

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        r = x * x + y * y
        return g * y / r * ctx.factor, -g * x / r, None


class _Angle(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x, y):
        return _Atan2.apply(x, y, self.factor) * 2.0


@pytest.mark.parametrize("factor", [1.0, 1.01], ids=["right", "torch's gradient 1 % off"])
def test_an_op_without_a_lowering_on_0_d_inputs_is_checked_on_torch_alone(monkeypatch, factor):
    """0-d inputs reach torch's float64 forward (the referee's, for a graph the tape and jax cannot run) as numpy
    scalars, which torch's ops refuse: that was an internal error while comparing."""
    monkeypatch.setenv("GRADCHECK_NO_CACHE", "1")
    monkeypatch.delitem(aten.LOWERINGS, "aten.atan2.default", raising=False)  # unlowered, whatever comes later
    x, y = torch.tensor(0.7, dtype=torch.float64), torch.tensor(-0.3, dtype=torch.float64)
    res = run_case(from_torch(_Angle(factor), x, y, mode="eval"), RunOptions(backends=ALL))
    assert set(res.unavailable) == {"tape", "jax"} and not res.errors, (res.unavailable, res.errors)
    if factor == 1.0:
        assert res.verdict == "agree", failing(res)
        return
    off = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert [leaf.path for leaf in off] == ["input.0"] and off[0].blame == ["torch"], failing(res)


class _Unpool(nn.Module):
    """max_unpool1d of its input at fixed indices, twice the same position (``twice``) or all apart."""

    def __init__(self, twice):
        super().__init__()
        self.register_buffer("idx", torch.tensor([[[1, 1, 4, 7]]] if twice else [[[1, 2, 4, 7]]]))

    def forward(self, v):
        return nn.functional.max_unpool1d(v, self.idx, 3, 3, output_size=(10,)) * 1.0


@pytest.mark.parametrize("twice", [False, True], ids=["positions apart", "one position written twice"])
def test_a_write_twice_to_one_position_at_a_referee_step_is_torchs_function_there(monkeypatch, twice):
    """At the case's point the two values written at one position are equal, and the lowering writes them; a
    referee step moves them apart, where the lowering refuses (torch keeps one of two different values, which one
    undefined): the referee then takes torch's float64 forward, not an internal error.  torch's gradient gives the
    position's gradient to each value written there, where its forward keeps one: torch's OpInfo expects its own
    gradient check of max_unpool to fail, and the referee blames torch.  Positions apart: all three agree."""
    monkeypatch.setenv("GRADCHECK_NO_CACHE", "1")
    v = torch.tensor([[[0.9, 0.9, 0.8, 0.7]]], dtype=torch.float64)
    res = run_case(from_torch(_Unpool(twice), v, mode="eval"), RunOptions(backends=ALL))
    assert not res.errors, res.errors
    if not twice:
        assert_agree(res)
        return
    assert res.verdict == "disagree", failing(res)
    assert all(leaf.blame == ["torch"] for leaf in res.leaves if leaf.verdict == "disagree"), failing(res)


class _Solves(nn.Module):
    """torch.linalg.solve and cholesky: torch.export orders their error checks by an effect token."""

    def forward(self, a):
        sym = (a + a.mT) / 2
        return torch.linalg.solve(sym, a[:, :2]) + torch.linalg.cholesky(sym)[:, :2]


@pytest.mark.parametrize("tokens_removed", [True, False], ids=["tokens removed", "control: tokens kept"])
def test_a_module_calling_torch_linalg_is_captured(monkeypatch, tokens_removed):
    """The exported graph of torch.linalg's solve and cholesky has an input and an output of kind TOKEN; without
    torch's pass that removes them, the capture failed.  torch is checked (its linalg kernels have no lowering yet:
    the tape and jax are unavailable, each naming the op)."""
    monkeypatch.setenv("GRADCHECK_NO_CACHE", "1")
    if not tokens_removed:
        monkeypatch.setattr(capture, "_without_effect_tokens", lambda ep: ep)
    torch.manual_seed(0)
    b = torch.randn(4, 4, dtype=torch.float64)
    a = b @ b.mT + 4 * torch.eye(4, dtype=torch.float64)
    if not tokens_removed:
        with pytest.raises(capture.CaptureError, match="kind TOKEN"):
            from_torch(_Solves(), a, mode="eval")
        return
    res = run_case(from_torch(_Solves(), a, mode="eval"), RunOptions(backends=ALL))
    assert not res.errors and res.verdict == "agree", failing(res)
    assert all("linalg_" in why for why in res.unavailable.values()), res.unavailable


class _LayerNormStats(nn.Module):
    """Returns torch.native_layer_norm's saved statistics, which the lowering does not compute."""

    def forward(self, x, w, b):
        return torch.native_layer_norm(x, [2, 3], w, b, 0.5)


def test_a_module_returning_what_the_lowering_does_not_compute_is_checked_on_torch():
    """The reference forward summed an output the lowering leaves uncomputed (an error of the case); now the graph
    is one the tape and jax cannot run, and torch's own forward is the referee's.  torch declares the statistics
    outputs not differentiable, so its input gradient leaves out what goes through them, and the referee, which
    differentiates the function as written, says so."""
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64), \
        torch.randn(2, 3, dtype=torch.float64)
    res = run_case(from_torch(_LayerNormStats(), x, w, b, mode="eval"), RunOptions(backends=ALL))
    assert not res.errors, res.errors
    assert set(res.unavailable) == {"tape", "jax"}, res.unavailable
    assert all("saved statistics of aten.native_layer_norm" in why for why in res.unavailable.values())
    assert [leaf.path for leaf in res.leaves if leaf.verdict == "disagree"] == ["input.0"], failing(res)


def _assert_nan_on_the_lowerings_backends(res):
    """The control of a lowering that sends NaN back: its one leaf off is nonfinite on the tape and jax, which run the
    lowering, and torch, which runs its own kernel, is finite."""
    (bad,) = [leaf for leaf in res.leaves if leaf.verdict != "agree"]
    assert bad.verdict == "nonfinite" and sorted(bad.blame) == ["jax", "tape"], failing(res)


class _MaskedRows(nn.Module):
    """torch's _safe_softmax (scaled_dot_product_attention's math path) over rows of which one is masked whole."""

    def forward(self, x):
        inf = float("-inf")
        mask = torch.tensor([[0.0, inf, 0.0], [inf, inf, inf], [0.0, 0.0, 0.0]], dtype=x.dtype)
        return torch.ops.aten._safe_softmax.default(x + mask, -1)


@pytest.mark.parametrize("masked_first", [True, False], ids=["right", "control: masked after the softmax only"])
def test_a_softmax_over_a_row_masked_whole_has_torchs_zero_gradient(monkeypatch, masked_first):
    monkeypatch.setenv("GRADCHECK_NO_CACHE", "1")
    if not masked_first:  # the decomposition's form: the softmax of a -inf row is NaN, and NaN comes back through it
        def after_only(ctx, self, dim, dtype=None):
            xp = aten._logic(self)
            dead = xp.all(xp.isneginf(aten._raw(self)), axis=dim, keepdims=True)
            return ops.where(dead, 0.0, ops.softmax(self, axis=dim))

        monkeypatch.setitem(aten.LOWERINGS, "aten._safe_softmax.default", after_only)
    res = run_case(from_torch(_MaskedRows(), torch.randn(3, 3, dtype=torch.float64), mode="eval"),
                   RunOptions(backends=ALL))
    if masked_first:
        assert_agree(res)
        return
    _assert_nan_on_the_lowerings_backends(res)


class _HermitianFFT(nn.Module):
    def forward(self, x):
        return torch.fft.hfft(x, norm="ortho")


def test_a_graph_with_a_conjugate_view_is_checked_on_torch():
    """hfft's graph makes a conjugate view (aten._conj), whose lazy bit numpy cannot read: the node-by-node check
    raised on it, an error of the case; now the tape and jax are unavailable for want of complex lowerings and torch
    is checked against the referee."""
    res = run_case(from_torch(_HermitianFFT(), torch.randn(3, 4, dtype=torch.float64), mode="eval"),
                   RunOptions(backends=ALL))
    assert not res.errors and res.verdict == "agree", failing(res)
    assert set(res.unavailable) == {"tape", "jax"}, res.unavailable


class _RowNorms(nn.Module):
    def forward(self, x):
        return torch.linalg.vector_norm(x, dim=-1) + torch.linalg.vector_norm(x, 3.0, dim=-1)


@pytest.mark.parametrize("guarded", [True, False], ids=["right", "control: the root's own derivative at 0"])
def test_a_norm_of_a_zero_row_has_torchs_subgradient(monkeypatch, guarded):
    """torch's gradient of a vector norm at a zero vector is 0 (its subgradient); the root's derivative there is
    infinite, and without the guard the tape's and jax's gradient of the row was NaN, blamed on them."""
    monkeypatch.setenv("GRADCHECK_NO_CACHE", "1")
    if not guarded:
        monkeypatch.setattr(aten, "_root_at_zero", lambda total, root: root(total))
    x = torch.randn(3, 4, dtype=torch.float64)
    x[1] = 0.0
    res = run_case(from_torch(_RowNorms(), x, mode="eval"), RunOptions(backends=ALL))
    if guarded:
        assert_agree(res)
        return
    _assert_nan_on_the_lowerings_backends(res)


class _Floored(nn.Module):
    def __init__(self, with_sin=True):
        super().__init__()
        self.with_sin = with_sin

    def forward(self, x):
        return torch.floor(x) * 2.0 + torch.sin(x) if self.with_sin else torch.floor(x) * 2.0


@pytest.mark.parametrize("escapes", [False, True], ids=["right", "control: sin's lowering leaves the tape"])
def test_a_loss_no_leaf_reaches_has_a_zero_gradient_on_the_tape(monkeypatch, escapes):
    """A piecewise-constant model (floor alone) has a zero gradient: the tape refused its loss, which no leaf
    reaches, an error where torch and jax give zeros; now the graph's outputs are constants on the tape, all three
    run and the case is vacuous (it checks nothing).  Beside sin all three agree; and a lowering that computes off
    the tape by mistake leaves the tape's gradient zero, caught against torch's and blamed on the tape.  A user's
    own loss off the tape is still refused (tests/test_errors.py)."""
    monkeypatch.setenv("GRADCHECK_NO_CACHE", "1")
    x = torch.tensor([0.3, 1.7, -2.2, 4.1], dtype=torch.float64)
    if not escapes:
        floor_only = run_case(from_torch(_Floored(False), x, mode="eval"), RunOptions(backends=ALL))
        assert not floor_only.errors and floor_only.verdict == "vacuous", (floor_only.errors, floor_only.verdict)
        assert_agree(run_case(from_torch(_Floored(), x, mode="eval"), RunOptions(backends=ALL)))
        return
    monkeypatch.setitem(aten.LOWERINGS, "aten.sin.default",
                        lambda ctx, x: np.sin(aten._raw(x)) if aten._logic(x) is np else ops.sin(x))
    res = run_case(from_torch(_Floored(), x, mode="eval"), RunOptions(backends=ALL))
    bad = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert [leaf.path for leaf in bad] == ["input"] and bad[0].blame == ["tape"], failing(res)


class _SignAndSine(nn.Module):
    def forward(self, x, y):
        return torch.sgn(x) * 2.0 + torch.sin(y)


def test_torchs_zero_tensor_gradient_is_read():
    """torch's gradient through sgn alone is a ZeroTensor, which holds no memory and which numpy refused: an error of
    torch's run.  Now x's gradient is zero on every backend (a leaf that checks nothing) and y's agrees."""
    x, y = torch.tensor([0.5, -1.5, 2.0], dtype=torch.float64), torch.tensor([0.3, 1.1, -0.7], dtype=torch.float64)
    res = run_case(from_torch(_SignAndSine(), x, y, mode="eval"), RunOptions(backends=ALL))
    assert_agree(res)
    verdicts = {leaf.path: leaf.verdict for leaf in res.leaves}
    assert verdicts["input.0"] == "vacuous" and verdicts["input.1"] == "agree", verdicts

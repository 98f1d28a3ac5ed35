"""``gradcheck.from_torch``: a torch.nn.Module as it is, checked on torch, the tape and jax.

Each family of ``torch_families`` agrees across the three backends under the
runner's two-part verdict, with torch's leaf names; each way of being wrong
(a custom autograd.Function's backward, a tape lowering's VJP, a lowering's
forward, an op without a lowering, a module export cannot capture) is caught
and named, and blamed on the right party.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import torch_families as fam  # noqa: E402
from torch import nn  # noqa: E402

from gradcheck import ops  # noqa: E402
from gradcheck.backends import backend_of  # noqa: E402
from gradcheck.check.runner import RunOptions, run_case  # noqa: E402
from gradcheck.frontends.torch import as_cases, aten, from_torch  # noqa: E402
from gradcheck.frontends.torch.capture import CaptureError  # noqa: E402

ALL = ("tape", "torch", "jax")


def check(module, *inputs, options=None, **kw):
    return run_case(from_torch(module, *inputs, **kw), options or RunOptions())


def failing(res) -> str:
    lines = [f"{leaf.path} [{leaf.role}] {leaf.verdict} blame={leaf.blame}: {leaf.message}"
             for leaf in res.leaves if leaf.verdict not in ("agree", "vacuous")]
    return "\n".join(lines + [f"{k}: {v}" for k, v in res.errors.items()])


def assert_agree(res, float32=True):
    assert not res.errors, failing(res)
    assert sorted(res.timings) == sorted(ALL), res.unavailable
    assert res.verdict == "agree", failing(res)
    assert res.leaves_compared > 0
    if float32:
        assert res.float32 in ("ok", "unmeasured"), [(leaf.path, leaf.float32) for leaf in res.leaves
                                                     if leaf.float32 and leaf.float32.verdict != "ok"]


def paths(res, role):
    return [leaf.path for leaf in res.leaves if leaf.role == role]


# ---------------------------------------------------------------- plain modules and ResNet
def test_plain_modules_agree_with_torch_names_and_buffers():
    model, inputs = fam.make_plain()
    res = check(model, *inputs)
    assert_agree(res)
    assert paths(res, "param") == [n for n, _ in model.named_parameters()]
    assert paths(res, "buffer") == [n for n, b in model.named_buffers() if b.is_floating_point()]
    assert paths(res, "input") == ["input"]
    # A conv bias followed by train-mode BatchNorm has an exactly zero gradient: flagged, not passed.
    assert next(leaf for leaf in res.leaves if leaf.path == "0.bias").verdict == "vacuous"


class ZeroKeyBias(nn.Module):
    """timm's BEiT attention: a query and a value bias, and a constant zero key bias between them (a buffer)."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24, bias=False)
        self.q_bias, self.v_bias = nn.Parameter(torch.randn(8)), nn.Parameter(torch.randn(8))
        self.register_buffer("k_bias", torch.zeros(8), persistent=False)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.qkv.weight, torch.cat((self.q_bias, self.k_bias, self.v_bias)))


def test_a_constant_zero_buffer_leaves_the_cases_float32_to_the_measured_leaves():
    torch.manual_seed(0)
    res = check(ZeroKeyBias().train(), torch.randn(2, 5, 8))
    assert_agree(res)
    parts = {leaf.path: leaf.float32.verdict for leaf in res.leaves if leaf.float32}
    assert parts.pop("k_bias") == "unmeasured" and set(parts.values()) == {"ok"}, parts
    assert res.float32 == "ok"


@pytest.mark.parametrize("make", [fam.make_basic_block, fam.make_bottleneck], ids=["basic", "bottleneck"])
def test_resnet_blocks_agree(make):
    model, inputs = make()
    res = check(model, *inputs)
    assert_agree(res)
    assert "downsample.1.running_var" in paths(res, "buffer")


def test_resnet18_at_224_agrees_leaf_by_leaf():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.torch_models import ResNet18

    torch.manual_seed(0)
    model = ResNet18().train()
    res = check(model, torch.randn(2, 3, 224, 224))
    assert_agree(res)
    assert len(paths(res, "param")) == 62 and len(paths(res, "buffer")) == 40 and paths(res, "input") == ["input"]
    assert all(leaf.verdict == "agree" for leaf in res.leaves if leaf.role in ("param", "buffer", "input"))
    # Kinks are reported at torch's module paths; torch's float32 relus are pinned like the tape's and jax's.
    assert {k.layer for k in res.kinks} >= {"relu", "layer1.0.relu"}


def test_eval_mode_uses_running_statistics_and_updates_nothing():
    model, inputs = fam.make_basic_block()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    res = check(model, *inputs, mode="eval")
    assert_agree(res, float32=False)
    assert model.training  # the module's own mode is left as it was


# ---------------------------------------------------------------- transformers
@pytest.mark.parametrize("fused,approximate", [(True, "none"), (False, "tanh")], ids=["sdpa", "softmax"])
def test_gpt_block_agrees(fused, approximate):
    model, inputs = fam.make_gpt(fused=fused, approximate=approximate)
    res = check(model, *inputs)
    assert_agree(res)
    names = paths(res, "param")
    assert "transformer.wte.weight" in names and "lm_head.weight" not in names  # tied: one leaf
    assert paths(res, "input") == []  # token ids are constants


def test_tied_head_gradient_sums_both_uses():
    import gradcheck

    model, (ids,) = fam.make_gpt(dropout=0.0)
    case = from_torch(model, ids, mode="eval")
    tree = case.build(np.random.default_rng(0)).eval()
    r = np.random.default_rng(1).standard_normal((2, 6, 11))
    grads = gradcheck.gradient(lambda m, i: ops.sum(m(i) * r), tree, ids.numpy(), backend="tape")[0]
    tied = grads.transformer.wte.weight
    # The same model untied: the tied gradient is the sum of the two copies' gradients.
    untied = fam.GPT(fused=True, dropout=0.0)
    untied.load_state_dict(model.state_dict())
    untied.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())
    untied.eval()
    (untied(ids) * torch.from_numpy(r).float()).sum().backward()
    expected = (untied.transformer.wte.weight.grad + untied.lm_head.weight.grad).numpy()
    np.testing.assert_allclose(tied, expected, rtol=1e-4, atol=1e-6)
    assert np.abs(untied.lm_head.weight.grad.numpy()).max() > 0.1  # the head's share is not negligible


def test_dropout_masks_come_from_the_case_seed():
    model, (ids,) = fam.make_gpt(dropout=0.3)
    tree = from_torch(model, ids).build(np.random.default_rng(0))
    other = from_torch(model, ids).build(np.random.default_rng(5))
    graph_out = tree(ids.numpy())
    torch_out = tree._program.call(_torch_tree(tree), (ids,)).detach().numpy()
    np.testing.assert_allclose(graph_out, torch_out, rtol=1e-5, atol=1e-6)  # the same masks on both paths
    assert np.abs(graph_out - other(ids.numpy())).max() > 1e-3  # another seed drops other units


def _torch_tree(tree):
    from gradcheck.tree import map_leaves

    return map_leaves(tree, lambda path, v, kind: torch.from_numpy(np.array(v, copy=True)))


def test_vit_with_class_token_agrees():
    res = check(*_flat(fam.make_vit()))
    assert_agree(res)
    assert paths(res, "param")[:2] == ["cls_token", "pos_embed"]


def test_convnext_block_agrees():
    assert_agree(check(*_flat(fam.make_convnext_block())))


def test_unet_with_transposed_conv_and_interpolation_agrees():
    # 44 gradient leaves: one joint referee direction keeps this test short; the three backends decide.
    res = check(*_flat(fam.make_unet()), options=RunOptions(referee="joint"))
    assert_agree(res)
    assert "up1.weight" in paths(res, "param")


@pytest.mark.parametrize("make", [fam.make_lstm_lm, fam.make_gru_lm], ids=["lstm", "gru"])
def test_recurrent_language_models_agree(make):
    res = check(*_flat(make()))
    assert_agree(res)
    assert "rnn.weight_hh_l0" in paths(res, "param")


def _flat(made):
    module, inputs = made
    return (module, *inputs)


# ---------------------------------------------------------------- MobileNetV3: a torch finding
class ComposedHardsigmoid(nn.Module):
    def forward(self, x):
        return torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


def test_mobilenet_block_blames_torchs_float64_hardsigmoid_backward():
    # torch 2.13's CPU hardsigmoid backward multiplies by 1/6 rounded to float32 in float64 too
    # (0.16666667163, 3e-8 off); the tape and jax agree, and torch is blamed on the leaves upstream.
    x = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.hardsigmoid(x).backward()
    buggy = abs(float(x.grad) - 1 / 6) > 1e-12
    # The torch CI pins has the bug (docs/from_torch.md): there the detection itself is what runs.
    assert buggy or not torch.__version__.startswith("2.13."), torch.__version__
    model, inputs = fam.make_mobilenet_block()
    res = check(model, *inputs)
    disagreeing = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert not res.errors
    assert all(leaf.blame == ["torch"] for leaf in disagreeing), failing(res)
    # Both ways: a torch with the float32 constant is caught, and one without it (a fixed torch) agrees.
    assert bool(disagreeing) == buggy, (buggy, failing(res))
    assert res.verdict == ("disagree" if buggy else "agree"), failing(res)
    # The same block with the activation written out agrees everywhere: hardswish, depthwise convolution,
    # squeeze-and-excite and adaptive pooling are not what differs.
    model.block[2].scale_activation = ComposedHardsigmoid()
    assert_agree(check(model, *inputs))


# ---------------------------------------------------------------- wrong gradients are caught and blamed
class _WrongTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.tanh(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.tanh(x)  # forgets x * (1 - tanh(x)^2)


class _RightTanh(_WrongTanh):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        t = torch.tanh(x)
        return g * (t + x * (1 - t * t))


class _WithFunction(nn.Module):
    def __init__(self, fn):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.fn = nn.Linear(4, 5), nn.Linear(5, 3), fn

    def forward(self, x):
        return self.b(self.fn.apply(self.a(x)))


def test_custom_function_with_a_wrong_backward_is_blamed_on_torch():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    res = check(_WithFunction(_WrongTanh), x)
    assert res.verdict == "disagree"
    wrong = {leaf.path for leaf in res.leaves if leaf.verdict == "disagree"}
    assert wrong == {"a.weight", "a.bias", "input"}  # upstream of the function only
    assert all(leaf.blame == ["torch"] and leaf.referee for leaf in res.leaves if leaf.path in wrong)
    assert res.first_disagreement == "a.bias"
    assert_agree(check(_WithFunction(_RightTanh), x))  # the negative control: the right backward agrees


class _Act(nn.Module):
    """The Function applied inside a submodule of its own, as a layer library writes an activation."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn.apply(x)


class _WithActivation(nn.Module):
    def __init__(self, fn):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.act, self.b = nn.Linear(4, 5), _Act(fn), nn.Linear(5, 3)

    def forward(self, x):
        return self.b(self.act(self.a(x)))


@pytest.mark.parametrize("model", [_WithFunction, _WithActivation])
def test_the_origin_of_a_wrong_custom_backward_names_the_function_and_its_line(model):
    import inspect

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    res = check(model(_WrongTanh), x)
    assert res.verdict == "disagree" and res.origin is not None, failing(res)
    # The call that applies it: the model's own code, or the activation module's.
    assert res.origin.path == ("act" if model is _WithActivation else "") and res.origin.blame == ["torch"]
    line = inspect.getsourcelines(_WrongTanh.backward)[1]
    assert f"custom autograd.Function _WrongTanh ({__file__}:{line})" in res.origin.message
    assert_agree(check(model(_RightTanh), x))  # the negative control: the right backward agrees


def test_the_origin_names_no_custom_function_where_torch_is_not_the_one_off(monkeypatch):
    from gradcheck.backends.tape.tape import Primitive

    # The tape's lowering of the Function's forward (a tanh) is wrong: the Function's backward is right, and torch
    # with it; the origin is where the Function is applied, without blaming its backward.
    bad = Primitive("bad_tanh", np.tanh).defvjp(lambda g, ans, x: ops.mul(g, ops.sub(1.0, ans)))
    monkeypatch.setitem(aten.LOWERINGS, "aten.tanh.default",
                        lambda ctx, x: bad(x) if backend_of(x) == "tape" else ops.tanh(x))
    res = check(_WithActivation(_RightTanh), torch.randn(3, 4, generator=torch.Generator().manual_seed(0)))
    assert res.origin is not None and res.origin.path == "act" and res.origin.blame == ["tape"], failing(res)
    assert "autograd.Function" not in res.origin.message


def test_a_wrong_tape_lowering_is_blamed_on_the_tape(monkeypatch):
    from gradcheck.backends.tape.tape import Primitive

    # A test double: tanh's forward, with a VJP that forgets to square (1 - tanh^2).
    bad = Primitive("bad_tanh", np.tanh).defvjp(lambda g, ans, x: ops.mul(g, ops.sub(1.0, ans)))
    monkeypatch.setitem(aten.LOWERINGS, "aten.tanh.default",
                        lambda ctx, x: bad(x) if backend_of(x) == "tape" else ops.tanh(x))
    model, inputs = fam.make_plain()  # its Tanh sits between the two Linears
    res = check(model, *inputs)
    wrong = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert wrong and all(leaf.blame == ["tape"] for leaf in wrong), failing(res)
    assert "11.weight" not in {leaf.path for leaf in wrong}  # the last Linear is downstream of tanh
    assert res.first_disagreement == "9.bias"


def test_a_lowering_that_computes_something_else_is_caught_before_blaming_torch(monkeypatch):
    # gelu lowered as the tanh approximation: the tape, jax and the referee would agree against torch.
    monkeypatch.setitem(aten.LOWERINGS, "aten.gelu.default", lambda ctx, x, approximate="none": ops.gelu(x, "tanh"))
    model, inputs = fam.make_convnext_block()
    res = check(model, *inputs)
    assert "torch" in res.timings and "torch" not in res.errors
    for backend in ("tape", "jax"):
        message = _why_not(res, backend)
        assert "the lowering of aten.gelu.default disagrees with torch's" in message
        assert "module act (GELU)" in message and "torch_families.py" in message
    assert not any("torch" in leaf.blame for leaf in res.leaves)


# ---------------------------------------------------------------- what cannot be checked, and why
def _why_not(res, backend) -> str:
    """Why a backend did not run the case: it is unavailable for this case (UnsupportedOp), not an error."""
    assert backend not in res.timings and backend not in res.errors, f"{backend} ran the case or errored"
    return res.unavailable[backend]


@torch.library.custom_op("gctest::scaled_atan", mutates_args=())
def _scaled_atan(x: torch.Tensor) -> torch.Tensor:
    return 2.0 * torch.atan(x)


_scaled_atan.register_fake(lambda x: torch.empty_like(x))
_scaled_atan.register_autograd(lambda ctx, g: g * 2.0 / (1.0 + ctx.saved_tensors[0] ** 2),
                               setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))


class _Opaque(nn.Module):
    """A module calling a custom op gradcheck has no lowering of (nor will: it is the test's own)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return _scaled_atan(self.lin(x))


def test_an_op_without_a_lowering_names_itself_its_module_and_line_and_the_others_run():
    case = from_torch(_Opaque(), torch.randn(2, 4))
    assert any("gctest.scaled_atan.default" in note for note in case.notes)
    res = run_case(case)
    for backend in ("tape", "jax"):
        message = _why_not(res, backend)
        assert "gctest.scaled_atan.default is an op without a lowering" in message
        assert "from the root module (_Opaque)" in message
        assert "test_from_torch.py:" in message and "return _scaled_atan(self.lin(x))" in message
        # The two public ways out, never a file inside the package.
        assert "references={'gctest::scaled_atan': fn}" in message
        assert "@gradcheck.frontends.torch.lowering('gctest::scaled_atan')" in message
        assert "gradcheck/frontends/torch/aten.py" not in message
    # torch still runs, and the referee (on torch's float64 forward) checks it leaf by leaf.
    assert "torch" in res.timings and "torch" not in res.errors
    grads = [leaf for leaf in res.leaves if leaf.role in ("param", "input")]
    assert grads and all(leaf.verdict == "agree" and [c.backend for c in leaf.referee] == ["torch"]
                         for leaf in grads)


def test_an_op_inside_a_submodule_is_located_there():
    model = nn.Sequential(nn.Linear(4, 4), _Opaque())
    case = from_torch(model, torch.randn(2, 4))
    assert any("from module 1 (_Opaque)" in note for note in case.notes)


class _DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            return y * 2
        return y


def test_a_branch_on_values_is_traced_at_the_example_and_checked_on_every_backend():
    case = from_torch(_DataDependent(), torch.randn(2, 3))
    refused = [n for n in case.notes if n.startswith("torch.export refused _DataDependent")]
    assert refused and "traced at the example inputs instead" in refused[0]
    assert "test_from_torch.py:" in refused[0] and "if y.sum() > 0:" in refused[0]  # the line that branches
    res = run_case(case)
    assert_agree(res)
    assert not res.unavailable  # the tape and jax ran the traced graph


class _Float32Kernel(nn.Module):
    """A layer whose kernel has no float64 (a stand-in that refuses a double as torch's kernels word it:
    transformers' grouped-matmul experts on ``torch._grouped_mm``)."""

    def __init__(self, message):
        super().__init__()
        self.lin, self.message = nn.Linear(3, 3), message

    def forward(self, x):
        y = self.lin(x)
        if y.dtype == torch.float64:
            raise RuntimeError(self.message)
        return y


def test_a_module_torch_cannot_run_in_float64_is_told_so_and_the_way_out():
    res = run_case(from_torch(_Float32Kernel("Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double"),
                              torch.randn(2, 3)))
    error = " ".join(res.errors.values())
    assert "torch cannot run _Float32Kernel in float64, which decides the check" in error, res.errors
    assert "got Double" in error and 'experts_implementation="eager"' in error
    # The control: a float64 failure that is not about the dtype keeps torch's own message alone.
    res = run_case(from_torch(_Float32Kernel("index 7 is out of bounds"), torch.randn(2, 3)))
    error = " ".join(res.errors.values())
    assert "index 7 is out of bounds" in error and "cannot run" not in error, res.errors


class _BranchAndCount(nn.Module):
    """A branch on values (torch.export refuses it) and a Python int among the outputs (a trace at the example
    compares tensors only): neither capture can take it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            return y * 2, 1
        return y, 0


def test_a_module_neither_capture_can_follow_gets_torchs_reason_and_the_ways_out():
    with pytest.raises(CaptureError) as info:
        from_torch(_BranchAndCount(), torch.randn(2, 3))
    message = str(info.value)
    assert message.startswith("torch.export could not capture _BranchAndCount (train mode)")
    assert "tracing it at the example inputs failed too" in message and "not tensors" in message
    assert "test_from_torch.py:" in message and "if y.sum() > 0:" in message  # the line that branches
    assert "torch.cond" in message and "forward=" in message


class _FixedSize(nn.Module):
    """Built for one input width, and says so when handed another (as timm's patch embedding does)."""

    def __init__(self, width=8):
        super().__init__()
        self.width = width
        self.lin = nn.Linear(width, 3)

    def forward(self, x):
        torch._assert(x.shape[-1] == self.width, f"input width ({x.shape[-1]}) does not match the model ({self.width})")
        return self.lin(x)


def test_a_module_that_fails_on_its_example_inputs_is_told_so_not_sent_to_torch_cond():
    with pytest.raises(CaptureError) as info:
        from_torch(_FixedSize(), torch.randn(2, 5))
    message = str(info.value)
    assert message.startswith("_FixedSize (train mode) fails on its example inputs when torch runs it as it is")
    assert "AssertionError: input width (5) does not match the model (8)" in message
    assert "test_from_torch.py:" in message and "torch._assert(x.shape[-1] == self.width" in message  # where
    assert "pass inputs it accepts" in message and "torch.cond" not in message
    # Control: the inputs it was built for are captured and checked.
    assert_agree(run_case(from_torch(_FixedSize(), torch.randn(2, 8))))


def test_as_cases_takes_module_input_pairs_and_records_a_capture_failure_per_case():
    made = [fam.make_convnext_block(), (_BranchAndCount(), (torch.randn(2, 3),))]
    cases = as_cases(made, name="target")
    assert [c.name for c in cases] == ["target[0]", "target[1]"]
    broken = run_case(cases[1])
    assert broken.verdict == "error" and "torch.export could not capture" in broken.errors["case"]
    assert as_cases(fam.make_convnext_block(), name="one")[0].name == "one"
    assert as_cases("not a case") is None


# ---------------------------------------------------------------- inputs, outputs, options
class _DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)
        self.frozen = nn.Linear(3, 3)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        y = self.frozen(self.lin(x))
        return {"logits": y, "ids": y.argmax(-1), "extra": (torch.tanh(y),)}


def test_outputs_are_every_float_tensor_named_and_frozen_parameters_are_constants():
    case = from_torch(_DictOut(), torch.randn(2, 4))
    assert "outputs: output.0 = logits, output.1 = extra.0" in case.notes
    res = run_case(case)
    assert_agree(res)
    assert paths(res, "output") == ["output.0", "output.1"]
    assert paths(res, "param") == ["lin.weight", "lin.bias"]  # frozen.* carry no gradient


def test_forward_says_what_is_differentiated():
    model, (x,) = fam.make_convnext_block()
    case = from_torch(model, x, forward=lambda m, x: torch.logsumexp(m(x), dim=1), name="lse")
    res = run_case(case)
    assert_agree(res)
    assert paths(res, "param")[0] == "gamma"  # names without the wrapper around the module


def test_a_float64_module_is_a_float64_case():
    model = nn.Sequential(nn.Linear(3, 2), nn.Tanh()).double()
    case = from_torch(model, torch.randn(4, 3, dtype=torch.float64))
    assert case.dtype == "float64"
    assert_agree(run_case(case), float32=False)


@pytest.mark.parametrize("make", [fam.make_basic_block, fam.make_gpt], ids=["basic", "gpt"])
def test_core_aten_decomposition_agrees_too(make):
    module, inputs = make()
    assert_agree(check(module, *inputs, decompose="core"))


def test_bad_arguments_say_what_to_pass():
    with pytest.raises(TypeError, match="pass a torch.nn.Module"):
        from_torch(lambda x: x, torch.randn(2))
    with pytest.raises(TypeError, match="example input 0 is a int"):
        from_torch(nn.Linear(2, 2), 3)
    with pytest.raises(ValueError, match="decompose='all'"):
        from_torch(nn.Linear(2, 2), torch.randn(1, 2), decompose="all")


# ---------------------------------------------------------------- the ways in: API, assertion, CLI target
def test_from_torch_is_part_of_the_package_api():
    import gradcheck

    assert gradcheck.from_torch is from_torch and "from_torch" in gradcheck.__all__


def test_assert_gradients_agree_takes_a_torch_module_and_catches_a_wrong_backward():
    import gradcheck
    from gradcheck.assertions import GradientsDisagree

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    gradcheck.assert_gradients_agree(net, torch.randn(5, 4))

    class Doubled(torch.autograd.Function):  # forward is the identity; backward doubles: a wrong VJP
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    class Wrong(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x):
            return Doubled.apply(self.lin(x))

    with pytest.raises(GradientsDisagree) as info:
        gradcheck.assert_gradients_agree(Wrong(), torch.randn(5, 4))
    first = str(info.value).splitlines()[0]
    assert first == "3/4 leaves disagree: lin.weight (torch), lin.bias (torch), input (torch)", str(info.value)
    assert {x.path: x.blame for x in info.value.result.leaves if x.verdict == "disagree"} == {
        "lin.weight": ["torch"], "lin.bias": ["torch"], "input": ["torch"]}


def test_the_cli_runs_a_target_that_returns_a_module_and_its_inputs(tmp_path, monkeypatch):
    from gradcheck.app import cli

    (tmp_path / "mychecks.py").write_text(
        "import torch\n"
        "def block():\n"
        "    torch.manual_seed(0)\n"
        "    net = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.ReLU(),\n"
        "                              torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 2))\n"
        "    return net.train(), (torch.randn(2, 2, 6, 6),)\n")
    monkeypatch.chdir(tmp_path)
    code = cli.main(["run", "mychecks:block", "--output", str(tmp_path / "out"), "-q"])
    assert code == 0
    from gradcheck import results

    [case] = results.load(tmp_path / "out" / "results.jsonl").cases
    assert case.verdict == "agree" and {"0.weight", "1.running_mean", "4.bias"} <= {x.path for x in case.leaves}

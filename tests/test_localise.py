"""Per-layer VJP replay (gradcheck.check.localise): a wrong backward injected into one framework for one op deep
inside a model is traced to that layer and blamed on that backend; the leaves before it only inherit it;
a forward difference is told apart from a wrong backward; inputs a backend mutates are reported."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gradcheck.layers as L
from gradcheck import ops
from gradcheck.backends import get_backend
from gradcheck.backends.base import Backend
from gradcheck.backends.tape import ops as tape_ops
from gradcheck.backends.tape.tape import Primitive
from gradcheck.case import Case
from gradcheck.check import localise, runner
from gradcheck.check.runner import RunOptions, run_case
from gradcheck.layers.models import MODELS
from gradcheck.module import Module, child

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

from gradcheck.backends.jax import ops as jax_ops  # noqa: E402  (after the importorskips: they import the frameworks)
from gradcheck.backends.torch import ops as torch_ops  # noqa: E402


def run_localised(monkeypatch, case, options=None, per_layer=False, keep=False):
    """``run_case`` (which localises by itself), and the CaseRun it built: its ``localisation`` is the replay's."""
    options = options or RunOptions()
    if per_layer:
        options.per_layer = True
    if keep:  # every replayed call keeps its arrays (by default only the disagreeing ones do)
        options.keep_replays = True
    seen = {}
    original = runner.CaseRun

    def capture(case):
        seen["cr"] = original(case)
        return seen["cr"]

    monkeypatch.setattr(runner, "CaseRun", capture)  # only to hand the CaseRun back; run_case does the rest
    res = run_case(case, options)
    monkeypatch.setattr(runner, "CaseRun", original)
    return res, seen["cr"]


def disagreeing(res):
    """The disagreeing leaves of the model (not the referee's joint check, which is no one leaf)."""
    return {x.path: x for x in res.leaves if x.verdict == "disagree" and x.role != "referee"}


def leaf(res, path):
    return next(x for x in res.leaves if x.path == path)


# ---------------------------------------------------------------- wrong backwards, one framework, one op
class BatchNormWithoutMeanTerm(torch.autograd.Function):
    """Train-mode BatchNorm2d whose input gradient forgets that the batch mean depends on x."""

    @staticmethod
    def forward(ctx, x, w, b, eps):
        axes = (0, 2, 3)
        mean = x.mean(axes, keepdim=True)
        rstd = torch.rsqrt(x.var(axes, unbiased=False, keepdim=True) + eps)
        xhat = (x - mean) * rstd
        ctx.save_for_backward(xhat, rstd, w)
        return xhat * w.view(1, -1, 1, 1) + b.view(1, -1, 1, 1)

    @staticmethod
    def backward(ctx, gy):
        xhat, rstd, w = ctx.saved_tensors
        axes = (0, 2, 3)
        gxhat = gy * w.view(1, -1, 1, 1)
        # Right: rstd * (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)); the mean(gxhat) term is missing.
        gx = rstd * (gxhat - xhat * (gxhat * xhat).mean(axes, keepdim=True))
        return gx, (gy * xhat).sum(axes), gy.sum(axes), None


def torch_batch_norm_wrong_where(monkeypatch, channels, size):
    """torch's BatchNorm backward is wrong, but only for inputs of ``channels`` channels and ``size`` pixels."""
    original = torch_ops.batch_norm

    def batch_norm(x, running_mean=None, running_var=None, weight=None, bias=None, training=True, momentum=0.1,
                   eps=1e-5):
        y, rm, rv = original(x, running_mean, running_var, weight, bias, training, momentum, eps)
        if training and x.shape[1] == channels and (size is None or tuple(x.shape[2:]) == size):
            y = BatchNormWithoutMeanTerm.apply(x, weight, bias, float(eps))
        return y, rm, rv

    monkeypatch.setattr(torch_ops, "batch_norm", batch_norm)


class ScaledInputGradient(torch.autograd.Function):
    """``fn(x, w)`` whose forward and weight gradient are right and whose input gradient is 0.1% too large."""

    @staticmethod
    def forward(ctx, x, w, fn):
        ctx.fn = fn
        ctx.save_for_backward(x, w)
        return fn(x, w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            x, w = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
            gx, gw = torch.autograd.grad(ctx.fn(x, w), (x, w), g)
        return gx * 1.001, gw, None


def torch_conv_input_gradient_wrong_for(monkeypatch, weight_shape):
    original = torch_ops.conv

    def conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
        if tuple(w.shape) != weight_shape or bias is not None:
            return original(x, w, bias, stride, padding, dilation, groups)
        return ScaledInputGradient.apply(x, w, lambda t, k: original(t, k, None, stride, padding, dilation, groups))

    monkeypatch.setattr(torch_ops, "conv", conv)


class SoftmaxShortOfItsRankOneTerm(torch.autograd.Function):
    """softmax whose backward keeps 99% of the ``- y <g, y>`` term: attention's VJP is wrong, its forward not."""

    @staticmethod
    def forward(ctx, s):
        y = torch.softmax(s, dim=-1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return y * (g - 0.99 * (g * y).sum(-1, keepdim=True))


def torch_attention_softmax_wrong(monkeypatch):
    def sdpa(query, key, value, attn_mask=None, dropout_mask=None, is_causal=False, scale=None):
        assert attn_mask is None and dropout_mask is None
        L_, S = query.shape[-2], key.shape[-2]
        s = query @ key.transpose(-1, -2) * (1 / math.sqrt(query.shape[-1]) if scale is None else scale)
        if is_causal:
            s = s.masked_fill(~torch.ones(L_, S, dtype=torch.bool).tril(), -math.inf)
        return SoftmaxShortOfItsRankOneTerm.apply(s) @ value

    monkeypatch.setattr(torch_ops, "scaled_dot_product_attention", sdpa)


# ---------------------------------------------------------------- the done-when: resnet18 and the transformer
def test_batchnorm_of_layer3_wrong_in_torch_is_the_origin_of_resnet18s_disagreement(monkeypatch):
    # Every train-mode BatchNorm of layer3 (256 channels at 14x14, ResNet-18 at 224x224) lacks the mean term
    # in torch: the deepest of them, layer3.1.bn2, is where the backward pass first goes wrong.
    torch_batch_norm_wrong_where(monkeypatch, 256, (14, 14))
    # The model-level referee is off (its every-leaf checks cost minutes here); the origin's own is not.
    res, cr = run_localised(monkeypatch, MODELS["resnet18"].case(), RunOptions(referee="off"))
    bad = disagreeing(res)
    assert res.verdict == "disagree" and "layer1.0.conv1.weight" in bad
    assert res.origin is not None, res.notes
    o = res.origin
    assert (o.path, o.layer, o.kind, o.blame, o.op) == ("layer3.1.bn2", "BatchNorm2d", "vjp", ["torch"], "batch_norm")
    assert "replayed alone" in o.message and "input.0" in o.message
    # Upstream: every disagreeing leaf only inherits it (BatchNorm's own weight and bias gradients are right).
    assert all(x.inherited for x in bad.values()), sorted(p for p, x in bad.items() if not x.inherited)
    assert {"conv1.weight", "layer1.0.conv1.weight", "layer3.1.conv2.weight", "input"} <= set(bad)
    # Downstream of the origin nothing disagrees, and nothing that agrees is marked.
    for path in ("layer3.1.bn2.weight", "layer4.0.conv1.weight", "layer4.1.bn2.weight", "fc.weight"):
        assert leaf(res, path).verdict == "agree" and not leaf(res, path).inherited
    loc = cr.localisation
    calls = {c.name: c for c in loc.calls}
    # The other layer3 BatchNorms are wrong too, alone; nothing else is.
    wrong = {c.name for c in loc.calls if c.replayed and c.vjp_off()}
    assert wrong == {"layer3.0.bn1", "layer3.0.bn2", "layer3.0.downsample.1", "layer3.1.bn1", "layer3.1.bn2"}, wrong
    assert [x.blame for x in calls["layer3.1.bn2"].vjp_off()] == [["torch"]]
    # Blocks are replayed only after the deepest disagreeing layer: layer4's, not layer1's.
    assert calls["layer4.1"].replayed and not calls["layer1.0"].replayed


def test_a_layer4_convolution_wrong_in_torch_is_the_origin(monkeypatch):
    # torch's input gradient of the 512 -> 512 3x3 convolutions (layer4 only) is 0.1% off.
    torch_conv_input_gradient_wrong_for(monkeypatch, (512, 512, 3, 3))
    res, cr = run_localised(monkeypatch, MODELS["resnet18"].case(size="small"), RunOptions(referee="off"))
    o = res.origin
    assert o is not None, res.notes
    assert (o.path, o.layer, o.kind, o.blame, o.op) == ("layer4.1.conv2", "Conv2d", "vjp", ["torch"], "conv")
    bad = disagreeing(res)
    assert {"layer4.1.conv1.weight", "layer3.1.conv2.weight", "conv1.weight"} <= set(bad)
    assert all(x.inherited for x in bad.values()), sorted(p for p, x in bad.items() if not x.inherited)
    assert leaf(res, "layer4.1.conv2.weight").verdict == "agree" and leaf(res, "fc.weight").verdict == "agree"
    wrong = {c.name for c in cr.localisation.calls if c.replayed and c.vjp_off()}
    assert wrong == {"layer4.0.conv2", "layer4.1.conv1", "layer4.1.conv2"}


def test_the_attention_softmax_wrong_in_torch_is_the_origin_in_the_transformer(monkeypatch):
    torch_attention_softmax_wrong(monkeypatch)
    res, cr = run_localised(monkeypatch, MODELS["transformer"].case())
    o = res.origin
    assert o is not None, res.notes
    assert (o.path, o.layer, o.kind, o.blame) == ("blocks.1.attn", "MultiheadAttention", "vjp", ["torch"])
    assert "scaled_dot_product_attention" in o.message
    bad = disagreeing(res)
    # Both attentions' own projections are wrong in their own replays: not inherited.  Everything else
    # before the origin is (pos_emb's table too: the model's own code slices it).
    own = {f"blocks.{i}.attn.in_proj_{w}" for i in (0, 1) for w in ("weight", "bias")}
    assert own <= set(bad) and not any(bad[p].inherited for p in own)
    upstream = {p: x for p, x in bad.items() if p not in own}
    assert {"tok_emb.weight", "pos_emb.weight", "blocks.0.mlp.0.weight", "blocks.1.ln_1.weight"} <= set(upstream)
    assert all(x.inherited for x in upstream.values()), sorted(p for p, x in upstream.items() if not x.inherited)
    # After it: its own out_proj, the MLP, the head agree.
    for path in ("blocks.1.attn.out_proj.weight", "blocks.1.mlp.0.weight", "head.weight"):
        assert leaf(res, path).verdict == "agree"
    calls = {c.name: c for c in cr.localisation.calls}
    assert calls["blocks.1.attn.out_proj"].verdict == "agree" and calls["blocks.1.attn"].verdict == "vjp"


# ---------------------------------------------------------------- forward differences, glue, two backends
def mlp(rng):
    return L.Chain(L.Dense(4, 8, rng=rng), L.Tanh(), L.Dense(8, 8, rng=rng), L.Tanh(), L.Dense(8, 3, rng=rng))


MLP = Case("mlp", mlp, lambda rng: (rng.standard_normal((5, 4)),))


# ---------------------------------------------------------------- the same fault on each backend
def linear_input_gradient_scaled(monkeypatch, backend, weight_shape=(8, 8), factor=1.001):
    """``backend``'s linear, for weights of ``weight_shape`` only: its forward and weight gradient right, its input
    gradient ``factor`` times too large.  The same fault on every backend, each through its own machinery: a
    torch ``autograd.Function``, a ``jax.custom_vjp``, a tape primitive."""
    if backend == "torch":
        class Scaled(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, g):
                return g * factor

        scaled, module = Scaled.apply, torch_ops
    elif backend == "jax":
        import jax

        @jax.custom_vjp
        def scaled(x):
            return x

        scaled.defvjp(lambda x: (x, None), lambda _, g: (g * factor,))
        module = jax_ops
    else:
        scaled = Primitive("linear_input_gradient_scaled", lambda x: x).defvjp(lambda g, ans, x: ops.mul(g, factor))
        module = tape_ops
    # The tape has no linear of its own: it runs the derived one (matmul and add on tape primitives).
    original = getattr(module, "linear", None) or ops.linear.__wrapped__

    def linear(x, weight, bias=None):
        return original(scaled(x) if tuple(ops.shape_of(weight)) == weight_shape else x, weight, bias)

    monkeypatch.setattr(module, "linear", linear, raising=False)


@pytest.mark.parametrize("backend", ["tape", "torch", "jax"])
def test_a_wrong_input_gradient_on_each_backend_is_localised_and_blamed_on_that_backend(monkeypatch, backend):
    # The control first: the same case agrees, every layer replayed alone agrees.  It also leaves every layer's
    # replay compiled by jax, as in a process that checked the model before: the fault injected next must
    # still be what the replays run (a cache keyed on the replay's function alone gave origin '' here).
    clean, cr = run_localised(monkeypatch, MLP, per_layer=True)
    assert clean.verdict == "agree" and clean.origin is None and not disagreeing(clean)
    assert all(c.verdict == "agree" for c in cr.localisation.calls if c.replayed)
    linear_input_gradient_scaled(monkeypatch, backend)
    res, cr = run_localised(monkeypatch, MLP)
    o = res.origin
    assert o is not None, res.notes
    assert (o.path, o.layer, o.kind, o.blame, o.op) == ("2", "Dense", "vjp", [backend], "linear"), o
    # Everything before the wrong layer is off, blamed on that backend alone, and only inherits the origin.
    bad = disagreeing(res)
    assert {p: (x.blame, x.inherited) for p, x in bad.items()} == {
        p: ([backend], True) for p in ("0.weight", "0.bias", "input")}
    for path in ("2.weight", "2.bias", "4.weight", "4.bias", "output"):
        assert leaf(res, path).verdict == "agree" and leaf(res, path).blame == []
    # The wrong layer alone: its input gradient is off and its weight gradient is not.
    calls = {c.name: c for c in cr.localisation.calls if c.replayed}
    assert {c for c, call in calls.items() if call.vjp_off()} == {"2"}
    assert [(x.path, x.blame) for x in calls["2"].vjp_off()] == [("2:input.0", [backend])]
    # Undone, the case agrees again (the replays compiled before the fault are the right ones to reuse).
    monkeypatch.undo()
    again = run_case(MLP)
    assert again.verdict == "agree" and again.origin is None


def test_run_case_itself_localises_a_disagreement(monkeypatch):
    # No capture and no second call here: the origin and the notes are what run_case alone produced.
    torch_batch_norm_wrong_where(monkeypatch, 4, None)
    res = run_case(CONV_BN)
    assert res.verdict == "disagree"
    o = res.origin
    assert o is not None, res.notes
    assert (o.path, o.layer, o.kind, o.blame, o.op) == ("1", "BatchNorm2d", "vjp", ["torch"], "batch_norm")
    assert leaf(res, "0.weight").inherited and leaf(res, "0.weight").blame == ["torch"]
    assert any(n.startswith("per-layer replay: 4 layers and 0 blocks replayed alone on torch, jax, tape")
               for n in res.notes), res.notes
    monkeypatch.undo()  # the control: the same case agrees and is not replayed
    clean = run_case(CONV_BN)
    assert clean.verdict == "agree" and clean.origin is None
    assert not any(n.startswith("per-layer replay") for n in clean.notes)


def test_a_forward_difference_is_not_a_wrong_backward(monkeypatch):
    # A test double of torch's linear: for the 8x8 layer its forward is slightly off (by a constant the
    # backward never sees), its backward exact.  Every gradient moves; no layer's own VJP is wrong.
    original = torch_ops.linear

    def linear(x, weight, bias=None):
        y = original(x, weight, bias)
        return y + (1e-6 * (1 + y.abs())).detach() if tuple(weight.shape) == (8, 8) else y

    monkeypatch.setattr(torch_ops, "linear", linear)
    res, cr = run_localised(monkeypatch, MLP)
    bad = disagreeing(res)
    assert {"output", "0.weight", "4.weight"} <= set(bad)
    o = res.origin
    assert (o.path, o.layer, o.kind, o.blame, o.op) == ("2", "Dense", "forward", ["torch"], "linear"), o
    assert o.message.startswith("forward divergence at 2 (Dense)")
    assert all(x.inherited for x in bad.values())
    assert not any(c.vjp_off() for c in cr.localisation.calls if c.replayed)


class Glue(Module):
    """A block whose own code (a relu and a residual) sits between its layers."""

    inner: object = child()

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, x):
        return ops.relu(self.inner(x)) + x


class LeakyReluGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x > 0).to(g.dtype) * 1.001


def test_a_wrong_op_between_layers_is_localised_to_the_block_that_calls_it(monkeypatch):
    monkeypatch.setattr(torch_ops, "relu", LeakyReluGrad.apply)
    case = Case("glue", lambda rng: L.Chain(L.Dense(4, 8, rng=rng), Glue(L.Dense(8, 8, rng=rng)), L.Dense(8, 3, rng=rng)),
                lambda rng: (rng.standard_normal((6, 4)),))
    res, cr = run_localised(monkeypatch, case)
    o = res.origin
    assert (o.path, o.layer, o.kind, o.blame) == ("1", "Glue", "vjp", ["torch"]), o
    assert "code between them" in o.message
    calls = {c.name: c for c in cr.localisation.calls}
    assert calls["1"].unit == "block" and calls["1.inner"].verdict == "agree"
    assert leaf(res, "1.inner.weight").inherited and leaf(res, "0.weight").inherited
    assert leaf(res, "2.weight").verdict == "agree"


def test_a_wrong_op_in_the_models_own_code_is_said_to_be_there(monkeypatch):
    # The model itself is the block: its relu is no layer's, and the model is not replayed (it already ran).
    monkeypatch.setattr(torch_ops, "relu", LeakyReluGrad.apply)
    case = Case("root_glue", lambda rng: Glue(L.Dense(4, 4, rng=rng)), lambda rng: (rng.standard_normal((6, 4)),))
    res, cr = run_localised(monkeypatch, case)
    o = res.origin
    assert (o.path, o.layer, o.blame) == ("", "Glue", ["torch"]), o
    assert "outside every replayed layer" in o.message
    assert [c.name for c in cr.localisation.calls if c.replayed] == ["inner"]


def conv_bn(rng):
    return L.Chain(L.Conv2d(3, 4, 3, padding=1, bias=False, rng=rng), L.BatchNorm2d(4), L.Flatten(),
                   L.Dense(4 * 6 * 6, 3, rng=rng))


CONV_BN = Case("conv_bn", conv_bn, lambda rng: (rng.standard_normal((2, 3, 6, 6)),))


def test_with_two_backends_the_layers_own_referee_blames(monkeypatch):
    torch_batch_norm_wrong_where(monkeypatch, 4, None)
    res, cr = run_localised(monkeypatch, CONV_BN, RunOptions(backends=("torch", "tape")))
    o = res.origin
    assert (o.path, o.kind, o.blame) == ("1", "vjp", ["torch"]), o
    assert "referee" in o.message
    origin = cr.localisation.origin_call
    assert any(c.backend == "tape" and c.agrees for x in origin.vjp_off() for c in x.referee)
    assert leaf(res, "0.weight").inherited and leaf(res, "input").inherited


def test_a_case_that_agrees_is_not_replayed_unless_asked(monkeypatch):
    res, cr = run_localised(monkeypatch, CONV_BN)
    assert res.verdict == "agree" and res.origin is None and getattr(cr, "localisation", None) is None


def test_per_layer_replays_every_layer_of_a_case_that_agrees(monkeypatch):
    res, cr = run_localised(monkeypatch, CONV_BN, per_layer=True)
    assert res.verdict == "agree" and res.origin is None
    rows = cr.localisation.layers()
    assert [r["path"] for r in rows] == ["0", "1", "2", "3"]
    assert all(r["verdict"] == "agree" and r["leaves"] >= 1 for r in rows)
    assert {r["layer"] for r in rows} == {"Conv2d", "BatchNorm2d", "Flatten", "Dense"}
    assert any("every layer's own backward and forward agree" in n for n in res.notes)
    # What agreed is let go: verdicts stay, arrays do not.
    assert all(c.dropped and not c.evaluations["torch"].grads for c in cr.localisation.calls if c.replayed)


class Twice(Module):
    """One layer applied twice (weight sharing)."""

    inner: object = child()

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, x):
        return self.inner(ops.tanh(self.inner(x)))


def test_a_module_called_twice_is_replayed_per_call(monkeypatch):
    case = Case("shared", lambda rng: Twice(L.Dense(4, 4, rng=rng)), lambda rng: (rng.standard_normal((3, 4)),))
    res, cr = run_localised(monkeypatch, case, per_layer=True, keep=True)
    names = [c.name for c in cr.localisation.calls if c.replayed]
    assert names == ["inner", "inner (call 2)"]
    assert all(c.verdict == "agree" for c in cr.localisation.calls if c.replayed)
    first, second = (c for c in cr.localisation.calls if c.path == "inner")
    assert not np.array_equal(first.args[0], second.args[0])  # each call's own inputs


def test_a_failing_replay_is_a_note_not_the_cases_end(monkeypatch):
    monkeypatch.setattr(localise, "record", lambda cr: 1 / 0)
    torch_batch_norm_wrong_where(monkeypatch, 4, None)
    res, _ = run_localised(monkeypatch, CONV_BN)
    assert res.verdict == "disagree" and res.origin is None
    assert any(n.startswith("per-layer replay failed") and "ZeroDivisionError" in n for n in res.notes)


# ---------------------------------------------------------------- inputs handed to a backend stay unchanged
class WritesIntoItsInput(Backend):
    """A test double: the tape, after scribbling on the input array it was handed and on a parameter field."""

    name = "scribbler"

    def evaluate(self, f, args, prefixes=None):
        np.asarray(args[1])[0, 0] += 1.0  # in place: the caller's array
        object.__setattr__(args[0].layers[0], "bias", args[0].layers[0].bias * 2.0)  # the caller's module
        return get_backend("tape").evaluate(f, args, prefixes)


def test_a_backend_that_writes_into_its_arguments_is_reported():
    cr = runner.CaseRun(MLP.with_(dtype="float64"))
    before = localise.snapshot(cr.args64, cr.prefixes)
    WritesIntoItsInput().evaluate(cr.loss_fn(cr.cotangents64), cr.args64, cr.prefixes)
    problems = localise.check_unchanged(before, cr.args64, cr.prefixes)
    assert len(problems) == 2, problems
    assert problems[0].startswith("0.bias: 8 of 8 elements changed by the call")
    assert problems[1].startswith("input: 1 of 20 elements changed by the call (first at [0, 0]")
    assert "wrote into an array it was handed" in problems[1]
    clean = localise.restored(cr.args64, before, cr.prefixes)  # what the next backend gets instead
    assert localise.check_unchanged(before, clean, cr.prefixes) == []


@pytest.mark.parametrize("backend", ["tape", "torch", "jax"])
def test_the_real_backends_leave_their_arguments_alone(backend):
    cr = runner.CaseRun(CONV_BN.with_(dtype="float64"))
    before = localise.snapshot(cr.args64, cr.prefixes)
    get_backend(backend).evaluate(cr.loss_fn(cr.cotangents64), cr.args64, cr.prefixes)
    assert localise.check_unchanged(before, cr.args64, cr.prefixes) == []
    assert set(before) >= {"1.running_mean", "1.running_var", "input"}  # buffers updated on copies only


def test_check_unchanged_reports_shape_and_missing_leaves():
    args, prefixes = (np.zeros((2, 2)), np.ones(3)), ("a", "b")
    before = localise.snapshot(args, prefixes)
    problems = localise.check_unchanged(before, (np.zeros((2, 3)), np.ones(3)), prefixes)
    assert problems == ["a: was float64[2, 2], is float64[2, 3] after the call"]
    assert localise.check_unchanged(before, (np.zeros((2, 2)), np.ones(3)), prefixes) == []

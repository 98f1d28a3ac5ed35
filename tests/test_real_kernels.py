"""Wrong backwards injected into the frameworks' own kernels are caught in float64 and blamed on that backend.

The torch backend calls ``F.batch_norm``, ``F.layer_norm``, ``F.linear``,
``F.conv2d`` and ``F.scaled_dot_product_attention``; each is replaced here by
a ``torch.autograd.Function`` around the real function whose backward is
slightly wrong.  The jax backend's ``linear`` gets a ``jax.custom_vjp`` with a
wrong bias cotangent, and the tape a wrong VJP.  On the real ResNet-18 at
224x224 and on the transformer, the run must find the bug in float64, blame
exactly that backend, and nobody else.
"""

from __future__ import annotations

import pytest

from gradcheck import ops
from gradcheck.backends.tape import ops as tape_ops
from gradcheck.check.runner import RunOptions, run_case
from gradcheck.layers.models import MODELS

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
F = torch.nn.functional

ALL = ("tape", "torch", "jax")
TINY = 1 + 1e-6  # a relative error of 1e-6 in one gradient: float64 must catch it


def _grads_of(fn, inputs, outputs_grad):
    """The correct gradients of ``fn`` at ``inputs`` (tensors or None) for ``outputs_grad``."""
    with torch.enable_grad():
        live = [None if t is None else t.detach().requires_grad_(t.requires_grad) for t in inputs]
        y = fn(*live)
        wrt = [t for t in live if t is not None and t.requires_grad]
        got = iter(torch.autograd.grad(y, wrt, outputs_grad, allow_unused=True))
    return [None if t is None or not t.requires_grad else next(got) for t in live]


def wrong_backward(fn, corrupt):
    """``fn(*tensors, **static)`` as an autograd Function whose gradients pass through ``corrupt(grads, ...)``."""

    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, static, *tensors):
            ctx.static = static
            ctx.save_for_backward(*[t if t is not None else torch.empty(0) for t in tensors])
            ctx.present = [t is not None for t in tensors]
            ctx.needs = [t is not None and t.requires_grad for t in tensors]
            return fn(*tensors, **static)

        @staticmethod
        def backward(ctx, gy):
            saved = [t if p else None for t, p in zip(ctx.saved_tensors, ctx.present)]
            for t, need in zip(saved, ctx.needs):
                if t is not None:
                    t.requires_grad_(need)
            grads = _grads_of(lambda *ts: fn(*ts, **ctx.static), saved, gy)
            return (None, *corrupt(grads, saved, gy, ctx.static))

    def call(*tensors, **static):
        return Wrong.apply(static, *tensors)

    return call


# ---------------------------------------------------------------- the injections
def torch_linear_bias(monkeypatch):
    original = F.linear
    wrong = wrong_backward(lambda x, w, b: original(x, w, b), lambda g, *_: [g[0], g[1], g[2] * TINY])
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: original(x, w, b) if b is None else wrong(x, w, b))


def torch_conv_weight(monkeypatch):
    original = F.conv2d
    wrong = wrong_backward(lambda x, w, b, **k: original(x, w, b, **k),
                           lambda g, *_: [g[0], None if g[1] is None else g[1] * TINY, g[2]])
    monkeypatch.setattr(F, "conv2d", lambda x, w, bias=None, stride=1, padding=0, dilation=1, groups=1:
                        wrong(x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups))


def torch_batch_norm_without_mean_term(monkeypatch):
    """Training-mode BatchNorm whose input gradient lacks its mean term: ``dx += mean(dy * w) / std``."""
    original = F.batch_norm

    def corrupt(grads, saved, gy, static):
        x, w = saved[0], saved[1]
        axes = (0,) + tuple(range(2, x.ndim))
        shape = (1, -1) + (1,) * (x.ndim - 2)
        std = torch.sqrt(x.var(dim=axes, unbiased=False, keepdim=True) + static["eps"])
        scale = 1.0 if w is None else w.reshape(shape)
        return [grads[0] + (gy * scale).mean(dim=axes, keepdim=True) / std, *grads[1:]]

    wrong = wrong_backward(lambda x, w, b, eps: original(x, None, None, w, b, training=True, eps=eps), corrupt)

    def batch_norm(x, rm, rv, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
        if not training:
            return original(x, rm, rv, weight, bias, training=False, momentum=momentum, eps=eps)
        if rm is not None:  # the running statistics as torch updates them, outside the wrong function
            original(x.detach(), rm, rv, None, None, training=True, momentum=momentum, eps=eps)
        return wrong(x, weight, bias, eps=eps)

    monkeypatch.setattr(F, "batch_norm", batch_norm)


def torch_layer_norm_weight(monkeypatch):
    original = F.layer_norm
    wrong = wrong_backward(lambda x, w, b, shape, eps: original(x, shape, w, b, eps),
                           lambda g, *_: [g[0], None if g[1] is None else g[1] * TINY, g[2]])
    monkeypatch.setattr(F, "layer_norm", lambda x, shape, weight=None, bias=None, eps=1e-5:
                        wrong(x, weight, bias, shape=shape, eps=eps))


def torch_sdpa_query(monkeypatch):
    original = F.scaled_dot_product_attention
    wrong = wrong_backward(lambda q, k, v, m, **kw: original(q, k, v, attn_mask=m, **kw),
                           lambda g, *_: [g[0] * TINY, *g[1:]])
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw:
                        wrong(q, k, v, attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw))


def jax_linear_bias(monkeypatch):
    from gradcheck.backends.jax import ops as jax_ops

    original = jax_ops.linear

    @jax.custom_vjp
    def linear(x, w, b):
        return original(x, w, b)

    def fwd(x, w, b):
        y, pullback = jax.vjp(original, x, w, b)
        return y, pullback

    def bwd(pullback, g):
        gx, gw, gb = pullback(g)
        return gx, gw, gb * TINY

    linear.defvjp(fwd, bwd)
    monkeypatch.setattr(jax_ops, "linear", lambda x, w, bias=None: original(x, w) if bias is None
                        else linear(x, w, bias))


def tape_conv_weight(monkeypatch):
    original = tape_ops._conv.vjps[1]
    monkeypatch.setitem(tape_ops._conv.vjps, 1, lambda *a, **k: ops.mul(original(*a, **k), TINY))


# ---------------------------------------------------------------- the checks
def _run(model: str, **case):
    spec = MODELS[model]
    return run_case(spec.case(seed=0, **case), RunOptions(backends=ALL))


RESNET = dict(model="resnet18")  # the real architecture at 224x224, batch 1
TRANSFORMER = dict(model="transformer")


@pytest.mark.slow
@pytest.mark.parametrize("inject, where, backend, expect", [
    (torch_batch_norm_without_mean_term, RESNET, "torch", "conv1.weight"),
    (torch_linear_bias, RESNET, "torch", "fc.bias"),
    (torch_conv_weight, RESNET, "torch", "layer4.1.conv2.weight"),
    (jax_linear_bias, RESNET, "jax", "fc.bias"),
    (tape_conv_weight, RESNET, "tape", "layer4.1.conv2.weight"),
    (torch_layer_norm_weight, TRANSFORMER, "torch", "ln_f.weight"),
    (torch_linear_bias, TRANSFORMER, "torch", "blocks.1.mlp.2.bias"),
    (torch_sdpa_query, TRANSFORMER, "torch", "blocks.0.attn.in_proj_weight"),
    (jax_linear_bias, TRANSFORMER, "jax", "blocks.1.mlp.2.bias"),
    (tape_conv_weight, dict(model="lenet5"), "tape", "conv1.weight"),
], ids=lambda v: v.__name__ if callable(v) else v.get("model") if isinstance(v, dict) else str(v))
def test_an_injected_wrong_backward_is_caught_in_float64_and_blamed_on_that_backend(monkeypatch, inject, where,
                                                                                    backend, expect):
    inject(monkeypatch)
    r = _run(**where)
    bad = r.failing_leaves()
    assert r.verdict == "disagree", (r.verdict, r.errors, [(x.path, x.message) for x in bad])
    assert expect in {x.path for x in bad}, sorted(x.path for x in bad)
    assert all(x.blame == [backend] for x in bad), [(x.path, x.blame, x.message) for x in bad if x.blame != [backend]]
    assert all(x.dtype == "float64" for x in bad)  # decided in float64


@pytest.mark.slow
@pytest.mark.parametrize("where", [RESNET, TRANSFORMER, dict(model="lenet5")], ids=lambda w: w["model"])
def test_without_an_injection_every_leaf_agrees_and_nobody_is_blamed(where):
    # The control of every injection above: the same model, seed and backends, the frameworks' own kernels.
    r = _run(**where)
    assert r.verdict == "agree" and not r.errors and not r.unavailable, (r.verdict, r.errors, r.unavailable)
    assert sorted(r.timings) == sorted(ALL)
    assert [(x.path, x.verdict, x.blame) for x in r.leaves if x.verdict != "agree" or x.blame] == []
    assert r.leaves_compared == len(r.leaves) and r.origin is None


def test_the_injections_are_real_calls_of_the_frameworks_kernels(monkeypatch):
    # The torch backend must reach the patched functions: count the calls of one forward.
    calls = []
    original = F.linear
    monkeypatch.setattr(F, "linear", lambda *a, **k: calls.append(1) or original(*a, **k))
    from gradcheck.layers import Dense

    ops.linear(torch.ones(2, 3), torch.ones(4, 3), torch.zeros(4))
    Dense(3, 4)(torch.ones(2, 3, dtype=torch.float32))
    assert len(calls) == 2

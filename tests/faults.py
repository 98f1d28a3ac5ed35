"""Injected faults for negative controls, one of each kind on every backend.

``wrong_bias_gradient(monkeypatch, backend)`` makes that backend's gradient
of every Dense bias ``factor`` times too large, its forward value untouched:
the tape through the VJP of ``a + b`` with respect to ``b``, torch through an
autograd.Function on the bias, jax through a ``custom_vjp`` on the bias.  The
torch and jax faults wrap ``ops.linear``'s kernel, so they are in place
before the backend first traces the case (jax compiles each case's fresh
loss function, so it sees the fault; a function compiled before the fault
was injected would not).

``unavailable(monkeypatch, backend)`` makes a backend unable to run any case,
as a torch model with an op that has no lowering makes the tape and jax: the
driver raises ``BackendUnavailable`` with a reason, and the runner records it
in ``CaseResult.unavailable``.
"""

from __future__ import annotations

from gradcheck import ops
from gradcheck.backends import get_backend
from gradcheck.backends.base import BackendUnavailable
from gradcheck.backends.tape import ops as tape_ops

FACTOR = 1.01  # 1 % too large: far outside the float64 referee's resolution, far inside plausibility
REASON = "no lowering for aten.fancy_op.default (a test's stand-in for an unsupported op)"


def wrong_bias_gradient(monkeypatch, backend: str, factor: float = FACTOR) -> None:
    {"tape": _tape, "torch": _torch, "jax": _jax}[backend](monkeypatch, factor)


def _tape(monkeypatch, factor):
    original = tape_ops.add.vjps[1]
    monkeypatch.setitem(tape_ops.add.vjps, 1, lambda g, ans, a, b: ops.mul(original(g, ans, a, b), factor))


def _torch(monkeypatch, factor):
    import torch

    from gradcheck.backends.torch import ops as torch_ops

    class ScaledGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, b):
            return b.clone()

        @staticmethod
        def backward(ctx, g):
            return g * factor

    original = torch_ops.linear
    monkeypatch.setattr(torch_ops, "linear", lambda x, w, bias=None: original(
        x, w, None if bias is None else ScaledGradient.apply(bias)))


def _jax(monkeypatch, factor):
    import jax

    from gradcheck.backends.jax import ops as jax_ops

    @jax.custom_vjp
    def scaled_gradient(b):
        return b

    scaled_gradient.defvjp(lambda b: (b, None), lambda _, g: (g * factor,))
    original = jax_ops.linear
    monkeypatch.setattr(jax_ops, "linear", lambda x, w, bias=None: original(
        x, w, None if bias is None else scaled_gradient(bias)))


def unavailable(monkeypatch, backend: str, reason: str = REASON) -> None:
    def refuse(*args, **kwargs):
        raise BackendUnavailable(reason)

    monkeypatch.setattr(get_backend(backend), "evaluate", refuse)


def wrong_sin_gradient(monkeypatch, backend: str, factor: float) -> None:
    """That backend's gradient of ``ops.sin`` ``factor`` times too large, its forward value untouched."""
    if backend == "tape":
        original = tape_ops.sin.vjps[0]
        monkeypatch.setitem(tape_ops.sin.vjps, 0, lambda g, ans, x: ops.mul(original(g, ans, x), factor))
    elif backend == "torch":
        import torch

        from gradcheck.backends.torch import ops as torch_ops

        class Sin(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return torch.sin(x)

            @staticmethod
            def backward(ctx, g):
                return g * torch.cos(ctx.saved_tensors[0]) * factor

        monkeypatch.setattr(torch_ops, "sin", Sin.apply)
    else:
        import jax

        from gradcheck.backends.jax import ops as jax_ops

        @jax.custom_vjp
        def sin(x):
            return jax.numpy.sin(x)

        sin.defvjp(lambda x: (jax.numpy.sin(x), x), lambda x, g: (g * jax.numpy.cos(x) * factor,))
        monkeypatch.setattr(jax_ops, "sin", sin)


def float32_gradient(monkeypatch, backend: str, path: str, change) -> None:
    """That backend's float32 gradient of leaf ``path`` replaced by ``change(gradient)`` as it returns, where only
    the float32 measurement can see it (its float64 run untouched); ``change`` returning None removes it."""
    import numpy as np

    driver = get_backend(backend)
    original = driver.evaluate

    def evaluate(f, args, prefixes=None, **kw):
        ev = original(f, args, prefixes, **kw)
        g = ev.grads.get(path)
        if g is not None and np.asarray(g).dtype == np.float32:
            changed = change(np.asarray(g))
            if changed is None:
                del ev.grads[path]
            else:
                ev.grads[path] = changed
        return ev

    monkeypatch.setattr(driver, "evaluate", evaluate)


def wrong_jax_tanh(monkeypatch, backend: str, factor: float) -> None:
    """For ``from_jax`` models: ``backend``'s gradient of jax's ``tanh`` ``factor`` times too large, its value
    untouched: the tape's and torch's lowering of the primitive (``primitives.LOWERINGS``), or jax's own rule for
    it (its JVP), as a bug in jax would be.  jax's caches are cleared, so that no program traced with the right
    rule is reused (clear them again after the test: nothing traced under the fault may outlive it)."""
    import jax
    import numpy as np

    from gradcheck.backends import backend_of
    from gradcheck.frontends.jax import primitives

    if backend == "jax":
        from jax import lax
        from jax._src.interpreters import ad

        right_jvp = ad.primitive_jvps[lax.tanh_p]

        def wrong_jvp(primals, tangents, **params):
            out, tangent = right_jvp(primals, tangents, **params)
            return out, (tangent if type(tangent) is ad.Zero else tangent * factor)

        monkeypatch.setitem(ad.primitive_jvps, lax.tanh_p, wrong_jvp)
        jax.clear_caches()
        return
    if backend == "tape":
        from gradcheck.backends.tape.tape import Primitive

        bad = Primitive("wrong_tanh", np.tanh).defvjp(
            lambda g, ans, x: ops.mul(ops.mul(g, ops.sub(1.0, ops.mul(ans, ans))), factor))
    else:
        import torch

        class WrongTanh(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = torch.tanh(x)
                ctx.save_for_backward(y)
                return y

            @staticmethod
            def backward(ctx, g):
                (y,) = ctx.saved_tensors
                return g * (1 - y * y) * factor

        bad = WrongTanh.apply
    right = primitives.LOWERINGS["tanh"]
    monkeypatch.setitem(primitives.LOWERINGS, "tanh", lambda ctx, x, **kw: bad(x) if backend_of(x) == backend
                        else right(ctx, x, **kw))


"""The PyTorch backend driver: ``torch.autograd`` on the same numpy bits the tape gets.

torch is imported on the first evaluation, never by ``import gradcheck``.
The device is "cpu" unless ``GRADCHECK_TORCH_DEVICE`` (or the ``device``
attribute) names another, e.g. "cuda"; the same cases then run on a GPU.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import os
import sys

import numpy as np

from gradcheck.backends.base import Backend, Evaluation, evaluate_eagerly

DEVICE_ENV = "GRADCHECK_TORCH_DEVICE"

_configured = False


def _configure(torch) -> None:
    """Make torch compute what it says: full float32 matmuls, deterministic kernels (once per process)."""
    global _configured
    if _configured:
        return
    # TF32 rounds float32 matmul inputs to 10 mantissa bits on Ampere+ GPUs,
    # which would show up as disagreements that are not bugs.  cuBLAS's switch is a plain setter, which
    # frozen flags do not guard; cuDNN's is set in _full_precision, which knows about frozen flags.
    torch.backends.cuda.matmul.allow_tf32 = False
    # Ops without a deterministic kernel warn instead of failing the case.
    _use_deterministic_algorithms(torch)
    _configured = True


def _full_precision(torch):
    """A context in which cuDNN computes float32 convolutions in full float32 (TF32 off).

    PyTorch's own test harness (``torch.testing._internal.common_utils``)
    freezes the global backend flags with ``torch.backends.disable_global_flags()``:
    from then on ``cudnn.allow_tf32 = False`` raises, and a flag may only be
    changed inside ``torch.backends.cudnn.flags(...)``, which puts it back on
    exit.  So: unfrozen, the flag is switched off once for the process, as
    before; frozen, each evaluation runs inside ``cudnn.flags`` with every
    other cuDNN flag as the harness set it, and leaves the harness's value
    behind.
    """
    cudnn = torch.backends.cudnn
    if not cudnn.allow_tf32:
        return contextlib.nullcontext()
    if not torch.backends.flags_frozen():
        cudnn.allow_tf32 = False
        return contextlib.nullcontext()
    return cudnn.flags(**_cudnn_flags(torch, allow_tf32=False))


def _cudnn_flags(torch, **changed) -> dict:
    """Every argument ``cudnn.flags`` takes (they differ between torch versions) at its current value, but
    ``changed``: ``cudnn.flags`` sets each one it is given, and its defaults would turn cuDNN off."""
    cudnn = torch.backends.cudnn
    current = {}
    for name in inspect.signature(cudnn.flags).parameters:
        if name == "fp32_precision":  # the value cudnn.flags saves and restores: all of cuda's, not cuDNN's own
            current[name] = torch._C._get_fp32_precision_getter("cuda", "all")
        else:
            current[name] = getattr(cudnn, name)
    return {**current, **changed}


def _use_deterministic_algorithms(torch) -> None:
    """``torch.use_deterministic_algorithms(True, warn_only=True)``, without its import cost.

    The public call imports torch._inductor (seconds, on first use) only to set
    torch.compile's flag; gradcheck never compiles, so when inductor is not
    loaded yet the same switch is set directly.
    """
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if "torch._inductor" in sys.modules or setter is None:
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        setter(True, warn_only=True)


class TorchBackend(Backend):
    name = "torch"
    module = "torch"
    install_hint = (
        "install the CPU build with `pip install torch==2.13.0 --index-url "
        "https://download.pytorch.org/whl/cpu`, or, after installing a CPU torch, "
        "`pip install 'gradcheck[torch]'`"
    )
    shares_cores = False  # its intra-op pool is the user's configuration (``gradcheck.check.cores``)

    def __init__(self, device: str | None = None):
        self.device = device or os.environ.get(DEVICE_ENV) or "cpu"

    def evaluate(self, f, args, prefixes=None) -> Evaluation:
        self.require()
        import torch

        _configure(torch)
        with _full_precision(torch), _held_to_backward():
            return self._evaluate(torch, f, args, prefixes)

    def _evaluate(self, torch, f, args, prefixes) -> Evaluation:
        device = self.device

        def lift(value, trainable):
            if isinstance(value, torch.Tensor) and value.requires_grad:
                # Called inside an outer torch gradient: stay linked to the outer
                # graph so the result is differentiable (gradients of gradients).
                return (value.clone() if trainable else value.detach().clone()), True
            if isinstance(value, torch.Tensor):
                return value.detach().clone().to(device).requires_grad_(trainable), False
            # A copy: torch must not share (and possibly write into) the caller's arrays.
            return torch.from_numpy(np.array(value, order="C", copy=True)).to(device).requires_grad_(trainable), False

        def differentiate(loss, wrt, create_graph):
            _check_loss(loss, torch)
            return _grads(torch, loss, wrt, create_graph)

        return evaluate_eagerly(f, args, prefixes, lift, differentiate, _to_numpy)


# The set-up of the torch calls made inside an evaluation, undone after its gradient (``hold``).
_HELD: contextvars.ContextVar[contextlib.ExitStack | None] = contextvars.ContextVar("gradcheck_torch_held",
                                                                                   default=None)


@contextlib.contextmanager
def _held_to_backward():
    with contextlib.ExitStack() as stack:
        token = _HELD.set(stack)
        try:
            yield
        finally:
            _HELD.reset(token)


def hold(setup: contextlib.ExitStack) -> None:
    """Undo ``setup`` (a module call's set-up) after the gradient of the evaluation it is made in; outside one, now.

    Gradient checkpointing (``torch.utils.checkpoint``, transformers'
    ``gradient_checkpointing_enable()``) and reversible layers run parts of
    a forward again inside the backward.  That recompute must meet the call
    it repeats: the case's leaves bound (not the module's own float32
    parameters), the run's float dtype, the module's mode, the same random
    draws.  So a call's set-up stays until the backward is done, and the
    set-ups are undone in the reverse order they were made.
    """
    held = _HELD.get()
    if held is None:
        setup.close()
    else:
        held.enter_context(setup)


def _to_numpy(x):
    from gradcheck.backends.torch import ops

    return ops.to_numpy(x)


def _check_loss(loss, torch) -> None:
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"the function returned a {type(loss).__name__}, not a torch tensor; "
            "it must compute its loss from its arguments with gradcheck.ops"
        )
    if loss.numel() != 1:
        raise ValueError(
            f"the loss has shape {tuple(loss.shape)}; it must be a scalar "
            "(reduce it first, e.g. ops.sum(ops.mul(output, cotangent)))"
        )
    if not loss.is_floating_point():
        raise TypeError(f"the loss has dtype {loss.dtype}; only a float loss can be differentiated")


def _grads(torch, loss, wrt, create_graph):
    """d loss / d wrt, with zeros where the loss does not depend on a tensor (as the tape gives)."""
    if not wrt:
        return []
    if not loss.requires_grad:  # the loss uses no trainable leaf at all
        return [torch.zeros_like(t) for t in wrt]
    if not create_graph and all(t.is_leaf for t in wrt) and _custom_function(loss):
        # A custom autograd.Function may give its gradient only as a training loop takes it, into .grad:
        # torch.utils.checkpoint(use_reentrant=True) refuses autograd.grad ("incompatible with .grad()"), and a
        # reversible layer (Reformer's) runs a backward of its own that accumulates its parameters' .grad and
        # returns nothing for them.  The plain backward, into the driver's own fresh leaves, takes both.
        loss.reshape(()).backward()
        grads = [t.grad for t in wrt]
    else:
        grads = torch.autograd.grad(loss.reshape(()), wrt, allow_unused=True, create_graph=create_graph)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(grads, wrt, strict=True)]


def _custom_function(loss) -> bool:
    """Whether the graph behind ``loss`` holds the backward of a custom ``torch.autograd.Function``."""
    from torch.autograd.function import BackwardCFunction

    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if isinstance(node, BackwardCFunction):
            return True
        todo.extend(fn for fn, _ in node.next_functions)
    return False

"""Which side of a node's lowering check is wrong: torch's own reference implementation of the op, as a third opinion.

The lowering check (``interpreter.verify``) runs every node by torch's kernel and by gradcheck's lowering on the
same float64 inputs.  When the two differ, one of them is wrong, and the check alone cannot say which: a lowering
that computes something else, or a torch kernel that does (a regression in torch, or a kernel a user or a test has
replaced through ``torch.library``).  torch keeps a Python decomposition for most ATen ops (``torch._decomp``),
written in other ops, independently of the op's own kernel.  Run in float64 on the same inputs, it sides with one
of the two.

The decomposition is taken as deep as the table goes (``layer_norm`` runs ``native_layer_norm``'s kernel, which the
table decomposes in turn).  It is an opinion only where it runs none of the kernels torch's op runs, by name: a
decomposition that does (``aten.exp``'s calls ``prims.exp``, which runs torch's exp kernel) would repeat the
kernel's answer, whichever it is.  Such a decomposition, none at all, or one that sides with neither, leaves the question open,
and the message says that either may be at fault.
"""

from __future__ import annotations

from dataclasses import dataclass

# What the decomposition's answer says.
LOWERING_WRONG = "lowering"  # it agrees with torch's kernel, not with the lowering
KERNEL_WRONG = "kernel"  # it agrees with the lowering, not with torch's kernel
OPEN = "open"  # no independent decomposition, or it sides with neither (or both)


@dataclass(frozen=True)
class Opinion:
    side: str  # LOWERING_WRONG, KERNEL_WRONG or OPEN
    why: str  # what was consulted and what it found, for the message


def _name(op) -> str:
    """An op's bare name, whatever its namespace and overload: ``aten.exp.default`` and ``prims.exp.default``
    are both ``exp``."""
    packet = getattr(op, "overloadpacket", op)
    return str(getattr(packet, "__name__", packet)).rsplit(".", 1)[-1]


def consult(target, targs, tkwargs, tout, lout, differ) -> Opinion:
    """torch's decomposition of ``target`` run on torch's float64 arguments, against torch's output ``tout`` and
    the lowering's ``lout`` (both numpy); ``differ(torch_value, numpy_value)`` is the lowering check's own
    comparison."""
    import torch

    spelled = str(target)
    try:
        with torch.no_grad():
            kernels, _ = _run(target, targs, tkwargs, decompose=False)
            used, reference = _run(target, targs, tkwargs, decompose=True)
    except Exception as exc:  # the decomposition does not take these arguments: no opinion, and not an error
        return Opinion(OPEN, f"torch's reference decomposition of {spelled} could not run here "
                             f"({type(exc).__name__}: {exc})")
    if used.decomposed == 0:
        return Opinion(OPEN, f"torch has no reference decomposition of {spelled} to tell which")
    shared = sorted(kernels.ran & used.ran)
    if shared:
        return Opinion(OPEN, f"torch's reference decomposition of {spelled} runs the kernel its op runs "
                             f"({', '.join(shared)}), so it cannot tell which")
    with_kernel = differ(reference, tout) is None
    with_lowering = differ(reference, lout) is None
    source = f"torch's own reference decomposition of {spelled} (torch._decomp, float64, on the same inputs)"
    if with_kernel and not with_lowering:
        return Opinion(LOWERING_WRONG, f"{source} agrees with torch's kernel")
    if with_lowering and not with_kernel:
        return Opinion(KERNEL_WRONG, f"{source} agrees with the lowering, not with torch's kernel")
    return Opinion(OPEN, f"{source} agrees with {'both' if with_kernel else 'neither'}")


@dataclass
class _Ran:
    ran: set  # the bare names of the kernels that ran
    decomposed: int = 0  # how many ops were replaced by their decomposition


def _run(target, targs, tkwargs, decompose: bool):
    """``target`` run under a dispatch mode that records the kernels it reaches; with ``decompose``, every op that
    torch._decomp decomposes is replaced by its decomposition, as deep as the table goes (an op is not decomposed
    inside its own decomposition).  Returns (what ran, the value)."""
    from torch._decomp import decomposition_table
    from torch.utils._python_dispatch import TorchDispatchMode

    ran = _Ran(set())
    inside: list = []

    class _Kernels(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            decomposition = decomposition_table.get(func) if decompose and func not in inside else None
            if decomposition is None:
                ran.ran.add(_name(func))
                return func(*args, **kwargs)
            ran.decomposed += 1
            inside.append(func)
            try:
                with self:  # the decomposition's own ops are dispatched here too
                    return decomposition(*args, **kwargs)
            finally:
                inside.pop()

    with _Kernels():
        value = target(*targs, **tkwargs)
    return ran, value

"""What every AD backend provides: run ``f`` on arguments, return value, gradients and buffers.

A backend driver moves the numpy leaves of the arguments onto its framework
(trainable leaves with gradients on), rebuilds the argument structure, calls
``f``, differentiates the loss with respect to the trainable leaves only, and
hands everything back as numpy, keyed by leaf path.  The drivers share this
module's helpers so that leaf selection and buffer read-back are identical.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass, field
from typing import Any

from gradcheck.tree import Leaf, leaves_with_paths, map_leaves


class BackendUnavailable(RuntimeError):
    """The framework behind a backend is not installed (the message says how to install it)."""


@dataclass
class Evaluation:
    """One backend's answer for one call of ``f``."""

    value: Any  # what f returned, as numpy (a tuple when f returned one)
    grads: dict[str, Any]  # path -> gradient, for every trainable leaf
    buffers: dict[str, Any] = field(default_factory=dict)  # path -> buffer value after the call
    leaves: list[Leaf] = field(default_factory=list)  # the input leaves, as given


def arg_prefixes(args, prefixes=None) -> tuple[str, ...]:
    if prefixes is None:
        return tuple(str(i) for i in range(len(args)))
    if len(prefixes) != len(args):
        raise ValueError(f"{len(prefixes)} prefixes for {len(args)} arguments")
    return tuple(prefixes)


def all_leaves(args, prefixes) -> list[Leaf]:
    return [leaf for a, p in zip(args, prefixes) for leaf in leaves_with_paths(a, p)]


def split_output(out):
    """f may return the loss alone or a tuple whose first element is the loss."""
    return (out[0], out) if isinstance(out, tuple) else (out, out)


def program_data(f):
    """``(arrays, rebuild)``: the arrays ``f`` closes over that a compiling backend takes as inputs of its program
    rather than constants compiled into it, and ``rebuild(values)``, ``f`` with ``values`` in their place; None for
    a function that declares none (a user's own).  The runner's cross-check loss declares its cotangents
    (``runner._loss_function``): they are drawn from the case seed, and as constants they made every seed's
    program a new one to jax's compilation cache."""
    return getattr(f, "program_data", None)


def read_buffers(args, prefixes, to_numpy) -> dict[str, Any]:
    """Buffer values after f ran (a layer updates a buffer by assigning the field)."""
    return {leaf.path: to_numpy(leaf.value) for leaf in all_leaves(args, prefixes) if leaf.kind == "buffer"}


def evaluate_eagerly(f, args, prefixes, lift, differentiate, to_numpy) -> Evaluation:
    """The eager drivers' shared skeleton (tape, torch): every leaf onto the framework, ``f``, the gradient.

    ``lift(value, trainable) -> (tensor, linked)`` makes one leaf's tensor;
    ``linked`` says the value was already a tensor of an outer gradient, and
    was kept attached to it: then ``f`` is being differentiated inside that
    gradient, so results stay tensors (and the gradient is taken with
    ``create_graph``) for the outer one to differentiate.
    ``differentiate(loss, tensors, create_graph)`` returns one gradient per
    trainable tensor; ``to_numpy`` hands results back.
    """
    prefixes = arg_prefixes(args, prefixes)
    leaves = all_leaves(args, prefixes)
    tracked: dict[str, Any] = {}
    nested = False

    def to_tensor(path, value, kind):
        nonlocal nested
        trainable = Leaf(path, value, kind).trainable
        tensor, linked = lift(value, trainable)
        nested = nested or linked
        if trainable:
            tracked[path] = tensor
        return tensor

    targs = [map_leaves(a, to_tensor, p) for a, p in zip(args, prefixes, strict=True)]
    loss, value = split_output(f(*targs))
    paths = list(tracked)
    grads = differentiate(loss, [tracked[p] for p in paths], nested)
    keep = (lambda x: x) if nested else to_numpy
    return Evaluation(
        value=map_output(value, keep),
        grads=dict(zip(paths, (keep(g) for g in grads), strict=True)),
        buffers=read_buffers(targs, prefixes, keep),
        leaves=leaves,
    )


def map_output(out, fn):
    if isinstance(out, (tuple, list)):
        items = [map_output(v, fn) for v in out]
        return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)  # namedtuples take fields
    if isinstance(out, dict):
        return {k: map_output(v, fn) for k, v in out.items()}
    return fn(out) if out is not None and not isinstance(out, (bool, int, float, str)) else out


class Backend:
    """Base of the backend drivers; subclasses implement ``evaluate``."""

    name = "?"
    module = None  # the framework's import name
    install_hint = ""
    # Whether the first call compiles (so a second call times the computation
    # alone); eager backends' calls all cost the same, and the runner calls them once.
    compiles = False
    # Whether the threads it computes on are the BLAS libraries' (the tape's numpy), which are lowered while a
    # compilation runs beside it (``gradcheck.check.cores``).  One whose are not (torch's own pool, left as torch
    # has it) runs after the compiling backends instead, when the compilation has every core back.
    shares_cores = True

    def busy(self) -> bool:
        """Whether work this backend started in the background (a compilation ``prepare`` began) is still
        running: the eager backends then leave it cores (``gradcheck.check.cores``)."""
        return False

    def available(self) -> tuple[bool, str]:
        """(True, version) or (False, why and how to install)."""
        if self.module is None:
            return True, "built in"
        try:
            importlib.import_module(self.module)
        except ImportError as exc:
            return False, f"{self.module} is not installed ({exc}); {self.install_hint}"
        return True, self.version()

    def version(self) -> str:
        if self.module is None:
            return "built in"
        try:
            return importlib.metadata.version(self.module)
        except importlib.metadata.PackageNotFoundError:
            return "unknown"

    def require(self):
        ok, why = self.available()
        if not ok:
            raise BackendUnavailable(f"backend '{self.name}' is unavailable: {why}")

    def evaluate(self, f, args, prefixes=None) -> Evaluation:
        raise NotImplementedError

"""Custom ops checked against the user's reference math, and the public way to lower an op.

A model library's own kernel (a ``torch.library.custom_op`` with its
``register_autograd`` backward, a fused CUDA kernel) is opaque to the tape
and jax: its ATen graph is one node.  Two ways to check it:

* ``from_torch(module, x, references={"mylib::fused_gelu": ref})``, where
  ``ref`` is a torch function with the op's signature written in ordinary
  torch ops.  torch runs the user's kernel, with its own backward; the tape,
  jax and the referee run ``ref``, traced through ``torch.export`` at the
  op's argument shapes and lowered like the rest of the graph.  The
  node-by-node check holds the kernel's forward to the reference's before
  anyone is blamed, so a wrong backward is torch's, and a reference that
  computes something else is reported as such.
* ``@gradcheck.frontends.torch.lowering("mylib::fused_gelu")`` on a function of the
  op's arguments written in ``gradcheck.ops``: the op is lowered like
  gradcheck's own rows (``gradcheck/frontends/torch/aten.py``), for every module.

An op name is written as torch prints the op (``mylib::fused_gelu``, with
an overload after a dot when it is not ``default``), or as the op object
(``torch.ops.mylib.fused_gelu``).
"""

from __future__ import annotations

from collections.abc import Callable


def op_key(op) -> str:
    """The graph's name of an op: ``mylib::fused_gelu`` -> ``mylib.fused_gelu.default``."""
    if not isinstance(op, str):
        name = str(op)  # OpOverload: "mylib.fused_gelu.default"; OpOverloadPacket: "mylib.fused_gelu"
    else:
        name = op.replace("::", ".")
    parts = name.split(".")
    if len(parts) == 2:
        parts.append("default")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"op name {op!r}: expected 'namespace::name' or 'namespace::name.overload' "
                         "(as torch prints it, e.g. 'mylib::fused_gelu'), or the op itself (torch.ops.mylib.fused_gelu)")
    return ".".join(parts)


def lowering(op):
    """Lower ``op`` in ``gradcheck.ops`` for every ``from_torch`` graph: ``@lowering("mylib::fused_gelu")``.

    The decorated function takes the op's arguments as the graph gives them
    (tensors on the backend that runs: tape tensors, jax arrays, numpy) and
    returns its value, written with ``gradcheck.ops`` so that each backend
    runs its own kernels.  It replaces gradcheck's own row of the same name.
    """
    from gradcheck.frontends.torch.aten import lower

    key = op_key(op)

    def register(fn: Callable):
        def lowered(ctx, *args, **kwargs):
            return fn(*args, **kwargs)

        lowered.__name__ = getattr(fn, "__name__", "lowering")
        lower(key)(lowered)
        return fn

    return register


def normalise(references: dict | None) -> dict[str, Callable]:
    """``references`` keyed by the graph's op names, each value checked to be callable."""
    out = {}
    for op, fn in (references or {}).items():
        if not callable(fn):
            raise TypeError(f"from_torch: references[{op!r}] is a {type(fn).__name__}; give a torch function with "
                            "the op's signature (its reference math in ordinary torch ops)")
        out[op_key(op)] = fn
    return out


class Reference:
    """The lowering of one custom op from its reference function, traced once per argument signature."""

    def __init__(self, key: str, fn: Callable, training: bool, decompose: str):
        self.key = key
        self.fn = fn
        self.training = training
        self.decompose = decompose
        self._graphs: dict = {}

    def graph_for(self, node):
        """The reference's graph at this node's argument shapes and constants (traced on first use)."""
        from torch.utils import _pytree as pytree

        flat, spec = pytree.tree_flatten((node.args, node.kwargs))
        signature = tuple(_signature(x) for x in flat)
        if signature not in self._graphs:
            self._graphs[signature] = self._trace(flat, spec)
        return self._graphs[signature]

    def _trace(self, flat, spec):
        import torch
        from torch.fx import Node
        from torch.utils import _pytree as pytree

        from gradcheck.frontends.torch import capture

        positions = [i for i, x in enumerate(flat) if isinstance(x, Node)]
        examples = tuple(_example(flat[i].meta.get("val")) for i in positions)
        fn = self.fn

        class _Reference(torch.nn.Module):
            def forward(self, *tensors):
                values = list(flat)
                for i, t in zip(positions, tensors):
                    values[i] = t
                args, kwargs = pytree.tree_unflatten(values, spec)
                return fn(*args, **kwargs)

        wrapper = capture._Forward(_Reference())
        name = f"the reference of {self.key}"
        ep = capture.export(wrapper, examples, self.training, self.decompose, name)
        graph = capture.read_graph(ep, wrapper, len(examples), self.training)
        return graph, positions

    def __call__(self, ctx, *args, **kwargs):
        from torch.utils import _pytree as pytree

        from gradcheck.frontends.torch import interpreter
        from gradcheck.frontends.torch.facts import CaseFacts

        graph, positions = self.graph_for(ctx.node)
        if graph.problems:
            raise interpreter.UnsupportedOp(f"the reference of {self.key} cannot run on the tape and jax: "
                                            + "; ".join(graph.problems.values()))
        flat, _ = pytree.tree_flatten((list(args), dict(kwargs)))
        tensors = [flat[i] for i in positions]
        values = {}
        for name, b in graph.inputs.items():
            if b.kind == "input":
                values[name] = tensors[b.index]
            elif b.kind == "constant":
                v = b.value
                values[name] = v.astype(ctx.floats) if v.dtype.kind == "f" else v
            else:
                raise interpreter.UnsupportedOp(f"the reference of {self.key} reads {b.kind} {b.target}; a "
                                                "reference is a function of the op's arguments alone")
        outs = interpreter.run(graph, values, ctx.floats, CaseFacts(getattr(ctx._mask, "seed", 0), graph))
        user = [v for (kind, _), v in zip(graph.outputs, outs) if kind == "output"]
        return user[0] if len(user) == 1 else tuple(user)


def _signature(x):
    from torch.fx import Node

    if isinstance(x, Node):
        val = x.meta.get("val")
        return ("tensor", tuple(val.shape), str(val.dtype)) if val is not None else ("node",)
    return ("value", repr(x))


def _example(val):
    """A real tensor like a graph value, to trace the reference at (values drawn, not zeros: a branch on
    them must be taken the way real inputs take it)."""
    import torch

    if val is None:
        raise ValueError("a reference's argument has no recorded shape")
    if val.dtype.is_floating_point:
        g = torch.Generator().manual_seed(0)
        return torch.randn(tuple(val.shape), generator=g, dtype=val.dtype)
    return torch.zeros(tuple(val.shape), dtype=val.dtype)


def lowerings(references: dict[str, Callable], training: bool, decompose: str) -> dict[str, Reference]:
    """One lowering per custom op that ``references`` covers, for the graph of one mode (``capture.read_graph``)."""
    return {key: Reference(key, fn, training, decompose) for key, fn in references.items()}

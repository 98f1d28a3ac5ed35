"""The tape backend driver: gradcheck's own reverse-mode AD on numpy."""

from __future__ import annotations

import numpy as np

from gradcheck import tape
from gradcheck.backends.base import (
    Backend,
    Evaluation,
    all_leaves,
    arg_prefixes,
    map_output,
    read_buffers,
    split_output,
)
from gradcheck.tree import Leaf, map_leaves


class TapeBackend(Backend):
    name = "tape"

    def evaluate(self, f, args, prefixes=None) -> Evaluation:
        from gradcheck.backends.tape_ops import identity

        prefixes = arg_prefixes(args, prefixes)
        leaves = all_leaves(args, prefixes)
        tracked: dict[str, tape.Tensor] = {}
        nested = False

        def to_tensor(path, value, kind):
            nonlocal nested
            trainable = Leaf(path, value, kind).trainable
            if not trainable and np.asarray(tape.raw(value)).dtype.kind != "f":
                # Integer leaves (token ids, labels) are constants: hand them over as
                # numpy, so indexing with them needs no unwrapping in layers.
                return np.asarray(tape.raw(value))
            if isinstance(value, tape.Tensor) and value.requires_grad:
                # Called inside an outer gradient: link to the outer tape so the
                # result stays differentiable (gradients of gradients).
                nested = True
                t = identity(value) if trainable else tape.Tensor(value.value)
            else:
                t = tape.Tensor(tape.raw(value), requires_grad=trainable)
            if trainable:
                tracked[path] = t
            return t

        targs = [map_leaves(a, to_tensor, p) for a, p in zip(args, prefixes)]
        out = f(*targs)
        loss, value = split_output(out)
        paths = list(tracked)
        grads = tape.grad(loss, [tracked[p] for p in paths], create_graph=nested) if paths else []
        keep = (lambda x: x) if nested else (lambda x: np.asarray(tape.raw(x)))
        return Evaluation(
            value=map_output(value, keep),
            grads=dict(zip(paths, (keep(g) for g in grads))),
            buffers=read_buffers(targs, prefixes, keep),
            leaves=leaves,
        )

"""The bare frameworks' own time for what ``gradcheck run resnet18`` checks, as a plain script.

Imports torch and jax, builds ResNet-18's parameters (the same numpy
initialisation the harness uses), then takes one forward+backward pass of
``<r, model(x)>`` in torch eager (a torch.nn ResNet-18 loaded with those
parameters) and one in jax (``jax.jit(jax.value_and_grad(...))`` of the model
through gradcheck's jax ops, compilation included), each in float32 and in
float64, train mode.  That is the least work that yields what the harness
compares: both frameworks' gradients in both precisions.  The harness does
that, plus its own tape in both precisions, a second timed jax call, the
float64 reference forward, the referee and the reports.  Prints a JSON
breakdown of where its time went.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

THREADS = _common.setup_threads()


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1, help="default 1, as `gradcheck run resnet18`")
    p.add_argument("--size", type=int, default=224)
    args = p.parse_args(argv)
    marks = {}

    t = time.perf_counter()
    import jax
    import numpy as np
    import torch

    _common.limit_loaded_libraries(THREADS)
    marks["import numpy, torch, jax"] = time.perf_counter() - t

    t = time.perf_counter()
    from gradcheck.case import materialise
    from gradcheck.layers.models import MODELS

    case = MODELS["resnet18"].case(batch=args.batch, input_shape=(3, args.size, args.size))
    model, (x,) = materialise(case)  # the case's seed: the harness's parameters and input
    r = np.random.default_rng(1).standard_normal((args.batch, 1000)).astype(np.float32)
    marks["build parameters (numpy)"] = time.perf_counter() - t

    import torch_models

    torch.backends.cudnn.allow_tf32 = False
    for dtype in (torch.float32, torch.float64):
        t = time.perf_counter()
        net = torch_models.build("resnet18", model).to(dtype)
        xt = torch.from_numpy(np.array(x, copy=True)).to(dtype).requires_grad_(True)
        wrt = list(net.parameters()) + [xt]
        grads = torch.autograd.grad((net(xt) * torch.from_numpy(r).to(dtype)).sum(), wrt)
        assert len(grads) == 63
        marks[f"torch eager forward+backward, {str(dtype)[6:]}"] = time.perf_counter() - t

    from gradcheck import ops
    from gradcheck.backends.jax.driver import configure_jax
    from gradcheck.tree import leaves_with_paths, map_leaves

    configure_jax()  # as the driver: float64 available, highest matmul precision
    leaves = leaves_with_paths(model)
    for dtype in (np.float32, np.float64):
        t = time.perf_counter()
        values = {leaf.path: jax.numpy.asarray(np.asarray(leaf.value).astype(dtype) if np.asarray(leaf.value).dtype.kind
                                               == "f" else leaf.value) for leaf in leaves}
        def loss(train_vals, x, values=values, train=tuple(leaf.path for leaf in leaves if leaf.trainable)):
            vals = dict(values)
            vals.update(zip(train, train_vals))
            out = map_leaves(model, lambda path, v, kind: vals[path])(x)
            return ops.sum(out * ops.asarray(r, like=out))

        train = [leaf.path for leaf in leaves if leaf.trainable]
        value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))([values[p] for p in train],
                                                                         jax.numpy.asarray(x.astype(dtype)))
        jax.block_until_ready(grads)
        marks[f"jax jit compile + forward+backward, {np.dtype(dtype).name}"] = time.perf_counter() - t

    marks["total (process start to end)"] = time.perf_counter() - T_START
    text = json.dumps({"batch": args.batch, "size": args.size, "threads": THREADS, "marks": marks}, indent=1)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(text)
    print(text)


if __name__ == "__main__":
    main()

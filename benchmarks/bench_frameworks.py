"""Figure 1: forward+backward of one model, tape vs torch eager vs jax jit, in one process.

Every variant computes the same thing: the gradient of the runner's loss
``<r, model(x)>`` (random cotangent ``r``) with respect to every trainable
parameter and the float input, from identical float32 parameters, with the
same thread count.  Variants:

* ``tape``, ``torch``, ``jax``: gradcheck's backend drivers (``evaluate``), as
  the runner calls them: leaves in, gradients out as numpy.
* ``tape ops``, ``torch ops``: the gradcheck model on tape or torch tensors
  without the driver (tensors made once; forward + ``tape.grad`` or
  ``torch.autograd.grad``): the driver's cost is the difference.
* ``torch.nn``: the model written as plain torch.nn (ResNet-18, MLP; see
  ``torch_models.py``), loaded with the same parameters: bare torch eager.
* ``jax.jit``: ``jax.jit(jax.value_and_grad(loss))`` of the gradcheck model
  through the jax backend, called directly: bare jax (compile time apart).

Times are medians of ``--runs`` runs after a warm-up, the variants taking
turns; jax's first call (trace + compile) is reported separately, after a
tiny jit call has paid jax's one-time start-up for both.  A sanity
check reports the normwise difference between the tape's and torch.nn's
gradients, which shows both got the same parameters.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

THREADS = _common.setup_threads()

CONFIGS = {
    # name: (batch, per-example input shape or None for the zoo's default)
    "resnet18": (2, (3, 224, 224)),
    "transformer": (None, None),
    "mlp": (None, None),
}


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(CONFIGS), help="comma-separated zoo models")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--batch", type=int, help="override the batch size (all models)")
    args = p.parse_args(argv)

    import numpy as np  # noqa: F401 - after setup_threads
    import torch

    _common.limit_loaded_libraries(THREADS)
    out = {"figure": 1, "threads": THREADS, "machine": _common.machine(), "models": {}}
    for name in args.models.split(","):
        batch, shape = CONFIGS.get(name, (None, None))
        out["models"][name] = bench_model(name, args.batch or batch, shape, args.runs, torch)
        _common.limit_loaded_libraries(THREADS)  # jax and torch imports may have started pools
    _common.write(out, args.json)


def bench_model(name, batch, shape, runs, torch):
    import jax
    import numpy as np

    from gradcheck.backends import get_backend
    from gradcheck.backends.base import all_leaves
    from gradcheck.backends.jax.driver import configure_jax
    from gradcheck.tree import map_leaves

    model, inputs, r, f, args, prefixes = _common.model_setup(name, batch, shape)
    leaves = all_leaves(args, prefixes)
    fns, extra = {}, {}
    # jax's one-time start-up (its CPU client, the first compilation) is paid here, so that neither
    # first call below, the driver's or bare jax.jit's, carries it.
    configure_jax()
    jax.block_until_ready(jax.jit(lambda v: v * 2.0)(jax.numpy.ones(3)))

    for backend in ("tape", "torch", "jax"):
        driver = get_backend(backend)
        fns[backend] = (lambda d=driver: d.evaluate(f, args, prefixes))
    t0 = time.perf_counter()
    fns["jax"]()  # trace + compile, cached by the driver
    extra["jax driver first call (trace + compile)"] = time.perf_counter() - t0

    # tape ops / torch ops: the driver's work done once, then only forward + backward.
    from gradcheck.backends.tape import tape

    tape_tensors = {leaf.path: tape.Tensor(leaf.value, requires_grad=leaf.trainable) for leaf in leaves}
    tape_args = [map_leaves(a, lambda path, v, kind: tape_tensors[path], p) for a, p in zip(args, prefixes)]
    tape_wrt = [tape_tensors[leaf.path] for leaf in leaves if leaf.trainable]
    fns["tape ops"] = lambda: tape.grad(f(*tape_args)[0], tape_wrt)

    tensors = {leaf.path: torch.from_numpy(np.array(leaf.value, copy=True)).requires_grad_(leaf.trainable)
               for leaf in leaves}
    targs = [map_leaves(a, lambda path, v, kind: tensors[path], p) for a, p in zip(args, prefixes)]
    trainable = [tensors[leaf.path] for leaf in leaves if leaf.trainable]
    fns["torch ops"] = lambda: torch.autograd.grad(f(*targs)[0], trainable)

    # torch.nn: bare torch eager.
    nn_grads = None
    try:
        import torch_models

        net = torch_models.build(name, model)
        x = torch.from_numpy(np.array(inputs[0], copy=True)).requires_grad_(True)
        rt = torch.from_numpy(r)
        wrt = list(net.parameters()) + [x]

        def torch_nn():
            return torch.autograd.grad((net(x) * rt).sum(), wrt)

        fns["torch.nn"] = torch_nn
        nn_grads = dict(zip([n for n, _ in net.named_parameters()] + ["input"], torch_nn()))
    except KeyError:
        pass  # no torch.nn version of this model: "torch ops" is the bare-est torch here

    # jax.jit: bare jax, the same numerics settings as the driver (x64 on, highest matmul precision).
    configure_jax()
    values = {leaf.path: jax.numpy.asarray(leaf.value) for leaf in leaves}
    train_paths = [leaf.path for leaf in leaves if leaf.trainable]

    def loss(train_vals):
        vals = dict(values)
        vals.update(zip(train_paths, train_vals))
        return f(*[map_leaves(a, lambda path, v, kind: vals[path], p) for a, p in zip(args, prefixes)])[0]

    value_and_grad = jax.jit(jax.value_and_grad(loss))
    train_vals = [values[p] for p in train_paths]
    t0 = time.perf_counter()
    jax.block_until_ready(value_and_grad(train_vals))
    extra["jax.jit first call (trace + compile)"] = time.perf_counter() - t0
    fns["jax.jit"] = lambda: jax.block_until_ready(value_and_grad(train_vals))

    timings = _common.measure_interleaved(fns, runs=runs, warmup=1)
    result = {"batch": int(np.shape(inputs[0])[0]), "input_shape": [int(s) for s in np.shape(inputs[0])[1:]],
              "params": int(sum(np.size(v) for _, v in model.named_parameters())), "timings": timings,
              "first_calls": extra}
    ref = timings["torch"]["median"]
    result["ratio_to_torch_driver"] = {k: v["median"] / ref for k, v in timings.items()}
    if "torch.nn" in timings:
        result["ratio_to_torch_nn"] = {k: v["median"] / timings["torch.nn"]["median"] for k, v in timings.items()}
    if nn_grads is not None:
        tape_grads = get_backend("tape").evaluate(f, args, prefixes).grads
        result["tape_vs_torch_nn_grad_rel_diff"] = max(
            float(np.linalg.norm(tape_grads[p] - g.numpy()) / np.linalg.norm(g.numpy()))
            for p, g in nn_grads.items())
    return result


if __name__ == "__main__":
    main()

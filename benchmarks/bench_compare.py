"""Judging a model's leaves: gradcheck's comparison against torch's and numpy's own closeness checks.

The leaves are ResNet-18's (62 parameter gradients and 40 running statistics, 11.7 M float64 elements, as
``gradcheck run resnet18`` compares them), each given by three backends that differ by float64 rounding; every
leaf is compared in its three pairs.  Side by side, in one process, taking turns:

* ``gradcheck``: ``compare.compare_leaf`` on each leaf (its three pairs, the mismatch count, the largest
  absolute and relative errors and where, the norms, the worst elements and the histogram of error ratios);
* ``torch.testing.assert_close``: torch's check of the same three pairs per leaf, at the same float64
  tolerance (pass or fail and, on failure, its message);
* ``numpy.allclose``: numpy's pass or fail of the same pairs.

``first``: the first call in the process, when every temporary is freshly mapped memory (as in a
``gradcheck run``, which compares each leaf once); then the median of repeated calls.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

THREADS = _common.setup_threads()


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args(argv)
    import numpy as np
    import torch

    from gradcheck.check import compare
    from gradcheck.check.tolerance import ToleranceRules

    _common.limit_loaded_libraries(THREADS)
    model = _common.model_setup("resnet18", dtype="float64")[0]
    rng = np.random.default_rng(0)
    leaves = []
    for path, value, _ in model.named_arrays():
        v = np.asarray(value, np.float64)
        g = rng.standard_normal(v.shape)
        leaves.append((path, {name: np.asarray(g * (1 + 1e-13 * rng.standard_normal(v.shape)) if name != "tape" else g)
                              for name in ("tape", "torch", "jax")}))
    rules = ToleranceRules()
    tol = rules.resolve("", "float64")

    def gradcheck_compare():
        for path, arrays in leaves:
            compare.compare_leaf(path, "param", arrays, dtype="float64", rules=rules, case_scale=1.0)

    pairs = [(arrays[x], arrays[y]) for _, arrays in leaves for x, y in (("torch", "tape"), ("jax", "tape"),
                                                                        ("jax", "torch"))]
    tpairs = [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in pairs]

    def torch_assert_close():
        for a, b in tpairs:
            try:
                torch.testing.assert_close(a, b, rtol=tol.rtol, atol=tol.absolute(1.0))
            except AssertionError:
                pass

    def numpy_allclose():
        for a, b in pairs:
            np.allclose(a, b, rtol=tol.rtol, atol=tol.absolute(1.0))

    fns = {"gradcheck": gradcheck_compare, "torch.testing.assert_close": torch_assert_close,
           "numpy.allclose": numpy_allclose}
    first = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - t0
    repeated = _common.measure_interleaved(fns, runs=args.runs, warmup=0)
    out = {"threads": THREADS, "machine": _common.machine(), "command": _common.command_line(),
           "leaves": len(leaves), "elements": int(sum(a["tape"].size for _, a in leaves)), "pairs": len(pairs),
           "block": compare.BLOCK, "first": first, "repeated": repeated,
           "ratio_to_torch": repeated["gradcheck"]["median"] / repeated["torch.testing.assert_close"]["median"]}
    print(f"{out['leaves']} leaves, {out['elements']} elements, {out['pairs']} pairs, BLAS {out['machine']['blas']}")
    for name in fns:
        print(f"  {name:28s} first {first[name]:.3f} s   repeated {repeated[name]['median']:.3f} s")
    print(f"  gradcheck / torch.testing.assert_close: {out['ratio_to_torch']:.2f}x")
    _common.write(out, args.json)


if __name__ == "__main__":
    main()

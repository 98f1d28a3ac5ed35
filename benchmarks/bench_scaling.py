"""Figure 5: how the tape's ResNet-18 forward+backward grows with batch size and image size.

Tape and torch drivers side by side (the runner's calls), medians of
``--runs`` runs after a warm-up, taking turns, float32, train mode:
batch 1, 2, 4, 8 at 3x224x224, and image sizes 32 to 224 at batch 2.  The
ratio column shows whether the tape's cost grows like torch's (arithmetic)
or faster (copies, per-op overhead).  Suite time against the number of
cases comes from figure 4's runs (``bench_suites.py``).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

THREADS = _common.setup_threads()


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,2,4,8")
    p.add_argument("--sizes", default="32,64,112,160,224")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)

    import torch  # noqa: F401 - loaded before the limit, so its pool is limited too

    from gradcheck.backends import get_backend

    _common.limit_loaded_libraries(THREADS)
    out = {"figure": 5, "threads": THREADS, "machine": _common.machine(), "batch": [], "size": []}
    points = [("batch", int(b), 224) for b in args.batches.split(",")]
    points += [("size", 2, int(s)) for s in args.sizes.split(",")]
    for axis, batch, size in points:
        t = _common.measure_interleaved(_drivers(get_backend, batch, size), runs=args.runs, warmup=1)
        out[axis].append({"batch": batch, "size": size, "tape": t["tape"], "torch": t["torch"],
                          "ratio": t["tape"]["median"] / t["torch"]["median"]})
    _common.write(out, args.json)


def _drivers(get_backend, batch, size) -> dict:
    """The tape's and torch's driver calls for ResNet-18 at this batch and image size."""
    _, _, _, f, args, prefixes = _common.model_setup("resnet18", batch, (3, size, size))
    drivers = {b: get_backend(b) for b in ("tape", "torch")}
    return {b: (lambda d=d: d.evaluate(f, args, prefixes)) for b, d in drivers.items()}


if __name__ == "__main__":
    main()

"""What every reproducer script shares: the layer's data stored next to it, and the lines it prints.

``gradcheck.repro`` writes this file's text, from the line below on, into each
script in place of its ``from _common import Reproducer`` line: a script needs
nothing but its folder, its framework and numpy.
"""
# -- written into each script from here
import json
import pathlib
import sys

import numpy as np

WORST = 5  # elements shown per leaf, where this framework or the backend gradcheck saw is furthest off


def fmt(v):
    return f"{float(v):.17g}"


class Reproducer:
    """The layer stored next to the script (layer.npz, meta.json): what a script computes with, and prints.

    ``framework`` computes here ("torch", "jax", "numpy"); ``backend`` is the
    gradcheck backend whose stored values are shown beside ("tape" for numpy).
    """

    def __init__(self, script, framework, backend):
        here = pathlib.Path(script).resolve().parent
        self.framework = framework
        self.backend = backend
        self.data = np.load(here / "layer.npz")
        self.meta = json.loads((here / "meta.json").read_text(encoding="utf-8"))
        # The layer's static configuration (JSON holds its tuples as lists), or why it cannot be rebuilt.
        self.config = {k: tuple(v) if isinstance(v, list) else v for k, v in self.meta["config"].items()}
        self.unsupported = self.meta["unsupported"]
        self.params = self.group("param")
        self.static = self.group("static")
        self.cotangents = [self.data[f"cotangent.{k}"] for k in range(self.meta["outputs"])]
        self.inputs = [self.data[spec] if isinstance(spec, str) else (None if spec is None else spec.get("value"))
                       for spec in self.meta["inputs"]]
        self.kwargs = dict(self.meta["kwargs"])
        self.kwargs.update({k: self.data[f"kwargs.{k}"] for k in self.meta["kwarg_arrays"]})
        self.saw_off = []  # leaves where the stored value of the backend is off the reference

    def group(self, prefix):
        return {k[len(prefix) + 1:]: self.data[k] for k in self.data.files if k.startswith(prefix + ".")}

    def stored(self, name):
        """The backend's value of a leaf as gradcheck saw it (None where it gave none)."""
        key = f"{self.backend}.{name}"
        return self.data[key] if key in self.data.files else None

    def rows(self, name, now, ref, saw, extra):
        """The elements furthest from the reference, this framework's and the stored backend's."""
        picks = []
        for other in (now, saw):
            if other is None or np.shape(other) != np.shape(ref):
                continue
            d = np.abs(np.asarray(other, np.float64) - ref).ravel()
            for flat in np.argsort(d)[::-1][:WORST]:
                if d[flat] > 0 and flat not in picks:
                    picks.append(int(flat))
        for flat in picks:
            idx = tuple(int(i) for i in np.unravel_index(flat, np.shape(ref)))
            parts = []
            if now is not None and np.shape(now) == np.shape(ref):
                parts.append(f"{self.framework} now {fmt(np.asarray(now).ravel()[flat])}")
            parts.append(f"reference {fmt(ref.ravel()[flat])}")
            if saw is not None and np.shape(saw) == np.shape(ref):
                parts.append(f"gradcheck saw {self.backend} {fmt(np.asarray(saw).ravel()[flat])}")
            print(f"  index {idx}: " + ", ".join(parts) + extra)

    def compare(self, leaf, now):
        """Elementwise, as gradcheck compares in float64: |now - ref| <= atol + rtol |ref|."""
        name = leaf["name"]
        ref = np.asarray(self.data[f"reference.{name}"], np.float64)
        saw = self.stored(name)
        if leaf["verdict"] == "vacuous":
            size = ("" if now is None else
                    f"; max |{self.framework}| {float(np.max(np.abs(np.asarray(now, np.float64)), initial=0.0)):.3g}")
            print(f"RESULT {name} vacuous: ~0 on every backend when gradcheck ran (rounding around an exact zero), "
                  f"not compared{size}")
            return True
        if now is None:
            print(f"RESULT {name} missing: {self.framework} gives no value here")
            self.rows(name, None, ref, saw, "")
            return False
        now = np.asarray(now, np.float64)
        if now.shape != ref.shape:
            print(f"RESULT {name} disagree: {self.framework} gives shape {now.shape}, the reference {ref.shape}")
            return False
        diff = np.abs(now - ref)
        bad = diff > leaf["atol"] + leaf["rtol"] * np.abs(ref)
        n = int(np.count_nonzero(bad))
        max_abs = float(diff.max()) if diff.size else 0.0
        verdict = "disagree" if n else "agree"
        seen = ""
        if saw is not None and np.shape(saw) == ref.shape:
            off = np.abs(np.asarray(saw, np.float64) - ref)
            seen = f" max_abs_gradcheck_saw={float(np.max(off, initial=0.0)):.3g}"
            if np.any(off > leaf["atol"] + leaf["rtol"] * np.abs(ref)):
                self.saw_off.append(name)
        print(f"RESULT {name} {verdict} max_abs={max_abs:.3g} mismatched={n}/{ref.size}{seen} "
              f"(reference: {leaf['reference']}, rtol {leaf['rtol']:.3g}, atol {leaf['atol']:.3g})")
        if n or leaf["verdict"] != "agree":  # the numbers that disagree, now or when gradcheck ran
            self.rows(name, now, ref, saw, "")
        return not n

    def print_stored(self):
        """The layer cannot be rebuilt: the numbers gradcheck stored, reference against this backend."""
        print(f"cannot rebuild this layer with {self.framework} alone: {self.unsupported}")
        for leaf in self.meta["leaves"]:
            if leaf["verdict"] == "agree":
                continue
            name = leaf["name"]
            print(f"STORED {name} {leaf['verdict']} blame={','.join(leaf['blame']) or '-'}: {leaf['message']}")
            self.rows(name, None, np.asarray(self.data[f"reference.{name}"], np.float64), self.stored(name), "")
        sys.exit(2)

    def header(self):
        meta = self.meta
        print(f"gradcheck reproducer: {meta['name']} ({meta['layer']}) of case {meta['case']}, float64, "
              f"computed with {self.framework}; origin kind {meta['kind']}, blamed: "
              f"{', '.join(meta['blame']) or 'nobody'}")
        if meta["message"]:
            print(f"gradcheck said: {meta['message']}")

    def finish(self, ok):
        if ok:
            print(f"SUMMARY {self.framework} agrees with the float64 reference on every leaf" + (
                f"; gradcheck saw {self.backend} disagree on {', '.join(self.saw_off)}, which does not reproduce "
                f"with this {self.framework} (another version, device or setting; or gradcheck's own use of it)"
                if self.saw_off else ""))
        else:
            print(f"SUMMARY {self.framework} DISAGREES with the float64 reference")
        sys.exit(0 if ok else 1)


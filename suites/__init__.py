"""What gets checked: suites of cases, by name.

``SUITES[name](seed=0, dtype=None)`` returns a list of ``gradcheck.case.Case``;
``dtype=None`` means the suite's own choice (float32 and float64 for
``layers`` and ``models``).  Case names read ``Layer[params]-dtype``
(``Conv2d[k3,s2,p1,g2]-float32``) and ``case.model`` is the layer or model
name, which is how ``gradcheck run Conv2d`` picks a layer's cases.

* ``layers``: every layer in several configurations, small shapes;
* ``models``: every model of ``gradcheck.layers.models`` at a small size;
* ``smoke``: a fast subset for CI;
* ``fuzz``: configurations drawn from the seed.

Inputs stay clear of kinks where subgradient conventions legitimately
differ; see ``gradcheck.suites.inputs``.
"""

from __future__ import annotations

from gradcheck.suites.fuzz import fuzz_cases, fuzz_suite
from gradcheck.suites.layers import layer_cases
from gradcheck.suites.models import model_cases
from gradcheck.suites.smoke import smoke_cases

SUITES = {
    "layers": layer_cases,
    "models": model_cases,
    "smoke": smoke_cases,
    "fuzz": fuzz_suite,
}

__all__ = ["SUITES", "fuzz_cases", "layer_cases", "model_cases", "smoke_cases"]

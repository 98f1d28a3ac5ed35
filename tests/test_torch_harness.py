"""gradcheck inside PyTorch's own test harness, whose import freezes torch's global backend flags.

``torch.testing._internal.common_utils`` calls ``torch.backends.disable_global_flags()``
when it is imported: from then on ``torch.backends.cudnn.allow_tf32 = False``
raises, and flags may only change inside ``torch.backends.cudnn.flags(...)``.
Each test runs in a fresh interpreter (the freeze is process-wide and cannot be
undone), checks that the freeze is real (the plain assignment raises: the
negative control), runs a torch case, and checks that every torch evaluation
ran with TF32 off and that the harness's own flag is left as it was.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

CHECK = '''
import torch

assert torch.backends.flags_frozen()
try:
    torch.backends.cudnn.allow_tf32 = False
except RuntimeError:
    pass
else:
    raise AssertionError("the global flags are not frozen: this test would check nothing")
assert torch.backends.cudnn.allow_tf32  # the harness's value

import gradcheck.layers as L
from gradcheck import ops
from gradcheck.case import Case
from gradcheck.check.runner import RunOptions, run_case

seen = []


def forward(m, x):
    if isinstance(x, torch.Tensor):  # the torch backend's evaluations
        seen.append(torch.backends.cudnn.allow_tf32)
    return m(x)


def build(rng):
    return L.Chain(L.Conv2d(2, 3, 3, padding=1, rng=rng), L.BatchNorm2d(3), L.Flatten(),
                   L.Dense(3 * 5 * 5, 2, activation=ops.tanh, rng=rng))


case = Case("conv-bn", build, lambda rng: (rng.standard_normal((2, 2, 5, 5)),), forward=forward)
r = run_case(case, RunOptions(backends=("tape", "torch"), referee="leaves"))
assert not r.errors, r.errors
assert r.verdict == "agree", [(x.path, x.verdict, x.message) for x in r.leaves if x.verdict != "agree"]
assert "torch" in r.timings and r.leaves_compared == len(r.leaves)
assert seen and not any(seen), seen  # every torch evaluation: TF32 off
assert torch.backends.flags_frozen() and torch.backends.cudnn.allow_tf32  # the harness's flags, as it left them
print("checked inside the frozen flags")
'''


def run_frozen(freeze: str) -> None:
    code = textwrap.dedent(freeze) + CHECK
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "checked inside the frozen flags" in proc.stdout, proc.stdout + proc.stderr


def test_a_torch_case_runs_inside_pytorchs_test_harness():
    # The harness needs expecttest (a test dependency of PyTorch itself).
    pytest.importorskip("expecttest", reason="torch.testing._internal.common_utils imports expecttest")
    run_frozen("import torch.testing._internal.common_utils  # noqa: F401  (freezes the flags)\n")


def test_a_torch_case_runs_with_the_global_flags_frozen():
    # The same freeze without the harness (and its dependencies): what common_utils calls on import.
    run_frozen("import torch\ntorch.backends.disable_global_flags()\n")

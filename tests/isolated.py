"""Run reproducer scripts as a user would: a fresh interpreter where gradcheck cannot be imported.

``python -I`` (no PYTHONPATH, no user site), outside the repository, with an
import hook that refuses ``gradcheck``; each script runs in turn in that one
process and must not have loaded gradcheck when it ends.  ``paths`` are put
first on ``sys.path`` (the user's own package, where a script imports it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

BOOT = r"""
import runpy, sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name == "gradcheck" or name.startswith("gradcheck."):
            raise ModuleNotFoundError(f"No module named {name!r} (a reproducer must not need gradcheck)")
        return None
sys.meta_path.insert(0, Blocked())
split = sys.argv.index("--")
sys.path[:0] = sys.argv[1:split]
for script in sys.argv[split + 1:]:
    print(f"=== {script}", flush=True)
    sys.argv = [script]
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    print(f"=== EXIT {code}", flush=True)
    assert "gradcheck" not in sys.modules
"""


def run_scripts(scripts, cwd, paths=(), timeout: float = 600) -> dict[str, tuple[int, str]]:
    """``{script: (exit code, output)}``, every script run in one fresh, isolated interpreter."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run([sys.executable, "-I", "-c", BOOT, *map(str, paths), "--", *map(str, scripts)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = {m.group(1): (int(m.group(3)), m.group(2))
           for m in re.finditer(r"=== (\S+)\n(.*?)=== EXIT (-?\d+)\n", done.stdout, re.S)}
    assert len(out) == len(scripts), done.stdout[-3000:] + done.stderr[-3000:]
    return out

"""Where ``[tool.gradcheck]`` settings are read from: ``pyproject.toml`` or a TOML file given with ``--config``.

Recognised keys (command-line flags, pytest options and markers override them;
``gradcheck.app.settings`` checks every value and names the key when one is wrong)::

    [tool.gradcheck]
    backends = ["tape", "torch", "jax"]
    dtype = "float32"          # float64 decides, float32 is measured; or "float64" (float64 only)
    seed = 0
    mode = "train"             # or "eval"
    referee = "auto"           # "leaves", "joint", "off"
    referee_budget_s = 20      # auto: every leaf when estimated to fit (counted work, gradcheck/check/cost.py)
    imprecise = "warn"         # or "fail": a float32 result too far from float64 fails its case
    order = 1                  # 2: Hessian-vector products per leaf too
    steps = 0                  # N > 0: N optimiser steps per backend, trajectories compared
    optimizer = "sgd"          # or "adam" (for steps)
    lr = 0.01                  # learning rate (for steps; default sgd 0.01, adam 0.001)
    output = "gradcheck-report"
    cache_dir = "~/.cache/gradcheck/jax"  # jax's persistent compilation cache (the default); false: none
    rtol = 1e-3                # applies to every leaf (a rule appended last)
    atol = 1e-6

    [tool.gradcheck.tolerance] # see gradcheck/check/tolerance.py
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path


class ConfigError(ValueError):
    """A configuration file that cannot be read (the message names the file and the fix)."""


def find_pyproject(start: str | os.PathLike | None = None) -> Path | None:
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load(path: str | os.PathLike | None = None) -> tuple[dict, str]:
    """The raw gradcheck settings table and the file it came from ("" when none was found).

    With ``path``, that file must exist and parse; a ``pyproject.toml`` holds
    the settings under ``[tool.gradcheck]`` only (having none is fine), any
    other TOML file under ``[tool.gradcheck]`` or at its top level.  Without
    it, the nearest ``pyproject.toml`` upwards from the working directory is
    read.  The values are checked by ``gradcheck.app.settings.from_config``.
    """
    if path is None:
        path = find_pyproject()
        if path is None:
            return {}, ""
    path = Path(path)
    if not path.is_file():
        what = "a folder" if path.is_dir() else "no such file"
        raise ConfigError(f"--config {path}: {what}; pass the path of a TOML file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the syntax or drop --config") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    tool = data.get("tool", {})
    table = tool.get("gradcheck") if isinstance(tool, dict) else None
    if table is None:
        # A project's pyproject.toml has other tools' keys at its top level; a file of
        # gradcheck's own may hold just the keys.
        table = {} if path.name == "pyproject.toml" else {k: v for k, v in data.items() if k != "tool"}
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.gradcheck] must be a table, not a {type(table).__name__}")
    return table, str(path)

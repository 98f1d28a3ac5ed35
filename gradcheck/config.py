"""Settings from ``[tool.gradcheck]`` in ``pyproject.toml`` or a TOML file given with ``--config``.

Recognised keys (command-line flags override them)::

    [tool.gradcheck]
    backends = ["tape", "torch", "jax"]
    dtype = "float32"          # or "float64", or "both"
    seed = 0
    mode = "train"             # or "eval"
    referee = "auto"           # "leaves", "joint", "off"
    referee_budget_s = 20      # auto: every leaf when estimated to fit (counted work, gradcheck/cost.py)
    noise_probe = "auto"       # or a list: backends whose float32 noise sets float32 tolerances
    output = "gradcheck-report"
    rtol = 1e-3                # applies to every leaf (a rule appended last)
    atol = 1e-6

    [tool.gradcheck.tolerance] # see gradcheck/tolerance.py
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

KEYS = {"backends", "dtype", "seed", "mode", "referee", "output", "rtol", "atol", "tolerance", "referee_budget_s",
        "noise_probe"}


class ConfigError(ValueError):
    """A malformed configuration file (the message names the file, the key and the fix)."""


def find_pyproject(start: str | os.PathLike | None = None) -> Path | None:
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load(path: str | os.PathLike | None = None) -> tuple[dict, str]:
    """The gradcheck settings and where they came from ("" when none were found).

    With ``path``, that file must exist and parse; it may hold a
    ``[tool.gradcheck]`` table or the keys at top level.  Without it, the
    nearest ``pyproject.toml`` upwards from the working directory is read, and
    having no ``[tool.gradcheck]`` table there is fine.
    """
    explicit = path is not None
    if path is None:
        path = find_pyproject()
        if path is None:
            return {}, ""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file; pass the path of a TOML file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the syntax or drop --config") from exc
    table = data.get("tool", {}).get("gradcheck")
    if table is None:
        table = {k: v for k, v in data.items() if k in KEYS} if explicit else {}
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.gradcheck] must be a table")
    unknown = set(table) - KEYS
    if unknown:
        raise ConfigError(
            f"{path}: unknown [tool.gradcheck] key(s) {sorted(unknown)}; known keys: {', '.join(sorted(KEYS))}"
        )
    return table, str(path)

"""Where gradcheck's persistent caches live, and the one switch that turns them all off.

Two caches share the ``cache_dir`` setting (``gradcheck run --cache-dir DIR``
or ``--no-cache``, ``cache_dir`` in ``[tool.gradcheck]``, the environment's
``GRADCHECK_CACHE_DIR`` / ``GRADCHECK_NO_CACHE``):

* jax's persistent compilation cache, whose entries sit at the folder's top
  level (``gradcheck.backends.jax.driver``);
* ``from_torch``'s capture cache, in the folder's ``torch-export``
  subfolder (``gradcheck.frontends.torch.capture_cache``).  jax's cache
  reads and evicts only its own ``*-cache`` files at the top level, so a
  subfolder beside them is left alone.

The folder is, in this order: the setting; ``GRADCHECK_NO_CACHE=1`` (none)
or ``GRADCHECK_CACHE_DIR``; the per-user folder (:func:`default_folder`).
Turning the setting off turns off both caches.  This module imports
nothing heavy, so a frontend can ask for its folder without importing jax.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

CACHE_DIR_ENV = "GRADCHECK_CACHE_DIR"
NO_CACHE_ENV = "GRADCHECK_NO_CACHE"
FALSE_WORDS = ("", "0", "false", "no", "off")
CAPTURES = "torch-export"  # the capture cache's subfolder of the cache folder


@dataclass(frozen=True)
class Choice:
    """A cache folder and what chose it."""

    folder: str | None  # None: no persistent cache
    source: str  # the setting as spelled (--cache-dir), an environment variable, or "default"


_setting: tuple[str | bool | None, str] = (None, "cache_dir")  # the cache_dir setting and how it was spelled
_GIVEN = object()  # choose's default: the setting given to use()


def default_folder() -> str:
    """The per-user folder: ``$XDG_CACHE_HOME/gradcheck/jax`` (``~/.cache/gradcheck/jax``), or the
    platform's own place on macOS (``~/Library/Caches``) and Windows (``%LOCALAPPDATA%``)."""
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return os.path.join(os.environ["LOCALAPPDATA"], "gradcheck", "Cache", "jax")
    if sys.platform == "darwin":
        return os.path.join(os.path.expanduser("~"), "Library", "Caches", "gradcheck", "jax")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gradcheck", "jax")


def use(setting: str | bool | None, where: str = "cache_dir") -> None:
    """Take the ``cache_dir`` setting (a folder, ``False`` for none, ``None`` for unset), spelled ``where``."""
    global _setting
    _setting = (setting, where)


def given() -> tuple[str | bool | None, str]:
    """The setting last given to :func:`use`, and how it was spelled."""
    return _setting


def choose(setting=_GIVEN, where: str = "cache_dir") -> Choice | None:
    """The folder the setting or the environment chooses; None when neither does (the caller's default).

    ``setting`` defaults to the one given to :func:`use`; another one is
    resolved without being taken (to check it first).
    """
    if setting is _GIVEN:
        setting, where = _setting
    if setting is False:
        return Choice(None, where)
    if setting:
        return Choice(os.path.expanduser(setting), where)
    if os.environ.get(NO_CACHE_ENV, "").strip().lower() not in FALSE_WORDS:
        return Choice(None, NO_CACHE_ENV)
    if os.environ.get(CACHE_DIR_ENV, "").strip():
        return Choice(os.path.expanduser(os.environ[CACHE_DIR_ENV].strip()), CACHE_DIR_ENV)
    return None


def capture_folder() -> Choice:
    """Where ``from_torch`` keeps its captures: the ``torch-export`` subfolder of the chosen folder."""
    choice = choose() or Choice(default_folder(), "default")
    return Choice(None if choice.folder is None else os.path.join(choice.folder, CAPTURES), choice.source)

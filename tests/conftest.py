"""The test session's settings: hypothesis profiles, and CI's rule that what it installs may not be skipped.

Hypothesis profiles (``tests/draws.py`` scales each test's own example count by the profile's):

* ``ci``: derandomized (every run draws the same examples, here as in CI) and no example database; the
  default;
* ``dev``: hypothesis' defaults, new random draws every run and a local example database;
* ``wide``: random draws and ten times the examples, to hunt for a failing draw that CI's fixed ones miss.

Choose one with ``GRADCHECK_HYPOTHESIS_PROFILE=wide`` or ``pytest --hypothesis-profile wide``.

``GRADCHECK_REQUIRE=torch,jax,playwright,chromium,flax,equinox,optax`` (``.ci/run`` sets it) turns a test skipped for want of any
of those into a failure, so a broken install cannot pass as a run with whole modules skipped.

jax's persistent compilation cache is off for the whole session (``GRADCHECK_NO_CACHE``, which the ``gradcheck run``
processes the tests start inherit): the tests never read or write the per-user cache folder, and no test is served a
program compiled by an earlier session.  ``tests/test_compile_cache.py`` turns it on, in folders of its own.
"""

from __future__ import annotations

import os
import re

import pytest

os.environ["GRADCHECK_NO_CACHE"] = "1"  # set before any test imports jax (see the module docstring)
os.environ.pop("GRADCHECK_CACHE_DIR", None)

try:
    from hypothesis import settings
except ImportError:  # the strategies' tests skip themselves; nothing else here needs hypothesis
    settings = None

if settings is not None:
    settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
    settings.register_profile("dev")
    settings.register_profile("wide", max_examples=1000)
    # --hypothesis-profile, read later by hypothesis' own plugin, overrides this.
    settings.load_profile(os.environ.get("GRADCHECK_HYPOTHESIS_PROFILE") or "ci")

# What a skip for each required thing says (pytest.importorskip's words, and the browser tests' own).
_SKIP_WORDS = {
    "torch": r"could not import 'torch\b",
    "jax": r"could not import 'jax\b",
    "playwright": r"could not import 'playwright\b|playwright is not installed",
    "chromium": r"\bChromium\b",
    "flax": r"could not import 'flax\b",
    "equinox": r"could not import 'equinox\b",
    "optax": r"could not import 'optax\b",
}


def _required() -> dict[str, re.Pattern]:
    names = [n.strip() for n in os.environ.get("GRADCHECK_REQUIRE", "").split(",") if n.strip()]
    unknown = [n for n in names if n not in _SKIP_WORDS]
    if unknown:
        raise pytest.UsageError(f"GRADCHECK_REQUIRE={os.environ['GRADCHECK_REQUIRE']!r}: {', '.join(unknown)} "
                                f"unknown; it takes a comma-separated list of {', '.join(_SKIP_WORDS)}")
    return {n: re.compile(_SKIP_WORDS[n]) for n in names}


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _fail_required_skip(report) -> None:
    if not report.skipped or not _REQUIRED:
        return
    reason = _skip_reason(report)
    missing = [n for n, words in _REQUIRED.items() if words.search(reason)]
    if missing:
        report.outcome = "failed"
        report.longrepr = (f"skipped for want of {', '.join(missing)}, which GRADCHECK_REQUIRE says this run "
                           f"has: {reason}")


_REQUIRED: dict[str, re.Pattern] = {}


def pytest_configure(config):
    _REQUIRED.update(_required())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_required_skip(outcome.get_result())  # a module-level importorskip or skip


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_required_skip(outcome.get_result())  # a skip inside a test or a fixture (the browser's start)

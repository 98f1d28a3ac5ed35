"""Test sessions per backend set, lint, and a report smoke test.

    nox                      # the "fast" tag: tests-numpy and lint
    nox -t full              # every backend set and the report smoke test
    nox -s tests-numpy       # no torch, no jax: tape + referee only
    nox -s tests-torch -- tests/test_backend_torch.py -x   # arguments after -- go to pytest
    nox -s report-smoke -- --backends tape,torch           # ... or to `gradcheck run`

The numpy-only session is the install a user without any framework gets;
its test run must pass, which it does because every torch/jax test skips
(``pytest.importorskip``) there.  ``tests-torch`` and ``tests-all`` install
the CPU build of torch first, from ``GRADCHECK_TORCH_INDEX_URL`` (default:
PyTorch's CPU wheel index; set it empty to use only the configured pip
indexes), so that pip does not pull the CUDA build from PyPI.

``nox --no-venv -s <session>`` runs a session in the current environment
without installing anything (quick local runs).
"""

from __future__ import annotations

import os
import pathlib
import tempfile

import nox

nox.options.default_venv_backend = "venv"
nox.options.tags = ["fast"]  # a bare `nox` runs the quick sessions
nox.options.error_on_missing_interpreters = True

TORCH = "torch==2.13.0"
TORCH_INDEX = os.environ.get("GRADCHECK_TORCH_INDEX_URL", "https://download.pytorch.org/whl/cpu")
TEST_DEPS = ("pytest>=7.4", "hypothesis>=6.80", "pytest-xdist>=3.3", "scipy>=1.10")
PYTEST = ("pytest", "-q", "-p", "no:cacheprovider")


def _installs(session) -> bool:
    return session.venv_backend not in ("none", None)


def _install_torch(session):
    extra = ("--extra-index-url", TORCH_INDEX) if TORCH_INDEX else ()
    # The CPU wheel's version is 2.13.0+cpu; with both indexes pip prefers it over PyPI's CUDA build.
    session.install(TORCH, *extra)


def _install_gradcheck(session, extras=""):
    session.install("numpy>=1.24", "threadpoolctl>=3.0", *TEST_DEPS)  # gradcheck's own dependencies, then the tests
    # --no-deps: the extras' frameworks are installed explicitly by each session.
    session.install("--no-deps", "-e", f".{extras}")


def _assert_frameworks(session, present=(), absent=()):
    """Fail the session if the venv does not hold exactly the frameworks it is meant to."""
    check = (
        "import importlib.util as u, sys\n"
        f"present, absent = {tuple(present)!r}, {tuple(absent)!r}\n"
        "wrong = [m + ' is missing' for m in present if not u.find_spec(m)]\n"
        "wrong += [m + ' is installed' for m in absent if u.find_spec(m)]\n"
        "sys.exit('this session must not see that: ' + ', '.join(wrong)) if wrong else None\n"
    )
    session.run("python", "-c", check, silent=True)


@nox.session(name="tests-numpy", tags=["fast"])
def tests_numpy(session):
    """numpy only (tape AD + referee): the torch and jax tests must skip, everything else pass."""
    if _installs(session):
        _install_gradcheck(session)
        _assert_frameworks(session, absent=("torch", "jax"))
    # Here torch and jax are meant to be missing: a caller's GRADCHECK_REQUIRE (.ci/run's) does not apply.
    session.run(*PYTEST, *(session.posargs or ["tests"]), env={"GRADCHECK_REQUIRE": ""})


@nox.session(name="tests-torch", tags=["full"])
def tests_torch(session):
    if _installs(session):
        _install_torch(session)
        _install_gradcheck(session)
        _assert_frameworks(session, present=("torch",), absent=("jax",))
    session.run(*PYTEST, *(session.posargs or ["tests"]))


@nox.session(name="tests-jax", tags=["full"])
def tests_jax(session):
    if _installs(session):
        session.install("jax>=0.4.20")
        _install_gradcheck(session)
        _assert_frameworks(session, present=("jax",), absent=("torch",))
    session.run(*PYTEST, *(session.posargs or ["tests"]))


@nox.session(name="tests-all", tags=["full"])
def tests_all(session):
    if _installs(session):
        _install_torch(session)  # first: `gradcheck[all]` then finds it satisfied
        session.install("jax>=0.4.20")
        _install_gradcheck(session)
        _assert_frameworks(session, present=("torch", "jax"))
    session.run(*PYTEST, *(session.posargs or ["tests"]))


@nox.session(tags=["fast"])
def lint(session):
    if _installs(session):
        session.install("ruff>=0.4")
    session.run("ruff", "check", *(session.posargs or ["."]))


@nox.session(name="report-smoke", tags=["full"])
def report_smoke(session):
    """`gradcheck run smoke` writes every report, and each one is there and not empty."""
    if _installs(session):
        _install_torch(session)
        session.install("jax>=0.4.20")
        _install_gradcheck(session)
    out = pathlib.Path(tempfile.mkdtemp(prefix="gradcheck-report-smoke-"))
    files = {"html": out / "report.html", "json": out / "results.json", "junit": out / "junit.xml",
             "markdown": out / "summary.md"}
    session.run("gradcheck", "run", "smoke", "--output", str(out), "--quiet",
                *(arg for fmt, path in files.items() for arg in (f"--{fmt}", str(path))),
                *session.posargs)
    missing = [f"{fmt} ({path})" for fmt, path in files.items() if not path.is_file() or not path.stat().st_size]
    missing += [] if (out / "results.jsonl").is_file() else [f"streamed results ({out / 'results.jsonl'})"]
    if missing:
        session.error("gradcheck run smoke did not write: " + ", ".join(missing))
    session.log(f"reports in {out}: " + ", ".join(sorted(p.name for p in out.iterdir())))

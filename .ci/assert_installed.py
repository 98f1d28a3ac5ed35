"""CI's check, after the install and before any test: torch, jax and playwright import and work, and Chromium starts.

A framework that is missing or broken would otherwise make pytest skip every module that needs it and exit 0
(``pytest.importorskip``); this fails the run instead, naming what is wrong.  ``noxfile._assert_frameworks``
does the same for the nox sessions.  Exit 0 when everything is there, 1 with one line per problem otherwise.
"""

from __future__ import annotations

import os
import shutil
import sys


def _torch():
    import torch

    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0, 2.0], x.grad
    return torch.__version__


def _jax():
    import jax
    import jax.numpy as jnp

    g = jax.grad(lambda x: jnp.sum(x * x))(jnp.ones(3))
    assert [float(v) for v in g] == [2.0, 2.0, 2.0], g
    return jax.__version__


def _jax_models():
    """flax, equinox and optax, which from_jax's tests use (the jax-models extra)."""
    import equinox
    import flax
    import optax

    return f"flax {flax.__version__}, equinox {equinox.__version__}, optax {optax.__version__}"


def _chromium():
    """Playwright drives the system's Chromium (never a downloaded browser), as tests/test_report_browser.py does."""
    from playwright.sync_api import sync_playwright

    path = os.environ.get("GRADCHECK_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        raise RuntimeError("no chromium on PATH (apt-get install chromium) and GRADCHECK_CHROMIUM is not set")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.set_content("<p id='x'>ok</p>")
            text, version = page.inner_text("#x"), browser.version
        finally:
            browser.close()
    assert text == "ok", text
    return f"{path} ({version})"


CHECKS = {"torch": _torch, "jax": _jax, "jax-models (flax, equinox, optax)": _jax_models,
          "chromium (through playwright)": _chromium}


def main(names=None) -> int:
    problems = []
    for name, check in CHECKS.items():
        if names and name.split()[0] not in names:
            continue
        try:
            print(f"{name}: {check()}")
        except Exception as exc:  # noqa: BLE001 - every failure is the answer, named
            problems.append(f"{name}: {type(exc).__name__}: {exc}".splitlines()[0])
    for line in problems:
        print(f"MISSING OR BROKEN: {line}", file=sys.stderr)
    if problems:
        print("CI needs torch, jax, flax, equinox, optax, playwright and Chromium; a test skipped for want of one hides a failure",
              file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

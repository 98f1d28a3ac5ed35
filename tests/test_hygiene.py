"""The tests' own rules: an assert must be able to fail, hypothesis draws the same examples in every CI run, and
a test skipped for want of what CI installed fails the run (tests/conftest.py).

An ``assert`` whose expression reads nothing but imported modules and module-level constants (``assert ops``,
``assert np.isfinite(TINY)``) is decided when the file is written: it checks nothing about the code under test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent
FILES = sorted(TESTS.glob("*.py"))


def _module_constants(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names bound by a module-level import, names bound at module level to a literal expression)."""
    imports, constants = set(), set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                imports.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and _literal(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            constants |= {t.id for t in targets if isinstance(t, ast.Name)}
    return imports, constants


def _literal(node) -> bool:
    return all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.Tuple, ast.List,
                              ast.Load)) for n in ast.walk(node))


PURE = {"np", "numpy", "math"}  # functions of these on constants compute constants
BUILTINS = {"len", "abs", "bool", "int", "float", "str", "isinstance", "all", "any", "min", "max", "sum"}


def constant_asserts(source: str) -> list[str]:
    """``line: source`` of each assert decided by the file alone."""
    tree = ast.parse(source)
    imports, constants = _module_constants(tree)
    found = []
    for fn in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        # A name the function takes or assigns is its own there, not the module's constant.
        own = set() if fn is tree else {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)} | {
            n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        body = fn.body if fn is tree else [fn]
        for node in (n for b in body for n in ast.walk(b)):
            if isinstance(node, ast.Assert) and _decided(node.test, imports, constants - own):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(set(found), key=lambda line: int(line.split(":")[0]))


def _decided(expr, imports, constants) -> bool:
    """Whether ``expr`` reads only imported modules (bare), module-level constants and literals, through
    numpy / math functions and builtins: nothing the code under test computes or holds."""
    def ok(node) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Name):
            return node.id in imports or node.id in constants
        if isinstance(node, ast.Call):
            f = node.func
            pure = (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in PURE) or (
                isinstance(f, ast.Name) and f.id in BUILTINS)
            return pure and all(ok(a) for a in node.args) and all(ok(k.value) for k in node.keywords)
        if isinstance(node, (ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Tuple, ast.List)):
            return all(ok(c) for c in ast.iter_child_nodes(node) if not isinstance(
                c, (ast.operator, ast.boolop, ast.unaryop, ast.cmpop, ast.expr_context)))
        return False

    return ok(expr)


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_no_assert_is_decided_by_the_file_alone(path):
    assert constant_asserts(path.read_text(encoding="utf-8")) == []


def test_the_check_finds_asserts_on_modules_and_constants():
    # The negative control: the two asserts of this kind the suite had (tests/test_strategies.py and
    # tests/test_real_kernels.py), and what is not one.
    source = (
        "import numpy as np\nfrom gradcheck import ops\nTINY = 1 + 1e-6\nLIMIT = 3\n"
        "def test(x, ops_result):\n"
        "    assert ops\n"
        "    assert np.isfinite(TINY)\n"
        "    assert x < LIMIT\n"
        "    assert np.isfinite(x)\n"
        "    assert ops.relu(x) is not None\n"
    )
    assert constant_asserts(source) == ["6: assert ops", "7: assert np.isfinite(TINY)"]


# ---------------------------------------------------------------- hypothesis: the same draws every run, unless widened
def test_hypothesis_draws_the_same_examples_every_run_unless_a_wider_profile_is_asked_for(request):
    import os

    settings = pytest.importorskip("hypothesis").settings
    from draws import examples

    asked = request.config.getoption("hypothesis_profile", None) or os.environ.get("GRADCHECK_HYPOTHESIS_PROFILE")
    name = settings.get_current_profile_name()
    assert name == (asked or "ci")
    if name == "ci":  # CI's: derandomized, no database, each test's own count of examples
        assert settings.default.derandomize and settings.default.database is None and examples(15) == 15
    elif name == "wide":  # a developer's hunt: random draws, ten times the examples
        assert not settings.default.derandomize and examples(15) == 150


# ---------------------------------------------------------------- CI: a skip for want of what it installed fails

_INNER = '''
import sys
import pytest

sys.modules["jax"] = None  # as if jax were broken: importing it fails
pytest.importorskip("jax")


def test_needs_jax():
    pass
'''


@pytest.mark.parametrize("required, outcome", [("", dict(skipped=1)), ("jax", dict(errors=1)),
                                               ("torch,chromium", dict(skipped=1))])
def test_a_skip_for_want_of_a_required_framework_fails_the_run(pytester, monkeypatch, required, outcome):
    pytester.makeconftest((TESTS / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_inner=_INNER)
    monkeypatch.setenv("GRADCHECK_REQUIRE", required)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(**outcome)
    if "errors" in outcome:
        result.stdout.fnmatch_lines(["*skipped for want of jax, which GRADCHECK_REQUIRE says this run has*"])


def test_a_browser_that_does_not_start_fails_the_run_when_required(pytester, monkeypatch):
    pytester.makeconftest((TESTS / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_inner='''
        import pytest

        @pytest.fixture
        def browser():
            pytest.skip("Chromium at /usr/bin/chromium did not start: missing libraries")

        def test_page(browser):
            pass
    ''')
    monkeypatch.setenv("GRADCHECK_REQUIRE", "chromium")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(errors=1)
    monkeypatch.setenv("GRADCHECK_REQUIRE", "")  # the control: not required, a skip
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(skipped=1)

"""The package has no import circles: every module can be read knowing only the modules below it.

The graph is built from the source with ``ast``, not by importing: every
``import`` and ``from ... import`` of a gradcheck module is an edge, the ones
inside functions too (a lazy import is still a dependency, only a later
one).  ``from pkg import sub`` is an edge to the submodule ``pkg.sub``, not
to ``pkg/__init__.py``; ``from pkg import name`` is an edge to ``pkg``.
The folders mapped into the package (``layers/`` as ``gradcheck.layers`` and
the others of ``pyproject.toml``'s ``package-dir``) are part of it.  A
circle is a strongly connected component of more than one module; the test
names each one with the edges that close it.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_dirs(root: Path) -> dict[str, Path]:
    """Package name -> its folder, as ``pyproject.toml``'s ``[tool.setuptools.package-dir]`` maps them."""
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    return {name: root / folder for name, folder in config["tool"]["setuptools"]["package-dir"].items()}


def modules_of(dirs: dict[str, Path]) -> dict[str, Path]:
    """Every module's dotted name -> its file (a package's name -> its ``__init__.py``)."""
    out: dict[str, Path] = {}
    for package, folder in sorted(dirs.items(), key=lambda item: -len(item[0])):  # a mapped sub-package first
        for path in sorted(folder.rglob("*.py")):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            out.setdefault(".".join([package, *parts]), path)
    return out


def _known(name: str | None, modules: dict) -> str | None:
    """The longest prefix of ``name`` that is one of ``modules`` (``pkg.mod.func`` -> ``pkg.mod``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(name: str, path: Path, modules: dict) -> set[str]:
    """The modules of ``modules`` that module ``name`` imports, anywhere in its file."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(_known(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's own package, one level up per extra dot
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in modules else _known(source, modules))
    found.discard(None)
    found.discard(name)
    return found


def import_graph(dirs: dict[str, Path]) -> dict[str, set[str]]:
    modules = modules_of(dirs)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, targets = work[-1]
            for w in targets:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    inside = set(component)
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & inside)]
    return f"{len(component)} modules import each other: " + "; ".join(edges)


def test_the_package_has_no_import_circles():
    graph = import_graph(package_dirs(ROOT))
    assert "gradcheck.ops" in graph and "gradcheck.layers" in graph  # the whole package was read
    found = circles(graph)
    assert not found, ("import circles (break each at what the modules share: a third module both import, "
                       "a registry, a hook):\n" + "\n".join(describe(graph, c) for c in found))


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_a_circle_is_found_and_named(tmp_path):
    # a -> b (lazily, inside a function) -> c -> a is a circle; d imports a and is not in it; `from pkg
    # import e` is an edge to pkg.e, and e's relative import of a's name is an edge to a.
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "def f():\n    from pkg import b\n    return b\n",
        "pkg/b.py": "import pkg.sub.c\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from ..a import f\n",
        "pkg/d.py": "from pkg import a, e\n",
        "pkg/e.py": "from .a import f\n",
        "mapped/x.py": "from pkg.d import a\n",
    })
    graph = import_graph({"pkg": tmp_path / "pkg", "pkg.mapped": tmp_path / "mapped"})
    assert graph["pkg.d"] == {"pkg.a", "pkg.e"} and graph["pkg.mapped.x"] == {"pkg.d"}
    found = circles(graph)
    assert found == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    assert describe(graph, found[0]) == ("3 modules import each other: pkg.a -> pkg.b; pkg.b -> pkg.sub.c; "
                                         "pkg.sub.c -> pkg.a")


def test_a_tree_without_circles_has_none(tmp_path):
    _write(tmp_path, {"pkg/__init__.py": "from pkg import a\n", "pkg/a.py": "import numpy\nfrom pkg import b\n",
                      "pkg/b.py": "x = 1\n"})
    graph = import_graph({"pkg": tmp_path / "pkg"})
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": set()}
    assert circles(graph) == []

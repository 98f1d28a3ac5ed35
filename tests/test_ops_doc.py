"""docs/ops.md has one row per op of ``gradcheck.ops``, and no row for anything else.

An op added to ``gradcheck/ops/__init__.py`` without a row in the table (what torch,
jax, the tape and the numpy referee run for it) fails here, as does a row
left behind for an op that was renamed or removed.
"""

from __future__ import annotations

import re
from pathlib import Path

from gradcheck import ops

DOC = Path(__file__).resolve().parents[1] / "docs" / "ops.md"
COLUMNS = ["op", "torch", "jax", "tape", "numpy"]
_CELL_SPLIT = re.compile(r"(?<!\\)\|")  # an escaped pipe (\|) stays inside its cell


def _cells(line: str) -> list[str]:
    return [c.strip() for c in _CELL_SPLIT.split(line.strip())[1:-1]]


def _table() -> list[list[str]]:
    """The rows of the op table (the first table whose header starts with "op"), header and separator left out."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.lstrip().startswith("|") and _cells(line)[:1] == ["op"])
    assert _cells(lines[start]) == COLUMNS, f"docs/ops.md: the table's header is {_cells(lines[start])}"
    rows = []
    for line in lines[start + 2:]:
        if not line.lstrip().startswith("|"):
            break
        rows.append(_cells(line))
    return rows


def _documented() -> list[str]:
    """The op named by each row; section rows (a bold first cell, the rest empty) are skipped."""
    names = []
    for cells in _table():
        first = cells[0]
        if first.startswith("**"):
            assert not any(cells[1:]), f"docs/ops.md: section row {first} has cells beyond the first"
            continue
        assert len(cells) == len(COLUMNS), (
            f"docs/ops.md: the row {first!r} has {len(cells)} cells; expected {len(COLUMNS)}"
        )
        match = re.fullmatch(r"`([A-Za-z_][A-Za-z0-9_]*)`", first)
        assert match, f"docs/ops.md: a row's first cell must be an op name in backticks, got {first!r}"
        names.append(match.group(1))
    return names


def test_every_op_has_a_row():
    documented = set(_documented())
    missing = [name for name in ops.__all__ if name not in documented]
    assert not missing, f"ops without a row in docs/ops.md: {missing}"


def test_every_row_names_an_op():
    names = _documented()
    unknown = [name for name in names if name not in ops.__all__]
    assert not unknown, f"rows in docs/ops.md for names that are not in gradcheck.ops.__all__: {unknown}"
    duplicates = sorted({name for name in names if names.count(name) > 1})
    assert not duplicates, f"ops with more than one row in docs/ops.md: {duplicates}"

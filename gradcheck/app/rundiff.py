"""``gradcheck diff BASE NEW``: what changed between two stored runs, leaf by leaf."""

from __future__ import annotations

from dataclasses import dataclass

from gradcheck.results import FAILING, RunResult


@dataclass
class Change:
    case: str
    leaf: str  # "" for the case itself
    before: str  # verdict (or "absent")
    after: str
    detail: str
    worse: bool


def _index(run: RunResult):
    return {c.name: c for c in run.cases}


def diff(base: RunResult, new: RunResult, threshold: float = 2.0) -> list[Change]:
    """Leaves whose verdict changed, whose errors changed, or whose headroom grew by ``threshold``x.

    A case of ``base`` that ``new`` no longer has counts as worse (a run that
    stopped early, a case dropped from a suite): nothing checks it any more.
    """
    changes: list[Change] = []
    old_cases, new_cases = _index(base), _index(new)
    for name, case in new_cases.items():
        old = old_cases.get(name)
        if old is None:
            changes.append(Change(name, "", "absent", case.verdict, "new case", case.verdict in FAILING))
            continue
        if old.verdict != case.verdict:
            changes.append(Change(name, "", old.verdict, case.verdict, "case verdict changed",
                                  case.verdict in FAILING and old.verdict not in FAILING))
        for backend in sorted(set(old.errors) | set(case.errors)):
            a, b = old.errors.get(backend), case.errors.get(backend)
            if (a is None) != (b is None):
                what = "error appeared" if b else "error gone"
                changes.append(Change(name, f"[{backend}]", "error" if a else "ok", "error" if b else "ok",
                                      f"{what}: {(b or a).splitlines()[0][:120]}", b is not None))
        old_leaves = {leaf.path: leaf for leaf in old.leaves}
        for leaf in case.leaves:
            prev = old_leaves.pop(leaf.path, None)
            if prev is None:
                changes.append(Change(name, leaf.path, "absent", leaf.verdict, "new leaf", leaf.verdict in FAILING))
            elif prev.verdict != leaf.verdict:
                detail = leaf.message or f"headroom {prev.headroom:.3g} -> {leaf.headroom:.3g}"
                changes.append(Change(name, leaf.path, prev.verdict, leaf.verdict, detail,
                                      leaf.verdict in FAILING and prev.verdict not in FAILING))
            elif prev.headroom > 0 and leaf.headroom >= threshold * prev.headroom and leaf.headroom > 0.1:
                changes.append(Change(name, leaf.path, prev.verdict, leaf.verdict,
                                      f"headroom {prev.headroom:.3g} -> {leaf.headroom:.3g} "
                                      f"({leaf.headroom / prev.headroom:.1f}x closer to the tolerance)", False))
        for path, prev in old_leaves.items():
            changes.append(Change(name, path, prev.verdict, "absent", "leaf no longer checked", False))
    for name, old in old_cases.items():
        if name not in new_cases:
            # A check that is gone can no longer fail: that is a change for the worse, not none.
            changes.append(Change(name, "", old.verdict, "absent", "case no longer run", True))
    return changes


def render(changes: list[Change], base_label: str, new_label: str) -> str:
    if not changes:
        return f"no changes between {base_label} and {new_label}"
    lines = [f"{len(changes)} change(s) from {base_label} to {new_label} "
             f"({sum(c.worse for c in changes)} worse):"]
    width = max(len(f"{c.case} {c.leaf}".strip()) for c in changes)
    for c in changes:
        mark = "!" if c.worse else " "
        where = f"{c.case} {c.leaf}".strip()
        lines.append(f"{mark} {where:<{width}}  {c.before} -> {c.after}  {c.detail}")
    return "\n".join(lines)

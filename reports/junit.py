"""JUnit XML for CI test tabs (GitLab "Tests", Jenkins JUnit plugin, GitHub test-report actions).

Layout, and why:

* one ``<testsuite>`` per case: GitLab lists suites with their own pass/fail
  counts and Jenkins groups by suite, so a run of 40 cases reads as 40 rows;
* in it, one ``<testcase name="gradients agree">`` summarising the case — a
  stable name, so CI history tracks "did resnet18 pass" across runs — whose
  ``time`` is the case's backend time and whose ``system-out`` holds the
  localisation, timings and the replay command;
* plus one ``<testcase>`` per leaf that failed, named by its dotted path, with
  ``classname`` the case name: Jenkins shows ``case`` as the class and the leaf
  as the test, GitLab shows both columns.  The ``<failure message>`` names the
  leaf, the numbers and the blamed backend, which is what both systems show
  without a click.  Agreeing leaves are left out by default (``all_leaves``
  adds them) because 62 passing rows per ResNet drown the one that failed.

Errors become ``<error>``, skipped cases and leaves ``<skipped>``.  The output
validates against ``junit.xsd`` next to this file (the common Jenkins/Ant
junit-10 shape).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import datetime

from gradcheck.results import CaseResult, LeafResult, RunResult

from ._common import (
    LeafNumbers,
    blame_text,
    case_time,
    compared,
    failing_leaves,
    fmt,
    fmt_index,
    fmt_seconds,
    is_failing,
    reason,
    write_text,
)

SUMMARY_TEST = "gradients agree"
# XML 1.0 cannot carry most control characters at all, escaped or not.
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _x(text) -> str:
    return _XML_ILLEGAL.sub("\ufffd", str(text))


def _one_line(text) -> str:
    return " ".join(_x(text).split())


def _seconds(s: float) -> str:
    return f"{max(float(s), 0.0):.6f}"


def _timestamp(env: dict) -> str | None:
    """``env["started"]`` as an xs:dateTime, or None when it is missing or not ISO 8601."""
    started = env.get("started")
    if not started:
        return None
    try:
        return datetime.fromisoformat(str(started)).isoformat(timespec="seconds")
    except ValueError:
        return None


def _leaf_message(leaf: LeafResult) -> str:
    n = LeafNumbers.of(leaf)
    msg = f"{leaf.path}: {leaf.verdict}"
    if n.headroom is not None:
        msg += f", max rel diff {fmt(n.max_rel)}, max abs diff {fmt(n.max_abs)}, headroom {fmt(n.headroom)}"
    msg += f"; blamed: {blame_text(leaf)}"
    if reason(leaf):
        msg += f" ({reason(leaf)})"
    return _one_line(msg)


def _leaf_detail(leaf: LeafResult) -> str:
    """The failure body: everything the HTML report shows for the leaf, as text."""
    lines = [leaf.message, f"layer {leaf.layer or '—'}, shape {leaf.shape}, dtype {leaf.dtype}"]
    if leaf.tolerance is not None:
        t = leaf.tolerance
        lines.append(f"tolerance: |a - b| <= {fmt(t.atol)} + {fmt(t.rtol)} * |b|  ({t.rule})")
    for p in leaf.pairs:
        lines.append(f"{p.backend} vs {p.reference}: {p.verdict}, {p.mismatched}/{p.total} off, "
                     f"max abs {fmt(p.max_abs)} at {fmt_index(p.max_abs_index)}, "
                     f"max rel {fmt(p.max_rel)} at {fmt_index(p.max_rel_index)}, "
                     f"rel err norm {fmt(p.rel_err_norm)}, cosine {fmt(p.cosine, 6)}, headroom {fmt(p.headroom)}")
    for r in leaf.referee:
        lines.append(f"referee {r.backend}: <g, v> = {fmt(r.directional, 6)} vs finite difference "
                     f"{fmt(r.numeric, 6)}, error/tol {fmt(r.error)} -> {'agrees' if r.agrees else 'DISAGREES'}")
    for w in leaf.worst:
        values = w.get("values") if isinstance(w.get("values"), dict) else {
            k: v for k, v in w.items() if k not in ("index", "ratio")}
        lines.append(f"at {fmt_index(w.get('index', []))}: "
                     + ", ".join(f"{b} {fmt(v, 6)}" for b, v in values.items()))
    return _x("\n".join(lines))


def _case_out(case: CaseResult) -> str:
    lines = [f"model {case.model or '—'}, dtype {case.dtype}, mode {case.mode}, seed {case.seed}",
             f"leaves: {case.count('agree')} of {compared(case)} compared agree"]
    if case.first_disagreement:
        lines.append(f"disagreement starts at {case.first_disagreement}")
    for b, t in case.timings.items():
        second = "" if t.second is None else f", second call {fmt_seconds(t.second)}"
        lines.append(f"{b}: first call {fmt_seconds(t.first)}{second}")
    for b, why in case.unavailable.items():
        lines.append(f"{b} unavailable: {why}")
    lines += case.notes
    if case.replay:
        lines.append(f"replay: {case.replay}")
    return _x("\n".join(lines))


def _testcase(parent, name: str, classname: str, time: float) -> ET.Element:
    return ET.SubElement(parent, "testcase", name=_one_line(name), classname=_one_line(classname),
                         time=_seconds(time))


def _case_suite(case: CaseResult, run: RunResult, all_leaves: bool) -> ET.Element:
    suite = ET.Element("testsuite", name=_one_line(case.name))
    props = ET.SubElement(suite, "properties")
    for key, value in (("model", case.model), ("dtype", case.dtype), ("mode", case.mode), ("seed", case.seed),
                       ("backends", ",".join(case.backends)), ("replay", case.replay)):
        if value not in ("", None):
            ET.SubElement(props, "property", name=key, value=_one_line(value))

    summary = _testcase(suite, SUMMARY_TEST, case.name, case_time(case))
    failing = failing_leaves(case)
    if case.errors or case.verdict == "error":
        text = "\n\n".join(f"[{b}]\n{t}" for b, t in case.errors.items()) or "the case ended in error"
        first = next(iter(case.errors.items()), ("case", "error"))
        last = next((ln for ln in reversed(str(first[1]).splitlines()) if ln.strip()), "")
        ET.SubElement(summary, "error", message=_one_line(f"{first[0]}: {last}"), type="error").text = _x(text)
    elif case.failed:
        blamed = sorted({b for leaf in failing for b in leaf.blame})
        msg = f"{len(failing)} of {compared(case)} leaves failed ({case.verdict})"
        if case.first_disagreement:
            msg += f"; starts at {case.first_disagreement}"
        if blamed:
            msg += f"; blamed: {', '.join(blamed)}"
        body = "\n".join(_leaf_message(leaf) for leaf in failing) or _one_line(case.verdict)
        ET.SubElement(summary, "failure", message=_one_line(msg), type=case.verdict).text = _x(body)
    elif case.verdict == "skipped":
        why = "; ".join(f"{b}: {w}" for b, w in case.unavailable.items()) or "every leaf was skipped"
        ET.SubElement(summary, "skipped", message=_one_line(why))
    ET.SubElement(summary, "system-out").text = _case_out(case)

    for leaf in case.leaves if all_leaves else failing:
        tc = _testcase(suite, leaf.path, case.name, 0.0)
        if leaf.verdict == "error":
            ET.SubElement(tc, "error", message=_leaf_message(leaf), type="error").text = _leaf_detail(leaf)
        elif leaf.verdict == "skipped":
            ET.SubElement(tc, "skipped", message=_one_line(leaf.message or "skipped"))
        elif is_failing(leaf.verdict):
            ET.SubElement(tc, "failure", message=_leaf_message(leaf), type=leaf.verdict).text = _leaf_detail(leaf)

    tests = suite.findall("testcase")
    suite.set("tests", str(len(tests)))
    suite.set("failures", str(sum(1 for t in tests if t.find("failure") is not None)))
    suite.set("errors", str(sum(1 for t in tests if t.find("error") is not None)))
    suite.set("skipped", str(sum(1 for t in tests if t.find("skipped") is not None)))
    suite.set("time", _seconds(case_time(case)))
    stamp = _timestamp(run.env)
    if stamp:
        suite.set("timestamp", stamp)
    return suite


def render_junit(run: RunResult, all_leaves: bool = False) -> str:
    root = ET.Element("testsuites", name="gradcheck")
    for case in run.cases:
        root.append(_case_suite(case, run, all_leaves))
    if not run.cases:
        # An empty run is a failure (nothing was checked); say so where CI looks.
        suite = ET.SubElement(root, "testsuite", name="gradcheck", tests="1", failures="0", errors="1",
                              skipped="0", time=_seconds(0))
        tc = _testcase(suite, "run", "gradcheck", 0.0)
        ET.SubElement(tc, "error", message="no case ran", type="error")
    suites = root.findall("testsuite")
    for attr in ("tests", "failures", "errors", "skipped"):
        root.set(attr, str(sum(int(s.get(attr, "0")) for s in suites)))
    root.set("time", _seconds(sum(float(s.get("time", "0")) for s in suites)))
    ET.indent(root)
    body = ET.tostring(root, encoding="unicode")
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{body}\n'


def write_junit(run: RunResult, path, all_leaves: bool = False):
    return write_text(path, render_junit(run, all_leaves))

"""Renderers on the two-part result model: terminal summary, Markdown, GitHub annotations, JUnit XML
(validated), JSON, HTML — including interrupted runs, vacuous leaves, float32 warnings and failures, kinks,
and case names that try to inject lines into a terminal or a CI log."""

from __future__ import annotations

import dataclasses
import html.parser
import json
import math
import re
import xml.etree.ElementTree as ET
from importlib import resources
from pathlib import Path

import pytest
import report_fixtures as fx

from gradcheck import reports, results
from gradcheck.reports.html import script_json
from gradcheck.reports.svg import kink_span
from gradcheck.reports.text import leaf_sentence
from gradcheck.results import KinkReport, RunResult, dumps, load, run_from_dict


def roundtrip(run: RunResult) -> RunResult:
    """What ``gradcheck report`` sees: the run after JSON serialisation."""
    return run_from_dict(json.loads(dumps(run)))


ALL_RUNS = {
    "agree": fx.agree_run,
    "disagree": fx.disagree_run,
    "mixed": fx.mixed_run,
    "hostile": fx.hostile_run,
    "two_part": fx.two_part_run,
    "interrupted": fx.interrupted_run,
    "injection": fx.injection_run,
    "unavailable": fx.unavailable_run,
    "empty": lambda: RunResult(env=dict(fx.ENV)),
}
KINK = "1 relu input in features.2 is 3.2e-6 from its kink; jax's float32 forward crossed it (pinned to the float64 branch)"
IMPRECISE = ("jax float32 is 800× further from float64 than torch on features.3.weight "
             "(4.8e-04 vs 6e-07; limit 6.1e-06)")
INTERRUPTED = "interrupted: 39 of 200 cases ran"
# After leading spaces, a line that starts so is a workflow command to GitHub's (or Azure's) runner.
COMMAND_START = re.compile(r"^\s*(::|##\[)")
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def case_of(run: RunResult, name: str):
    return next(c for c in run.cases if c.name == name)


def table_lines(text: str) -> list[str]:
    """The summary's case table and timing table: everything before the second blank line."""
    out, blanks = [], 0
    for line in text.splitlines():
        if line == "":
            blanks += 1
            if blanks == 2:
                break
        out.append(line)
    return out


def assert_inert(lines):
    """Every line is one printable line that no CI runner reads as a command."""
    for line in lines:
        assert "\n" not in line and "\r" not in line, repr(line)
        assert not CONTROL.search(line), repr(line)
        assert not COMMAND_START.match(line), repr(line)


# ---------------------------------------------------------------- terminal
def test_summary_all_agree():
    text = reports.render_summary(fx.agree_run(), color=False)
    lines = text.splitlines()
    assert lines[-1].startswith("gradcheck PASS")
    assert "10 of 10 leaves agree" in lines[-1]
    assert "DISAGREE" not in text and "\x1b" not in text
    assert lines[0].split() == ["case", "float64", "agree", "headroom", "float32"]
    convnet = next(ln for ln in lines if ln.startswith("convnet "))
    assert re.search(r"✓ agree\s+9/9\s+0\.08\s+ok, jax 2\.3×$", convnet), convnet
    timing_head = next(ln for ln in lines if ln.startswith("case ") and "1st/2nd/f64" in ln)
    assert timing_head.split()[1:] == ["tape", "1st/2nd/f64", "torch", "1st/2nd/f64", "jax", "1st/2nd/f64"]
    timing = [ln for ln in lines if ln.startswith("convnet ")][1]
    # float32 first call / second call (jax compiles; the eager backends are called once) / float64 call
    assert timing.split()[1:] == ["1.20s/—/600ms", "720ms/—/360ms", "3.60s/150ms/1.80s"]
    relu = [ln for ln in lines if ln.startswith("relu-two-backends")][1]
    assert relu.rstrip().endswith("n/a")


def test_summary_names_leaf_numbers_and_blamed_backend():
    text = reports.render_summary(fx.disagree_run(blamed="jax"), color=False)
    leaf_lines = [ln for ln in text.splitlines() if "DISAGREE" in ln]
    assert len(leaf_lines) == 1
    line = leaf_lines[0]
    assert line.startswith("✗ DISAGREE convnet-broken :: features.3.weight — ")
    for part in ("max rel diff 0.93", "max abs diff 0.0241 at [3, 1, 2, 2] (jax vs tape)", "headroom 2400",
                 "blamed: jax", "tape and torch agree"):
        assert part in line, (part, line)
    assert text.splitlines()[-1].startswith("gradcheck FAIL")
    assert "blamed: jax ×1" in text.splitlines()[-1]


def test_summary_shows_both_parts_failures_before_notices():
    text = reports.render_summary(fx.two_part_run(), color=False)
    lines = text.splitlines()
    table = lines[1:lines.index("")]  # the case table; the timing table follows
    row = {ln.split()[0]: ln for ln in table}
    assert row["convnet-imprecise-warn"].split()[1:4] == ["✓", "agree", "9/9"]
    assert row["convnet-imprecise-warn"].endswith("imprecise: jax 800×")
    assert row["convnet-imprecise-fail"].split()[1:3] == ["≈", "imprecise"]
    assert "ok, jax" in row["convnet"]
    # The vacuous leaves' headroom (2.25e9) is not the case's worst headroom, and they are not failures.
    assert re.search(r"✓ agree\s+7/9\s+0\.08\b", row["conv-bn-vacuous"]), row["conv-bn-vacuous"]
    assert "2.25e+09" not in text
    failures = [ln for ln in lines if re.match(r"^(✗ DISAGREE|≈ IMPRECISE (?!\()|! ERROR)", ln)]
    assert [ln.split(" :: ")[0] for ln in failures] == ["≈ IMPRECISE convnet-imprecise-fail",
                                                        "✗ DISAGREE convnet-broken"]
    assert failures[0].endswith(f"{IMPRECISE}; float64 agrees (headroom 0.05)")
    warn = next(ln for ln in lines if ln.startswith("≈ IMPRECISE (warning)"))
    assert warn == f"≈ IMPRECISE (warning) convnet-imprecise-warn :: features.3.weight — {IMPRECISE}"
    assert f"∧ KINK convnet — {KINK}" in lines
    vac = next(ln for ln in lines if ln.startswith("∅ VACUOUS"))
    assert "conv-bn-vacuous" in vac and "features.0.bias, features.3.bias" in vac and "not failures" in vac
    # failures first, then every notice
    assert max(lines.index(ln) for ln in failures) < min(lines.index(ln) for ln in (warn, vac))
    last = lines[-1]
    assert last.startswith("gradcheck FAIL: 2 of 5 cases failed")
    assert "(imprecise 1, disagree 1)" in last and "vacuous 2" not in last and "2 vacuous" in last


def test_summary_errors_show_the_exception_first():
    plain = reports.render_summary(fx.mixed_run(), color=False)
    assert (f"! ERROR gelu-error :: tape — ValueError: {fx.ERROR_MESSAGE} — at gradcheck/backends/numpy_ops.py:96 "
            "in check_matmul") in plain.splitlines()
    # Python's own traceback form: the exception is its last line, the frame before it.
    assert ("! ERROR gelu-error :: jax — NotImplementedError: op 'erf' has no jax kernel; add it to "
            "backends/jax_ops.py — at ops.py:12") in plain.splitlines()
    assert "STRUCTURAL linear-structural :: bias" in plain and "blamed: torch" in plain
    gelu = [ln for ln in plain.splitlines() if ln.startswith("gelu-error")][1]
    assert gelu.rstrip().endswith("error")
    assert "\x1b[" in reports.render_summary(fx.mixed_run(), color=True)


def test_summary_one_unavailable_notice_per_backend_after_the_failure():
    lines = reports.render_summary(fx.unavailable_run(50), color=False).splitlines()
    unavailable = [ln for ln in lines if "UNAVAILABLE" in ln]
    assert unavailable == ["– UNAVAILABLE jax — jax is not installed: pip install 'gradcheck[jax]' (50 cases)"]
    disagree = next(i for i, ln in enumerate(lines) if ln.startswith("✗ DISAGREE"))
    assert disagree < lines.index(unavailable[0])


def test_summary_interrupted_run_is_not_a_pass():
    text = reports.render_summary(fx.interrupted_run(39, 200), color=False)
    last = text.splitlines()[-1]
    assert last.startswith(f"gradcheck INCOMPLETE: {INTERRUPTED}; none of those failed")
    assert "PASS" not in text and "passed" not in last
    planned = RunResult(env={}, cases=[fx.convnet_case()], planned=3)  # fewer ran than planned, no Ctrl-C
    assert "incomplete: 1 of 3 cases ran" in reports.render_summary(planned).splitlines()[-1]


@pytest.mark.parametrize("name", sorted(ALL_RUNS))
def test_summary_tables_fit_80_columns(name):
    run = ALL_RUNS[name]()
    if run.cases:
        run.cases[0].name = "a-case-name-far-too-long-for-any-terminal-column-" * 3
    for color in (False, True):
        text = reports.render_summary(run, color=color)
        plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
        assert all(len(ln) <= 80 for ln in table_lines(plain)), [ln for ln in table_lines(plain) if len(ln) > 80]


def test_summary_tables_fit_with_many_backends():
    run = fx.agree_run()
    for case in run.cases:
        for extra in ("numpy", "mlx", "tinygrad"):
            case.timings[extra] = results.Timing(1.5, 0.25, 2.0)
    assert all(len(ln) <= 80 for ln in table_lines(reports.render_summary(run)))


@pytest.mark.parametrize("name", ["hostile", "injection"])
def test_summary_neutralises_injection(name):
    run = ALL_RUNS[name]()
    text = reports.render_summary(run, color=False)
    lines = text.split("\n")
    assert_inert(lines)
    assert "\x1b" not in text and "\r" not in text and "\u2028" not in text
    if name == "hostile":
        assert fx.HOSTILE in text  # a terminal shows it as text; no escaping needed beyond control characters
    else:
        # Each forged name still shows, defused: the command is behind a backslash, the escape made visible.
        assert "ok ::error file=x.py,line=1::forged failure" in text
        assert "\\::warning::forged warning" in text and "red \\x1b[31mRED" in text


def test_summary_caps_leaf_lines():
    text = reports.render_summary(fx.many_failures_run(cases=3, leaves=30), color=False, max_leaf_lines=10)
    assert len([ln for ln in text.splitlines() if "DISAGREE" in ln]) == 10
    assert "… and 80 more failures" in text


def test_progress_bar_and_line_fit_and_are_clean():
    for name in [*fx.INJECTIONS, "x" * 300, "short"]:
        bar = reports.progress_bar(3, 200, name)
        assert len(bar) == 79 and bar.startswith("[") and " 3/200 " in bar
        assert_inert([bar])
        case = fx.convnet_case(name=name)
        line = reports.progress_line(4, 200, case, 12.34)
        assert_inert([line])
        assert line.startswith("[4/200] ") and "agree (9 leaves, 12.3s; float32 ok, jax 2.3×)" in line
    assert reports.progress_bar(200, 200, "done").startswith("[" + "#" * 20 + "] 200/200 done")


# ---------------------------------------------------------------- markdown
def _cells(row: str) -> list[str]:
    """Split a GFM table row on unescaped pipes."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def _section(text: str, title: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(f"### {title}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("### ")), len(lines))
    return lines[start + 1:end]


def _rows(text: str, title: str) -> list[list[str]]:
    """A section's table rows as cells, without its head and rule."""
    rows = [ln for ln in _section(text, title) if ln.startswith("|")]
    return [_cells(r) for r in rows[2:]]


def test_markdown_tables():
    text = reports.render_markdown(fx.mixed_run())
    assert text.startswith("## ❌ gradcheck:")
    leaf = next(r for r in _section(text, "Failing leaves") if "features.3.weight" in r)
    assert _cells(leaf) == ["convnet-broken", "features.3.weight", "❌ disagree", "jax", "0.93", "2400"]
    cases = [r for r in _section(text, "Cases") if r.startswith("| convnet |")]
    assert _cells(cases[0])[:5] == ["convnet", "✅ agree", "9 / 9", "0.08", "ok, jax 2.3×"]
    assert "### Cases" in text and "### Failing leaves" in text and "### Errors" in text
    errors = [_cells(r) for r in _section(text, "Errors") if r.startswith("| gelu-error")]
    # The exception first, where it was raised after.
    assert errors[1][:3] == ["gelu-error", "tape", reports.markdown.md(f"ValueError: {fx.ERROR_MESSAGE}")]
    assert errors[1][3] == "gradcheck/kernels.py:210 in matmul; gradcheck/backends/numpy\\_ops.py:96 in check\\_matmul"
    assert errors[0][2].startswith("NotImplementedError: op 'erf'")
    assert "```sh\ngradcheck run convnet" in text
    assert text.index("### Errors") < text.index("### Failing leaves") < text.index("### Notices")


def test_markdown_all_agree_has_no_failure_table():
    text = reports.render_markdown(fx.agree_run())
    assert text.startswith("## ✅ gradcheck: All gradients agree")
    assert "### Failing leaves" not in text and "### Errors" not in text


def test_markdown_float32_precision_section():
    text = reports.render_markdown(fx.two_part_run())
    precision = {r[0]: r for r in _rows(text, "float32 precision")}
    assert precision["convnet"][1:3] == ["✅ ok", "ok, jax 2.3×"]
    assert precision["convnet"][4:] == ["0", "2 (1 crossed, pinned)", "warn"]
    assert precision["convnet-imprecise-warn"][1:5] == ["⚠️ imprecise", "imprecise: jax 800×",
                                                             "features.3.weight", "1"]
    imprecise = _rows(text, "Imprecise leaves")
    assert [(c[0], c[2], c[-2], c[-1]) for c in imprecise] == [
        ("convnet-imprecise-warn", "jax", "800×", "warning"), ("convnet-imprecise-fail", "jax", "800×", "failure")]
    assert imprecise[0][3:6] == ["4.8e-04", "torch 6e-07", "6.1e-06"]
    kinks = [ln for ln in _section(text, "Kinks") if ln.startswith("- ")]
    assert kinks[0] == f"- **convnet**: {KINK.replace('_', chr(92) + '_')}"
    assert "no float32 forward crossed them; 1 closer than float64 resolves" in kinks[1]
    notices = _section(text, "Notices")
    assert any("conv-bn-vacuous" in ln and "2 leaves are vacuous" in ln for ln in notices)
    failing = _rows(text, "Failing leaves")
    assert [(c[0], c[2]) for c in failing] == [("convnet-imprecise-fail", "⚠️ imprecise"),
                                               ("convnet-broken", "❌ disagree")]
    vac = next(r for r in _rows(text, "Cases") if r[0] == "conv-bn-vacuous")
    assert vac[1:4] == ["✅ agree", "7 / 9", "0.08"]


def test_markdown_interrupted_run():
    text = reports.render_markdown(fx.interrupted_run(39, 200))
    assert text.startswith("## ⏹️ gradcheck: The run was interrupted")
    assert f"> **{INTERRUPTED}**; 161 never ran. This is not a pass" in text
    assert "passed" not in text and "All gradients agree" not in text


def test_markdown_unavailable_once_per_backend():
    text = reports.render_markdown(fx.unavailable_run(50))
    notes = [ln for ln in _section(text, "Notices") if "unavailable" in ln]
    assert notes == ["- unavailable: jax — jax is not installed: pip install 'gradcheck\\[jax\\]' (50 cases)"]


@pytest.mark.parametrize("name", ["hostile", "injection"])
def test_markdown_escapes_html_pipes_and_injection(name):
    text = reports.render_markdown(ALL_RUNS[name]())
    prose = re.sub(r"```sh\n.*?\n```", "", text, flags=re.S)  # a fenced block shows its text literally
    assert "<script>" not in prose and "<b>" not in prose
    if name == "hostile":
        assert "```sh\ngradcheck run '<script>alert(1)</script>'" in text
    assert_inert(prose.split("\n"))
    header_cells = None
    for row in (ln for ln in text.splitlines() if ln.startswith("|")):
        if header_cells is None or row.startswith("| case"):
            header_cells = len(_cells(row))
        assert len(_cells(row)) == header_cells, row


@pytest.mark.parametrize("limit", [300, 2_000, 20_000, 100_000])
def test_markdown_truncates_below_limit(limit):
    text = reports.render_markdown(fx.many_failures_run(), limit_bytes=limit)
    assert len(text.encode("utf-8")) <= limit
    if limit >= 2_000:
        assert "**Truncated:**" in text
        assert text.rstrip().endswith("```")  # the reproduce command survives the cut


def test_markdown_default_limit_fits_large_run():
    text = reports.render_markdown(fx.many_failures_run(cases=60, leaves=300))
    assert len(text.encode("utf-8")) <= 1_000_000
    assert "**Truncated:**" in text


def test_write_markdown_is_gone():
    assert not hasattr(reports, "write_markdown")  # dead: the CLI and the plugin write render_markdown's text


# ---------------------------------------------------------------- github annotations
def test_github_annotations():
    lines = reports.github_annotations(fx.mixed_run())
    errors = [ln for ln in lines if ln.startswith("::error ")]
    assert len(errors) == 5  # disagree, structural, nonfinite, two backend errors
    assert all(re.match(r"^::error title=[^:,]*::", ln) for ln in errors)
    leaf = next(ln for ln in errors if "features.3.weight" in ln)
    assert leaf.endswith("::" + leaf_sentence(fx.mixed_run().cases[0].leaves[5]))
    assert "blamed: jax" in leaf and "max rel diff 0.93" in leaf and "headroom 2400" in leaf
    tape = next(ln for ln in errors if "tape error" in ln)
    assert tape.split("::", 2)[2].startswith(f"ValueError: {fx.ERROR_MESSAGE} — at ")
    assert [ln for ln in lines if ln.startswith("::warning ")] == [
        "::warning title=gradcheck%3A partial check::1 of 5 cases checked on tape and torch alone: jax unavailable",
        "::warning title=gradcheck%3A jax unavailable::jax — jax is not installed: pip install 'gradcheck[jax]'"]
    assert all(ln.startswith("::warning") for ln in reports.github_annotations(fx.agree_run()))


def test_github_float32_warning_once_per_case():
    lines = reports.github_annotations(fx.two_part_run())
    warnings = [ln for ln in lines if ln.startswith("::warning ")]
    assert warnings == [f"::warning title=gradcheck convnet-imprecise-warn%3A float32 imprecise::{IMPRECISE}"]
    errors = [ln for ln in lines if ln.startswith("::error ")]
    assert [ln.split("::")[1] for ln in errors] == [
        "error title=gradcheck convnet-imprecise-fail%3A features.3.weight imprecise",
        "error title=gradcheck convnet-broken%3A features.3.weight disagree"]
    run = fx.two_part_run()
    run.cases += [fx.imprecise_case("warn") for _ in range(3)]  # the same case thrice: said once
    assert len([ln for ln in reports.github_annotations(run) if "float32 imprecise" in ln]) == 1


def test_github_unavailable_once_and_failures_first():
    lines = reports.github_annotations(fx.unavailable_run(50))
    assert [ln.split("::")[1] for ln in lines] == ["error title=gradcheck convnet-broken%3A features.3.weight disagree",
                                                   "warning title=gradcheck%3A partial check",
                                                   "warning title=gradcheck%3A jax unavailable"]
    assert lines[1].endswith("::50 of 51 cases checked on tape and torch alone: jax unavailable")
    assert lines[2].endswith("(50 cases)")


def test_github_interrupted_and_empty():
    lines = reports.github_annotations(fx.interrupted_run(39, 200))
    assert lines[0].startswith("::error title=gradcheck%3A run incomplete::" + INTERRUPTED)
    empty = reports.github_annotations(RunResult(env={}))
    assert empty == ["::error title=gradcheck%3A nothing was checked::no case results: nothing was checked"]


@pytest.mark.parametrize("name", ["hostile", "injection"])
def test_github_annotations_escape_and_cap(name):
    lines = reports.github_annotations(ALL_RUNS[name]())
    assert all(ln.startswith(("::error title=", "::warning title=")) for ln in lines)
    assert all("\n" not in ln and "\r" not in ln and not CONTROL.search(ln) for ln in lines)
    for ln in lines:
        title = ln.split("::")[1]
        assert ":" not in title.split("=", 1)[1] and "," not in title
    many = reports.github_annotations(fx.many_failures_run(cases=2, leaves=20), limit=10)
    assert len(many) == 10 and "31 more failures" in many[-1]


# ---------------------------------------------------------------- JUnit (validated against junit.xsd)
XS = "{http://www.w3.org/2001/XMLSchema}"
_SIMPLE = {
    "xs:string": lambda v: True,
    "xs:decimal": lambda v: re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)", v) is not None,
    "xs:nonNegativeInteger": lambda v: re.fullmatch(r"\+?\d+", v) is not None,
    "xs:dateTime": lambda v: re.fullmatch(
        r"-?\d{4,}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?", v) is not None,
}


class MiniXsd:
    """Validates against the XSD subset junit.xsd uses: nested element declarations with
    sequence/choice, min/maxOccurs, attributes with use="required" and the simple types above."""

    def __init__(self, xsd_text: str):
        self.root = ET.fromstring(xsd_text).find(f"{XS}element")

    @staticmethod
    def _occurs(node) -> tuple[int, float]:
        mx = node.get("maxOccurs", "1")
        return int(node.get("minOccurs", "1")), math.inf if mx == "unbounded" else int(mx)

    def validate(self, elem) -> list[str]:
        errors: list[str] = []
        if elem.tag != self.root.get("name"):
            return [f"root is <{elem.tag}>, expected <{self.root.get('name')}>"]
        self._element(self.root, elem, elem.tag, errors)
        return errors

    def _element(self, decl, elem, where, errors):
        simple = decl.get("type")
        ctype = decl.find(f"{XS}complexType")
        if simple is not None:
            if len(elem) or elem.attrib:
                errors.append(f"{where}: simple-typed element has children or attributes")
            return
        attrs = {a.get("name"): a for a in ctype.findall(f"{XS}attribute")}
        for name, value in elem.attrib.items():
            if name not in attrs:
                errors.append(f"{where}: unknown attribute {name!r}")
            elif not _SIMPLE[attrs[name].get("type")](value):
                errors.append(f"{where}: attribute {name}={value!r} is not {attrs[name].get('type')}")
        for name, a in attrs.items():
            if a.get("use") == "required" and name not in elem.attrib:
                errors.append(f"{where}: missing required attribute {name!r}")
        if ctype.get("mixed") != "true" and (elem.text or "").strip():
            errors.append(f"{where}: text in element-only content")
        model = ctype.find(f"{XS}sequence")
        if model is None:
            model = ctype.find(f"{XS}choice")
        kids = list(elem)
        if model is None:
            if kids:
                errors.append(f"{where}: unexpected children {[k.tag for k in kids]}")
            return
        if len(kids) not in self._repeat(model, kids, 0):
            errors.append(f"{where}: children {[k.tag for k in kids]} do not match the content model")
            return
        decls = {d.get("name"): d for d in model.iter(f"{XS}element")}
        for i, kid in enumerate(kids):
            self._element(decls[kid.tag], kid, f"{where}/{kid.tag}[{i}]", errors)

    def _repeat(self, particle, kids, start) -> set[int]:
        """Positions reachable after minOccurs..maxOccurs matches of ``particle`` from ``start``."""
        lo, hi = self._occurs(particle)
        reached = {start} if lo == 0 else set()
        frontier, seen, n = {start}, set(), 0
        while frontier and n < hi:
            n += 1
            nxt = set().union(*(self._once(particle, kids, p) for p in frontier))
            if n >= lo:
                reached |= nxt
                nxt -= seen  # past the minimum, only new positions can lead anywhere new
                seen |= nxt
            frontier = nxt
        return reached

    def _once(self, particle, kids, start) -> set[int]:
        tag = particle.tag
        if tag == f"{XS}element":
            return {start + 1} if start < len(kids) and kids[start].tag == particle.get("name") else set()
        items = [c for c in particle if c.tag in (f"{XS}element", f"{XS}sequence", f"{XS}choice")]
        if tag == f"{XS}choice":
            out = set()
            for item in items:
                out |= self._repeat(item, kids, start)
            return out
        positions = {start}
        for item in items:
            positions = set().union(*(self._repeat(item, kids, p) for p in positions)) if positions else set()
        return positions


@pytest.fixture(scope="module")
def xsd() -> MiniXsd:
    return MiniXsd(resources.files("gradcheck.reports").joinpath("junit.xsd").read_text(encoding="utf-8"))


def test_mini_xsd_rejects_bad_documents(xsd):
    """The validator must be able to fail, or the JUnit tests below prove nothing."""
    good = ET.fromstring('<testsuites><testsuite name="a" tests="1" failures="0" errors="0" skipped="0" time="1">'
                         '<testcase name="t" classname="c" time="0"/></testsuite></testsuites>')
    assert xsd.validate(good) == []
    bad = [
        '<testsuites><testsuite name="a" tests="1" failures="0" errors="0" skipped="0"/></testsuites>',
        '<testsuites><testsuite name="a" tests="x" failures="0" errors="0" skipped="0" time="1"/></testsuites>',
        '<testsuites><testsuite name="a" tests="1" failures="0" errors="0" skipped="0" time="1">'
        '<testcase name="t" classname="c" time="0"><bogus/></testcase></testsuite></testsuites>',
        '<testsuites><testsuite name="a" tests="1" failures="0" errors="0" skipped="0" time="1">'
        '<system-out/><testcase name="t" classname="c" time="0"/></testsuite></testsuites>',
        '<testsuites><testsuite name="a" tests="1" failures="0" errors="0" skipped="0" time="1">'
        '<testcase classname="c" time="0"/></testsuite></testsuites>',
        '<testsuite name="a"/>',
    ]
    for doc in bad:
        assert xsd.validate(ET.fromstring(doc)), doc


@pytest.mark.parametrize("name", sorted(ALL_RUNS))
@pytest.mark.parametrize("all_leaves", [False, True])
def test_junit_validates_and_counts(name, all_leaves, xsd, tmp_path):
    path = reports.write_junit(ALL_RUNS[name](), tmp_path / "junit.xml", all_leaves=all_leaves)
    root = ET.parse(path).getroot()
    assert xsd.validate(root) == []
    for suite in root.findall("testsuite"):
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases)
        for kind, attr in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
            assert int(suite.get(attr)) == sum(1 for c in cases if c.find(kind) is not None), (suite.get("name"), kind)
    for attr in ("tests", "failures", "errors", "skipped"):
        assert int(root.get(attr)) == sum(int(s.get(attr)) for s in root.findall("testsuite"))
    for elem in root.iter():
        for key in ("message", "name", "classname", "value"):
            if key in elem.attrib:
                assert_inert([elem.get(key)])


def test_junit_content():
    root = ET.fromstring(reports.render_junit(fx.mixed_run()).encode())
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == ["convnet-broken", "convnet", "linear-structural", "gelu-error", "relu-two-backends"]

    broken = suites["convnet-broken"]
    names = [c.get("name") for c in broken.findall("testcase")]
    assert names == ["gradients agree", "features.3.weight"]
    leaf = broken.findall("testcase")[1]
    assert leaf.get("classname") == "convnet-broken"
    failure = leaf.find("failure")
    assert failure.get("type") == "disagree"
    assert failure.get("message") == leaf_sentence(fx.mixed_run().cases[0].leaves[5])
    for part in ("features.3.weight", "max rel diff 0.93", "headroom 2400", "blamed: jax"):
        assert part in failure.get("message")
    assert "[3, 1, 2, 2]: tape 0.01302, torch 0.01302, jax 0.03712" in failure.text
    assert "float32 against float64" in failure.text
    summary = broken.find("testcase")
    assert summary.find("failure").get("message") == "1 of 9 leaves failed (disagree); starts at features.3.weight; " \
                                                     "blamed: jax"
    # Time comes from the timings: float32 first and second calls and the float64 call of every backend.
    assert float(summary.get("time")) == pytest.approx(1.2 + 0.6 + 0.72 + 0.36 + 3.6 + 0.15 + 1.8)
    assert float(broken.get("time")) == float(summary.get("time"))
    assert broken.get("timestamp") == "2024-05-01T12:00:00+00:00"
    out = summary.find("system-out").text
    assert "replay: gradcheck run convnet -k convnet-broken" in out
    assert "jax: float32 first call 3.60 s, second call 150 ms, float64 call 1.80 s" in out

    assert suites["convnet"].get("failures") == "0" and len(suites["convnet"].findall("testcase")) == 1
    error = suites["gelu-error"].find("testcase/error")
    # The exception first, where it was raised after; the full text in the body.
    assert error.get("message") == ("jax: NotImplementedError: op 'erf' has no jax kernel; add it to "
                                    "backends/jax_ops.py — at ops.py:12")
    assert "Traceback" in error.text and "check_matmul" in error.text
    assert "jax unavailable: jax is not installed" in suites["relu-two-backends"].find("testcase/system-out").text
    structural = suites["linear-structural"]
    assert [c.find("failure").get("type") for c in structural.findall("testcase")] == [
        "structural", "structural", "nonfinite"]


def _props(suite) -> dict:
    return {p.get("name"): p.get("value") for p in suite.iter("property")}


def test_junit_two_parts():
    root = ET.fromstring(reports.render_junit(fx.two_part_run()).encode())
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    # float32 imprecise under "warn": system-out and properties, no failure
    warn = suites["convnet-imprecise-warn"]
    assert warn.get("failures") == "0" and len(warn.findall("testcase")) == 1
    assert f"float32 warning: {IMPRECISE}" in warn.find("testcase/system-out").text
    assert {k: v for k, v in _props(warn).items() if k.startswith("float32")} == {
        "float32": "imprecise", "float32.policy": "warn", "float32.imprecise": "jax",
        "float32.worst": "jax 800x on features.3.weight"}
    # under "fail": a failure on the case and on the leaf
    fail = suites["convnet-imprecise-fail"]
    summary, leaf = fail.findall("testcase")
    assert summary.find("failure").get("type") == "imprecise"
    assert summary.find("failure").get("message") == "1 of 9 leaves failed (imprecise)"
    assert leaf.get("name") == "features.3.weight" and leaf.find("failure").get("type") == "imprecise"
    assert leaf.find("failure").get("message").startswith(f"features.3.weight: imprecise; {IMPRECISE}")
    # the kink in the passing case, and its properties
    convnet = suites["convnet"]
    assert f"kink: {KINK}" in convnet.find("testcase/system-out").text
    assert _props(convnet)["kinks"] == "2" and _props(convnet)["kinks.crossed"] == "1"
    # a float64 disagreement is a failure
    assert suites["convnet-broken"].find("testcase/failure").get("type") == "disagree"
    # vacuous leaves: apart, never failures
    vac = suites["conv-bn-vacuous"]
    assert vac.get("failures") == "0" and _props(vac)["vacuous"] == "2"
    assert "2 leaves are vacuous" in vac.find("testcase/system-out").text
    every = ET.fromstring(reports.render_junit(fx.two_part_run(), all_leaves=True).encode())
    vac = next(s for s in every.findall("testsuite") if s.get("name") == "conv-bn-vacuous")
    bias = next(c for c in vac.findall("testcase") if c.get("name") == "features.0.bias")
    assert bias.find("failure") is None and "vacuous (not a failure)" in bias.find("system-out").text


def test_junit_interrupted_run():
    root = ET.fromstring(reports.render_junit(fx.interrupted_run(39, 200)).encode())
    last = root.findall("testsuite")[-1]
    assert last.get("name") == "gradcheck"
    failure = last.find("testcase/failure")
    assert last.find("testcase").get("name") == "run complete"
    assert failure.get("type") == "interrupted" and failure.get("message") == f"{INTERRUPTED}; 161 never ran"
    assert root.get("failures") == "1"
    empty = ET.fromstring(reports.render_junit(RunResult(env={})).encode())
    assert empty.find("testsuite/testcase/error").get("message") == "no case results: nothing was checked"


def test_junit_skipped_case_and_hostile_text(xsd):
    run = fx.hostile_run()
    run.cases.append(fx.CaseResult(name="all-skipped", verdict="skipped",
                                   unavailable={"torch": "not installed", "jax": "not installed"}))
    run.cases[0].errors["tape"] = "bad \x00 byte \x1b[31m and \ufffe"
    text = reports.render_junit(run)
    root = ET.fromstring(text.encode())  # parses: illegal XML characters were replaced
    assert xsd.validate(root) == []
    assert "\x1b" not in text
    skipped = root.findall("testsuite")[-1].find("testcase/skipped")
    assert "torch: not installed" in skipped.get("message")
    names = [c.get("name") for c in root.iter("testcase")]
    assert f"{fx.HOSTILE}.weight" in names


# ---------------------------------------------------------------- JSON
def test_write_json_roundtrip(tmp_path):
    run = fx.mixed_run()
    run.cases[0].leaves[1].pairs[0].headroom = math.inf
    path = reports.write_json(run, tmp_path / "out" / "results.json")
    loaded = load(path)
    assert loaded.cases[0].leaves[1].pairs[0].headroom == math.inf
    assert dumps(loaded) == dumps(run)


@pytest.mark.parametrize("make", [fx.two_part_run, fx.interrupted_run])
def test_json_carries_both_parts_and_the_interruption(make, tmp_path):
    run = make()
    data = json.loads(reports.write_json(run, tmp_path / "r.json").read_text())
    assert data["schema"] == "gradcheck.results/2" and data["planned"] == run.planned
    assert data["interrupted"] is run.interrupted
    loaded = load(tmp_path / "r.json")
    assert dumps(loaded) == dumps(run)
    assert isinstance(loaded.cases[0].kinks, list) and all(isinstance(k, KinkReport) for k in loaded.cases[0].kinks)
    leaf = next(x for x in loaded.cases[0].leaves if x.float32 is not None)
    assert isinstance(leaf.float32, results.Float32Result) and leaf.float32.best == "tape"


def test_schema_1_results_still_render():
    """A file written before the two-part verdict: ``tie`` on leaves, ``noise`` in tolerances, no float32."""
    old = json.loads(dumps(fx.mixed_run()))
    old["schema"] = "gradcheck.results/1"
    for case in old["cases"]:
        for key in ("float32", "imprecise", "kinks"):
            case.pop(key)
        for t in case["timings"].values():
            t.pop("float64")
        for leaf in case["leaves"]:
            leaf.pop("float32")
            leaf["tie"] = False
            if leaf["tolerance"]:
                leaf["tolerance"]["noise"] = 3e-6
    del old["planned"], old["interrupted"]
    run = run_from_dict(old)
    assert run.planned is None and not run.interrupted
    for render in (reports.render_html, reports.render_junit, reports.render_markdown, reports.render_summary,
                   reports.github_annotations):
        render(run)
    assert reports.render_summary(run).splitlines()[1].endswith("—")  # float32 was not run
    assert run.cases[0].leaves[5].float32 is None and not hasattr(run.cases[0].leaves[5].tolerance, "noise")


@pytest.mark.parametrize("name", sorted(ALL_RUNS))
def test_renderers_agree_on_stored_results(name):
    """``gradcheck report`` re-renders from JSON; the output must not depend on which it got."""
    run = ALL_RUNS[name]()
    again = roundtrip(run)
    assert reports.render_html(again) == reports.render_html(run)
    assert reports.render_junit(again) == reports.render_junit(run)
    assert reports.render_markdown(again) == reports.render_markdown(run)
    assert reports.render_summary(again, color=False) == reports.render_summary(run, color=False)
    assert reports.github_annotations(again) == reports.github_annotations(run)


SCHEMA_DOC = Path(__file__).resolve().parents[1] / "docs" / "results-schema.md"


@pytest.mark.parametrize("cls", [results.RunResult, results.CaseResult, results.LeafResult, results.Timing,
                                 results.Tolerance, results.PairResult, results.RefereeCheck,
                                 results.Float32Result, results.KinkReport])
def test_schema_doc_documents_every_field(cls):
    text = SCHEMA_DOC.read_text(encoding="utf-8")
    assert f"`{results.SCHEMA}`" in text
    heading = {"RunResult": "## RunResult"}.get(cls.__name__, f"### {cls.__name__}")
    if cls.__name__ in ("CaseResult", "LeafResult"):
        heading = f"## {cls.__name__}"
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    nxt = text.find("\n### ", start + len(heading))
    section = text[start: min(x for x in (end, nxt, len(text)) if x > 0)]
    documented = set(re.findall(r"^\| `([a-z0-9_]+)`", section, re.M))
    documented |= {n for row in re.findall(r"^\| (`[a-z0-9_]+`(?:, `[a-z0-9_]+`)+) \|", section, re.M)
                   for n in re.findall(r"`([a-z0-9_]+)`", row)}
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in documented]
    assert missing == [], f"{cls.__name__}: {missing} not in docs/results-schema.md"


def test_dead_helpers_are_gone():
    from gradcheck.reports import _common

    assert not hasattr(_common, "verdict_rank")


# ---------------------------------------------------------------- HTML
VOID = {"meta", "br", "input", "img", "hr", "link", "col", "area", "base", "source", "wbr"}


class _Checker(html.parser.HTMLParser):
    """Balanced tags, and every URL in the page local (the report must work offline)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.problems, self.text, self.scripts = [], [], [], 0
        self.ids = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self.scripts += 1
            if "src" in a:
                self.problems.append(f"external script {a['src']}")
        if tag == "link":
            self.problems.append(f"<link> to {a.get('href')}")
        for key in ("src", "href"):
            url = a.get(key) or ""
            if url and not url.startswith(("#", "data:")):
                self.problems.append(f"non-local {key}={url}")
        if "id" in a:
            self.ids.append(a["id"])
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1] not in ("script", "style"):
            self.text.append(data)


def check_html(text: str) -> _Checker:
    checker = _Checker()
    checker.feed(text)
    checker.close()
    assert checker.problems == []
    assert checker.stack == []
    assert len(checker.ids) == len(set(checker.ids)), "duplicate ids"
    return checker


def page_text(text: str) -> str:
    """The page's visible text, as one line with single spaces."""
    return " ".join("".join(check_html(text).text).split())


def embedded_data(text: str) -> dict:
    m = re.search(r'<script type="application/json" id="gradcheck-data">(.*?)</script>', text, re.S)
    return json.loads(m.group(1), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c} in page data"))


@pytest.mark.parametrize("name", sorted(ALL_RUNS))
def test_html_is_self_contained_and_well_formed(name, tmp_path):
    path = reports.write_html(ALL_RUNS[name](), tmp_path / "report.html")
    text = path.read_text(encoding="utf-8")
    checker = check_html(text)
    assert checker.scripts == 2  # the data block and the inline script
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    if name != "injection":  # whose case names hold an OSC-8 hyperlink to http://x, shown as text
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text
    assert embedded_data(text)["cases"] is not None
    assert "leafs" not in text


def test_html_header_and_case_content():
    run = fx.mixed_run()
    text = reports.render_html(run)
    page = " ".join(check_html(text).text)
    assert "The run hit errors" in page and "3 of 5 cases failed" in page
    assert fx.ENV["command"] in page and "numpy 1.26.4" in page
    assert "Disagreement starts at" in page and "features.3.weight" in page
    assert "blamed: jax" in page
    assert "jax is not installed: pip install 'gradcheck[jax]'" in page  # unavailable backend with its hint
    assert "<pre class='err'>Traceback (most recent call last):" in text  # the full text, in <pre>
    assert f"<p class='errhead'>ValueError: {fx.ERROR_MESSAGE}</p>" in text  # the exception first
    assert "rule: default float64; config: features.3.*" in page
    assert 'class="hist"' in text and "tolerance</text>" in text  # histogram with the 0 = tolerance line
    assert 'class="timings"' in text and "3.60 s" in text and "float64 call: 1.80 s" in text
    assert "⟨g, v⟩" in page and "51.7" in page  # referee checks
    assert "0.03712" in page  # the blamed backend's value at the worst element
    # Tree: features > 3 > weight, the failing branch open, the agreeing classifier closed.
    assert re.search(r"<details class=\"tnode\" open><summary class=\"trow v-disagree\"><span class=\"tname\">"
                     r"features</span>", text)
    assert re.search(r"<details class=\"tnode\"><summary class=\"trow v-agree\"><span class=\"tname\">"
                     r"classifier</span>", text)
    assert "2 leaves</span>" in text and "1 of 7 failing" in text


def test_html_tree_lists_a_layer_before_its_buffers():
    text = reports.render_html(RunResult(env={}, cases=[fx.convnet_case()]))
    tree = text[text.index('<div class="tree">'):text.index("<h3>Time per backend</h3>")]
    order = re.findall(r'data-path="([^"]+)"', tree)
    # The comparison lists the updated buffer first; the tree still shows features.0 before features.1,
    # and features.1's parameters before its running mean.
    assert order[:5] == ["features.0.weight", "features.0.bias", "features.1.weight", "features.1.bias",
                         "features.1.running_mean"]
    assert order[-1] == "input"


def test_html_table_data():
    data = embedded_data(reports.render_html(fx.disagree_run()))
    rows = data["cases"][1]["rows"]
    broken = next(r for r in rows if r["p"] == "features.3.weight")
    assert broken["v"] == "disagree" and broken["b"] == ["jax"] and broken["h"] == 2400.0
    assert broken["anchor"] == "c1-leaf5" and broken["F"] is True
    assert broken["f"] == "ok" and set(broken["e"]) == {"tape", "torch", "jax"} and broken["q"] == pytest.approx(2.25)
    assert data["verdicts"][0] == "error" and "imprecise" in data["f32verdicts"]
    buffer = next(r for r in rows if r["r"] == "buffer")
    assert buffer["F"] is False and buffer["f"] == ""


def test_html_leaf_table_has_float32_columns_and_filter():
    text = reports.render_html(fx.two_part_run())
    table = text[text.index("<div class='leaftable' data-case='1'>"):]
    table = table[:table.index("</table>")]
    keys = re.findall(r"<th data-k='([^']+)'", table)
    assert keys == ["i", "p", "l", "s", "v", "b", "h", "a", "x", "f", "e:tape", "e:torch", "e:jax", "q", "m"]
    assert "<select data-f='float32'><option value=''>all</option><option value='imprecise'>imprecise (1)</option>" \
           "<option value='ok'>ok (8)</option></select>" in table
    row = next(r for r in embedded_data(text)["cases"][1]["rows"] if r["p"] == fx.IMPRECISE_LEAF)
    assert row["f"] == "imprecise" and row["w"] == ["jax"] and row["q"] == pytest.approx(800)
    assert row["F"] is False  # a warning: float64 agrees and the policy is "warn"
    fail = next(r for r in embedded_data(text)["cases"][2]["rows"] if r["p"] == fx.IMPRECISE_LEAF)
    assert fail["F"] is True and fail["v"] == "imprecise"


def _chart(text: str, case: int) -> str:
    body = text[text.index(f"id='case-{case}'"):]
    body = body[:body.index("</details>\n") if "</details>\n" in body else len(body)]
    m = re.search(r'<svg class="f32chart".*?</svg>', body, re.S)
    assert m, f"no precision chart in case {case}"
    return m.group(0)


def test_html_float32_chart():
    run = fx.two_part_run()
    text = reports.render_html(run)
    check_html(text)
    assert text.count('<svg class="f32chart"') == len(run.cases)
    chart = _chart(text, 0)
    lines = re.findall(r'<g class="f32line" data-backend="([^"]+)">', chart)
    assert lines == ["tape", "torch", "jax"]  # one line per backend
    assert chart.count("<polyline points=") == 3 and 'class="f32limit"' in chart
    # every gradient leaf is a point per backend, with its path and number in a tooltip
    assert chart.count("<title>jax · ") == 9 and "<title>jax · features.0.weight: 9e-07 (limit 4.1e-06)</title>" in chart
    # the kink sites: features.2 (no parameters) sits after features.1's leaves; crossed in float32 -> filled
    kinks = re.findall(r'<g class="kink" data-layer="([^"]*)" data-crossed="(\d)"><title>([^<]*)</title>', chart)
    assert [(layer, crossed) for layer, crossed, _ in kinks] == [("features.2", "1"), ("features.4", "0")]
    assert html.unescape(kinks[0][2]).startswith(KINK) and "4096 elements" in kinks[0][2]
    # legible axes and a legend
    for label in ("1e-7", "1e-5", "‖g32 − g64‖ ÷ ‖g64‖ (log scale)", "gradient leaves in forward order",
                  "imprecise limit", "kink crossed in float32 (pinned)", ">features.*<", ">classifier.*<", ">input<"):
        assert label in chart, label
    assert 'aria-label="float32 gradient error against float64, per backend (tape, torch, jax), over 9 leaves' in chart
    # the imprecise point is ringed, in the warning and the failing case alike
    for c in (1, 2):
        ring = _chart(text, c)
        assert ring.count('r="6" fill="none"') == 1 and "— imprecise</title>" in ring
    assert _chart(text, 0).count('r="6" fill="none"') == 0


def test_html_float32_chart_edge_values():
    case = fx.convnet_case()
    leaves = [x for x in case.leaves if x.float32 is not None]
    leaves[0].float32.errors["tape"] = 0.0  # exact: on the bottom edge
    leaves[1].float32.errors["jax"] = math.inf  # not finite: on the top edge
    del leaves[2].float32.errors["torch"]  # not measured: the line breaks there
    text = reports.render_html(RunResult(env={}, cases=[case]))
    check_html(text)
    chart = _chart(text, 0)
    assert "tape · features.0.weight: exact (0)" in chart and "jax · features.0.bias: inf" in chart
    torch = chart[chart.index('data-backend="torch"'):]
    torch = torch[:torch.index("</g>")]
    assert torch.count("<polyline") == 2
    assert reports.html.float32_svg(fx.error_case()) == ""  # no float32 part: no chart


def test_kink_span():
    paths = ["features.0.weight", "features.0.bias", "features.1.weight", "features.3.weight", "fc.bias", "input"]
    assert kink_span(KinkReport(op="relu", layer="features.1"), paths) == (2.0, 2.0)
    assert kink_span(KinkReport(op="relu", layer="features.2"), paths) == (2.5, 2.5)  # between features.1 and .3
    assert kink_span(KinkReport(op="relu", layer="features"), paths) == (0.0, 3.0)
    assert kink_span(KinkReport(op="relu", layer=""), paths) == (0.0, 5.0)
    assert kink_span(KinkReport(op="relu", layer="head.act"), paths) == (0.0, 5.0)  # unknown: the whole model
    assert kink_span(KinkReport(op="relu", layer="x"), []) is None


def test_html_precision_section_and_notices():
    text = reports.render_html(fx.two_part_run())
    page = page_text(text)
    assert KINK in page and IMPRECISE in page
    assert "Imprecise leaves (1) warnings: float64 agrees, the case passes" in page
    assert "Imprecise leaves (1) failures" in page
    assert "float32 warnings (1)" in page and "Failing leaves (1)" in page
    assert "Notices" in page
    # vacuous leaves: apart, not failing, not the case's headroom
    vac = text[text.index("id='case-4'"):]
    assert "2 leaves are vacuous (≈0 on every backend; not failures, not in the headroom)." in vac
    assert "Failing leaves (" not in vac.split("</details>\n")[0]
    header = text[:text.index("<section class='panel'>")]
    assert "conv-bn-vacuous" not in header.split("<h3>Failing leaves and errors</h3>")[-1].split("</table>")[0]
    assert "<b>2</b><span>vacuous leaves (not failures)</span>" in header
    assert "<b>2</b><span>leaves failing</span>" in header  # the imprecise (fail) leaf and the disagreement
    overview = text[text.index("<section class='panel'>"):]
    vac_row = next(r for r in overview.split("<tr") if "conv-bn-vacuous" in r)
    assert "<td class='n'>0.08</td>" in vac_row


def test_html_interrupted_run():
    text = reports.render_html(fx.interrupted_run(39, 200))
    page = page_text(text)
    assert "The run was interrupted" in page and f"{INTERRUPTED}." in page and "161 never ran" in page
    assert "passed" not in page and "All gradients agree" not in page
    assert "<title>gradcheck: interrupted — " in text
    assert "<b>39 of 200</b><span>cases ran</span>" in text
    assert "Nothing was checked" in reports.render_html(RunResult(env={}))


def test_html_escapes_hostile_text():
    text = reports.render_html(fx.hostile_run())
    assert "<script>alert" not in text
    assert "</script><script>" not in text
    assert "<b>Evil</b>" not in text
    page = " ".join(check_html(text).text)
    assert f"{fx.HOSTILE}.weight" in page  # shown as text
    data = embedded_data(text)
    assert data["cases"][0]["rows"][1]["p"] == f"{fx.HOSTILE}.weight"
    assert data["cases"][0]["name"] == f'hostile "case" & {fx.HOSTILE}'
    assert 'data-layer="&lt;script&gt;alert(1)&lt;/script&gt;"' in text


def test_script_json_cannot_close_its_script():
    text = script_json({"s": "</script><!-- \u2028 & >", "x": math.nan, "y": -math.inf})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"s": "</script><!-- \u2028 & >", "x": "nan", "y": "-inf"}


def test_html_nonfinite_numbers():
    run = fx.disagree_run()
    run.cases[1].leaves[5].pairs[1].headroom = math.nan
    run.cases[1].leaves[5].pairs[1].max_rel = math.inf
    text = reports.render_html(run)
    check_html(text)
    row = embedded_data(text)["cases"][1]["rows"][5]
    assert row["h"] == "nan" and row["x"] == "inf"


def test_html_case_without_leaves_and_odd_histograms():
    run = fx.mixed_run()
    run.cases.append(fx.CaseResult(name="crashed", verdict="error", errors={"case": "ValueError: bad shape"}))
    leaf = run.cases[0].leaves[5]
    leaf.histogram = {"edges": [0.0], "counts": [1, 2]}  # malformed: no picture rather than a crash
    leaf.worst = [{"index": [0, 0, 0, 0], "torch": 1.0, "jax": 2.0}]  # flat form: backend -> value
    text = reports.render_html(run)
    check_html(text)
    assert "No leaf was compared for this case." in text
    assert "ValueError: bad shape" in text


def test_every_renderer_says_where_the_disagreement_starts():
    """``CaseResult.origin`` (the per-layer replay) in the terminal, Markdown, JUnit and HTML, in one wording."""
    run = fx.disagree_run()
    origin = ("the disagreement starts in features.3 (Conv2d): its own backward disagrees when replayed alone on "
              "the same inputs and cotangent; op conv2d; blamed: jax")
    lines = reports.render_summary(run).splitlines()
    i = lines.index(f"→ ORIGIN convnet-broken — {origin}")
    assert lines[i - 1].startswith("✗ DISAGREE convnet-broken :: features.3.weight")
    md_case = next(r for r in _rows(reports.render_markdown(run), "Cases") if r[0] == "convnet-broken")
    assert md_case[5] == "features.3.weight · starts in features.3 (vjp, blamed: jax)"
    suite = ET.fromstring(reports.render_junit(run).encode()).findall("testsuite")[1]
    assert origin in suite.find("testcase/system-out").text and origin in suite.find("testcase/failure").text
    assert f"Replayed layer by layer: {origin}." in page_text(reports.render_html(run))


def test_the_tree_marks_the_origin_layer_and_greys_inherited_leaves():
    from gradcheck.reports.tree import tree_html
    from gradcheck.results import LeafResult

    leaves = [LeafResult(path="layer1.conv.weight", role="param", verdict="disagree", blame=["torch"], inherited=True),
              LeafResult(path="layer3.bn.weight", role="param", verdict="disagree", blame=["torch"])]
    html = tree_html(leaves, {}, origin="layer3.bn")
    assert html.count("◆ origin") == 1 and html.index("◆ origin") > html.index(">layer3<")
    assert 'class="trow leaf v-disagree inherited"' in html and html.count(" inherited\"") == 1


@pytest.mark.parametrize("paths, expected", [
    (["layer1.0.conv1.weight", "layer1.0.bn1.weight"], {"layer1": {"0": {"conv1": {}, "bn1": {}}}}),
    (["params/Dense_0/kernel", "params/Dense_0/bias", "batch_stats/BatchNorm_0/mean"],
     {"params": {"Dense_0": {}}, "batch_stats": {"BatchNorm_0": {}}}),
    ([".layers[0].weight", ".layers[1].weight"], {"layers": {"0": {}, "1": {}}}),
    (["['encoder']['w']", "['decoder']['w']"], {"encoder": {}, "decoder": {}}),
])
def test_the_html_tree_follows_each_frameworks_paths(paths, expected):
    from gradcheck.reports.tree import build_tree

    def shape(node):  # the layer nodes only: a leaf's own last segment holds no children
        return {name: shape(child) for name, child in node.children.items() if child.children or not child.leaves}

    leaves = [results.LeafResult(path=p, role="param", layer="", shape=[2], dtype="float64", verdict="agree")
              for p in paths]
    root = build_tree(leaves)
    assert shape(root) == expected
    ends = {leaf.path for node in _walk(root) for leaf in node.leaves}
    assert ends == set(paths)  # every leaf hangs at the end of its own path


def _walk(node):
    yield node
    for child in node.children.values():
        yield from _walk(child)

"""Renderers: terminal summary, Markdown, GitHub annotations, JUnit XML (validated), JSON, HTML."""

from __future__ import annotations

import html.parser
import json
import math
import re
import xml.etree.ElementTree as ET
from importlib import resources

import pytest
import report_fixtures as fx

from gradcheck import reports
from gradcheck.reports.html import script_json
from gradcheck.results import RunResult, dumps, load, run_from_dict


def roundtrip(run: RunResult) -> RunResult:
    """What ``gradcheck report`` sees: the run after JSON serialisation."""
    return run_from_dict(json.loads(dumps(run)))


ALL_RUNS = {
    "agree": fx.agree_run,
    "disagree": fx.disagree_run,
    "mixed": fx.mixed_run,
    "hostile": fx.hostile_run,
    "empty": lambda: RunResult(env=dict(fx.ENV)),
}


# ---------------------------------------------------------------- terminal
def test_summary_all_agree():
    text = reports.render_summary(fx.agree_run(), color=False)
    lines = text.splitlines()
    assert lines[-1].startswith("gradcheck PASS")
    assert "10 of 10 leaves agree" in lines[-1]
    assert "DISAGREE" not in text and "\x1b" not in text
    header = lines[0].split()
    assert header[:5] == ["case", "verdict", "compared", "agree", "headroom"]
    assert "tape 1st / 2nd" in lines[0] and "jax 1st / 2nd" in lines[0]
    convnet = next(ln for ln in lines if ln.startswith("convnet "))
    assert "3.60 s / 150 ms" in convnet  # jax time to first gradient / second call
    assert re.search(r"\b9\s+9\s+0\.08\b", convnet)  # compared, agreeing, worst headroom


def test_summary_names_leaf_numbers_and_blamed_backend():
    text = reports.render_summary(fx.disagree_run(blamed="jax"), color=False)
    leaf_lines = [ln for ln in text.splitlines() if "DISAGREE" in ln]
    assert len(leaf_lines) == 1
    line = leaf_lines[0]
    for part in ("convnet-broken :: features.3.weight", "max rel 0.93", "max abs 0.0241", "headroom 2400",
                 "blamed: jax", "tape and torch agree"):
        assert part in line, (part, line)
    assert text.splitlines()[-1].startswith("gradcheck FAIL")
    assert "blamed: jax ×1" in text.splitlines()[-1]


def test_summary_errors_unavailable_and_color():
    text = reports.render_summary(fx.mixed_run(), color=True)
    assert "\x1b[" in text
    plain = reports.render_summary(fx.mixed_run(), color=False)
    assert "! ERROR gelu-error :: jax — NotImplementedError: op 'erf'" in plain
    assert "UNAVAILABLE relu-two-backends :: jax — jax is not installed" in plain
    assert "STRUCTURAL linear-structural :: bias" in plain and "blamed: torch" in plain
    relu = next(ln for ln in plain.splitlines() if ln.startswith("relu-two-backends"))
    assert relu.rstrip().endswith("n/a")
    gelu = next(ln for ln in plain.splitlines() if ln.startswith("gelu-error"))
    assert gelu.rstrip().endswith("error")


def test_summary_neutralises_control_characters():
    text = reports.render_summary(fx.hostile_run(), color=False)
    assert "\x1b" not in text
    assert fx.HOSTILE in text  # a terminal shows it as text; no escaping needed beyond control characters


def test_summary_caps_leaf_lines():
    text = reports.render_summary(fx.many_failures_run(cases=3, leaves=30), color=False, max_leaf_lines=10)
    assert len([ln for ln in text.splitlines() if "DISAGREE" in ln]) == 10
    assert "… and 80 more" in text


# ---------------------------------------------------------------- markdown
def _cells(row: str) -> list[str]:
    """Split a GFM table row on unescaped pipes."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def test_markdown_tables():
    text = reports.render_markdown(fx.mixed_run())
    assert text.startswith("## ❌ gradcheck:")
    rows = [ln for ln in text.splitlines() if ln.startswith("|")]
    leaf = next(r for r in rows if "features.3.weight" in r and "disagree" in r and "jax" in r)
    assert _cells(leaf) == ["convnet-broken", "features.3.weight", "❌ disagree", "jax", "0.93", "2400"]
    assert "### Cases" in text and "### Failing leaves" in text and "### Errors" in text
    assert "```sh\ngradcheck run convnet" in text


def test_markdown_all_agree_has_no_failure_table():
    text = reports.render_markdown(fx.agree_run())
    assert text.startswith("## ✅ gradcheck: All gradients agree")
    assert "### Failing leaves" not in text


def test_markdown_escapes_html_and_pipes():
    text = reports.render_markdown(fx.hostile_run())
    prose = re.sub(r"```sh\n.*?\n```", "", text, flags=re.S)  # a fenced block shows its text literally
    assert "<script>" not in prose and "<b>" not in prose
    assert "```sh\ngradcheck run '<script>alert(1)</script>'" in text
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


# ---------------------------------------------------------------- github annotations
def test_github_annotations():
    lines = reports.github_annotations(fx.mixed_run())
    errors = [ln for ln in lines if ln.startswith("::error ")]
    assert len(errors) == 4  # disagree, structural, nonfinite, backend error
    assert all(re.match(r"^::error title=[^:,]*::", ln) for ln in errors)
    leaf = next(ln for ln in errors if "features.3.weight" in ln)
    assert "blamed: jax" in leaf and "max rel diff 0.93" in leaf and "headroom 2400" in leaf
    assert any(ln.startswith("::warning ") and "jax is not installed" in ln for ln in lines)
    assert reports.github_annotations(fx.agree_run()) == [ln for ln in reports.github_annotations(fx.agree_run())
                                                          if ln.startswith("::warning")]


def test_github_annotations_escape_and_cap():
    lines = reports.github_annotations(fx.hostile_run())
    assert all("\n" not in ln and "\r" not in ln for ln in lines)
    title = lines[0].split("::")[1]
    assert ":" not in title[len("error title="):] and "," not in title
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
    for part in ("features.3.weight", "max rel diff 0.93", "headroom 2400", "blamed: jax"):
        assert part in failure.get("message")
    assert "[3, 1, 2, 2]: tape 0.01302, torch 0.01302, jax 0.03712" in failure.text
    summary = broken.find("testcase")
    assert "starts at features.3.weight" in summary.find("failure").get("message")
    # Time comes from the timings: 1.2 + 0.05 + 0.72 + 0.03 + 3.6 + 0.15 s.
    assert float(summary.get("time")) == pytest.approx(5.75)
    assert float(broken.get("time")) == pytest.approx(5.75)
    assert broken.get("timestamp") == "2024-05-01T12:00:00+00:00"
    assert "replay: gradcheck run convnet -k convnet-broken" in summary.find("system-out").text

    assert suites["convnet"].get("failures") == "0" and len(suites["convnet"].findall("testcase")) == 1
    error = suites["gelu-error"].find("testcase/error")
    assert "NotImplementedError" in error.get("message") and "Traceback" in error.text
    assert "jax unavailable: jax is not installed" in suites["relu-two-backends"].find("testcase/system-out").text
    structural = suites["linear-structural"]
    assert [c.find("failure").get("type") for c in structural.findall("testcase")] == [
        "structural", "structural", "nonfinite"]


def test_junit_skipped_case_and_hostile_text(xsd):
    run = fx.hostile_run()
    run.cases.append(fx.CaseResult(name="all-skipped", verdict="skipped",
                                   unavailable={"torch": "not installed", "jax": "not installed"}))
    run.cases[0].errors["tape"] = "bad \x00 byte \x1b[31m and \ufffe"
    text = reports.render_junit(run)
    root = ET.fromstring(text.encode())  # parses: illegal XML characters were replaced
    assert xsd.validate(root) == []
    skipped = root.findall("testsuite")[-1].find("testcase/skipped")
    assert "torch: not installed" in skipped.get("message")
    names = [c.get("name") for c in root.iter("testcase")]
    assert f"{fx.HOSTILE}.weight" in names


# ---------------------------------------------------------------- JSON
def test_write_json_roundtrip(tmp_path):
    run = fx.mixed_run()
    run.cases[0].leaves[0].pairs[0].headroom = math.inf
    path = reports.write_json(run, tmp_path / "out" / "results.json")
    loaded = load(path)
    assert loaded.cases[0].leaves[0].pairs[0].headroom == math.inf
    assert dumps(loaded) == dumps(run)


@pytest.mark.parametrize("name", sorted(ALL_RUNS))
def test_renderers_agree_on_stored_results(name):
    """``gradcheck report`` re-renders from JSON; the output must not depend on which it got."""
    run = ALL_RUNS[name]()
    again = roundtrip(run)
    assert reports.render_html(again) == reports.render_html(run)
    assert reports.render_junit(again) == reports.render_junit(run)
    assert reports.render_markdown(again) == reports.render_markdown(run)
    assert reports.render_summary(again, color=False) == reports.render_summary(run, color=False)


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
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text
    assert embedded_data(text)["cases"] is not None


def test_html_header_and_case_content():
    run = fx.mixed_run()
    text = reports.render_html(run)
    page = " ".join(check_html(text).text)
    assert "The run hit errors" in page and "3 of 5 cases failed" in page
    assert fx.ENV["command"] in page and "numpy 1.26.4" in page
    assert "Disagreement starts at" in page and "features.3.weight" in page
    assert "blamed: jax" in page
    assert "jax is not installed: pip install 'gradcheck[jax]'" in page  # unavailable backend with its hint
    assert "<pre class='err'>Traceback (most recent call last):" in text  # errors in <pre>
    assert "rule: default float32; config: features.3.*" in page
    assert 'class="hist"' in text and "tolerance</text>" in text  # histogram with the 0 = tolerance line
    assert 'class="timings"' in text and "3.60 s" in text
    assert "⟨g, v⟩" in page and "51.7" in page  # referee checks
    assert "0.03712" in page  # the blamed backend's value at the worst element
    # Tree: features > 3 > weight, the failing branch open, the agreeing classifier closed.
    assert re.search(r"<details class=\"tnode\" open><summary class=\"trow v-disagree\"><span class=\"tname\">"
                     r"features</span>", text)
    assert re.search(r"<details class=\"tnode\"><summary class=\"trow v-agree\"><span class=\"tname\">"
                     r"classifier</span>", text)


def test_html_table_data():
    data = embedded_data(reports.render_html(fx.disagree_run()))
    rows = data["cases"][1]["rows"]
    broken = next(r for r in rows if r["p"] == "features.3.weight")
    assert broken["v"] == "disagree" and broken["b"] == ["jax"] and broken["h"] == 2400.0
    assert broken["anchor"] == "c1-leaf4"
    assert data["verdicts"][0] == "error" and "disagree" in data["failing"]


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


def test_script_json_cannot_close_its_script():
    text = script_json({"s": "</script><!-- \u2028 & >", "x": math.nan, "y": -math.inf})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"s": "</script><!-- \u2028 & >", "x": "nan", "y": "-inf"}


def test_html_nonfinite_numbers():
    run = fx.disagree_run()
    run.cases[1].leaves[4].pairs[1].headroom = math.nan
    run.cases[1].leaves[4].pairs[1].max_rel = math.inf
    text = reports.render_html(run)
    check_html(text)
    row = embedded_data(text)["cases"][1]["rows"][4]
    assert row["h"] == "nan" and row["x"] == "inf"


def test_html_case_without_leaves_and_odd_histograms():
    run = fx.mixed_run()
    run.cases.append(fx.CaseResult(name="crashed", verdict="error", errors={"case": "ValueError: bad shape"}))
    leaf = run.cases[0].leaves[4]
    leaf.histogram = {"edges": [0.0], "counts": [1, 2]}  # malformed: no picture rather than a crash
    leaf.worst = [{"index": [0, 0, 0, 0], "torch": 1.0, "jax": 2.0}]  # flat form: backend -> value
    text = reports.render_html(run)
    check_html(text)
    assert "No leaf was compared for this case." in text
    assert "ValueError: bad shape" in text

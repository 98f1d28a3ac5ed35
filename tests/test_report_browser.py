"""The HTML report in a real headless Chromium: loads cleanly, sorts, filters, escapes, shows the blamed leaf,
draws the float32 precision chart (one line per backend).

Uses the system's Chromium (``GRADCHECK_CHROMIUM``, else ``chromium`` on PATH),
never a downloaded browser; skips when either Chromium or Playwright is missing.
Set ``GRADCHECK_REPORT_SCREENSHOT=/some/file.png`` to keep a copy of the
disagreement report's screenshot.
"""

from __future__ import annotations

import os
import shutil

import pytest
import report_fixtures as fx

from gradcheck import reports

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

CHROMIUM = os.environ.get("GRADCHECK_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
if not CHROMIUM or not os.path.exists(CHROMIUM):
    pytest.skip("no Chromium found: install it (apt-get install chromium) or set GRADCHECK_CHROMIUM",
                allow_module_level=True)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with sync_api.sync_playwright() as p:
        try:
            context = p.chromium.launch_persistent_context(
                str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
                viewport={"width": 1366, "height": 900})
        except Exception as exc:  # a Chromium that cannot start here (missing libraries) is a skip, not a fail
            pytest.skip(f"Chromium at {CHROMIUM} did not start: {exc}")
        yield context
        context.close()


class Page:
    """A loaded report with everything that must not happen recorded."""

    def __init__(self, context, path):
        self.page = context.new_page()
        self.console_errors, self.dialogs, self.requests = [], [], []
        self.page.on("console", lambda m: self.console_errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda exc: self.console_errors.append(str(exc)))
        self.page.on("dialog", self._dialog)
        self.page.on("request", lambda r: self.requests.append(r.url) if not r.url.startswith(("file:", "data:"))
                     else None)
        self.page.goto(path.as_uri())
        self.page.wait_for_load_state("load")

    def _dialog(self, dialog):
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def table(self, case: int):
        return self.page.locator(f".leaftable[data-case='{case}']")

    def visible_paths(self, case: int) -> list[str]:
        return self.table(case).locator("tbody tr:not([hidden]) td.path").all_inner_texts()

    def assert_clean(self):
        assert self.console_errors == []
        assert self.dialogs == []
        assert self.requests == []


@pytest.fixture
def disagreement(browser, tmp_path):
    path = reports.write_html(fx.mixed_run(), tmp_path / "report.html")
    page = Page(browser, path)
    yield page
    page.page.close()


def test_loads_without_console_errors(disagreement):
    disagreement.assert_clean()
    assert "10 of 10 leaves shown" in disagreement.table(0).locator(".shown").inner_text()


def test_sorting_reorders_rows(disagreement):
    t = disagreement
    forward = t.visible_paths(0)
    assert forward[:2] == ["features.1.running_mean", "features.0.weight"]  # the comparison's order: buffers first
    t.table(0).locator("th[data-k=h] button").click()  # headroom: worst first
    by_headroom = t.visible_paths(0)
    assert by_headroom[0] == "features.3.weight"
    assert by_headroom != forward and sorted(by_headroom) == sorted(forward)
    assert t.table(0).locator("th[data-k=h]").get_attribute("aria-sort") == "descending"
    t.table(0).locator("th[data-k=h] button").click()
    assert t.visible_paths(0)[-2] == "features.3.weight"  # ascending; the skipped leaf (no number) stays last
    t.table(0).locator("th[data-k=p] button").click()
    assert t.visible_paths(0) == sorted(forward)
    t.assert_clean()


def test_filters_hide_agreeing_rows(disagreement):
    t = disagreement
    table = t.table(0)
    table.locator("select[data-f=verdict]").select_option("disagree")
    assert t.visible_paths(0) == ["features.3.weight"]
    assert table.locator("tbody tr[hidden]").count() == 9
    assert "1 of 10 leaves shown" in table.locator(".shown").inner_text()
    table.locator("select[data-f=verdict]").select_option("")
    table.locator("input[data-f=failing]").check()
    assert t.visible_paths(0) == ["features.3.weight"]
    table.locator("input[data-f=failing]").uncheck()
    table.locator("select[data-f=blame]").select_option("jax")
    assert t.visible_paths(0) == ["features.3.weight"]
    table.locator("select[data-f=blame]").select_option("tape")
    assert t.visible_paths(0) == []
    table.locator("select[data-f=blame]").select_option("")
    table.locator("input[data-f=text]").fill("classifier")
    assert t.visible_paths(0) == ["classifier.weight", "classifier.bias"]
    t.assert_clean()


def test_hostile_names_are_text(browser, tmp_path):
    path = reports.write_html(fx.hostile_run(), tmp_path / "hostile.html")
    t = Page(browser, path)
    t.page.wait_for_timeout(200)  # give any injected script a chance to run
    t.assert_clean()
    assert t.page.evaluate("document.querySelectorAll('script').length") == 2
    assert t.page.evaluate("[...document.querySelectorAll('b')].filter(b => b.textContent === 'Evil').length") == 0
    assert f"{fx.HOSTILE}.weight" in t.visible_paths(0)
    body = t.page.locator("body").inner_text()
    assert f"{fx.HOSTILE}.weight" in body
    assert "<script>alert(2)</script>" in body  # the command, shown as text
    t.page.close()


def test_screenshot_shows_blamed_leaf(disagreement, tmp_path):
    t = disagreement
    row = t.table(0).locator("tbody tr", has_text="features.3.weight")
    assert row.is_visible()
    assert row.locator("td.blame").inner_text() == "jax"
    tree_row = t.page.locator("#case-0 .trow.leaf.v-disagree")
    assert tree_row.is_visible() and "blamed: jax" in tree_row.inner_text()
    # The first screen, before any scrolling, must already name the blamed leaf.
    top = t.page.locator("header.top tbody tr", has_text="features.3.weight")
    box = top.bounding_box()
    assert box is not None and box["y"] + box["height"] <= 900
    shot = tmp_path / "disagreement.png"
    t.page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("GRADCHECK_REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
    t.assert_clean()


@pytest.fixture
def two_part(browser, tmp_path):
    path = reports.write_html(fx.two_part_run(), tmp_path / "two-part.html")
    page = Page(browser, path)
    yield page
    page.page.close()


def test_precision_chart_has_one_line_per_backend(two_part, tmp_path):
    t = two_part
    t.assert_clean()
    assert t.page.locator("svg.f32chart").count() == len(fx.two_part_run().cases)
    t.page.locator("#case-0").evaluate("d => d.open = true")  # a passing case starts collapsed
    chart = t.page.locator("#case-0 svg.f32chart")
    assert chart.is_visible()
    box = chart.bounding_box()
    assert box["width"] > 500 and box["height"] > 150
    lines = chart.locator("g.f32line")
    assert lines.count() == 3
    assert [lines.nth(k).get_attribute("data-backend") for k in range(3)] == ["tape", "torch", "jax"]
    for k in range(3):  # each backend's line is drawn, with a point per leaf
        assert lines.nth(k).locator("polyline").first.bounding_box()["width"] > 300
    assert chart.locator("g.f32line[data-backend=jax] title").count() == 9
    kink = chart.locator("g.kink[data-crossed='1']")
    assert kink.count() == 1 and kink.locator("title").text_content().startswith(
        "1 relu input in features.2 is 3.2e-6 from its kink; jax's float32 forward crossed it")
    legend = chart.locator("g.legend text").all_text_contents()
    assert legend == ["tape", "torch", "jax"]
    assert chart.locator("polyline.f32limit").count() == 1
    # the imprecise case's chart rings jax's point on the imprecise leaf
    assert t.page.locator("#case-1 svg.f32chart circle[r='6']").count() == 1
    chart.screenshot(path=str(tmp_path / "chart.png"))
    assert (tmp_path / "chart.png").stat().st_size > 5_000
    t.assert_clean()


def test_float32_columns_sort_and_filter(two_part):
    t = two_part
    table = t.table(1)
    assert table.locator("th[data-k='e:jax']").inner_text().startswith("jax f32 err")
    table.locator("select[data-f=float32]").select_option("imprecise")
    assert t.visible_paths(1) == [fx.IMPRECISE_LEAF]
    table.locator("select[data-f=float32]").select_option("")
    table.locator("th[data-k='e:jax'] button").click()  # largest error first
    assert t.visible_paths(1)[0] == fx.IMPRECISE_LEAF
    assert table.locator("th[data-k='e:jax']").get_attribute("aria-sort") == "descending"
    row = table.locator("tbody tr", has_text=fx.IMPRECISE_LEAF)
    assert "imprecise" in row.inner_text() and "800×" in row.inner_text()
    assert "warn" in (row.get_attribute("class") or "")
    table.locator("th[data-k=q] button").click()
    assert t.visible_paths(1)[0] == fx.IMPRECISE_LEAF
    # "only failing" follows the one rule: the warning is not a failure, the vacuous leaves neither
    table.locator("input[data-f=failing]").check()
    assert t.visible_paths(1) == []
    t.page.locator("#case-4").evaluate("d => d.open = true")
    t.table(4).locator("input[data-f=failing]").check()
    assert t.visible_paths(4) == []
    t.table(2).locator("input[data-f=failing]").check()
    assert t.visible_paths(2) == [fx.IMPRECISE_LEAF]
    t.assert_clean()


def test_interrupted_report_says_so(browser, tmp_path):
    path = reports.write_html(fx.interrupted_run(39, 200), tmp_path / "interrupted.html")
    t = Page(browser, path)
    t.assert_clean()
    banner = t.page.locator("header.top .callout.v-interrupted")
    assert banner.is_visible() and banner.inner_text().startswith("interrupted: 39 of 200 cases ran. 161 never ran.")
    assert "passed" not in t.page.locator("header.top").inner_text()
    t.page.close()


def test_link_opens_collapsed_card(browser, tmp_path):
    run = fx.many_failures_run(cases=1, leaves=10)
    path = reports.write_html(run, tmp_path / "many.html")
    t = Page(browser, path)
    card = t.page.locator("#c0-leaf7")
    assert card.get_attribute("open") is None  # beyond the first few cards, collapsed
    t.page.locator("header.top a", has_text="block7.conv.weight").click()
    # The card opens in the link's click handler: wait for it (a loaded machine runs it later than the click).
    t.page.wait_for_function("() => document.querySelector('#c0-leaf7').open === true", timeout=10_000)
    assert card.get_attribute("open") is not None
    t.assert_clean()
    t.page.close()


def test_report_of_a_real_run_with_a_broken_backend_shows_the_blamed_leaf(browser, tmp_path, monkeypatch):
    """End to end: a deliberately wrong tape VJP -> runner -> HTML -> Chromium -> screenshot."""
    import numpy as np

    import gradcheck.layers as L
    from gradcheck.backends.tape import ops as tape_ops
    from gradcheck.case import Case
    from gradcheck.check.runner import RunOptions, run_case
    from gradcheck.results import RunResult

    def build(rng):
        return L.Chain(L.Conv2d(2, 3, 3, padding=1, rng=rng), L.BatchNorm2d(3), L.Dense(5, 2, rng=rng))

    original = tape_ops._conv.vjps[1]
    monkeypatch.setitem(tape_ops._conv.vjps, 1, lambda *a, **k: np.flip(np.asarray(original(*a, **k)), (-1, -2)))
    pytest.importorskip("torch")
    backends = ("tape", "torch")
    case = Case("conv-bn-dense", build, lambda rng: (rng.standard_normal((2, 2, 5, 5)),))
    result = run_case(case, RunOptions(backends=backends, referee="leaves"))
    assert [(x.path, x.blame) for x in result.leaves if x.verdict == "disagree"] == [("0.weight", ["tape"])]
    path = reports.write_html(RunResult(env={"command": "gradcheck run conv-bn-dense", "seed": 0}, cases=[result]),
                              tmp_path / "broken.html")
    page = Page(browser, path)
    page.assert_clean()
    row = page.table(0).locator("tbody tr", has_text="0.weight").first
    assert row.is_visible()
    assert row.locator("td.path").inner_text() == "0.weight"
    assert row.locator("td.blame").inner_text() == "tape"  # the blame column, not a backend named anywhere
    agreeing = page.table(0).locator("tbody tr", has_text="1.weight").first  # the control: nobody blamed
    assert agreeing.is_visible() and agreeing.locator("td.blame").count() == 0
    shot = tmp_path / "broken.png"
    page.page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    page.page.close()

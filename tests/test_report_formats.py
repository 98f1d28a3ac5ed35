"""Report formats are registry rows: a format registered here alone is written by output and the CLI.

The toy format is a CSV of leaves (case, leaf, verdict), registered from this
file with ``gradcheck.reports.formats.register`` and nothing else: no edit of
gradcheck.  ``gradcheck.app.output`` renders and writes it, ``gradcheck run``
and ``gradcheck report`` grow a ``--csv PATH`` flag for it, and a folder given
as its path is refused with its own example file name.  The negative
controls: an unknown format name is refused with the list of registered ones,
before any report is written, and without the registration ``--csv`` is no
flag at all.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from report_fixtures import disagree_run

import gradcheck.layers as L
from gradcheck import ops, results
from gradcheck.app import output
from gradcheck.app.cli import build_parser, main
from gradcheck.case import Case
from gradcheck.reports import formats

BUILT_IN = ("html", "json", "junit", "markdown")


def render_csv(run) -> str:
    """Every leaf of the run as one CSV row."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["case", "leaf", "verdict"])
    for case in run.cases:
        for leaf in case.leaves:
            writer.writerow([case.name, leaf.path, leaf.verdict])
    return out.getvalue()


def tiny_cases():
    """A target for `gradcheck run tests.test_report_formats:tiny_cases`."""

    def build(rng):
        return L.Chain(L.Dense(3, 2, activation=ops.tanh, rng=rng))

    return [Case("tiny", build, lambda rng: (rng.standard_normal((2, 3)),), seed=1)]


@pytest.fixture
def csv_format():
    fmt = formats.register(formats.Format("csv", ".csv", render_csv, example="leaves.csv",
                                          help="write every leaf as a CSV row here"))
    yield fmt
    formats.unregister("csv")


@pytest.fixture
def in_tmp(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent))  # tests.test_report_formats
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _rows(path):
    return list(csv.reader(Path(path).read_text(encoding="utf-8").splitlines()))


def test_the_built_in_formats_are_rows_and_render_as_before():
    from gradcheck import reports

    assert formats.names() == BUILT_IN == output.FORMATS
    run = disagree_run()
    assert output.render("json", run) == results.dumps(run) + "\n"
    assert output.render("html", run) == reports.render_html(run)
    assert output.render("junit", run) == reports.render_junit(run)
    assert output.render("markdown", run) == reports.render_markdown(run)
    assert {f.name: f.example for f in formats.registered()} == {
        "html": "report.html", "json": "results.json", "junit": "junit.xml", "markdown": "summary.md"}


def test_a_registered_format_is_written_by_output(csv_format, tmp_path):
    run = disagree_run()
    written = output.write_reports(run, {"csv": tmp_path / "leaves.csv", "json": tmp_path / "run.json"})
    assert written == [("csv", tmp_path / "leaves.csv"), ("json", tmp_path / "run.json")]
    rows = _rows(tmp_path / "leaves.csv")
    assert rows[0] == ["case", "leaf", "verdict"]
    assert rows[1:] == [[c.name, leaf.path, leaf.verdict] for c in run.cases for leaf in c.leaves]
    assert "csv" in output.FORMATS


def test_a_registered_format_gets_its_flag_in_gradcheck_run_and_report(csv_format, in_tmp, capsys):
    assert main(["run", "tests.test_report_formats:tiny_cases", "--backends", "tape", "--no-html", "-q",
                 "--csv", "run.csv"]) == 0
    assert "csv: run.csv" in capsys.readouterr().out
    stored = in_tmp / "gradcheck-report" / "results.jsonl"
    run = results.load(stored)
    assert _rows(in_tmp / "run.csv")[1:] == [["tiny", leaf.path, leaf.verdict] for leaf in run.cases[0].leaves]
    assert ["tiny", "0.weight", "agree"] in _rows(in_tmp / "run.csv")
    assert main(["report", str(stored), "--csv", "again.csv"]) == 0
    assert _rows(in_tmp / "again.csv") == _rows(in_tmp / "run.csv")
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "write every leaf as a CSV row here" in capsys.readouterr().out


def test_a_folder_given_for_a_registered_format_suggests_its_example(csv_format, in_tmp, capsys):
    from gradcheck import reports

    reports.write_json(disagree_run(), in_tmp / "run.json")
    (in_tmp / "out").mkdir()
    assert main(["report", "run.json", "--csv", "out"]) == 2
    err = capsys.readouterr().err
    assert "--csv out: is a folder; give the path of a file, e.g. " in err and "leaves.csv" in err, err


def test_an_unknown_format_is_refused_with_the_registered_ones(csv_format, tmp_path):
    run = disagree_run()
    listed = "choose from html, json, junit, markdown, csv"
    with pytest.raises(ValueError, match=f"unknown report format 'tsv'; {listed}"):
        output.render("tsv", run)
    with pytest.raises(ValueError, match=f"unknown report format 'tsv'; {listed}"):
        output.write_reports(run, {"json": tmp_path / "run.json", "tsv": tmp_path / "run.tsv"})
    assert not list(tmp_path.iterdir()), "a report was written before the unknown format was refused"


def test_without_the_registration_there_is_no_flag(in_tmp, capsys):
    assert "csv" not in formats.names()
    with pytest.raises(SystemExit) as exit_:
        main(["report", "results.jsonl", "--csv", "out.csv"])
    assert exit_.value.code == 2 and "unrecognized arguments: --csv" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown report format 'csv'; choose from html, json, junit, markdown"):
        output.render("csv", disagree_run())


@pytest.mark.parametrize("kw, match", [
    (dict(name="CSV"), "report format name 'CSV': use lowercase letters"),
    (dict(name="leaf table"), "report format name 'leaf table'"),
    (dict(suffix="csv"), "suffix='csv' is not a file suffix; give one with its dot"),
    (dict(render="render_csv"), "render='render_csv' names no function"),
    (dict(render=42), "render=42 is not callable"),
])
def test_a_malformed_format_is_refused_with_what_to_give(kw, match):
    with pytest.raises(ValueError, match=match):
        formats.Format(**{**dict(name="csv", suffix=".csv", render=render_csv), **kw})


def test_a_name_taken_twice_or_a_flag_taken_is_refused(csv_format):
    with pytest.raises(ValueError, match="a report format named 'csv' is already registered; unregister"):
        formats.register(formats.Format("csv", ".csv", render_csv))
    with pytest.raises(ValueError, match="no report format named 'tsv'; registered: html, json, junit, markdown, csv"):
        formats.unregister("tsv")
    formats.register(formats.Format("results", ".csv", render_csv))  # --results is gradcheck run's own
    try:
        with pytest.raises(ValueError, match="report format 'results': its flag --results is already an option "
                                             "of gradcheck; register the format under another name"):
            build_parser()
    finally:
        formats.unregister("results")


def test_a_renderer_named_by_module_is_imported_when_first_used(tmp_path):
    fmt = formats.register(formats.Format("leaf-table", ".csv", "test_report_formats:render_csv"))
    try:
        assert fmt.dest == "leaf_table" and fmt.example == "report.csv"
        assert fmt.help == "write the leaf-table report here"
        run = disagree_run()
        assert output.render("leaf-table", run) == render_csv(run)
        args = build_parser().parse_args(["report", "r.jsonl", "--leaf-table", "t.csv"])
        assert args.leaf_table == "t.csv"
    finally:
        formats.unregister("leaf-table")

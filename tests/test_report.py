"""The one-file report: every section, no external URL, log strings escaped, findings adapter,
and (when chromium is installed) charts that really render."""

from __future__ import annotations

import html
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from forensics import report
from forensics.cli import cli
from tests import browser
from tests.throughput_helpers import ABS, basic_store, write

EXTERNAL = re.compile(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", re.IGNORECASE)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of a small hand-built store (its failed request's error is a <script> tag)."""
    base = tmp_path_factory.mktemp("report")
    basic_store(base / "store")
    out = base / "report.html"
    res = CliRunner().invoke(cli, ["report", "rec", "--store", str(base / "store"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines()[-1] == f"report: written to {out}"
    return out


@pytest.fixture(scope="module")
def demo_page(demo: tuple[Path, Any]) -> str:
    """The report the demo writes for its dead-slot run, run-np6."""
    return (demo[0] / "report.html").read_text(encoding="utf-8")


def test_sections_in_reading_order(demo_page: str) -> None:
    """The answer first: verdict, then the timeline, the findings' tables, the throughput, the raw metrics."""
    at = [demo_page.index(f'<h2 id="{anchor}">') for anchor, _ in report.SECTIONS]
    assert at == sorted(at)
    for title in ("Dead slots", "Runaways", "Prompts over the context", "Missing items", "Recommended output cap",
                  "Errors"):
        assert f'<h3 id="{title.lower().replace(" ", "-")}">{title}</h3>' in demo_page
    for chart in ("timeline", "tokens", "busy", "incidents", "throughput", "latency"):
        assert f'<div id="chart-{chart}" class="chart">' in demo_page
    assert demo_page.index('id="chart-timeline"') < demo_page.index('<h2 id="findings">')


def test_the_verdict_comes_first_and_links_to_its_tables(demo_page: str) -> None:
    verdict = demo_page[demo_page.index('<h2 id="verdict">'):demo_page.index('<h2 id="timeline">')]
    text = re.sub(r"<[^>]+>", "", verdict)
    assert "run-np6: Slot 2 of `main-np6` died at 10:50:19 on NVDA/score and never recovered" in text
    assert "a cap of 1024 would have stopped both runaways and touched no normal response" in text
    assert '<a href="#dead-slots">[main-np6.log:75-493, 495-603, 605-749, +1]</a>' in verdict
    assert '<a href="#runaways">[backup.log:7-49, main-np6.log:398-811]</a>' in verdict
    assert 'class="run sick"' in verdict


def test_throughput_pools_only_the_comparable_healthy_runs(demo_page: str) -> None:
    """One run named: its setup (the runs with its build, model and workload), less the runs that measured a broken
    server: the runaways of run-np4 (their garbage tokens are not throughput), the dead slot of run-np6 itself,
    and run-np8 that a watchdog killed."""
    section = demo_page[demo_page.index('<h2 id="throughput">'):demo_page.index('<h2 id="whatif">')]
    assert "<p>Setup: qwen3-30b-a3b-q4_k_m.</p>" in section  # one setup: one table, one fit
    assert "<p>Compared: the runs of its setup: run-np1, run-np2, run-np3, run-np5, run-np7.</p>" in section
    left_out = re.findall(r"<li>(run-np\d+):", section)
    assert left_out == ["run-np4", "run-np6", "run-np8"]
    nps = re.findall(r'<tr><td class="num">(\d+)</td>', section)
    assert nps == ["1", "2", "3", "5", "7"]


def test_tables_wrap_and_long_cells_fold() -> None:
    long = "x" * (report.FOLD_CHARS + 10)
    html_text = report.html_table(pl.DataFrame({"evidence": [long, "short <b>"]}))
    assert html_text.startswith('<div class="scroll"><table>')
    assert f"<details><summary>{'x' * (report.FOLD_CHARS // 2)}…</summary>{long}</details>" in html_text
    assert "<td>short &lt;b&gt;</td>" in html_text
    assert "overflow-wrap: break-word" in report.CSS


def test_report_references_no_external_url(demo_page: str) -> None:
    assert not EXTERNAL.search(demo_page)
    embeds = re.findall(r'vegaEmbed\("#chart-[a-z]+", (.*)\)\.catch', demo_page)
    assert len(embeds) == 8
    assert not any("http" in e for e in embeds)  # the specs carry no $schema URL and no data URL
    assert demo_page.count("window.vegaEmbed=") == 1  # the library inlined once


def test_log_strings_are_escaped(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert "<script>alert(1)" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text  # the failed request's error, as text
    assert "\\u003cscript\\u003ealert(1)" in text  # the same string inside a chart's data


def test_a_section_that_cannot_be_computed_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from forensics import registry
    from forensics.errors import QueryError

    def broken(session: object, runs: list[str]) -> pl.DataFrame:
        raise QueryError("error groups need <events>", hint="ingest the log again")

    monkeypatch.setitem(registry.FINDINGS, "errors", replace(registry.FINDINGS["errors"], detail=broken))
    res = report.write_report(basic_store(tmp_path / "store"), "abs", tmp_path / "r.html")
    text = res.path.read_text(encoding="utf-8")
    assert '<p class="na">error groups need &lt;events&gt; (ingest the log again)</p>' in text
    # the what-if section pools the healthy runs by the findings that break a run, which the error groups are not
    assert res.notes == ["errors: error groups need <events> (ingest the log again)"]
    assert '<h2 id="throughput">' in text and 'id="chart-timeline"' in text  # the rest of the report is there


def test_the_report_shows_the_findings_own_verdicts(tmp_path: Path) -> None:
    """Classes in the charts and the cap line come from the findings themselves: the same counts and the same
    cap as the findings API gives for the run, on a store whose ground truth is known."""
    from fixtures.findings.scenarios import build
    from forensics import findings

    store = build(tmp_path / "s")
    res = report.write_report(store, "one-runaway", tmp_path / "r.html")
    text = res.path.read_text(encoding="utf-8")
    classes = findings.request_classes(store, "one-runaway")
    assert classes.group_by("class").len().sort("class").rows() == [("normal", 19), ("runaway", 1)]
    for chart in ("timeline", "tokens"):
        spec = _chart_spec(text, chart)
        data = (spec.get("data") or spec["layer"][0]["data"])["values"]  # the tokens chart: points, then the cap
        drawn = sorted(Counter(row["class"] for row in data if "class" in row).items())
        assert drawn == [("normal", 19), ("runaway", 1)], chart
    cap = findings.recommend_cap(store, ["one-runaway"]).cap
    assert cap == 512 and f'"cap": {cap}' in text  # drawn as the rule on the tokens chart
    assert res.notes == []  # a run with logs only has no items to miss: nothing that could not be computed


def _chart_spec(page: str, chart: str) -> dict[str, Any]:
    start = page.index(f'vegaEmbed("#chart-{chart}", ') + len(f'vegaEmbed("#chart-{chart}", ')
    spec, _ = json.JSONDecoder().raw_decode(page, start)
    return spec


def test_unknown_run_and_runs_to_name(tmp_path: Path) -> None:
    basic_store(tmp_path / "store")
    args = ["--store", str(tmp_path / "store"), "-o", str(tmp_path / "r.html")]
    res = CliRunner().invoke(cli, ["report", "nope", *args])
    assert res.exit_code == 2
    assert res.stderr == "forensics: error: no run 'nope' in the store (runs: abs, order, rec)\n"
    res = CliRunner().invoke(cli, ["report", *args])
    assert res.exit_code == 2
    assert res.stderr == "forensics: error: name a run: the store has 3 runs (runs: abs, order, rec)\n"
    assert not (tmp_path / "r.html").exists()


def test_a_store_with_one_run_needs_no_name(tmp_path: Path) -> None:
    write(tmp_path / "store", {"requests": ABS})
    res = CliRunner().invoke(cli, ["report", "--store", str(tmp_path / "store"), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    assert "<h1>Run abs</h1>" in (tmp_path / "r.html").read_text(encoding="utf-8")


def test_a_sweep_report_compares_the_runs_named(demo: tuple[Path, Any], tmp_path: Path) -> None:
    out = tmp_path / "sweep.html"
    res = CliRunner().invoke(cli, ["report", "run-np1", "run-np2", "run-np4", "--store", str(demo[0] / "store"),
                                   "-o", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text(encoding="utf-8")
    assert "<h1>Runs run-np1, run-np2, run-np4</h1>" in text
    assert "<p>Compared: the runs named: run-np1, run-np2.</p>" in text  # run-np4's runaways: left out
    assert "<li>run-np4: 2 outputs ran far longer than normal" in text
    verdict = re.sub(r"<[^>]+>", "", text[text.index('<h2 id="verdict">'):text.index('<h2 id="timeline">')])
    assert [ln.split(":")[0] for ln in verdict.splitlines() if ln.startswith("run-")] == \
        ["run-np1", "run-np2", "run-np4"]


# CI sets FORENSICS_REQUIRE_CHROMIUM=1: there a missing browser fails these tests instead of skipping them.
needs_chromium = pytest.mark.skipif(browser.CHROMIUM is None and not os.environ.get("FORENSICS_REQUIRE_CHROMIUM"),
                                    reason="chromium is not installed")
CHARTS = ("chart-timeline", "chart-tokens", "chart-busy", "chart-incidents", "chart-throughput", "chart-latency",
          "chart-recommend", "chart-whatif")


def _blank_charts(report_path: Path, folder: Path) -> tuple[list[str], str]:
    """Render the report, screenshot the whole page, and name the charts with (almost) nothing drawn."""
    probed = browser.probed_copy(report_path, folder)
    dom, boxes, height = browser.layout(probed, folder)
    png = browser.screenshot(probed, folder / "page.png", height, folder)
    from PIL import Image

    with Image.open(png) as im:
        assert im.size == (browser.WIDTH, height)
    assert [b.id for b in boxes] == list(CHARTS)
    blank = []
    for box in boxes:
        inked, colours = browser.ink(png, box)
        if box.w < 300 or box.h < 100 or inked < 0.02 or colours < 8:
            blank.append(box.id)
    return blank, dom


@needs_chromium
def test_report_renders_in_headless_chromium(demo: tuple[Path, Any], tmp_path: Path) -> None:
    """Every chart of the demo's report is drawn: on the screenshot its box has ink and colours, and the
    first screen (the verdict) is not blank."""
    blank, dom = _blank_charts(demo[0] / "report.html", tmp_path)
    assert blank == []
    assert 'class="chart">chart failed' not in dom
    first = browser.Box("first-screen", 0, 0, browser.WIDTH, 800)
    inked, _ = browser.ink(tmp_path / "page.png", first)
    assert inked > 0.03


@needs_chromium
def test_the_screenshot_check_catches_a_broken_chart(demo: tuple[Path, Any], tmp_path: Path) -> None:
    """The same check fails when a chart cannot be drawn (its spec names a mark Vega-Lite does not know)."""
    page = (demo[0] / "report.html").read_text(encoding="utf-8")
    head, tail = page.split('vegaEmbed("#chart-busy", ', 1)
    broken = tmp_path / "broken.html"
    spec = tail.replace('"mark": {"type": "', '"mark": {"type": "nope', 1)
    assert spec != tail
    broken.write_text(head + 'vegaEmbed("#chart-busy", ' + spec, encoding="utf-8")
    blank, dom = _blank_charts(broken, tmp_path)
    assert blank == ["chart-busy"]
    assert 'id="chart-busy" class="chart">chart failed: ' in dom


def test_the_incidents_section_lists_what_the_command_lists(demo: tuple[Path, Any], demo_page: str) -> None:
    """One truth: the report's incidents are `forensics incidents run-np6`'s rows, and its first line says so."""
    store = demo[0] / "store"
    res = CliRunner().invoke(cli, ["incidents", "run-np6", "--store", str(store), "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert rows and any(r["kind"] == "dead_slot" for r in rows)
    section = demo_page[demo_page.index('<h2 id="incidents">'):demo_page.index('<h2 id="throughput">')]
    assert section.count("<tr><td") == len(rows)
    assert f"<p>{html.escape(res.stderr.strip())}</p>" in section

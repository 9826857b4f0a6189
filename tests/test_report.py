"""The one-file report: every section, no external URL, log strings escaped, findings adapter,
and (when chromium is installed) charts that really render."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from forensics import report
from forensics.cli import cli
from tests.throughput_helpers import basic_store

EXTERNAL = re.compile(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", re.IGNORECASE)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("report")
    basic_store(base / "store")
    out = base / "report.html"
    res = CliRunner().invoke(cli, ["report", "rec", "--store", str(base / "store"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines()[-1] == f"report: written to {out}"
    return out


def test_report_has_every_section(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for anchor in ("summary", "findings", "throughput", "charts"):
        assert f'<h2 id="{anchor}">' in text
    for title in ("Dead slots", "Runaways", "Prompts over the context", "Missing items", "Recommended output cap",
                  "Failed requests"):
        assert f"<h3>{title}</h3>" in text
    for chart in ("timeline", "busy", "tokens", "throughput", "latency"):
        assert f'<div id="chart-{chart}" class="chart">' in text


def test_report_references_no_external_url(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert not EXTERNAL.search(text)
    embeds = re.findall(r'vegaEmbed\("#chart-[a-z]+", (.*)\)\.catch', text)
    assert len(embeds) == 5
    assert not any("http" in e for e in embeds)  # the specs carry no $schema URL and no data URL
    assert text.count("window.vegaEmbed=") == 1  # the library inlined once


def test_log_strings_are_escaped(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert "<script>alert(1)" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text  # the failed request's error, as text
    assert "\\u003cscript\\u003ealert(1)" in text  # the same string inside a chart's data


def test_a_section_that_cannot_be_computed_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from forensics import findings
    from forensics.errors import QueryError

    def broken(store: object, run: str) -> pl.DataFrame:
        raise QueryError("error groups need <events>", hint="ingest the log again")

    monkeypatch.setattr(findings, "error_groups", broken)
    res = report.write_report(basic_store(tmp_path / "store"), "abs", tmp_path / "r.html")
    text = res.path.read_text(encoding="utf-8")
    assert '<p class="na">error groups need &lt;events&gt; (ingest the log again)</p>' in text
    assert res.notes == ["error groups: error groups need <events> (ingest the log again)"]
    assert '<h2 id="charts">' in text  # the rest of the report is there


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
    assert "<td>runaway</td><td class=\"num\">1</td>" in text and "<td>normal</td><td class=\"num\">19</td>" in text
    cap = findings.recommend_cap(store, ["one-runaway"]).cap
    assert cap == 512 and f'"cap": {cap}' in text  # drawn as the rule on the tokens chart
    assert res.notes == ["missing items: no replay run 'one-runaway' (known runs: overflow)"]  # logs, no records


def test_unknown_run(tmp_path: Path) -> None:
    basic_store(tmp_path / "store")
    res = CliRunner().invoke(cli, ["report", "nope", "--store", str(tmp_path / "store"), "-o",
                                   str(tmp_path / "r.html")])
    assert res.exit_code == 2 and "forensics: error: no run 'nope'" in res.stderr


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_report_renders_charts_in_headless_chromium(page: Path, tmp_path: Path) -> None:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000", "--dump-dom",
           page.resolve().as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=True).stdout
    for chart in ("timeline", "busy", "tokens", "throughput", "latency"):
        m = re.search(rf'<div id="chart-{chart}" class="chart[^"]*"[^>]*>\s*<(svg|canvas)', dom)
        assert m, f"chart {chart} was not drawn"
    assert "chart failed: " + "Error" not in dom

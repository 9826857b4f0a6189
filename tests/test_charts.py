"""Every chart kind renders to offline HTML, PNG and SVG; request classes follow the simple rules."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from forensics import charts, metrics
from forensics.cli import cli
from forensics.store import Store
from tests.throughput_helpers import basic_store, sweep_store

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("charts")
    basic_store(base / "basic")
    sweep_store(base / "sweep", [(1, 10.0, 100), (2, 11.0, 100), (4, 13.0, 100)])
    return base / "basic", base / "sweep"


@pytest.mark.parametrize("kind", charts.KINDS)
def test_every_kind_renders_html_and_png(kind: str, stores: tuple[Path, Path], tmp_path: Path) -> None:
    store_dir = stores[1] if kind in {"throughput", "latency"} else stores[0]
    runner = CliRunner()
    for ext in ("html", "png"):
        out = tmp_path / f"{kind}.{ext}"
        res = runner.invoke(cli, ["chart", kind, "--store", str(store_dir), "-o", str(out)])
        assert res.exit_code == 0, res.output
        assert res.stderr == f"chart: {kind} written to {out}\n"
    page = (tmp_path / f"{kind}.html").read_text(encoding="utf-8")
    assert "vegaEmbed(" in page and "window.vegaEmbed=" in page  # the library is inline
    assert not re.search(r"""(src|href)\s*=\s*["']?https?://""", page)
    assert (tmp_path / f"{kind}.png").read_bytes()[:8] == PNG_MAGIC
    assert (tmp_path / f"{kind}.png").stat().st_size > 5000  # not an empty canvas


def test_svg_and_spec_and_bad_extension(stores: tuple[Path, Path], tmp_path: Path) -> None:
    c = charts.build(pl_store(stores[0]), "timeline", ["abs"])
    svg = charts.save(c, tmp_path / "t.svg").read_text(encoding="utf-8")
    assert svg.startswith("<svg") and "abs server slot 1" in svg
    assert '"mark"' in charts.save(c, tmp_path / "t.json").read_text(encoding="utf-8")
    res = CliRunner().invoke(cli, ["chart", "busy", "--store", str(stores[0]), "-o", str(tmp_path / "x.gif")])
    assert res.exit_code != 0
    assert res.exit_code == 2 and "cannot write a chart as .gif" in res.stderr


def pl_store(path: Path) -> Store:
    return Store(path)


def test_script_json_cannot_close_the_script() -> None:
    text = charts.script_json({"item": "</script><script>alert(1)</script>"})
    assert "</script" not in text and "<" not in text
    assert text == '{"item": "\\u003c/script\\u003e\\u003cscript\\u003ealert(1)\\u003c/script\\u003e"}'


def test_request_classes_come_from_the_findings_only(tmp_path: Path) -> None:
    """The charts' classes are the findings' verdicts (scenario ground truth), never a rule of their own."""
    from fixtures.findings.scenarios import build
    from forensics import findings

    store = build(tmp_path / "s")
    cls = findings.request_classes(store, ["dead", "one-runaway", "healthy"])
    got = {(r["run"], r["slot"], r["task"]): r["class"] for r in cls.iter_rows(named=True) if r["class"] != "normal"}
    dead = findings.dead_slot_report(store, "dead")
    gone = dead.sequence.filter(pl.col("abnormal") & (pl.col("seq") >= dead.slots["seq"][0]))
    runaway = findings.find_runaways(store, "one-runaway")
    assert got == {**{("dead", 1, t): "dead slot" for t in gone["task"]},
                   **{("one-runaway", 0, t): "runaway" for t in runaway["task"]}}
    assert dead.slots.select("slot", "seq").rows() == [(1, 5)]  # the scenario's ground truth
    assert runaway.select("slot", "seq").rows() == [(0, 4)]
    ri = metrics.with_classes(metrics.request_intervals(store, ["dead"]), cls)
    assert ri.filter(pl.col("class") == "dead slot").height == gone.height


def test_busy_over_time_steps(store_dir: Path) -> None:
    ri = metrics.request_intervals(basic_store(store_dir), ["abs"])
    b = metrics.busy_over_time(ri)
    assert isinstance(b, pl.DataFrame)
    # slot 0: 0-10 then 10-16, slot 1: 2-8 then 8-20: each slot busy without a break, so no step at 8 or 10
    assert b.select("t_s", "busy").rows() == [(0.0, 1), (2.0, 2), (16.0, 1), (20.0, 0)]


def test_busy_slots_do_not_drop_between_requests_of_a_slot() -> None:
    """The server hands a slot from one request to the next within a fraction of a second: that is not the
    slot going idle.  A longer pause is, and the line drops there."""
    ri = pl.DataFrame({"run": ["r"] * 4, "instance": ["s"] * 4, "slot": [0, 0, 0, 1],
                       "start_s": [0.0, 10.4, 15.0, 1.0], "end_s": [10.0, 12.0, 18.0, 17.0]})
    rows = metrics.busy_over_time(ri).select("t_s", "busy").rows()
    # slot 0: 0-12 (0.4 s hand-over joined), idle 12-15 (3 s: a real pause), 15-18; slot 1: 1-17
    assert rows == [(0.0, 1), (1.0, 2), (12.0, 1), (15.0, 2), (17.0, 1), (18.0, 0)]

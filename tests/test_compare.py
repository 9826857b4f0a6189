"""``forensics compare``: two runs side by side, every number from the one place that defines it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from forensics import compare, metrics
from forensics.cli import cli
from forensics.store import Store
from tests.throughput_helpers import sweep_store


def test_two_runs_by_hand(store_dir: Path) -> None:
    """np1: one slot, two 2 s requests of 100 tokens (4 s, 50 tok/s); np2: two slots, two 3 s requests each
    (6 s, 400 tokens, 66.7 tok/s)."""
    store = sweep_store(store_dir, [(1, 2.0, 100), (2, 3.0, 100)])
    cmp = compare.compare(store, "np1", "np2")
    rows = {r["metric"]: r for r in cmp.table.iter_rows(named=True)}
    assert (rows["parallel slots (np)"]["np1"], rows["parallel slots (np)"]["np2"]) == (1.0, 2.0)
    tput = rows["throughput (generated tokens/s)"]
    assert tput["np1"] == pytest.approx(50.0) and tput["np2"] == pytest.approx(400 / 6)
    assert tput["change_pct"] == pytest.approx(100 * (400 / 6 - 50) / 50) and tput["better"] == "np2"
    p50 = rows["latency p50 (s)"]
    assert (p50["np1"], p50["np2"], p50["change"], p50["better"]) == (2.0, 3.0, 1.0, "np1")
    assert rows["dead slots"]["np1"] == rows["dead slots"]["np2"] == 0.0 and rows["dead slots"]["better"] == ""
    assert cmp.items.height == 0
    assert cmp.sentences == [
        "np1 → np2: np 1 → 2 (+100%), 2 → 4 (+100%) requests.",
        "Throughput 50 tok/s → 66.67 tok/s (+33%); wall time 4 s → 6 s (+50%).",
        "Latency p50 2 s → 3 s (+50%), p95 2 s → 3 s (+50%).",
    ]


def test_the_numbers_are_the_metrics_and_findings_own(demo: tuple[Path, Any]) -> None:
    store = Store(demo[0] / "store")
    cmp = compare.compare(store, "run-np4", "run-np6")
    m = {r["run"]: r for r in metrics.throughput(store, ["run-np4", "run-np6"]).iter_rows(named=True)}
    rows = {r["metric"]: r for r in cmp.table.iter_rows(named=True)}
    for col, label, _ in compare.METRICS:
        assert rows[label]["run-np4"] == pytest.approx(m["run-np4"][col]), label
        assert rows[label]["run-np6"] == pytest.approx(m["run-np6"][col]), label
    assert (rows["dead slots"]["run-np4"], rows["dead slots"]["run-np6"]) == (0.0, 1.0)
    assert (rows["prompts over the context"]["run-np4"], rows["prompts over the context"]["run-np6"]) == (2.0, 0.0)
    # V and CRM failed in extract, so their score stage is missing too (an item whose last stage reached did not
    # end ok is missing in every later stage)
    assert cmp.items.rows() == [("META", "score", "run-np4"), ("V", "extract", "run-np4"), ("V", "score", "run-np4"),
                                ("CRM", "extract", "run-np6"), ("CRM", "score", "run-np6")]


def test_compare_cli(demo: tuple[Path, Any], tmp_path: Path) -> None:
    store = str(demo[0] / "store")
    chart = tmp_path / "cmp.json"
    res = CliRunner().invoke(cli, ["compare", "run-np4", "run-np6", "--store", store, "-o", str(chart)])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0].split() == ["metric", "run-np4", "run-np6", "change", "change_pct", "better"]
    assert "# items missing" in res.stdout
    assert res.stderr.splitlines() == [
        "run-np4 → run-np6: np 4 → 6 (+50%), 49 → 96 (+96%) requests.",
        # every token the servers generated counts, the runaways' too (the client gave up on them): run-np4's
        # (77.65 - 46.25) x 270.2 s = 8,484 = 3,026 + 5,458, run-np6's 7,812 = 2,135 + 5,677
        "Throughput 77.65 tok/s → 97.94 tok/s (+26%), 46.25 tok/s → 72.76 tok/s (+57%) from normal requests; "
        "wall time 270.2 s → 344.8 s (+28%).",
        "Latency p50 10.80 s → 13.90 s (+29%), p95 22.75 s → 43.92 s (+93%).",
        "Findings: dead slots 0 → 1, runaways 2 → 2, prompts over the context 2 → 0, failovers 0 → 1.",
        "Items missing only in run-np4: META, V; only in run-np6: CRM.",
        f"compare: chart written to {chart}",
    ]
    import json

    spec = json.loads(chart.read_text())
    assert [c["title"] for c in spec["hconcat"]] == ["Latency", "Throughput"]
    res = CliRunner().invoke(cli, ["compare", "run-np4", "nope", "--store", store])
    assert res.exit_code == 2 and res.stderr.startswith("forensics: error: no run 'nope' in the store (runs: run-np1")
    res = CliRunner().invoke(cli, ["compare", "run-np4", "run-np4", "--store", store])
    assert res.exit_code == 2
    assert res.stderr == "forensics: error: compare needs two different runs, got 'run-np4' twice (name two runs)\n"


def test_the_compare_chart_draws(demo: tuple[Path, Any], tmp_path: Path) -> None:
    import numpy as np
    from PIL import Image

    from forensics import charts

    cmp = compare.compare(Store(demo[0] / "store"), "run-np4", "run-np6")
    png = charts.save(charts.compare_chart(cmp), tmp_path / "cmp.png")
    with Image.open(png) as im:
        px = np.asarray(im.convert("RGB"))
    assert px.shape[1] > 800 and px.shape[0] > 500
    assert (px.astype(int).sum(axis=2) < 3 * 245).mean() > 0.05  # bars, axes and text: not a blank image
    assert len(np.unique(px.reshape(-1, 3), axis=0)) > 20

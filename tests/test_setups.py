"""One rule of which runs are comparable (forensics.setups), on real run folders of three builds: runs group by
setup, a comparison gives one answer per setup, and a broken run is left out with its verdict's words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.analyse import ingest_and_analyse
from forensics.cli import cli
from forensics.ingest import IngestOptions
from forensics.setups import groups
from forensics.store import Store
from forensics.sweep import throughput_fits
from tests.conftest import ROOT

RUNS = ROOT / "fixtures" / "server-runs"
FOLDERS = ("b11312-sweep-np1", "b11312-sweep-np2", "b11312-sweep-np4", "b11312-sweep-np8", "b11312-runaway",
           "b11312-runaway-capped", "b4747-healthy", "b3605-healthy")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    root = tmp_path_factory.mktemp("setups") / "store"
    ingest_and_analyse(root, [RUNS / f for f in FOLDERS], IngestOptions(keep_going=True))
    return Store(root)


def test_every_run_groups_by_its_setup(store: Store) -> None:
    """Three builds never pool; the b11312 runs capped otherwise by their harness are a setup of their own; the
    runaway run is left out of its setup with its verdict's sentence."""
    found = {g.label: g for g in groups(store)}
    sweep = found["b11312 · tiny-llama-spm · caps analyze=64,extract=192"]
    assert sweep.runs == ["b11312-sweep-np1", "b11312-sweep-np2", "b11312-sweep-np4", "b11312-sweep-np8"]
    assert list(sweep.left_out) == ["b11312-runaway"]
    assert sweep.left_out["b11312-runaway"].startswith("4 outputs ran to the context")
    assert found["b11312 · tiny-llama-spm · caps analyze=64,extract=128"].runs == ["b11312-runaway-capped"]
    assert found["b4747 · tiny-llama-spm · -c 2048 · caps analyze=64,extract=192"].runs == ["b4747-healthy"]
    assert found["b3605 · tiny-random-llama-spm · -c 2048 · caps analyze=64,extract=192"].runs == ["b3605-healthy"]
    assert sum(len(g.runs) + len(g.left_out) for g in found.values()) == len(FOLDERS)


def test_one_run_named_is_its_setup_and_several_named_keep_their_setups(store: Store) -> None:
    (mine,) = groups(store, ["b11312-sweep-np2"])
    assert mine.runs == ["b11312-sweep-np1", "b11312-sweep-np2", "b11312-sweep-np4", "b11312-sweep-np8"]
    assert mine.basis == "the runs of its setup"
    two = groups(store, ["b4747-healthy", "b11312-sweep-np4", "b11312-sweep-np8"])
    assert [g.runs for g in two] == [["b11312-sweep-np4", "b11312-sweep-np8"], ["b4747-healthy"]]


def test_throughput_by_np_is_one_fit_per_setup_never_a_pool(store: Store) -> None:
    fits = throughput_fits(store)
    sweep = fits[0]
    assert sweep.scaling is not None
    assert sweep.scaling.table["np"].to_list() == [1, 2, 4, 8]
    assert sweep.scaling.table["runs"].to_list() == [1, 1, 1, 1]
    # each row is that run's own measurement: nothing of another build is averaged in
    own = {r["run"]: r["gen_tok_per_s"] for r in sweep.metrics.iter_rows(named=True)}
    assert sweep.scaling.table.filter(sweep.scaling.table["np"] == 4)["gen_tok_per_s"][0] == \
        pytest.approx(own["b11312-sweep-np4"])


def test_the_command_shows_the_setup_on_every_row(store: Store) -> None:
    res = CliRunner().invoke(cli, ["--store", str(store.root), "throughput", "--by", "np", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert list(rows[0])[:3] == ["setup", "np", "runs"]
    sweep = [r["np"] for r in rows if r["setup"] == "b11312 · tiny-llama-spm · caps analyze=64,extract=192"]
    assert sweep == [1, 2, 4, 8]
    assert len(rows) == 4 + 3  # the sweep's four np, and one row for each other setup
    assert "note: left out b11312-runaway (it measures a broken server)" in res.stderr


def test_two_stores_are_two_hosts(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        ingest_and_analyse(root, [RUNS / "b11312-sweep-np1", RUNS / "b11312-sweep-np4"], IngestOptions())
    res = CliRunner().invoke(cli, ["--store", f"sA={a}", "--store", f"sB={b}", "throughput", "--by", "np",
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert sorted({r["setup"].split(" · ")[0] for r in rows}) == ["sA", "sB"]
    assert [(r["np"], r["runs"]) for r in rows] == [(1, 1), (4, 1), (1, 1), (4, 1)]  # never the two averaged

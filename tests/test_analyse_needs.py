"""Which runs need deriving: every commit marks the runs it changes stale (a new run too), so a store whose analysis
is current and has no stale run needs nothing, and one that does names exactly those runs; the analysis of another
version needs every run again."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from forensics import analyse, derived, schema
from forensics.analyse import ingest_and_analyse
from forensics.ingest import IngestOptions, ingest
from forensics.session import read_derived
from forensics.store import MANIFEST, Store
from tests.test_store_safety import write_log


def test_needs_names_the_runs_a_commit_changed_and_nothing_once_derived(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    for run in ("a", "b"):
        write_log(tmp_path / f"{run}.log", 6)
    ingest_and_analyse(store_dir, [tmp_path / "a.log"], IngestOptions(run="a"))
    assert analyse.needs(Store(store_dir)) == []
    assert derived.state(Store(store_dir)).stale == frozenset()

    ingest(store_dir, [tmp_path / "b.log"], IngestOptions(run="b"))  # read, not derived yet
    assert analyse.needs(Store(store_dir)) == ["b"]
    write_log(tmp_path / "a.log", 8)  # a grew: its rows change, its analysis is out of date
    ingest(store_dir, [tmp_path / "a.log"], IngestOptions(run="a"))
    assert analyse.needs(Store(store_dir)) == ["a", "b"]

    store = Store(store_dir)
    with store.lock():
        assert analyse.analyse(store).runs == ["a", "b"]
    assert analyse.needs(Store(store_dir)) == []

    manifest = json.loads((store_dir / MANIFEST).read_text())
    manifest["derived"]["version"] -= 1  # derived by another version of the analysis
    for b in manifest["derived"]["batches"]:
        b["version"] -= 1
    (store_dir / MANIFEST).write_text(json.dumps(manifest))
    assert analyse.needs(Store(store_dir)) == ["a", "b"]


def test_an_analysis_in_many_chunks_stores_what_one_chunk_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs are derived a chunk at a time (memory stays flat); the stored rows do not depend on the chunks."""
    logs = []
    for run in ("a", "b", "c"):
        write_log(tmp_path / f"{run}.log", 6)
        logs.append(tmp_path / f"{run}.log")
    tables = {}
    for name, per_chunk in (("one", 1_000), ("many", 1)):
        monkeypatch.setattr(analyse, "CHUNK_RUNS", per_chunk)
        store_dir = tmp_path / name
        for log in logs:
            ingest(store_dir, [log], IngestOptions(run=log.stem))
        store = Store(store_dir)
        with store.lock():
            done = analyse.analyse(store)
        assert (done.runs, done.batches) == (["a", "b", "c"], 1 if per_chunk > 1 else 3)
        tables[name] = {t: read_derived(Store(store_dir), t, ["a", "b", "c"]).sort(pl.all()) for t in schema.DERIVED}
    for t in schema.DERIVED:
        assert tables["one"][t].equals(tables["many"][t]), t

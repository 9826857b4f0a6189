"""`runs` and `missing` read what the ingest's join stored (the ``matches`` table, ``requests.replay_run``)
instead of joining again: the answers are the same as a join computed now, on every replay fixture folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from forensics.ingest import IngestOptions, ingest
from forensics.replay import tables as replay_tables
from forensics.runs import all_runs
from forensics.store import Store

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = [("multistage", None), ("two-instance", None), ("newharness", "bench.toml"), ("foreign", "harness.toml")]


def both_ways(store: Store) -> list[tuple[str, pl.DataFrame, pl.DataFrame]]:
    """(what, stored answer, answer of a join computed now) for `runs` and `missing` of every run."""
    assert store.meta("join_stored") is True and not store.meta("join_pending")
    stored = [("runs", replay_tables.runs_table(store))]
    record_runs = [r for r in stored[0][1]["run"].to_list() if r in all_runs(store)]
    stored += [(f"missing {r}", replay_tables.missing(store, r)) for r in record_runs]
    store._manifest["meta"]["join_stored"] = False  # as a store written before the join was stored
    live = [replay_tables.runs_table(store)] + [replay_tables.missing(store, r) for r in record_runs]
    return [(what, s, lv) for (what, s), lv in zip(stored, live, strict=True)]


@pytest.mark.parametrize(("folder", "mapping"), FOLDERS)
def test_stored_join_answers_as_a_join_computed_now(folder: str, mapping: str | None, tmp_path: Path) -> None:
    src = ROOT / "fixtures" / "replay" / folder
    logs = tmp_path / folder
    shutil.copytree(src, logs)
    store_dir = tmp_path / "store"
    ingest(store_dir, [logs], IngestOptions(keep_going=True, mapping=logs / mapping if mapping else None))
    answers = both_ways(Store(store_dir))
    assert answers[0][1].height > 0
    for what, stored, live in answers:
        assert stored.equals(live), what


def test_stored_join_on_the_demo(demo: tuple[Path, object], tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    shutil.copytree(demo[0] / "store", store_dir)
    answers = both_ways(Store(store_dir))
    assert len(answers) > 5 and any(s.height for what, s, _ in answers if what.startswith("missing"))
    for what, stored, live in answers:
        assert stored.equals(live), what

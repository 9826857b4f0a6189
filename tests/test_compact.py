"""Compaction: packs hold the same rows as the part files they replace, every command answers the same, later
ingests (grown, changed files) drop packed parts correctly, a crash at any step leaves the store before or after."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

import forensics.compact as compact_mod
import forensics.store as store_mod
from forensics import schema
from forensics.check import check_store
from forensics.cli import cli
from forensics.compact import compact, own_files
from forensics.ingest import ingest
from forensics.runs import all_runs
from forensics.store import PACKS_DIR, Store, fetch_pl, view_names
from tests.test_store_safety import Crash, _crash_at, write_log

COMMANDS = [["verdict"], ["runs"], ["deadslots"], ["runaways"], ["cap"], ["throughput"], ["errors"],
            ["smoke"], ["missing", "--format", "csv", "run-np2"]]


def tables(store_dir: Path) -> dict[str, pl.DataFrame]:
    """Every table as the store's views give it (one connection for all), rows in one canonical order (part
    names differ only in where rows sit)."""
    store = Store(store_dir)
    con = store.connect()
    have = view_names(con)
    out = {}
    try:
        for name in schema.TABLES:
            df = fetch_pl(con, f"SELECT * FROM {name}") if name in have else schema.empty(name)
            df = (schema.conform(df, name) if name != "events" else df).drop("ingested_at", strict=False)
            keys = [c for c in df.columns if not isinstance(df[c].dtype, (pl.List, pl.Struct, pl.Object))]
            out[name] = df.sort(keys, nulls_last=True) if df.height else df
    finally:
        con.close()
    return out


def assert_same_tables(a: dict[str, pl.DataFrame], b: dict[str, pl.DataFrame]) -> None:
    for name in schema.TABLES:
        assert a[name].height == b[name].height, name
        assert a[name].equals(b[name]), name


def answers(store_dir: Path) -> list[tuple[int, str]]:
    runner = CliRunner()
    return [(r.exit_code, r.stdout) for r in
            (runner.invoke(cli, [*cmd, "--store", str(store_dir)]) for cmd in COMMANDS)]


def test_a_compacted_store_holds_the_same_rows_and_answers_the_same(demo: tuple[Path, object],
                                                                     tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    shutil.copytree(demo[0] / "store", store_dir)
    before_tables, before_answers = tables(store_dir), answers(store_dir)
    files_before = own_files(Store(store_dir))
    assert files_before > 20

    res = CliRunner().invoke(cli, ["compact", "--store", str(store_dir)])
    assert res.exit_code == 0, res.output
    store = Store(store_dir)
    packs = sum(len(store.packs(t)) for t in schema.TABLES)
    assert res.stdout == ""
    assert res.stderr == (f"compact: {files_before} parts into {packs} packs; {files_before} files -> {packs}\n")
    assert own_files(store) == 0  # the readable tables; ingest's carried state (``_facts``...) stays per file
    assert not [p for t in schema.TABLES for p in (store_dir / t).glob("run=*/*.parquet")]
    assert_same_tables(before_tables, tables(store_dir))
    assert answers(store_dir) == before_answers
    assert set(check_store(store)["status"]) == {"ok"}
    again = CliRunner().invoke(cli, ["compact", "--store", str(store_dir)])
    assert again.stderr == "compact: nothing to do\n"


def test_packs_are_sorted_by_run_and_a_run_filter_reads_only_its_row_groups(demo: tuple[Path, object],
                                                                           tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    store_dir = tmp_path / "store"
    shutil.copytree(demo[0] / "store", store_dir)
    compact(Store(store_dir))
    pack = next((store_dir / "events" / PACKS_DIR).glob("*.parquet"))
    runs = pl.read_parquet(pack, columns=["run"])["run"]
    assert runs.to_list() == sorted(runs.to_list())
    meta = pq.ParquetFile(pack).metadata
    stats = [meta.row_group(i).column(meta.schema.names.index("run")).statistics for i in range(meta.num_row_groups)]
    assert all(s is not None and s.has_min_max for s in stats)


def test_a_grown_file_and_a_changed_file_after_compaction_read_as_without_it(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.log", 30)
    write_log(logs / "b.log", 20, first_task=1)
    packed, plain = tmp_path / "packed", tmp_path / "plain"  # the same ingests, one store compacted between
    for store_dir in (packed, plain):
        ingest(store_dir, [logs])
    compact(Store(packed))
    assert own_files(Store(packed)) == 0

    with (logs / "a.log").open("a") as fh:  # grows: an append keeps the packed parts, replaces the open tail
        fh.write((logs / "b.log").read_text().replace("task 1 ", "task 9001 "))
    write_log(logs / "b.log", 12, first_task=5)  # rewritten: every packed part of b is dropped
    for store_dir in (packed, plain):
        ingest(store_dir, [logs])
    assert Store(packed).table("requests").height == 30 + 20 + 12
    assert_same_tables(tables(packed), tables(plain))
    assert set(check_store(Store(packed))["status"]) == {"ok"}

    # the dropped parts are left out until a compaction rewrites the packs that hold them: `forensics compact`
    # rewrites every such pack, so that the packs alone hold each table's rows for any Parquet reader
    compact(Store(packed))
    assert_same_tables(tables(packed), tables(plain))
    assert set(check_store(Store(packed))["status"]) == {"ok"}
    for name in ("requests", "events", "instances"):
        alone = pl.read_parquet(packed / name / PACKS_DIR / "*.parquet").drop("_part")
        assert alone.height == tables(plain)[name].height, name


def test_an_ingest_compacts_once_the_store_has_many_part_files(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    logs = tmp_path / "logs"
    for i in range(4):
        (logs / f"run-{i}").mkdir(parents=True)
        write_log(logs / f"run-{i}" / "server.log", 5, first_task=i)
    monkeypatch.setattr(compact_mod, "AUTO_PARTS", 10)
    store_dir = tmp_path / "store"
    res = CliRunner().invoke(cli, ["ingest", str(logs), "--store", str(store_dir)])
    assert res.exit_code == 0, res.output
    assert "compact: " in res.stderr and "packs;" in res.stderr
    store = Store(store_dir)
    assert own_files(store) == 0 and store.packs("requests")
    assert store.table("requests").height == 20
    assert all_runs(store) == [f"run-{i}" for i in range(4)]


def test_a_crash_at_any_step_of_a_compaction_leaves_the_store_before_or_after(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.log", 30)
    write_log(logs / "b.log", 20, first_task=1)
    store_dir = tmp_path / "store"
    ingest(store_dir, [logs])
    compact(Store(store_dir))
    write_log(logs / "b.log", 12, first_task=5)  # b's packed parts dropped: the next compaction rewrites a pack
    ingest(store_dir, [logs])
    want = tables(store_dir)
    steps: list[str] = []
    copy = tmp_path / "steps"
    shutil.copytree(store_dir, copy)
    store_mod.FAULT = steps.append
    try:
        compact(Store(copy), min_parts=1)
    finally:
        store_mod.FAULT = None
    assert any(s.startswith("delete:") for s in steps) and "manifest:after" in steps
    pristine = tmp_path / "pristine"
    shutil.copytree(store_dir, pristine)
    for k, point in enumerate(steps):
        shutil.rmtree(store_dir)
        shutil.copytree(pristine, store_dir)
        store_mod.FAULT = _crash_at(k)
        try:
            with pytest.raises(Crash):
                compact(Store(store_dir), min_parts=1)
        finally:
            store_mod.FAULT = None
        assert_same_tables(tables(store_dir), want)  # a reader sees the same rows at every step
        store = Store(store_dir)
        with store.lock():  # the next writer finishes or discards the interrupted commit
            assert store.recovered, point
        assert_same_tables(tables(store_dir), want)
        assert set(check_store(Store(store_dir))["status"]) == {"ok"}, point
        assert not list(store_dir.rglob("*.tmp-*")), point

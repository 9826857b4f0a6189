"""A bulk ingest writes its small parts straight into packs (``forensics.packing``): the store holds the same rows
and answers the same as one whose parts are their own files, nothing needs compacting after, and a file whose
reading fails part-way leaves none of its rows behind, even in a pack written while it was read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import forensics.ingest as ingest_mod
from forensics import schema
from forensics.check import check_store
from forensics.compact import own_files
from forensics.errors import InputError
from forensics.ingest import IngestOptions, ingest
from forensics.store import Store
from tests.test_compact import answers, assert_same_tables, tables


def _ingest(logs: Path, store: Path, *, pack: bool, monkeypatch: pytest.MonkeyPatch, **kw: object) -> None:
    monkeypatch.setattr(ingest_mod, "PACK_FROM", 1 if pack else 10**9)
    ingest(store, [logs], **kw)  # type: ignore[arg-type]


def test_a_bulk_ingest_packs_its_parts_and_reads_as_part_files(demo: tuple[Path, object], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    logs = demo[0] / "logs"
    _ingest(logs, tmp_path / "files", pack=False, monkeypatch=monkeypatch)
    _ingest(logs, tmp_path / "packed", pack=True, monkeypatch=monkeypatch)
    files, packed = Store(tmp_path / "files"), Store(tmp_path / "packed")
    assert own_files(files) > 20
    assert own_files(packed) == 0  # every readable table's parts are in packs: nothing to compact
    assert not [p for t in schema.TABLES for p in (tmp_path / "packed" / t).glob("run=*/*.parquet")]
    assert sorted(packed.parts("requests")) != []
    assert {len(packed.packs(t)) for t in schema.TABLES if packed.parts(t)} == {1}
    assert_same_tables(tables(tmp_path / "files"), tables(tmp_path / "packed"))
    assert answers(tmp_path / "files") == answers(tmp_path / "packed")
    assert set(check_store(packed)["status"]) == {"ok"}


def test_a_file_that_fails_part_way_leaves_no_row_in_a_pack(demo: tuple[Path, object], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    logs = tmp_path / "logs"
    shutil.copytree(demo[0] / "logs", logs)
    bad = logs / "run-np6" / "backup.log"
    finish = ingest_mod.LogParse._finish

    def failing_finish(self: ingest_mod.LogParse) -> None:  # after the file's events and requests were written
        if self.path == bad:
            self.ing.txn.flush()  # the packs written now hold the earlier files' parts and this file's
            raise InputError("injected: the file fails after its parts were written")
        finish(self)

    monkeypatch.setattr(ingest_mod.LogParse, "_finish", failing_finish)
    _ingest(logs, tmp_path / "failed", pack=True, monkeypatch=monkeypatch,
            options=IngestOptions(keep_going=True))
    monkeypatch.setattr(ingest_mod.LogParse, "_finish", finish)
    _ingest(logs, tmp_path / "whole", pack=False, monkeypatch=monkeypatch)
    failed, whole = tables(tmp_path / "failed"), tables(tmp_path / "whole")
    for name in ("events", "requests", "instances", "files"):
        assert failed[name].filter(failed[name]["path"] == str(bad)).height == 0, name
        assert whole[name].filter(whole[name]["path"] == str(bad)).height > 0, name
    others = {n: df.filter(df["run"] != "run-np6") if "run" in df.columns else df for n, df in failed.items()}
    assert_same_tables(others, {n: df.filter(df["run"] != "run-np6") if "run" in df.columns else df
                                for n, df in whole.items()})
    store = Store(tmp_path / "failed")
    live = set(store.parts("events"))
    assert any(p not in live for pk in store.packs("events") for p in pk["parts"])  # the undone part's rows sit dead
    assert set(check_store(store)["status"]) == {"ok"}

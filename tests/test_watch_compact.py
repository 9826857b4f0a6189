"""A long watch merges a log's many small parts: rows unchanged, the store checks clean, and later appends and
replacements treat the merged part like the others."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from forensics.check import check_store
from forensics.ingest import ingest
from forensics.store import Store
from forensics.watch.compact import compact
from tests import watch_log as L

TABLES = ("events", "requests", "unparsed")


def rows(store_dir: Path, table: str) -> pl.DataFrame:
    df = Store(store_dir).table(table)
    keep = sorted(c for c in df.columns if c != "ingested_at")  # extra event fields come in any order
    return df.select(keep).sort(keep, nulls_last=True)


def grow(log: Path, store: Path, pieces: list[list[str]]) -> None:
    for lines in pieces:
        with log.open("a", encoding="utf-8") as fh:
            fh.write("".join(lines))
        ingest(store, [log])


def test_merged_parts_hold_the_same_rows_and_appends_go_on(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "live" / "server.log"
    log.parent.mkdir(parents=True)
    reqs = L.normal_requests()
    pieces = [L.banner() + reqs[:7]] + [reqs[i:min(i + 31, 200)] for i in range(7, 200, 31)] + [["not a server line\n"]]
    store = tmp_path / "store"
    grow(log, store, pieces)
    before = {t: rows(store, t) for t in TABLES}
    parts = {t: len(Store(store).parts(t)) for t in TABLES}
    assert parts["events"] > 4

    merged = compact(store, [str(log)], limit=2)
    after = Store(store)
    assert merged > 0
    assert len(after.parts("events")) == 1 and len(after.parts("requests")) <= 2  # merged, and the open requests
    for t in TABLES:
        assert rows(store, t).equals(before[t]), t
    assert check_store(after).filter(pl.col("status") != "ok").height == 0

    grow(log, store, [reqs[200:]])  # an append after the merge
    whole = tmp_path / "whole"
    ingest(whole, [log])
    for t in TABLES:
        assert rows(store, t).equals(rows(whole, t)), t

    log.write_text("".join(L.banner() + reqs[:14]), encoding="utf-8")  # replaced: the merged part goes too
    ingest(store, [log])
    fresh = tmp_path / "fresh"
    ingest(fresh, [log])
    assert rows(store, "requests").equals(rows(fresh, "requests"))
    assert compact(store, [str(log)], limit=2) == 0  # nothing left to merge

"""Keeping a long watch's store fast: every incremental ingest adds a part per table for the lines it read, so a log
followed for days would leave thousands of small Parquet files, and every query opens each of them.  When one
file's small parts of a table pass ``LIMIT``, they are merged into one, rows unchanged, in one commit under the writer
lock.  Only parts an append keeps are merged (``events``, ``requests``, ``unparsed``; never the parts an append
replaces: the open requests, the lines still waiting for their slot, the carried state); the merged part is named
after the file like the others, so a later append keeps it and a replaced file drops it.

Library only: no click.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import polars as pl

from forensics.ingest import file_id_of
from forensics.store import Store

LIMIT = 48
SMALL = 8 << 20  # only parts below this size are merged: large ones are already cheap to open, and merging them
                 # again and again would cost more than it saves
TABLES = ("events", "requests", "unparsed")
REPLACED_ON_APPEND = ("-req-open-", "-ev-tail-")


def _mergeable(root: Path, parts: list[str], fid: str) -> dict[str, list[str]]:
    """The file's small parts that an append keeps, by run partition (the folder, ``run=...``)."""
    by_run: dict[str, list[str]] = {}
    for rel in parts:
        if f"/{fid}-" in rel and not any(tag in rel for tag in REPLACED_ON_APPEND):
            try:
                if (root / rel).stat().st_size >= SMALL:
                    continue
            except OSError:
                continue
            by_run.setdefault(rel.split("/")[1], []).append(rel)
    return by_run


def compact(store_root: Path, paths: list[str], limit: int = LIMIT) -> int:
    """Merge the parts of ``paths``' files that passed ``limit`` in a table; returns the parts merged away."""
    store = Store(store_root)
    fids = [file_id_of(Path(p)) for p in paths]
    if not any(len(g) > limit for t in TABLES for fid in fids for g in _mergeable(store.root, store.parts(t), fid).values()):
        return 0
    merged = 0
    with store.lock():  # re-reads the manifest: parts listed now are the ones to merge
        txn = store.transaction()
        for table in TABLES:
            for fid in fids:
                for folder, group in _mergeable(store.root, store.parts(table), fid).items():
                    if len(group) <= limit:
                        continue
                    frames = [pl.read_parquet(store.root / rel, hive_partitioning=False) for rel in group]
                    run = urllib.parse.unquote(folder.removeprefix("run="))
                    txn.write(table, pl.concat(frames, how="diagonal_relaxed"), run=run, name=f"{fid}-merged")
                    txn.remove(table, group)
                    merged += len(group) - 1
        if merged:
            txn.commit()
    return merged

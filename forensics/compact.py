"""Compaction: many small parts into a few packs, so that a store of thousands of runs answers in a second.

An ingest writes one small Parquet file per table, log file and run (``<table>/run=<run>/<part>.parquet``): right
for incremental ingest (a file that grows or changes replaces its own parts), slow to read when there are tens of
thousands of them.  ``compact`` rewrites a table's own part files, and packs that carry many dropped rows, into
packs: ``<table>/packs/<pack>.parquet``, each holding the rows of many parts with ``run`` and ``_part`` columns,
sorted by run, so that a run filter skips the row groups of other runs (DuckDB, Spark and Trino read them as
plain Parquet).  Part names do not change: the manifest says which pack holds which part, an ingest that
replaces a packed part drops it by name (the views leave its rows out until the next compaction rewrites the
pack), and every reader sees the same rows before and after.  The commit is the store's own (journal, renames,
manifest, deletions), so a crash at any step leaves the store as it was before or after.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from forensics import schema
from forensics.lazy import lazy_import
from forensics.store import PACKS_DIR, Store, Transaction, run_of_part, sql_string, sql_strings

if TYPE_CHECKING:
    import duckdb
else:  # loaded when a compaction runs: every ingest asks whether one is due (forensics.lazy)
    duckdb = lazy_import("duckdb")

PACK_BYTES = 96 * 1024 * 1024  # input bytes per pack: large enough to be few, small enough to sort in memory
ROW_GROUP = 100_000  # rows per row group: a run filter skips whole groups of other runs
STALE = 0.25  # after an ingest, a pack whose dropped parts are at least this share of its parts is rewritten
AUTO_PARTS = 2000  # an ingest that leaves more own part files than this compacts (``ingest``)


@dataclass
class Compacted:
    """What a compaction did, per table: parts moved into packs, packs written, files before and after."""

    parts: dict[str, int] = field(default_factory=dict)
    packs: dict[str, int] = field(default_factory=dict)
    files_before: int = 0
    files_after: int = 0

    def line(self) -> str:
        moved = sum(self.parts.values())
        if not moved:
            return "compact: nothing to do"
        return (f"compact: {moved} parts into {sum(self.packs.values())} packs; "
                f"{self.files_before} files -> {self.files_after}")


def own_files(store: Store) -> int:
    """How many part files of the readable tables are their own file (not packed)."""
    return sum(len(set(store.parts(t)) - set(store.packed(t))) for t in schema.TABLES)


def _files(store: Store) -> int:
    return own_files(store) + sum(len(store.packs(t)) for t in schema.TABLES)


def compact(store: Store, *, min_parts: int = 2, stale: float = 0.0,
            on_wait: Callable[[], None] | None = None) -> Compacted:
    """Pack every table's own part files (when it has at least ``min_parts``) and rewrite its packs that hold
    dropped rows (by default every one: then each pack holds exactly its table's rows, and any Parquet reader
    can read ``<table>/packs/`` alone once no part is left in its own file)."""
    with store.lock(on_wait=on_wait):
        return compact_locked(store, min_parts=min_parts, stale=stale)


def compact_locked(store: Store, *, min_parts: int = 2, stale: float = STALE) -> Compacted:
    """``compact`` for a caller that holds the store's lock (an ingest that just committed)."""
    out = Compacted(files_before=_files(store))
    txn = store.transaction()
    for table in schema.TABLES:
        _compact_table(store, txn, table, (min_parts, stale), out)
    if out.parts:
        txn.commit()
    out.files_after = _files(store)
    return out


def _compact_table(store: Store, txn: Transaction, table: str, limits: tuple[int, float], out: Compacted) -> None:
    min_parts, share = limits
    live = set(store.parts(table))
    packed = store.packed(table)
    own = [rel for rel in store.parts(table) if rel not in packed]
    stale = [pk for pk in store.packs(table)
             if 0 < sum(p not in live for p in pk["parts"]) >= share * len(pk["parts"])]
    if len(own) < min_parts and not stale:
        return
    stale_live = [p for pk in stale for p in pk["parts"] if p in live]
    batches = _batches(store, sorted(own, key=lambda rel: run_of_part(rel) or ""), stale, stale_live)
    for i, (mine, packs) in enumerate(batches):
        final = f"{table}/{PACKS_DIR}/pack-{txn.txn_id}-{i:04d}.parquet"
        tmp = f"{final}.tmp-{txn.txn_id}"
        (store.root / tmp).parent.mkdir(parents=True, exist_ok=True)
        parts = _write_pack(store, mine, packs, [p for p in stale_live if packed.get(p) in packs], store.root / tmp)
        txn.staged.append((tmp, final))
        txn.packs_add.setdefault(table, []).append({"path": final, "parts": parts})
    txn.freed |= set(own)
    txn.packs_drop.setdefault(table, set()).update(pk["path"] for pk in stale)
    out.parts[table] = len(own) + len(stale_live)
    out.packs[table] = len(batches)


def _batches(store: Store, own: list[str], stale: list[dict], stale_live: list[str]) -> list[tuple[list[str], list[str]]]:
    """Own files (in run order) cut into batches of about PACK_BYTES; the stale packs' live rows go with the
    first batch (they are rewritten once)."""
    batches: list[tuple[list[str], list[str]]] = []
    size, current = 0, []
    for rel in own:
        current.append(rel)
        size += (store.root / rel).stat().st_size
        if size >= PACK_BYTES:
            batches.append((current, []))
            size, current = 0, []
    if current or not batches:
        batches.append((current, []))
    if stale_live:
        batches[0] = (batches[0][0], [pk["path"] for pk in stale])
    return batches if batches[0][0] or batches[0][1] else []


def _write_pack(store: Store, own: list[str], packs: list[str], keep: list[str], dest: Path) -> list[str]:
    """Write the rows of the own files ``own`` and the kept parts of ``packs`` to ``dest``, sorted by run and
    part; return the parts it holds."""
    root = str(store.root) + "/"

    selects = []
    if own:
        files = sql_strings([root + rel for rel in own])
        # hive_types_autocast off: the run stays the text of its folder name, as the manifest has it
        selects.append(f"SELECT * EXCLUDE (filename), substr(filename, {len(root) + 1}) AS _part FROM "
                       f"read_parquet([{files}], hive_partitioning = true, hive_types_autocast = false, "
                       "union_by_name = true, filename = true)")
    for pack in packs:
        selects.append(f"SELECT * FROM read_parquet([{sql_string(root + pack)}]) WHERE _part IN ({sql_strings(keep)})")
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET memory_limit = '1GB'")
        con.execute("SET enable_progress_bar = false")
        con.execute(f"SET temp_directory = {sql_string(str(store.root / '.txn' / 'spill'))}")
        query = " UNION ALL BY NAME ".join(selects)
        con.execute(f"COPY (SELECT * FROM ({query}) ORDER BY run, _part) TO {sql_string(str(dest))} "
                    f"(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE {ROW_GROUP})")
    finally:
        con.close()
    return [*own, *keep]

"""Small parts written straight into packs: what a bulk ingest of many small run folders writes.

An ingest writes a few parts per log file and run (``forensics.store``); a folder of thousands of small runs
makes tens of thousands of tiny Parquet files, which the ingest then had to read back and pack
(``forensics.compact``) and delete.  A transaction opened with ``pack_small`` keeps each small part in memory
instead and writes a table's buffered parts as one pack once PACK_ROWS rows wait (and at commit): the same
layout a compaction leaves (rows tagged with ``run`` and ``_part``, sorted by run and part; the manifest lists
every part by name and which pack holds it), written once.  A part dropped later is left out of the views by
name, as for any packed part.

Library only: no click, no altair.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

PART_ROWS = 50_000  # a part of at most this many rows waits in memory to be packed; a bigger one is its own file
PACK_ROWS = 1_000_000  # the buffered rows of one table written as one pack


@dataclass
class PartBuffer:
    """The small parts of a transaction not written yet, by table."""

    parts: dict[str, list[tuple[str, str, pl.DataFrame]]] = field(default_factory=dict)  # table -> (part, run, rows)
    rows: dict[str, int] = field(default_factory=dict)

    def add(self, table: str, rel: str, run: str, df: pl.DataFrame) -> bool:
        """Keep a part's rows; True when the table has PACK_ROWS rows waiting (time to write its pack)."""
        self.parts.setdefault(table, []).append((rel, run, df))
        self.rows[table] = self.rows.get(table, 0) + df.height
        return self.rows[table] >= PACK_ROWS

    def tables(self) -> list[str]:
        return [t for t, parts in self.parts.items() if parts]

    def take(self, table: str) -> tuple[pl.DataFrame, list[str]]:
        """The table's waiting rows as one pack (``run`` and ``_part`` columns, sorted by run and part, as
        ``forensics.compact`` writes them) and the parts it holds, in that order; the buffer is emptied."""
        parts = sorted(self.parts.pop(table, []), key=lambda p: (p[1], p[0]))
        self.rows.pop(table, None)
        heights = [df.height for _, _, df in parts]
        tags = pl.DataFrame({"run": [run for _, run, _ in parts], "_part": [rel for rel, _, _ in parts]},
                            schema={"run": pl.String, "_part": pl.String})
        rows = pl.concat([df for _, _, df in parts], how="diagonal_relaxed")
        tagged = tags.select(pl.all().repeat_by(pl.Series(heights, dtype=pl.UInt32)).explode())
        return pl.concat([rows, tagged], how="horizontal"), [rel for rel, _, _ in parts]

    def keep_only(self, live: dict[str, list[str]]) -> None:
        """Forget the waiting parts that are no longer to be added (a file's work undone)."""
        for table, parts in self.parts.items():
            mine = set(live.get(table, []))
            self.parts[table] = [p for p in parts if p[0] in mine]
            self.rows[table] = sum(p[2].height for p in self.parts[table])

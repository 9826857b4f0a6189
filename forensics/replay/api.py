"""The replay package's two entry points over its modules: ``load`` record files, ``ingest_records`` into a store."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from forensics import schema
from forensics.replay.intake import Context, RecordFile, read_files
from forensics.replay.items import build_items
from forensics.replay.mapping import Mapping, load_mapping
from forensics.replay.records import RecordIssue, Records, detect


def load(paths: Path | str | Iterable[Path | str], *, mapping: Mapping | Path | str | None = None,
         run: str | None = None) -> Records:
    """Read replay record files into ``Records``.

    Each file is a canonical manifest or attempts file (``detect``, by content), or, with ``mapping`` (a
    ``Mapping``, a TOML path or a shipped mapping name), a file the mapping reads (its ``files`` globs, or
    any file when it has none); any other file becomes a ``RecordIssue``.  ``run`` fills records without a
    ``run_id``.  Bad records become ``RecordIssue``s naming file, line and field; good records still load.
    Raises ``MappingError`` when the mapping does not fit a file, and ``MappingError`` / ``RecordError``
    when every record of a file is rejected.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    mp = load_mapping(mapping) if isinstance(mapping, (str, Path)) else mapping
    files: list[RecordFile] = []
    issues: list[RecordIssue] = []
    for p in map(Path, paths):
        kind = detect(p)
        if kind is not None:
            files.append(RecordFile(p, kind))
        elif mp is not None:  # named here: a file no files glob names is tried by content
            files.append(RecordFile(p, "mapped", mapping=mp, named=True))
        else:
            issues.append(RecordIssue(str(p), None, None, "not a replay manifest or attempts file (pass a mapping "
                                                          "for other layouts)"))
    intake = read_files(files, Context(tie=False, fill_run=run))
    for outcome in intake.files.values():
        if outcome.error is not None:
            raise outcome.error
    intake.records.errors[:0] = issues
    return intake.records


def ingest_records(target: Any, records: Records, *, replace_runs: bool = True,
                   existing: Records | None = None, stale: Sequence[str] = ()) -> dict[str, int]:
    """Write ``records`` into a store transaction (or a ``Store``: committed here).

    For each run in ``records`` (and each run in ``stale``, whose records were read again and may now
    belong to another run): its ``runs`` row and ``attempts`` are written, and its ``items`` are rebuilt
    from those plus ``existing`` (records of the same runs already in the store that are not replaced).
    With ``replace_runs``, earlier replay parts of those runs are removed so ingesting again does not
    double rows.  Returns counts written per table.
    """
    from forensics.store import Store, escape_partition

    store = target if isinstance(target, Store) else target.store
    txn = target.transaction() if isinstance(target, Store) else target
    runs, attempts = records.runs, records.attempts
    if existing is not None:
        runs = pl.concat([existing.runs.filter(~pl.col("run").is_in(runs["run"].to_list())), runs])
        attempts = pl.concat([existing.attempts, attempts])
    items = build_items(runs, attempts)
    counts = {"runs": 0, "attempts": 0, "items": 0}
    touched = sorted(set(records.run_ids) | set(stale))
    if replace_runs:
        for table in ("runs", "attempts", "items"):
            parts = [p for p in store.parts(table)
                     if any(p.startswith(f"{table}/run={escape_partition(r)}/replay-") for r in touched)]
            if parts:
                txn.remove(table, parts)
    for run in touched:
        for table, df in (("runs", runs), ("attempts", attempts), ("items", items)):
            part = df.filter(pl.col("run") == run)
            if part.height:
                txn.write(table, schema.conform(part, table), run=run, name="replay")
                counts[table] += part.height
    if isinstance(target, Store):
        txn.commit()
    return counts

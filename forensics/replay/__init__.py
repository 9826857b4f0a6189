"""Replay runs: the harness's records (run manifests and request attempts), their join to the server's
requests, and the questions asked of them (``runs``, ``missing``).

Public API::

    detect(path) -> "manifest" | "attempts" | None       what kind of record file a path is, by content
    load(paths, *, mapping=None, run=None) -> Records     runs + attempts frames and per-record errors
    load_mapping(path) -> Mapping                          a harness mapping file (TOML), or a shipped name
    build_items(runs, attempts) -> DataFrame               one row per expected item x stage, final outcome
    ingest_records(store_or_txn, records, ...)             write runs, attempts and items into the store
    join(requests, instances, runs, attempts) -> JoinResult   attempts <-> server requests
    join_store(store) -> JoinResult                        the same over the store's tables
    runs_table(store) -> DataFrame                         the ``forensics runs`` listing
    missing(store, run) -> DataFrame                       the ``forensics missing RUN`` listing
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from forensics import schema
from forensics.errors import RecordError
from forensics.replay.join import JoinResult, join, join_store
from forensics.replay.mapping import Mapping, apply, load_mapping, shipped_mappings
from forensics.replay.records import RecordIssue, Records, build, canonical_raw, detect
from forensics.replay.report import missing, runs_table

__all__ = [
    "JoinResult", "Mapping", "RecordIssue", "Records", "build_items", "detect", "ingest_into", "ingest_records",
    "join", "join_store", "load", "load_mapping", "missing", "runs_table", "shipped_mappings",
]


def load(paths: Path | str | Iterable[Path | str], *, mapping: Mapping | Path | str | None = None,
         run: str | None = None) -> Records:
    """Read replay record files into ``Records``.

    Without ``mapping`` each file must be a canonical manifest or attempts file (``detect``); a file that
    is neither becomes a ``RecordIssue``.  With ``mapping`` (a ``Mapping``, a TOML path or a shipped
    mapping name) every file is read through it.  ``run`` fills records without a ``run_id``.  Bad records
    become ``RecordIssue``s naming file, line and field; good records still load.  A mapping that names a
    field absent from the data raises ``MappingError``.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    mp = load_mapping(mapping) if isinstance(mapping, (str, Path)) else mapping
    raw = []
    issues: list[RecordIssue] = []
    for p in paths:
        p = Path(p)
        if mp is not None:
            raw.extend(apply(mp, p))
            continue
        kind = detect(p)
        if kind is None:
            issues.append(RecordIssue(str(p), None, None,
                                      "not a replay manifest or attempts file (pass a mapping for other layouts)"))
            continue
        raw.extend(canonical_raw(p, kind))
    recs = build(raw, run=run)
    recs.errors[:0] = issues
    return recs


def _json_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return [str(v) for v in value] if isinstance(value, list) else None


def build_items(runs: pl.DataFrame, attempts: pl.DataFrame) -> pl.DataFrame:
    """One row per expected item x stage of each run, with its attempts and final outcome.

    The universe is the manifest's items (and stages) when the run has a manifest, else the items (and
    stages) seen in its attempts; attempted items outside the manifest's universe are kept too.  Final
    outcome: ``ok`` when any attempt succeeded, else the outcome of the last attempt, else
    ``never_attempted``.
    """
    rows: list[dict[str, Any]] = []
    manifests = {r["run"]: r for r in runs.iter_rows(named=True)} if runs.height else {}
    att = attempts.sort(["run", "started_at", "attempt"], nulls_last=True) if attempts.height else attempts
    by_run: dict[str, list[dict[str, Any]]] = {}
    for a in att.iter_rows(named=True):
        by_run.setdefault(a["run"], []).append(a)
    for run in sorted(set(manifests) | set(by_run)):
        m = manifests.get(run) or {}
        atts = by_run.get(run, [])
        items = _json_list(m.get("items")) or []
        stages = _json_list(m.get("stages")) or []
        for a in atts:
            if a["item"] not in items:
                items.append(a["item"])
            if a["stage"] not in stages:
                stages.append(a["stage"])
        if not _json_list(m.get("items")):
            items = sorted(items)
        per: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for a in atts:
            per.setdefault((a["item"], a["stage"]), []).append(a)
        for item in items:
            for stage in stages:
                tries = per.get((item, stage), [])
                if not tries:
                    outcome = "never_attempted"
                elif any(t["outcome"] == "ok" for t in tries):
                    outcome = "ok"
                else:
                    outcome = max(tries, key=lambda t: t["attempt"])["outcome"]
                rows.append({"run": run, "item": item, "stage": stage, "attempts": len(tries), "outcome": outcome,
                             "done": outcome == "ok"})
    if not rows:
        return schema.empty("items")
    return schema.conform(pl.DataFrame(rows), "items")


def ingest_records(target: Any, records: Records, *, replace_runs: bool = True,
                   existing: Records | None = None) -> dict[str, int]:
    """Write ``records`` into a store transaction (or a ``Store``: committed here).

    For each run in ``records``: its ``runs`` row and ``attempts`` are written, and its ``items`` are
    rebuilt from those plus ``existing`` (records of the same runs already in the store that are not
    replaced).  With ``replace_runs`` and a ``Store``, earlier replay parts of those runs are removed so
    ingesting again does not double rows.  Returns counts written per table.
    """
    from forensics.store import Store

    store = target if isinstance(target, Store) else target.store
    txn = target.transaction() if isinstance(target, Store) else target
    runs, attempts = records.runs, records.attempts
    if existing is not None:
        runs = pl.concat([existing.runs.filter(~pl.col("run").is_in(runs["run"].to_list())), runs])
        attempts = pl.concat([existing.attempts, attempts])
    items = build_items(runs, attempts)
    counts = {"runs": 0, "attempts": 0, "items": 0}
    touched = sorted(set(records.run_ids))
    if replace_runs:
        from forensics.store import escape_partition

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


def existing_records(store: Any, runs: Sequence[str], exclude_sources: Sequence[str]) -> Records:
    """Records of ``runs`` already in the store, except those read from ``exclude_sources``."""
    out = Records()
    if not runs:
        return out
    r = store.table("runs")
    a = store.table("attempts")
    excl = [str(s) for s in exclude_sources]
    if r.height:
        out.runs = schema.conform(r.filter(pl.col("run").is_in(list(runs)) & ~pl.col("source").is_in(excl)), "runs")
    if a.height:
        out.attempts = schema.conform(
            a.filter(pl.col("run").is_in(list(runs)) & ~pl.col("source").is_in(excl)), "attempts")
    return out


def ingest_into(ing: Any, store: Any) -> None:
    """Hook for ``forensics ingest``: load the record files it found (``ing.records``: (path, kind, run)
    tuples; ``ing.mapping``: the --mapping file or None) into its transaction ``ing.txn``, and report each
    file and each bad record in ``ing.result``."""
    paths = [p for p, _, _ in ing.records]
    fallback = {str(p): run for p, _, run in ing.records}
    mp = load_mapping(ing.mapping) if getattr(ing, "mapping", None) is not None else None
    recs = Records()
    raws = []
    for p, kind, _run in ing.records:
        try:
            if mp is not None:
                part = apply(mp, p)
            elif kind in ("manifest", "attempts"):
                part = canonical_raw(Path(p), kind)
            else:
                raise RecordError("not a replay manifest or attempts file", path=str(p))
        except RecordError as exc:
            if not getattr(ing, "keep_going", False):
                raise
            ing.result.errors.append(exc.one_line())
            continue
        for r in part:
            if isinstance(r.obj, dict) and not r.obj.get("run_id"):
                r.obj = {**r.obj, "run_id": fallback[str(p)]}
        raws.extend(part)
    recs = build(raws)
    existing = existing_records(store, recs.run_ids, [str(p) for p in paths])
    counts_by_file: dict[str, int] = {}
    for src in recs.attempts["source"].to_list() + recs.runs["source"].to_list():
        counts_by_file[src] = counts_by_file.get(src, 0) + 1
    bad_by_file: dict[str, int] = {}
    for e in recs.errors:
        bad_by_file[e.path] = bad_by_file.get(e.path, 0) + 1
        ing.result.warnings.append(e.one_line())
    ingest_records(ing.txn, recs, existing=existing)
    for f in ing.result.files:
        if f.status == "pending" and f.kind.startswith("records:"):
            f.status = "ingested"
            f.parsed = counts_by_file.get(f.path, 0)
            f.unparsed = bad_by_file.get(f.path, 0)
            f.lines = f.parsed + f.unparsed

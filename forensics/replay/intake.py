"""Reading a set of record files together: each file read on its own (a file that cannot be read is an
error of that file only), then run identity, relative clocks and validation over all of them, so that a
manifest in one file anchors or names the attempts of another.

A file whose every record is rejected is an error of that file (one line with the first three reasons),
not one warning per record; for other files at most three bad records are listed one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from forensics.errors import ForensicsError, InternalError, MappingError, RecordError
from forensics.paths import file_stem
from forensics.replay.clock import manifest_starts, resolve
from forensics.replay.identity import tie_runs
from forensics.replay.mapping import ForeignFile, Mapping, apply, load_mapping
from forensics.replay.records import RawRecord, RecordIssue, Records, build, canonical_raw, detect

if TYPE_CHECKING:
    from forensics.ingest import FileReport, Ingestor
    from forensics.store import Store

SHOWN_PER_FILE = 3  # bad records listed one by one per file; the rest are counted


@dataclass(frozen=True)
class RecordFile:
    """A file to read: canonical records (``kind`` manifest or attempts) or a mapping's data file."""

    path: Path
    kind: str  # manifest | attempts | mapped
    folder_run: str = ""  # the run of the folder it sits in (--run, or the folder's name)
    mapping: Mapping | None = None
    named: bool = False  # named by the user: a mapping tries it by content when no files glob names it


@dataclass
class FileOutcome:
    """What became of one file: its kind for the ingest listing, good and bad records, and an error (the
    file was not read) or a message."""

    kind: str
    good: int = 0
    bad: int = 0
    error: ForensicsError | None = None
    message: str = ""
    skipped: bool = False  # not read, on purpose (another file of its folder is the run's manifest)


@dataclass
class Intake:
    records: Records
    files: dict[str, FileOutcome] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Context:
    """What the reading needs to know beyond the files: ``forced_run`` (``--run``), the runs that have a
    server log (run identity) and the start times of manifests already in the store (anchors)."""

    tie: bool = True
    forced_run: str | None = None
    log_runs: frozenset[str] = frozenset()
    known_starts: dict[str, datetime] = field(default_factory=dict)
    fill_run: str | None = None  # fills a missing run_id when runs are not tied (``load(run=...)``)


def read_files(files: Sequence[RecordFile], ctx: Context) -> Intake:
    """Read ``files`` (see the module docstring)."""
    outcomes: dict[str, FileOutcome] = {}
    raws: list[RawRecord] = []
    warnings: list[str] = []
    for f in files:
        chosen = manifest_of_folder(f.path) if f.kind == "manifest" else None
        if chosen is not None:
            outcomes[str(f.path)] = FileOutcome("records:manifest", skipped=True, message=f"not the manifest: {chosen.name} is")
            warnings.append(f"{f.path}: not read as a run manifest: {chosen.name} in the same folder is the run's "
                            "manifest (a folder's manifest is the file named manifest.json)")
            continue
        outcome, part = _read_one(f)
        outcomes[str(f.path)] = outcome
        raws.extend(part)
    if ctx.tie:
        warnings += tie_runs(raws, {str(f.path): f.folder_run for f in files}, set(ctx.log_runs), ctx.forced_run)
    warnings += resolve(raws, manifest_starts(raws, ctx.known_starts))
    recs = build(raws, run=ctx.fill_run)
    by_file: dict[str, list[RecordIssue]] = {}
    for e in recs.errors:
        by_file.setdefault(e.path, []).append(e)
    _reject_whole_files(raws, recs, outcomes, by_file, {str(f.path) for f in files if f.kind == "mapped"})
    warnings += recs.notes + _count(recs, outcomes, by_file) + _sampled(recs)
    return Intake(recs, outcomes, warnings)


def manifest_of_folder(path: Path) -> Path | None:
    """The file named like a manifest (``manifest.json``, ``run.manifest.json``, ``bench_manifest.json``) beside
    ``path``, when ``path`` is not itself so named and that file is a run manifest by content: then it, not
    ``path``, is the folder's manifest (a labels, truth or config file with a ``run_id`` is not)."""
    if manifest_named(path.name):
        return None
    try:
        siblings = sorted(p for p in path.parent.iterdir() if p.is_file() and manifest_named(p.name))
    except OSError:
        return None
    return next((p for p in siblings if detect(p) == "manifest"), None)


def manifest_named(name: str) -> bool:
    stem = file_stem(name).lower()
    return stem == "manifest" or stem.endswith((".manifest", "_manifest", "-manifest"))


def _sampled(recs: Records) -> list[str]:
    """Runs whose summary counts more requests than their records list (a tool that keeps a sample)."""
    if not recs.runs.height or not recs.attempts.height:
        return []
    listed = recs.attempts.group_by("run").agg(pl.len().alias("listed"))
    short = recs.runs.join(listed, on="run").filter(pl.col("summary_requests") > pl.col("listed"))
    return [f"run {r['run']!r}: its records list {r['listed']} of the {r['summary_requests']} requests its summary "
            "counts (a sample): items and attempts cover only those" for r in short.iter_rows(named=True)]


def _read_one(f: RecordFile) -> tuple[FileOutcome, list[RawRecord]]:
    try:
        if f.kind != "mapped":
            return FileOutcome(f"records:{f.kind}"), canonical_raw(f.path, f.kind)
        if f.mapping is None:
            raise InternalError(f"{f.path}: classified as a mapped record file without its mapping")
        mapped = apply(f.mapping, f.path, by_content=f.named)
    except ForeignFile as exc:
        if f.named:  # the user asked for this file: say why it was not read
            return FileOutcome("records:?", error=exc), []
        return FileOutcome("other", skipped=True, message=f"not read: {exc.message}"), []
    except InternalError:
        raise  # a bug, not a problem of this file
    except ForensicsError as exc:
        if f.named:
            return FileOutcome("records:?", error=exc), []
        # found in a run folder: a mapping reads only what it can read, the rest is passed over and said
        return FileOutcome("other", skipped=True, message=f"not read by mapping {f.mapping.name if f.mapping else ''}:"
                           f" {exc.one_line()}"), []
    attempts = sum(r.kind in ("attempt", "invalid") for r in mapped.records)
    runs = sorted({str(r.obj.get("run_id")) for r in mapped.records
                   if r.kind == "manifest" and isinstance(r.obj, dict)})
    out = FileOutcome("records:mapped")
    if not attempts and not mapped.reads_attempts:
        out.kind = "records:manifest"
    elif not attempts and not mapped.per_request:
        out.kind = "records:summary"
        out.message = ("summary only (no per-request rows): read into runs"
                       + (f" ({len(runs)} runs)" if len(runs) > 1 else ""))
    if mapped.filtered:
        out.message = f"where left out {mapped.filtered} of {mapped.filtered + attempts} records"
    out.message = "; ".join(m for m in (out.message, *mapped.notes) if m)
    return out, mapped.records


def _reject_whole_files(raws: list[RawRecord], recs: Records, outcomes: dict[str, FileOutcome],
                        by_file: dict[str, list[RecordIssue]], mapped: set[str]) -> None:
    """A file that gave records and kept none is an error: its issues are folded into that one line (and
    leave ``recs.errors`` and ``by_file``)."""
    given: dict[str, int] = {}
    for r in raws:
        given[r.path] = given.get(r.path, 0) + 1
    kept = set(recs.attempts["source"].to_list()) | set(recs.runs["source"].to_list())
    for path, n in given.items():
        if path in kept or path not in by_file:
            continue
        first = "; ".join(_reason(e) for e in by_file.pop(path)[:SHOWN_PER_FILE])
        cls = MappingError if path in mapped else RecordError
        hint = "fix the mapping's fields" if path in mapped else "check the records against the record schema"
        outcomes[path].error = cls(f"all {n} record{'s' if n > 1 else ''} rejected (first: {first})", path=path,
                                   hint=hint)
    recs.errors[:] = [e for e in recs.errors if e.path in by_file]


def _reason(e: RecordIssue) -> str:
    where = f"line {e.line}" if e.line is not None else f"record {e.record}" if e.record is not None else ""
    what = f"{e.field}: " if e.field else ""
    return f"{where}: {what}{e.message}" if where else f"{what}{e.message}"


def _count(recs: Records, outcomes: dict[str, FileOutcome], by_file: dict[str, list[RecordIssue]]) -> list[str]:
    """Good and bad records per file; the bad ones as warnings, at most three per file."""
    for src in recs.attempts["source"].to_list() + recs.runs["source"].to_list():
        if src in outcomes:
            outcomes[src].good += 1
    warnings: list[str] = []
    for path, errs in by_file.items():
        if path in outcomes:
            outcomes[path].bad = len(errs)
        warnings.extend(e.one_line() for e in errs[:SHOWN_PER_FILE])
        if len(errs) > SHOWN_PER_FILE:
            warnings.append(f"{path}: {len(errs) - SHOWN_PER_FILE} more bad records not shown")
    return warnings


# ---------------------------------------------------------------------------------------------- ingest
def ingest_into(ing: Ingestor, store: Store) -> None:
    """Hook for ``forensics ingest``: read the record files it queued (``ing.records``: (path, kind, folder
    run, mapping) tuples) together into its transaction ``ing.txn``, and report each file, each tie of
    runs and the bad records in ``ing.result``.  A file that cannot be read is that file's error; the
    others load."""
    from forensics.replay import ingest_records

    mappings: dict[str, Mapping] = {}
    files = [RecordFile(Path(p), kind, run, _mapping(m, mappings) if kind == "mapped" else None, str(p) in ing.named)
             for p, kind, run, m in ing.records]
    stored = Records(runs=store.table("runs"), attempts=store.table("attempts"))
    intake = read_files(files, Context(forced_run=ing.run, log_runs=frozenset(log_runs(ing.files_meta)),
                                       known_starts=_starts(stored.runs)))
    read = [p for p, o in intake.files.items() if o.error is None] + ing.dropped_records
    stale = _runs_of_sources(stored, read)
    ingest_records(ing.txn, intake.records, existing=_others(stored, set(intake.records.run_ids) | stale, read),
                   stale=sorted(stale))
    ing.result.warnings.extend(intake.warnings)
    mapped = [str(f.path) for f in files if f.kind == "mapped"]
    if mapped and all(intake.files[p].error is not None or intake.files[p].skipped for p in mapped):
        n = len(mapped)
        said = f"the mapping read nothing from the {n} file{'s' if n > 1 else ''} it names"
        if any(p in ing.named for p in mapped):  # a file the user named: an error even with --keep-going
            ing.result.mapping_failed = said
        else:  # a run folder as it lies: ingested, and said
            ing.result.warnings.append(f"{said} in the run folders (-v says why for each)")
    ing.result.warnings.extend(f"{p}: {intake.files[p].message}" for p in mapped
                               if intake.files[p].skipped and intake.files[p].message.startswith("not read by"))
    for f in ing.result.files:
        outcome = intake.files.get(f.path)
        if outcome is None or not f.kind.startswith("records:") or f.status not in ("pending", "unchanged"):
            continue
        _report(ing, f, outcome)


def _mapping(source: Any, cache: dict[str, Mapping]) -> Mapping:
    key = str(source)
    if key not in cache:
        cache[key] = load_mapping(source)
    return cache[key]


def _report(ing: Ingestor, f: FileReport, outcome: FileOutcome) -> None:
    if outcome.skipped:
        f.status, f.kind, f.message = "skipped", outcome.kind, outcome.message
        return
    if outcome.error is not None:
        f.status, f.kind, f.message = "error", outcome.kind, outcome.error.one_line()
        ing.result.errors.append(f.message)
        return
    if f.status == "pending":
        f.status = "ingested"
    f.kind = outcome.kind
    f.parsed, f.unparsed = outcome.good, outcome.bad
    f.lines = f.parsed + f.unparsed
    f.message = outcome.message


def log_runs(files_meta: dict[str, Any]) -> set[str]:
    """Runs that have a server log, by the ``files`` metadata of everything ingested so far."""
    return {str(m.get("run")) for m in files_meta.values()
            if not str(m.get("format", "")).startswith("records") and m.get("format") not in ("empty", "duplicate")}


def _starts(runs: pl.DataFrame) -> dict[str, datetime]:
    """Run -> its manifest's start, of the runs already in the store (anchors of relative times)."""
    return {r: t for r, t in runs.select("run", "started_at").iter_rows() if t is not None}


def _runs_of_sources(stored: Records, sources: list[str]) -> set[str]:
    """The stored runs that hold records read from ``sources`` (rewritten: those files may name other runs
    now)."""
    return {r for df in (stored.runs, stored.attempts) for r in df.filter(pl.col("source").is_in(sources))["run"]}


def _others(stored: Records, runs: set[str], sources: list[str]) -> Records:
    """The stored records of ``runs`` that were not read from ``sources``: they stay beside the new ones."""
    keep = pl.col("run").is_in(sorted(runs)) & ~pl.col("source").is_in(sources)
    return Records(runs=stored.runs.filter(keep), attempts=stored.attempts.filter(keep))

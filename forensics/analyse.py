"""The analysis of a run, worked out once and stored: what every command, the report, the notebook and watch read.

After an ingest commits what the files said, ``analyse`` derives, for each run whose inputs changed, the tables
of ``forensics.derived``:

* ``request_facts``: each server request as every finding reads it (``findings_base.sql``): one clock, one
  instance name, its item and stage, its tokens, its cap and what stopped it;
* ``instance_facts``: each server instance, the one name every output gives it;
* ``finding_<name>``: every finding's rows (the registry's findings, at the default thresholds);
* ``cap_facts``: ``cap.sql``'s requests grouped alike (what ``forensics cap`` chooses a cap from);
* ``verdict_facts``: the verdict's sentences with their evidence and numbers;
* ``run_facts``: one row per run: its requests and slots, its throughput and latency (``metrics.throughput``).

A command with the default thresholds reads these rows instead of working the findings out again
(``forensics.session`` does, through ``forensics.stored``): a question about one run costs what it costs on a
one-run store, and a question over every run is a scan of small tables.  A store derived by another analysis
version, or runs whose inputs changed, are derived (again) on first use (``ensure``), with progress.

Library only: no click, no altair.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from forensics import derived, metrics, registry, schema
from forensics import runs as runs_mod
from forensics.errors import StoreError
from forensics.findings import cap_facts
from forensics.session import DEFAULTS, VERSION, Analysis
from forensics.store import MANIFEST, Store, fetch_pl
from forensics.verdict import RunVerdict, verdict, verdict_frame

if TYPE_CHECKING:
    from forensics.ingest import IngestOptions, IngestResult

CHUNK_REQUESTS = 400_000  # requests derived together (memory stays flat on a store of millions)
CHUNK_RUNS = 1_000  # runs derived together (each run's verdict is Python objects: 10,000 small runs took 2.2 GB)
MAX_BATCHES = 8  # more batches than this are merged into one after an analysis
SAY_FROM = 200  # a command that derives this many runs (not derived yet) says so first

Progress = Callable[[str], None]


@dataclass
class Analysed:
    """What ``analyse`` did: the runs it derived, in how many batches, and how long it took."""

    runs: list[str] = field(default_factory=list)
    batches: int = 0
    seconds: float = 0.0
    merged: bool = False


def finding_table(name: str) -> str:
    """The derived table holding a finding's rows."""
    return f"finding_{name}"


def stored_findings() -> list[registry.Finding]:
    """The findings whose rows are derived and stored: every registered one (helper relations included)."""
    return list(registry.FINDINGS.values())


def needs(store: Store, runs: list[str] | None = None) -> list[str]:
    """Those of ``runs`` (default: every run of the store) whose derived rows are missing or out of date."""
    state = derived.state(store)
    if runs is None and state.version == VERSION and not state.stale and state.analysed:
        return []  # every commit marks the runs it changes stale, a new run too: none is, so every run is derived
    names = runs_mod.all_runs(store) if runs is None else runs
    return state.needs(names, VERSION)


def frames_of(store: Store, runs: list[str]) -> dict[str, pl.DataFrame]:
    """The derived tables of ``runs``, worked out from the store's tables (nothing is read from earlier
    analyses: this is where each finding is computed)."""
    # the join's modules (numpy) are loaded only when deriving, not by every command that imports this one
    from forensics.replay.tables import bind_join, runs_rows

    with Analysis.open(store, runs, stored=False) as s:
        s.prepare(runs)
        out = {"request_facts": s.query("request_facts", DEFAULTS, runs)}
        for f in registry.in_dependency_order(stored_findings()):
            out[finding_table(f.name)] = s.rows(f.name, DEFAULTS, runs)
        s.register("fx_runaway", out[finding_table("runaway")])
        out["cap_facts"] = cap_facts(s.query("cap", DEFAULTS, runs))
        out["instance_facts"] = fetch_pl(s.con, "SELECT * FROM fx_instances ORDER BY run, instance")
        bind_join(s.con, store)
        out["run_records"] = runs_rows(s.con, runs)
        verdicts = verdict(s, runs)
        out["verdict_facts"] = verdict_frame(verdicts)
        out["run_facts"] = run_frame(s, runs, verdicts)
    for table in schema.DERIVED:  # the declared columns and types (docs/tables.md), whatever the queries gave
        out[table] = schema.conform_derived(out[table], table)
    return out


def run_frame(session: Analysis, runs: list[str], verdicts: list[RunVerdict]) -> pl.DataFrame:
    """One row per run: its setup (``run_setup.sql``: what makes runs comparable), its server requests and slots
    (the verdict's stats), whether the verdict found it healthy, and its throughput row (``metrics.throughput``,
    whose columns keep their names: ``metrics.throughput`` reads them back)."""
    if not runs:
        return schema.conform_derived(pl.DataFrame(), "run_facts")
    setup = session.query("run_setup", DEFAULTS, runs).drop("np")
    stats = session.query("run_stats", DEFAULTS, runs).rename({"requests": "server_requests"})
    health = pl.DataFrame({"run": [v.run for v in verdicts], "healthy": [v.healthy for v in verdicts]},
                          schema={"run": pl.String, "healthy": pl.Boolean})
    session.bind(metrics.THROUGHPUT_TABLES)
    tput = metrics.throughput(session.con, runs)
    return setup.join(tput, on="run", how="left").join(stats, on="run", how="left").join(health, on="run", how="left")


def _chunks(store: Store, runs: list[str]) -> Iterator[list[str]]:
    """``runs`` in groups of about CHUNK_REQUESTS requests and at most CHUNK_RUNS runs (a run is never split)."""
    sizes = _request_counts(store, runs)
    chunk: list[str] = []
    total = 0
    for r in runs:
        chunk.append(r)
        total += sizes.get(r, 0)
        if total >= CHUNK_REQUESTS or len(chunk) >= CHUNK_RUNS:
            yield chunk
            chunk, total = [], 0
    if chunk:
        yield chunk


def _request_counts(store: Store, runs: list[str]) -> dict[str, int]:
    if len(runs) <= 1:
        return {}
    con = store.connect(tables=["requests"])
    try:
        rows = con.execute("SELECT run, count(*) FROM requests GROUP BY run").fetchall()
    finally:
        con.close()
    return {str(r): int(n) for r, n in rows}


def analyse(store: Store, runs: list[str] | None = None, *, progress: Progress | None = None,
            force: bool = False) -> Analysed:
    """Derive and store the analysis of ``runs`` (default: those that need it; ``force``: every run).  The
    caller holds the store's lock."""
    t0 = time.perf_counter()
    todo = runs_mod.all_runs(store) if force else needs(store, runs)
    out = Analysed(todo)
    if not todo and derived.state(store).version == VERSION:
        return out
    chunks = list(_chunks(store, todo)) or [[]]
    done = 0
    for chunk in chunks:
        frames = frames_of(store, chunk)
        txn = store.transaction()
        derived.stage_batch(txn, frames, chunk, VERSION)
        txn.commit()
        out.batches += 1
        done += len(chunk)
        if progress is not None and len(chunks) > 1:
            progress(f"analysed {done} of {len(todo)} runs")
    if len(derived.batches(store)) > MAX_BATCHES:
        merge(store)
        out.merged = True
    out.seconds = time.perf_counter() - t0
    return out


def merge(store: Store) -> None:
    """Rewrite every live batch as one (the caller holds the lock): few files to open, no dead rows."""
    state = derived.state(store)
    runs = sorted(state.analysed)
    frames: dict[str, pl.DataFrame] = {}
    con = store.connect(tables=[])
    try:
        for table in sorted(state.tables):
            store.attach(con, [table])
            frames[table] = pl.DataFrame(con.sql(f"SELECT * FROM {table}")).rechunk()
    finally:
        con.close()
    txn = store.transaction()
    derived.replace_all(txn, frames, runs, VERSION)
    txn.commit()


def ensure(store: Store, *, progress: Progress | None = None) -> None:
    """Derive what the store's runs lack before a command reads them: under the store's lock when it can be taken
    at once; when another process holds it (an ingest), the command computes what it needs itself and stores
    nothing.  A fleet ensures each of its stores."""
    from forensics.fleet import members_of

    for _host, member in members_of(store):
        todo = needs(member)
        if derived.state(member).version == VERSION and not todo:
            continue
        try:
            with member.lock(wait=False):
                older = derived.state(member).version not in (None, VERSION)
                if progress is not None and todo and (older or len(todo) >= SAY_FROM):
                    why = "derived by another version" if older else "not derived yet"
                    progress(f"forensics: analysing {len(todo)} run{'s' if len(todo) != 1 else ''} of "
                             f"{member.root} ({why}); the next command reads what it stores")
                analyse(member, progress=progress)
        except (StoreError, PermissionError):
            continue


def ingest_and_analyse(store_dir: Path, paths: list[Path], options: IngestOptions | None = None, *,
                       progress: Callable[..., None] | None = None, on_wait: Callable[[], None] | None = None,
                       note: Progress | None = None) -> IngestResult:
    """What ``forensics ingest`` does: read the files into the store (``forensics.ingest``), then derive the
    analysis of every run they changed.  Files that could not be read (``FilesNotRead``) leave the others in and
    analysed before the error goes on."""
    from forensics.ingest import FilesNotRead, ingest

    try:
        result = ingest(store_dir, paths, options, progress=progress, on_wait=on_wait)
    except FilesNotRead as exc:
        _analyse_after(store_dir, exc.result, note)
        raise
    _analyse_after(store_dir, result, note)
    return result


def _analyse_after(store_dir: Path, result: IngestResult, note: Progress | None) -> None:
    if not (store_dir / MANIFEST).exists():
        return
    store = Store(store_dir)
    if not needs(store) and derived.state(store).version == VERSION:  # as analyse() would find it: nothing to do,
        result.analysed = Analysed([])  # told from the manifest the ingest just committed, no lock taken again
        return
    with store.lock():
        result.analysed = analyse(store, progress=note)

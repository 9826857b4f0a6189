"""Derived tables: each run's analysis, worked out once and stored beside the tables it was derived from.

The tables an ingest writes (``schema.TABLES``) hold what the files said.  What the project concludes from them
(each request's clock and instance name, the run's setup, every finding's rows, the verdict's facts) is derived
once per run and stored here, so that every command, the report, the notebook and watch read the same rows and a
question over many runs is a scan of small tables.

Layout and bookkeeping.  One analysis pass derives a set of runs and writes one *batch*: one Parquet file per
derived table holding the rows of all its runs (``run`` is a column, rows sorted by run, so a run filter skips the
row groups of other runs)::

    STORE/_derived/<batch>/<table>.parquet

The manifest's ``derived`` entry says which batches are live, which of their runs were derived again since (their
rows in that batch are dead), the analysis version that wrote them and the runs whose inputs changed since they
were derived (``stale``, set by an ingest in the same commit as the rows it wrote)::

    "derived": {"version": 3, "stale": ["run-7"],
                "batches": [{"id": "ab12", "version": 3, "runs": [...], "dead": [...], "tables": {name: file}}]}

A batch is committed through the store's own journal (``Transaction``), so a crash leaves the store before or after
it.  Every table of a batch has a file, empty or not, so its view always has the columns.

The store layer knows nothing of what the tables mean: the analysis (``forensics.analysis``) decides what to
derive and its version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from forensics.errors import StoreError

if TYPE_CHECKING:
    import polars as pl

    from forensics.store import Store, Transaction

DERIVED_DIR = "_derived"
KEY = "derived"


@dataclass(frozen=True)
class Batch:
    id: str
    version: int
    runs: tuple[str, ...]
    dead: frozenset[str]
    tables: dict[str, str]  # table -> file, relative to the store

    @property
    def live(self) -> list[str]:
        return [r for r in self.runs if r not in self.dead]


def entry(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``derived`` entry (an empty one for a store that never had an analysis)."""
    got = manifest.get(KEY)
    return got if isinstance(got, dict) else {"version": None, "stale": [], "batches": []}


def batches(store: Store) -> list[Batch]:
    """The live batches of the store, oldest first."""
    out = []
    for b in entry(store.manifest).get("batches", []):
        out.append(Batch(str(b["id"]), int(b.get("version") or 0), tuple(b.get("runs", [])),
                         frozenset(b.get("dead", [])), dict(b.get("tables", {}))))
    return out


@dataclass(frozen=True)
class DerivedState:
    """Which runs have current derived rows, and which need deriving (again)."""

    version: int | None  # the analysis version of the store's derived rows (None: never derived)
    analysed: dict[str, str]  # run -> the batch holding its live rows
    stale: frozenset[str]  # runs whose inputs changed since they were derived
    tables: frozenset[str]  # the derived tables the batches hold

    def needs(self, runs: list[str], version: int) -> list[str]:
        """Those of ``runs`` whose derived rows are missing, stale or of another version."""
        if self.version != version:
            return list(runs)
        return [r for r in runs if r in self.stale or r not in self.analysed]


def state(store: Store) -> DerivedState:
    """Which runs of ``store`` have derived rows (a fleet's: each member's, with the fleet's run names)."""
    members = getattr(store, "members", None)
    if members is not None:
        return _fleet_state([(host, state(member)) for host, member in members])
    got = entry(store.manifest)
    analysed: dict[str, str] = {}
    tables: set[str] = set()
    versions = set()
    for b in batches(store):
        versions.add(b.version)
        tables |= set(b.tables)
        for r in b.live:
            analysed[r] = b.id
    version = got.get("version")
    if len(versions) > 1:  # batches of two versions: the older rows count as missing
        version = None
    return DerivedState(version, analysed, frozenset(got.get("stale", [])), frozenset(tables))


def _fleet_state(states: list[tuple[str, DerivedState]]) -> DerivedState:
    versions = {st.version for _, st in states}
    return DerivedState(versions.pop() if len(versions) == 1 else None,
                        {f"{host}:{r}": b for host, st in states for r, b in st.analysed.items()},
                        frozenset(f"{host}:{r}" for host, st in states for r in st.stale),
                        frozenset(t for _, st in states for t in st.tables))


# ---------------------------------------------------------------------------------------- writing
def mark_stale_in(manifest: dict[str, Any], runs: set[str]) -> None:
    """Say in a new manifest that ``runs`` changed (the store's commit does, for every run whose parts it adds or
    removes): their derived rows are out of date until derived again."""
    got = dict(entry(manifest))
    got["stale"] = sorted(set(got.get("stale", [])) | runs)
    manifest[KEY] = got


def stage_batch(txn: Transaction, frames: dict[str, pl.DataFrame], runs: list[str], version: int) -> str:
    """Write ``frames`` (derived table -> its rows for ``runs``, ``run`` a column) as a new batch of ``txn``: on
    commit the runs' rows in older batches are dead, the runs are no longer stale, and a batch left with no live
    run is dropped with its files.  Returns the batch id."""
    bid = txn.txn_id
    tables: dict[str, str] = {}
    for name, df in frames.items():
        final = f"{DERIVED_DIR}/{bid}/{name}.parquet"
        tmp = f"{final}.tmp-{bid}"
        path = txn.store.root / tmp
        path.parent.mkdir(parents=True, exist_ok=True)
        ordered = df.sort("run", maintain_order=True) if "run" in df.columns and df.height else df
        ordered.write_parquet(path, compression="zstd", compression_level=1, statistics=True, row_group_size=100_000)
        txn.staged.append((tmp, final))
        tables[name] = final
    mine = sorted(set(runs))

    def edit(manifest: dict[str, Any]) -> set[str]:
        got = dict(entry(manifest))
        kept, dead_files = [], set()
        for b in got.get("batches", []):
            dead = sorted(set(b.get("dead", [])) | (set(b.get("runs", [])) & set(mine)))
            if set(b.get("runs", [])) <= set(dead):
                dead_files |= set(b.get("tables", {}).values())
                continue
            kept.append({**b, "dead": dead})
        kept.append({"id": bid, "version": version, "runs": mine, "dead": [], "tables": tables})
        got.update(version=version, batches=kept, stale=sorted(set(got.get("stale", [])) - set(mine)))
        manifest[KEY] = got
        return dead_files

    txn.edits.append(edit)
    return bid


def replace_all(txn: Transaction, frames: dict[str, pl.DataFrame], runs: list[str], version: int) -> None:
    """Stage one batch that replaces every batch of the store (a merge of all live rows, or a new version)."""
    stage_batch(txn, frames, runs, version)
    bid = txn.txn_id

    def edit(manifest: dict[str, Any]) -> set[str]:
        got = dict(entry(manifest))
        dead_files = {f for b in got.get("batches", []) if b["id"] != bid for f in b.get("tables", {}).values()}
        got["batches"] = [b for b in got.get("batches", []) if b["id"] == bid]
        manifest[KEY] = got
        return dead_files

    txn.edits.append(edit)


# ---------------------------------------------------------------------------------------- reading
def is_derived(store: Store, table: str) -> bool:
    return any(table in b.tables for b in batches(store))


def view_source(store: Store, table: str, runs: list[str] | None = None) -> str | None:
    """The FROM of a derived table's view: its file in every live batch, less the batches' dead runs (and only
    ``runs``, when given, skipping the batches that hold none of them).  None when no batch has the table."""
    from forensics.store import sql_string, sql_strings

    selects, clean = [], []
    wanted = None if runs is None else set(runs)
    for b in batches(store):
        rel = b.tables.get(table)
        if rel is None:
            continue
        if wanted is not None and not wanted & set(b.live):
            continue
        path = store.root / rel
        if not path.exists():
            raise StoreError(f"{path} is listed in the store's manifest but missing",
                             hint="run `forensics check` to see how to repair the store")
        if b.dead:
            selects.append(f"SELECT * FROM read_parquet({sql_string(str(path))}) "
                           f"WHERE run NOT IN ({sql_strings(sorted(b.dead))})")
        else:
            clean.append(str(path))
    if clean:
        selects.insert(0, f"SELECT * FROM read_parquet([{sql_strings(clean)}], union_by_name = true)")
    if not selects:
        return None
    return "(" + " UNION ALL BY NAME ".join(selects) + ")"

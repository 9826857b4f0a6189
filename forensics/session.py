"""An analysis session: one connection over some runs of a store, with the relations every finding reads, and
each finding's rows worked out once.

Every finding of the registry (``forensics.registry``) is computed through a session: ``Analysis.rows(name)``
runs the finding's named SQL (binding its parameters from the thresholds) over the session's runs, after the
findings it reads (``uses``) have been computed and registered as ``fx_<name>``.  The verdict, the report,
compare, watch and the CLI open one session and pass it along explicitly, so a finding they all need is
computed once.

Per run and cached.  Every finding is defined per run (its baselines and windows are partitioned by run), so
its rows for a set of runs are the union of its rows for each run.  ``rows`` keeps them per run in a
``FindingCache`` keyed by ``cache_key``: the finding, the run, the run's content (the store's part files of
that run: a part never changes once committed, so new content means new names) and the thresholds.  A run
found in the cache is not computed again; the others are computed together, set-based, in one query.  The
default cache lives as long as the session; a store-wide cache can be passed in.

Live requests (``forensics watch``): ``live`` gives the running requests' tokens and time so far; the
session's requests relation (``fx_live_requests``) shows them in place of the logged values, so early warning
applies the same rules to what runs now.  Such a session is never cached beyond itself.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Protocol

import duckdb
import polars as pl

from forensics import derived, schema
from forensics import runs as runs_mod
from forensics.errors import QueryError
from forensics.sql import load_query
from forensics.store import ArrowStream, Store, fetch_pl, run_of_part, sql_strings
from forensics.thresholds import DEFAULTS, Thresholds, thresholds  # noqa: F401  (the knobs' own module is light)

if TYPE_CHECKING:
    from forensics.registry import Finding

# The analysis version: bump it whenever a rule, a query or a derived column changes what the store's analysis
# holds (forensics.analyse), so that a store derived by an older project is derived again on first use.
VERSION = 19




class FindingCache(Protocol):
    """Where a session keeps each finding's rows per run (see ``cache_key``)."""

    def get(self, key: tuple[str, ...]) -> pl.DataFrame | None: ...

    def put(self, key: tuple[str, ...], rows: pl.DataFrame) -> None: ...


@dataclass
class MemoryCache:
    """A cache that lives as long as its session."""

    frames: dict[tuple[str, ...], pl.DataFrame] = field(default_factory=dict)

    def get(self, key: tuple[str, ...]) -> pl.DataFrame | None:
        return self.frames.get(key)

    def put(self, key: tuple[str, ...], rows: pl.DataFrame) -> None:
        self.frames[key] = rows


# The relations the session builds before a finding's query runs (see findings_base.sql).
EVENT_FIELDS = {"slot": "BIGINT", "task": "BIGINT", "error": "VARCHAR", "msg": "VARCHAR", "status": "BIGINT",
                "method": "VARCHAR", "n_ctx_train": "BIGINT", "role": "VARCHAR", "level": "VARCHAR",
                "http_path": "VARCHAR", "sim_lcp": "BIGINT"}
MATCH_COLUMNS = {"run": "VARCHAR", "item": "VARCHAR", "stage": "VARCHAR", "attempt": "BIGINT",
                 "instance": "VARCHAR", "slot": "BIGINT", "task": "BIGINT"}
REQUEST_KEYS = {"run": pl.String, "instance": pl.String, "slot": pl.Int64, "task": pl.Int64}
LIVE_SCHEMA = {**REQUEST_KEYS, "gen_tokens": pl.Int64, "total_ms": pl.Float64}
BASE_TABLES = ["requests", "instances", "matches", "events", "items"]


class Analysis:
    """One session over ``runs`` of ``store`` (see the module's docstring).  Open it with ``Analysis.open``."""

    def __init__(self, store: Store, runs: list[str], *, live: pl.DataFrame | None = None,
                 cache: FindingCache | None = None, stored: bool = True) -> None:
        self.store = store
        self.runs = runs
        self.live = live if live is not None and live.height else None
        # the rows the store's analysis holds (forensics.analyse) stand for the findings at the default
        # thresholds; a live session and the analysis itself compute them
        self.stored = StoredRows(self) if stored and self.live is None else None
        self.cache: FindingCache = cache if cache is not None and self.live is None else MemoryCache()
        self.con = store.connect(tables=[])
        self._bound: set[str] = set()
        self._base_runs: list[str] | None = None
        self._view_runs: list[str] | None = None
        self._content: dict[str, str] | None = None
        self.has_matches = "matches" in schema.TABLES and bool(store.parts("matches"))

    @classmethod
    @contextlib.contextmanager
    def open(cls, store: Store, runs: str | list[str] | tuple[str, ...] | None = None, *,
             live: pl.DataFrame | None = None, cache: FindingCache | None = None,
             stored: bool = True) -> Iterator[Analysis]:
        """A session over the runs ``runs`` names (all runs when none), closed on exit."""
        session = cls(store, runs_mod.resolve(store, runs).runs, live=live, cache=cache, stored=stored)
        try:
            yield session
        finally:
            session.close()

    def close(self) -> None:
        self.con.close()

    def narrowed(self, runs: str | list[str] | tuple[str, ...] | None) -> list[str]:
        """The runs of this session that ``runs`` names (all of them when none); a run outside it is an error."""
        if runs is None or (not isinstance(runs, str) and not runs):
            return self.runs
        wanted = runs_mod.resolve(self.store, runs).runs
        outside = [r for r in wanted if r not in self.runs]
        if outside:
            raise QueryError(f"run {outside[0]!r} is not in this analysis session",
                             hint="open the session over the runs you ask about")
        return wanted

    # ------------------------------------------------------------------ relations
    def bind(self, tables: list[str] | tuple[str, ...]) -> None:
        """Views of the store's ``tables`` on the session's connection (each bound once)."""
        todo = [t for t in tables if t not in self._bound]
        self.store.attach(self.con, todo)
        self._bound.update(todo)

    def register(self, name: str, df: pl.DataFrame) -> None:
        self.con.register(name, ArrowStream(df))

    def _relations(self, runs: list[str]) -> None:
        """fx_names, fx_instances, fx_matches, fx_events, fx_lost and fx_live_requests over ``runs``: the store's
        rows with each instance under the one name every output gives it (``instance_names.sql``: the manifest's
        server names; the store's id stays in ``instance_id``).  Cheap: only the names are computed here.  Plain
        joins and column lists: the same statements run on Spark."""
        if self._view_runs == runs:
            return
        self.bind([*BASE_TABLES, "runs", "attempts"])
        inlist = sql_strings(runs) if runs else "NULL"
        con = self.con
        con.execute("CREATE OR REPLACE TEMP TABLE fx_names AS " + load_query("instance_names").text.rstrip()
                    .removesuffix("ORDER BY run, instance"), {"runs": runs})
        con.execute("CREATE OR REPLACE TEMP VIEW fx_instances AS " + self._named("instances", f"t.run IN ({inlist})"))
        if self.has_matches:
            cols = ", ".join(f'CAST("{c}" AS {t}) AS "{c}"' for c, t in MATCH_COLUMNS.items())
            have_m = {c.name for c in schema.TABLES["matches"]}
            where = " AND coalesce(\"match\", 'matched') <> 'unmatched'" if "match" in have_m else ""
            con.execute(f"CREATE OR REPLACE TEMP VIEW fx_matches_raw AS SELECT {cols} FROM matches "
                        f"WHERE task IS NOT NULL AND run IN ({inlist}){where}")
            con.execute("CREATE OR REPLACE TEMP VIEW fx_matches AS " + self._named("fx_matches_raw", "true"))
        else:
            cols = ", ".join(f'CAST(NULL AS {t}) AS "{c}"' for c, t in MATCH_COLUMNS.items())
            con.execute(f"CREATE OR REPLACE TEMP VIEW fx_matches AS SELECT {cols}, CAST(NULL AS VARCHAR) AS instance_id "
                        "WHERE false")
        have = [r[0] for r in con.execute("DESCRIBE events").fetchall()]
        extra = "".join(f', CAST(NULL AS {t}) AS "{c}"' for c, t in EVENT_FIELDS.items() if c not in have)
        # a line without a wall-clock time of its own gets its instance's start plus its elapsed time, when the
        # instance was anchored (a manifest's launch time, the join): every time column is then wall clock
        # (the offset between its requests' wall-clock and elapsed starts, as the join or the manifest placed them)
        cols = ", ".join('coalesce(t.ts, to_timestamp(i.offset_s + t.elapsed_s)) AS "ts"' if c == "ts" else
                         f't."{c}"' for c in have)
        con.execute(f"CREATE OR REPLACE TEMP VIEW fx_events_raw AS SELECT {cols}{extra} FROM events t "
                    "LEFT JOIN (SELECT run, instance, median(epoch(t_start) - elapsed_start_s) AS offset_s "
                    "FROM requests WHERE t_start IS NOT NULL AND elapsed_start_s IS NOT NULL GROUP BY run, instance) i "
                    f"ON i.run = t.run AND i.instance = t.instance WHERE t.run IN ({inlist})")
        con.execute("CREATE OR REPLACE TEMP VIEW fx_events AS " + self._named("fx_events_raw", "true"))
        con.execute("CREATE OR REPLACE TEMP VIEW fx_lost AS SELECT DISTINCT run, item, stage FROM items "
                    f"WHERE NOT coalesce(done, false) AND run IN ({inlist})")
        self._live_requests(inlist)
        self._view_runs = list(runs)

    def _named(self, relation: str, where: str) -> str:
        """``relation``'s rows with ``instance`` the instance's one name (fx_names) and ``instance_id`` its id."""
        cols = [r[0] for r in self.con.execute(f"DESCRIBE {relation}").fetchall()]
        picked = ", ".join("coalesce(n.name, t.instance) AS instance" if c == "instance" else f't."{c}"'
                           for c in cols if c != "instance_id")
        return (f"SELECT {picked}, t.instance AS instance_id FROM {relation} t LEFT JOIN fx_names n "
                f"ON n.run = t.run AND n.instance = t.instance WHERE {where}")

    def _base(self, runs: list[str]) -> None:
        """fx_requests (a temporary table: every finding reads it several times) and fx_degenerate for ``runs``."""
        self._relations(runs)
        if self._base_runs == runs:
            return
        self.bind(["attempts"])
        if self.stored is not None and self.stored.has("request_facts", runs):  # worked out at ingest
            self.bind(["request_facts"])
            self.con.execute("CREATE OR REPLACE TEMP TABLE fx_requests AS SELECT * FROM request_facts "
                             "WHERE run IN (SELECT unnest($runs))", {"runs": runs})
        else:
            self.con.execute(load_query("findings_base").text, {"runs": runs})
        self.register("fx_degenerate", self._degenerate())
        self._base_runs = list(runs)

    def _live_requests(self, inlist: str) -> None:
        """fx_live_requests: the requests of the runs (instances named), with the running ones' tokens and duration
        so far when live."""
        con = self.con
        if self.live is None:
            con.execute(f"CREATE OR REPLACE TEMP VIEW fx_requests_raw AS SELECT * FROM requests WHERE run IN ({inlist})")
        else:
            self.register("fx_live", self.live.select(*LIVE_SCHEMA).cast(LIVE_SCHEMA))  # type: ignore[arg-type]
            cols = [r[0] for r in con.execute("DESCRIBE requests").fetchall()]
            picked = ", ".join(f"CASE WHEN l.task IS NULL THEN r.{c} ELSE l.{c} END AS {c}" if c in ("gen_tokens",
                               "total_ms") else f'r."{c}"' for c in cols)
            con.execute(f"CREATE OR REPLACE TEMP VIEW fx_requests_raw AS SELECT {picked} FROM requests r "
                        "LEFT JOIN fx_live l ON l.run = r.run AND l.instance = r.instance AND l.slot = r.slot "
                        f"AND l.task = r.task WHERE r.run IN ({inlist})")
        con.execute("CREATE OR REPLACE TEMP VIEW fx_live_requests AS " + self._named("fx_requests_raw", "true"))

    def _degenerate(self) -> pl.DataFrame:
        """Matched requests whose attempt's output text is degenerate (repetition.py)."""
        from forensics.repetition import score_texts

        empty = pl.DataFrame(schema={**REQUEST_KEYS, "degenerate": pl.Boolean})
        if not self.has_matches:
            return empty
        texts = fetch_pl(self.con, "SELECT m.run, m.instance, m.slot, m.task, a.output_text FROM fx_matches m "
                                   "JOIN attempts a USING (run, item, stage, attempt) WHERE a.output_text IS NOT NULL")
        if texts.height == 0:
            return empty
        return score_texts(texts).filter(pl.col("degenerate")).select(*REQUEST_KEYS, "degenerate")

    # ------------------------------------------------------------------ findings
    def content_key(self, run: str) -> str:
        """What the run's rows are: a digest of the store's part files of that run (names never reused)."""
        if self._content is None:
            by_run: dict[str, list[str]] = {}
            for table in schema.TABLES:
                for rel in self.store.parts(table):
                    by_run.setdefault(run_of_part(rel) or "", []).append(rel)
            self._content = {r: hashlib.sha1("\n".join(sorted(v)).encode()).hexdigest()[:16]
                             for r, v in by_run.items()}
        return self._content.get(run, "empty")

    def cache_key(self, finding: Finding, run: str, th: Thresholds) -> tuple[str, ...]:
        return (finding.name, finding.version, run, self.content_key(run), th.digest())

    def rows(self, name: str, th: Thresholds = DEFAULTS, runs: list[str] | None = None) -> pl.DataFrame:
        """The finding ``name``'s rows for ``runs`` (default: the session's), from the cache where it has them."""
        from forensics.registry import finding

        f = finding(name)
        runs = self.runs if runs is None else runs
        if self.stored is not None and th == DEFAULTS:
            got = self.stored.rows(f.name, runs)
            if got is not None:
                return got
        have: dict[str, pl.DataFrame] = {}
        for run in runs:
            got = self.cache.get(self.cache_key(f, run, th))
            if got is not None:
                have[run] = got
        todo = [r for r in runs if r not in have]
        if todo:
            fresh = self._compute(f, th, todo)
            parts = fresh.partition_by("run", as_dict=True) if fresh.height else {}
            empty = fresh.clear()
            for run in todo:
                part = parts.get((run,), empty)
                self.cache.put(self.cache_key(f, run, th), part)
                have[run] = part
        frames = [have[r] for r in runs if have[r].height]
        return pl.concat(frames, how="vertical_relaxed") if frames else self._empty(f, th, have, runs)

    def _empty(self, f: Finding, th: Thresholds, have: dict[str, pl.DataFrame], runs: list[str]) -> pl.DataFrame:
        if runs:
            return have[runs[0]].clear()
        return self._compute(f, th, []).clear()

    def prepare(self, runs: list[str] | None = None, *, requests: bool = True) -> None:
        """Build the relations a query over ``runs`` reads (fx_requests too, unless ``requests`` is false)."""
        runs = self.runs if runs is None else runs
        if requests:
            self._base(runs)
        else:
            self._relations(runs)

    def _compute(self, f: Finding, th: Thresholds, runs: list[str]) -> pl.DataFrame:
        for dep in f.uses:
            self.register(f"fx_{dep}", self.rows(dep, th, runs))
        self.bind(f.tables)
        self.prepare(runs, requests=f.reads_requests)
        df = self.query(f.query, th, runs, directory=f.sql_dir) if f.query else pl.DataFrame()
        return f.shape(df, self, th) if f.shape is not None else df

    def query(self, name: str, th: Thresholds = DEFAULTS, runs: list[str] | None = None, *,
              directory: object = None) -> pl.DataFrame:
        """The named query ``name`` over the session, its ``$parameters`` bound from the thresholds and the
        session (``$runs``, ``$has_matches``)."""
        q = load_query(name, directory)
        values: dict[str, object] = {**asdict(th), "runs": self.runs if runs is None else runs,
                                     "has_matches": self.has_matches}
        missing = sorted(q.params - set(values))
        if missing:
            raise QueryError(f"query {name} binds ${missing[0]}, which no threshold provides",
                             hint="add it to Thresholds or rename the parameter")
        try:
            return fetch_pl(self.con, q.text, {k: values[k] for k in q.params})
        except duckdb.Error as exc:
            raise QueryError(f"query {name} failed: {str(exc).splitlines()[0]}",
                             hint="the store may come from another version; re-ingest it") from exc


class StoredRows:
    """The findings' rows a store's analysis holds (``forensics.derived``), for the runs it has derived at this
    ``VERSION``: one scan of the finding's table per question."""

    def __init__(self, session: Analysis) -> None:
        self.session = session
        self.store = session.store
        self._state: derived.DerivedState | None = None

    def current(self, runs: list[str]) -> bool:
        if self._state is None:
            self._state = derived.state(self.store)
        return not self._state.needs(runs, VERSION)

    def has(self, table: str, runs: list[str]) -> bool:
        """The derived ``table`` holds the rows of every run of ``runs`` at this version."""
        return self.current(runs) and self._state is not None and table in self._state.tables

    def rows(self, name: str, runs: list[str]) -> pl.DataFrame | None:
        """The finding's stored rows of ``runs`` (None when some of them are not derived at this version)."""
        table = f"finding_{name}"
        if not self.has(table, runs):
            return None
        self.session.bind([table])
        if set(runs) >= set(self._state.analysed if self._state else ()):  # every run: no filter to apply
            return fetch_pl(self.session.con, f"SELECT * FROM {table}")
        return fetch_pl(self.session.con, f"SELECT * FROM {table} WHERE run IN (SELECT unnest($runs))", {"runs": runs})


def read_derived(store: Store, table: str, runs: list[str] | None) -> pl.DataFrame:
    """A derived table's rows of ``runs`` (None: every run), in the order they were stored (by run).  Read in this
    process whatever the store's engine: the analysis's tables are small, and reading them computes nothing."""
    con = store.connect(tables=[table], local=True)
    try:
        if runs is None:
            return fetch_pl(con, f"SELECT * FROM {table}")
        return fetch_pl(con, f"SELECT * FROM {table} WHERE run IN (SELECT unnest($runs))", {"runs": runs})
    finally:
        con.close()


@contextlib.contextmanager
def analysis(source: Store | Analysis, runs: str | list[str] | tuple[str, ...] | None = None) -> Iterator[Analysis]:
    """The session to compute with: ``source`` itself when it is one, else a new session over ``runs``."""
    if isinstance(source, Analysis):
        yield source
        return
    with Analysis.open(source, runs) as session:
        yield session

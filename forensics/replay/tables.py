"""The replay listings: ``runs_table`` (``forensics runs``) and ``missing`` (``forensics missing RUN``).

Both run named SQL (``forensics/queries/replay_runs.sql``, ``missing.sql``) over the store's views plus
the join computed here (``replay_matches``, ``replay_requests``), so they work whether or not the store
holds server logs.
"""

from __future__ import annotations

from typing import Any

import duckdb
import polars as pl

from forensics import schema
from forensics.sql import load_query
from forensics.store import fetch_pl, view_names


def _connect(store: Any, also: tuple[str, ...] = ()) -> duckdb.DuckDBPyConnection:
    """The store's views plus the join's ``replay_matches`` and ``replay_requests``: read from the store when
    the last ingest stored what the join found (the ``matches`` table, ``requests.replay_run``), else computed
    now (a store written before the join stored it, or one whose join could not rewrite every log).  ``also``
    names further store tables the caller's query reads."""
    con = store.connect(tables=["runs", "attempts", "items", "matches", "requests", *also])
    bind_join(con, store)
    return con


def bind_join(con: duckdb.DuckDBPyConnection, store: Any) -> None:
    """``replay_matches`` and ``replay_requests`` on ``con`` (which has the store's ``matches`` and ``requests``
    views when they exist): the stored join when the last ingest stored it, else the join worked out now."""
    if store.meta("join_stored") and not store.meta("join_pending"):
        have = view_names(con)
        for name, table in (("replay_matches", "matches"), ("replay_requests", "requests")):
            if table in have:
                con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM {table}")
            else:
                con.register(name, schema.empty(table).to_arrow())
        return
    from forensics.replay.join import join_store

    jr = join_store(store)
    con.register("replay_matches", jr.matches.to_arrow())
    con.register("replay_requests", jr.requests.to_arrow())


def runs_table(store: Any, runs: list[str] | None = None) -> pl.DataFrame:
    """One row per replay run (those of ``runs`` when given): run, alias, np, items_expected, items_done,
    items_missing, attempts, requests, wall_s, ended, from (records, or summary for a run read from a
    benchmark's summary alone): as the store's analysis holds them (``run_records``), else worked out."""
    from forensics import derived
    from forensics import runs as runs_mod
    from forensics.session import VERSION, read_derived

    names = runs_mod.resolve(store, runs).runs
    if not derived.state(store).needs(names, VERSION) and names:
        got = read_derived(store, "run_records", names)
        return got.filter(pl.col("listed")).drop("listed").sort("run")
    con = _connect(store)
    try:
        return runs_rows(con, names).filter(pl.col("listed")).drop("listed")
    finally:
        con.close()


def runs_rows(con: duckdb.DuckDBPyConnection, runs: list[str]) -> pl.DataFrame:
    """replay_runs.sql for ``runs`` on a connection with the store's views and the join's relations; every run
    of ``runs`` gets a row (``listed``: the run has replay records, a manifest or items: what ``forensics runs``
    lists), so the analysis stores one per run."""
    got = fetch_pl(con, load_query("replay_runs").text, {"runs": runs})
    every = pl.DataFrame({"run": runs}, schema={"run": pl.String})
    return every.join(got.with_columns(pl.lit(True).alias("listed")), on="run", how="left").with_columns(
        pl.col("listed").fill_null(False))


def missing(store: Any, run: str) -> pl.DataFrame:
    """Every expected item x stage of ``run`` that did not finish ok: item, stage, reason, detail,
    evidence.  Raises NotFoundError naming the known runs when ``run`` is unknown, or has no records."""
    from forensics import runs

    name = runs.resolve(store, [run], need="records", command="missing").runs[0]
    con = _connect(store)
    try:
        return fetch_pl(con, load_query("missing").text, {"run": name})
    finally:
        con.close()

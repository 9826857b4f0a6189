"""Run names: which runs the store holds, and which runs a command was asked about.

Every command and every library function that takes runs resolves them here, so they all behave the same:
no run named means every run (or, for a command about one run, the store's only run: with several, a one-line
error listing them); a name the store does not know is a one-line error listing the runs it does; a run asked
for by the id its replay records carry (its alias) is found under the name it is stored as, with a note; in a
fleet of stores, a run named without its host is the run of that name on the one host that has it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb

from forensics.errors import NotFoundError
from forensics.store import Store, view_names

RUN_TABLES = ("requests", "events", "attempts", "runs")  # a run is known when it has rows in one of these
LISTED = 12  # runs named in a one-line message before "… and N more"


def all_runs(store: Store | duckdb.DuckDBPyConnection) -> list[str]:
    """The runs with rows in requests, events, attempts or runs, sorted.  From the store's manifest when the
    names allow it (no file opened), else through the views."""
    if isinstance(store, Store):
        names = store.run_names(list(RUN_TABLES))
        if names is not None:
            return names
        con = store.connect(tables=list(RUN_TABLES))
        try:
            return _from_views(con)
        finally:
            con.close()
    return _from_views(store)


def _from_views(con: duckdb.DuckDBPyConnection) -> list[str]:
    have = view_names(con)
    tables = [t for t in RUN_TABLES if t in have]
    if not tables:
        return []
    union = " UNION ALL ".join(f"SELECT run FROM {t}" for t in tables)
    rows = con.execute(f"SELECT DISTINCT run FROM ({union}) WHERE run IS NOT NULL ORDER BY run").fetchall()
    return [r[0] for r in rows]


def run_list(known: list[str], limit: int = LISTED) -> str:
    """The store's runs for a one-line message: the first few, then how many more."""
    if not known:
        return "none; run `forensics ingest` first"
    more = f" … and {len(known) - limit} more (`forensics runs`)" if len(known) > limit else ""
    return ", ".join(known[:limit]) + more


@dataclass
class Asked:
    """The runs a command reads, and what the user should know about how they were found."""

    runs: list[str]
    notes: list[str] = field(default_factory=list)


def resolve(store: Store | duckdb.DuckDBPyConnection, runs: str | Sequence[str] | None, *, one: bool = False,
            need: str | None = None, command: str = "") -> Asked:
    """The runs ``runs`` names, checked against the store.

    None or empty: every run, or with ``one`` the store's only run.  ``need`` (``requests``, ``log`` or
    ``records``, with a Store): each run must have that half, and an alias resolves to its run."""
    known = all_runs(store)
    wanted = [runs] if isinstance(runs, str) else list(dict.fromkeys(runs or []))
    if not wanted:
        if not one or len(known) == 1:
            return Asked(known)
        raise NotFoundError("name a run: the store has " + (f"{len(known)} runs" if known else "no run"),
                            hint=f"runs: {run_list(known)}")
    asked, have = Asked([]), set(known)  # a set: a summary names every one of 10,000 runs
    for name in wanted:
        run = name = _on_its_host(store, name, known)
        if need is not None and isinstance(store, Store):
            run = _checked(store, name, need, command, asked.notes)
        if run not in have:
            raise NotFoundError(f"no run {name!r} in the store", hint=f"runs: {run_list(known)}")
        asked.runs.append(run)
    asked.runs = list(dict.fromkeys(asked.runs))
    return asked


def _on_its_host(store: Store | duckdb.DuckDBPyConnection, name: str, known: list[str]) -> str:
    """In a fleet, a run named without its host (``dead-slot`` for ``sA:dead-slot``) when one host only has a
    run of that name; a name the fleet knows as given, or any name outside a fleet, stays as it is."""
    from forensics.fleet import Fleet, qualified

    if not isinstance(store, Fleet) or name in known:
        return name
    have = set(known)
    hosts = [qualified(h, name) for h in store.hosts if qualified(h, name) in have]
    if len(hosts) > 1:
        raise NotFoundError(f"run {name!r} is on {len(hosts)} hosts: {', '.join(hosts)}",
                            hint="name it with its host: HOST:RUN")
    return hosts[0] if hosts else name


def _checked(store: Store, name: str, need: str, command: str, notes: list[str]) -> str:
    from forensics.replay.identity import check_run  # the records' aliases: read only when a command asks

    check: Any = check_run(store, name, need=need, command=command)
    notes.extend(check.notes)
    return str(check.run)

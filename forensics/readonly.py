"""A store opened read-only, and SQL over it that can only read it (``forensics mcp``, ``run_sql``'s limits).

``ReadOnlyStore`` is a ``Store`` that refuses every write: it never takes the store's lock, never starts a
transaction, never writes its manifest.  Nothing is derived through it (``forensics.analyse.ensure`` needs the
lock): a run whose analysis is missing or out of date is worked out in memory, the way a command does while an
ingest holds the store.

``guard`` turns a connection ``Store.connect`` opened into one for a stranger's SQL: one SELECT statement only,
DuckDB's external access off (files only under the store's own folder, which the views read), its settings
locked, at most ``max_rows`` rows back and interrupted after ``timeout_s`` seconds.

Library only: no click, no altair.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from forensics.errors import QueryError, StoreError
from forensics.store import Store

READ_ONLY_HINT = "this store was opened read-only (forensics mcp): run `forensics ingest` or `forensics check` " \
                 "from a shell to change it"


class ReadOnlyStore(Store):
    """A store that can be read and never written (see the module's docstring)."""

    def __init__(self, root: Path | str) -> None:
        super().__init__(root, create=False)

    def _init(self) -> None:
        raise StoreError(f"no store at {self.root}", hint=READ_ONLY_HINT)

    @staticmethod
    def _write_json(path: Path, data: Any) -> None:
        raise StoreError(f"refused to write {path.name}", hint=READ_ONLY_HINT)

    @contextlib.contextmanager
    def lock(self, *, wait: bool = True, on_wait: Any = None) -> Iterator[None]:
        raise StoreError(f"{self.root} is read-only here", hint=READ_ONLY_HINT)
        yield  # a generator, as the base's: the raise above always wins

    def transaction(self) -> Any:
        raise StoreError(f"{self.root} is read-only here", hint=READ_ONLY_HINT)


@dataclass(frozen=True)
class SqlLimits:
    """What a guarded query may do: rows back, seconds of work."""

    max_rows: int = 1000
    timeout_s: float = 20.0


@dataclass
class Guarded:
    """A guarded query's rows (at most ``max_rows``) and whether there were more."""

    rows: Any  # pl.DataFrame
    truncated: bool


def check_select(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """One SELECT statement (WITH, VALUES, FROM-first, DESCRIBE, SUMMARIZE included), else a QueryError."""
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as exc:
        raise QueryError(str(exc).splitlines()[0], hint="check the SQL") from exc
    if len(statements) != 1:
        raise QueryError(f"one statement at a time, got {len(statements)}", hint="send one SELECT")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise QueryError(f"only SELECT is allowed here, got {kind.name}",
                         hint="the store is read-only: ask with SELECT (WITH ... SELECT, DESCRIBE and SUMMARIZE too)")


def lock_down(con: duckdb.DuckDBPyConnection, roots: list[Path]) -> None:
    """No file outside ``roots`` (the store's folders, which its views read), no network, no extension loads,
    and no setting changed afterwards."""
    allowed = ", ".join("'" + str(r.resolve()).replace("'", "''") + "/'" for r in roots)
    con.execute(f"SET allowed_directories = [{allowed}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET lock_configuration = true")


def guarded(con: duckdb.DuckDBPyConnection, query: str, roots: list[Path], limits: SqlLimits) -> Guarded:
    """``query`` on ``con`` (``Store.connect``'s, views bound) under ``limits``, after ``lock_down``."""
    import polars as pl

    check_select(con, query)
    lock_down(con, roots)
    timer = threading.Timer(limits.timeout_s, con.interrupt)
    timer.start()
    try:
        rel = con.sql(query)
        df = pl.DataFrame(rel.limit(limits.max_rows + 1)).rechunk() if rel is not None else pl.DataFrame()
    except duckdb.InterruptException as exc:
        raise QueryError(f"the query ran past {limits.timeout_s:g} s and was stopped",
                         hint="narrow it (a WHERE on run, a LIMIT)") from exc
    finally:
        timer.cancel()
    return Guarded(df.head(limits.max_rows), df.height > limits.max_rows)


def store_roots(store: Any) -> list[Path]:
    """The folders of a store (a fleet's members' too)."""
    from forensics.fleet import members_of

    return [member.root for _host, member in members_of(store)]

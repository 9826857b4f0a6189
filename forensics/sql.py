"""Named SQL: one ``.sql`` file per query in ``forensics/queries/``, with a header comment.

The header is the leading block of ``--`` comment lines: what the query finds and its parameters.
Values always reach a query as bound parameters (``$name``), never formatted into its text.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forensics.errors import QueryError

if TYPE_CHECKING:
    import polars as pl

    from forensics.readonly import Guarded, SqlLimits

QUERIES_DIR = Path(__file__).resolve().parent / "queries"


@dataclass(frozen=True)
class Query:
    name: str
    text: str
    header: str  # the leading comment block, without the ``--`` markers

    @cached_property
    def params(self) -> frozenset[str]:
        """The ``$name`` parameters the query's text binds (its comments left out)."""
        import regex

        body = "\n".join(line.split("--", 1)[0] for line in self.text.splitlines())
        return frozenset(regex.findall(r"\$([A-Za-z_][A-Za-z0-9_]*)", body))


@cache
def load_query(name: str, directory: Path | None = None) -> Query:
    """The query ``<name>.sql`` of ``directory`` (default ``forensics/queries/``) with its header comment."""
    path = (directory or QUERIES_DIR) / f"{name}.sql"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise QueryError(f"no named query {name!r}", path=str(path),
                         hint="the package is incomplete; reinstall it") from exc
    header = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        header.append(line[2:].removeprefix(" "))
    return Query(name, text, "\n".join(header).strip())


def run_sql(store: Any, query: str, limits: SqlLimits | None = None) -> pl.DataFrame:
    """A user's SQL ``query`` over every table of ``store``, as a polars DataFrame; a DuckDB error is a
    QueryError with its first line.  With ``limits`` (``forensics mcp``): one SELECT only, no file outside the
    store, at most ``limits.max_rows`` rows and ``limits.timeout_s`` seconds (``forensics.readonly.guarded``)."""
    return run_sql_limited(store, query, limits).rows


def run_sql_limited(store: Any, query: str, limits: SqlLimits | None = None) -> Guarded:
    """``run_sql``, saying too whether ``limits.max_rows`` cut the rows."""
    import duckdb

    from forensics.readonly import Guarded, guarded, store_roots
    from forensics.store import fetch_pl, view_names

    con = store.connect()
    try:
        if limits is None:
            return Guarded(fetch_pl(con, query), False)
        return guarded(con, query, store_roots(store), limits)
    except duckdb.Error as exc:
        raise QueryError(str(exc).splitlines()[0],
                         hint="check the SQL; tables: " + ", ".join(sorted(view_names(con)))) from exc
    finally:
        con.close()

"""Mapping expressions: DuckDB SQL over the records of one data file.

A mapping field may be ``{ sql = "..." }`` and a section may have ``where = "..."``: expressions over the
record's fields, written as DuckDB SQL (``error.code`` is a nested field, ``"request_goodput:"`` a key that
needs quoting).  Every expression of a section is evaluated in one query over all the file's records:
the records are handed to DuckDB as JSON and typed by the structure of all of them together.

A field an expression names that no record has reads as null (one file of a tool has ``error`` objects,
another release omits the key); the caller decides whether that is an error (an expression none of whose
fields exist reads nothing from this file).  ``"$index"``, ``"$number"``, ``"$source"``, ``"$line"`` (the
record) and ``"$stem"``, ``"$name"``, ``"$parent"`` (the data file) are columns too.

Mappings are shared, so an expression is untrusted code: it may read its record's fields and nothing else.
Two walls keep it there.  When the mapping loads, an expression that names a table, a table function other
than the few that read a value of the record (``unnest``, ``json_each``, ...) or a function that reports on
the host (``getenv``, ``current_setting``) is refused, naming what it reached for.  And every expression runs
on a connection (``sandbox``) with external access off, no temp directory (DuckDB always lets a connection read
its own), no extension loading, no Python variables as tables and the configuration locked, under a memory and
a time limit: what the first wall misses the second refuses (``Permission Error``).
"""

from __future__ import annotations

import functools
import json
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import duckdb
import polars as pl

SPECIAL_COLUMNS = ("$index", "$number", "$source", "$line", "$stem", "$name", "$parent")
Path_ = tuple[str, ...]
# Table functions that read a value of the record (a list, a JSON text) or count: the only ones an expression
# may name.  Every other table function reads files, the catalog, settings or secrets.
RECORD_TABLE_FUNCTIONS = frozenset({"unnest", "generate_series", "range", "json_each", "json_tree"})
# Scalar functions that tell about the host or stall the ingest.
HOST_FUNCTIONS = frozenset({"getenv", "current_setting", "pg_sleep", "sleep_ms"})
SANDBOX_CONFIG: dict[str, str | bool] = {
    "enable_external_access": False,  # no file, URL, database, extension directory or secret store
    "temp_directory": "",  # DuckDB always allows its temp directory (./.tmp) even with external access off
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "python_enable_replacements": False,  # a Python variable of the caller is not a table
    "allow_persistent_secrets": False,  # no secret store on disk to list or read
    "memory_limit": "2GB",
}
TIME_LIMIT_S = 300.0  # one section's expressions over one file; real files take well under a second


class ExpressionError(ValueError):
    """An expression DuckDB cannot parse, one that is not a single expression, or one that reaches outside
    its record."""


class Refused(ExpressionError):
    """An expression that reaches outside its record (a file, a table, the host's settings)."""


def sandbox() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection that can reach nothing outside what is registered on it (see the module
    docstring); its configuration is locked, so no expression can turn that off."""
    con = duckdb.connect(config=dict(SANDBOX_CONFIG))
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET lock_configuration = true")
    return con


@functools.cache
def field_refs(expr: str) -> tuple[Path_, ...]:
    """The field paths ``expr`` reads (``error.code`` -> ("error", "code")), lambda parameters left out.

    Raises ExpressionError with DuckDB's message when ``expr`` is not one valid SQL expression, and
    Refused when it names a table, a file-reading table function or a host function."""
    con = sandbox()
    try:
        text = con.execute("SELECT json_serialize_sql($q)", {"q": f"SELECT {expr}"}).fetchone()
    finally:
        con.close()
    tree: dict[str, Any] = json.loads(text[0]) if text else {"error": True, "error_message": "no result"}
    if tree.get("error"):
        raise ExpressionError(str(tree.get("error_message", "not valid SQL")).splitlines()[0])
    stmts = tree.get("statements", [])
    node = stmts[0].get("node", {}) if len(stmts) == 1 else {}
    if len(node.get("select_list", [])) != 1 or node.get("from_table", {}).get("type") != "EMPTY" \
            or node.get("where_clause") is not None:
        raise ExpressionError("write one SQL expression (no commas at the top level, no FROM or WHERE)")
    reach = _outside_reach(node["select_list"][0])
    if reach:
        raise Refused(f"{reach} reaches outside the record")
    refs: list[Path_] = []
    _walk(node["select_list"][0], frozenset(), refs)
    return tuple(dict.fromkeys(refs))


def _outside_reach(node: Any) -> str:
    """What in the expression's tree reads beyond the record ("read_text(...)", "table t"), or ""."""
    if isinstance(node, list):
        return next((r for r in map(_outside_reach, node) if r), "")
    if not isinstance(node, dict):
        return ""
    kind = node.get("type")
    if kind == "BASE_TABLE":
        return f"table {node.get('table_name')!r}"
    if kind == "TABLE_FUNCTION":
        name = str((node.get("function") or {}).get("function_name", "")).lower()
        if name not in RECORD_TABLE_FUNCTIONS:
            return f"{name}(...)"
    if node.get("class") == "FUNCTION" and str(node.get("function_name", "")).lower() in HOST_FUNCTIONS:
        return f"{node['function_name']}(...)"
    return next((r for r in map(_outside_reach, node.values()) if r), "")


def _walk(node: Any, bound: frozenset[str], refs: list[Path_]) -> None:
    if isinstance(node, list):
        for x in node:
            _walk(x, bound, refs)
        return
    if not isinstance(node, dict):
        return
    cls = node.get("class")
    if cls == "LAMBDA":
        params: list[Path_] = []
        _walk(node.get("lhs"), frozenset(), params)
        _walk(node.get("expr"), bound | {p[0] for p in params}, refs)
        return
    if cls == "COLUMN_REF":
        names = tuple(node.get("column_names", ()))
        if names and names[0] not in bound:
            refs.append(names)
        return
    for v in node.values():
        _walk(v, bound, refs)


@dataclass
class Evaluated:
    """Per-record results: ``values[name][i]`` for record i, ``keep[i]`` from the ``where`` filter (all True
    without one), and the referenced fields no record has."""

    values: dict[str, list[Any]]
    keep: list[bool]
    absent: set[Path_]


def evaluate(exprs: dict[str, str], where: str | None, objs: Sequence[Any],
             lookup: Callable[[Any, str], Any], specials: dict[str, list[Any]]) -> Evaluated:
    """Evaluate ``exprs`` (name -> SQL) and ``where`` over ``objs`` in one DuckDB query.

    ``lookup(obj, key)`` reads a top-level field of a record (a missing one is any non-JSON sentinel);
    ``specials`` gives the ``$...`` columns, one value per record.  Raises ExpressionError naming the
    expression DuckDB rejects."""
    every = dict(exprs)
    if where is not None:
        every["$where"] = where
    refs = {r for e in every.values() for r in field_refs(e) if r[0] not in SPECIAL_COLUMNS}
    top = sorted({r[0] for r in refs})
    texts = [_json_row(obj, top, lookup) for obj in objs]
    frame = pl.DataFrame({"j": texts, **{k: v for k, v in specials.items()}},
                         schema_overrides={"j": pl.String})
    con = sandbox()
    try:
        con.register("records", frame)
        structure = _structure(con) if top else {}
        absent = {r for r in refs if not _has(structure, r)}
        for r in absent:
            _add(structure, r)
        unpacked = f"unnest(json_transform(j, '{_sql_text(json.dumps(structure))}'))," if structure else ""
        specials_sql = ", ".join(f'"{k}"' for k in specials) or "1 AS \"$none\""
        selects = ", ".join(f"(\n{e}\n) AS \"{_sql_ident(n)}\"" for n, e in every.items())
        sql = f"SELECT {selects} FROM (SELECT {unpacked} {specials_sql} FROM records)"
        try:
            rows = _timed(con, sql)
        except duckdb.Error as exc:
            raise _failure(_which(con, every, unpacked, specials_sql, exc), exc) from None
    finally:
        con.close()
    names = list(every)
    cols = {n: [_plain(r[i]) for r in rows] for i, n in enumerate(names)}
    keep = [bool(v) for v in cols.pop("$where")] if where is not None else [True] * len(rows)
    return Evaluated(cols, keep, absent)


def evaluate_texts(exprs: dict[str, str], where: str | None, texts: pl.Series, specials: dict[str, Any]
                   ) -> tuple[pl.DataFrame, set[Path_]]:
    """Evaluate ``exprs`` (name -> SQL) and ``where`` over records given as JSON texts, in one DuckDB query, and
    return a frame (a column per expression, ``$where`` among them, and the ``specials`` columns) with the
    referenced fields no record has.  Texts that are not JSON are left out.  Nothing here loops over records
    in Python: an event stream of any length is read in bulk."""
    every = dict(exprs)
    if where is not None:
        every["$where"] = where
    refs = {r for e in every.values() for r in field_refs(e) if r[0] not in SPECIAL_COLUMNS}
    frame = pl.DataFrame({"j": texts, **specials}, schema_overrides={"j": pl.String})
    con = sandbox()
    try:
        con.register("records", frame)
        structure = _structure(con) if refs else {}
        absent = {r for r in refs if not _has(structure, r)}
        for r in absent:
            _add(structure, r)
        unpacked = f"unnest(json_transform(j, '{_sql_text(json.dumps(structure))}'))," if structure else ""
        specials_sql = ", ".join(f'"{k}"' for k in specials) or "1 AS \"$none\""
        selects = ", ".join(f"(\n{e}\n) AS \"{_sql_ident(n)}\"" for n, e in every.items())
        inner = f"SELECT {unpacked} {specials_sql} FROM records WHERE json_valid(j)"
        try:
            out = _timed(con, f"SELECT {selects}, {specials_sql} FROM ({inner})", frame=True)
        except duckdb.Error as exc:
            raise _failure(_which(con, every, unpacked, specials_sql, exc), exc) from None
    finally:
        con.close()
    return out, absent


def _timed(con: duckdb.DuckDBPyConnection, sql: str, *, frame: bool = False) -> Any:
    """The query's rows (a polars frame with ``frame``); interrupted after TIME_LIMIT_S (an expression that
    never ends is a bad mapping)."""
    timer = threading.Timer(TIME_LIMIT_S, con.interrupt)
    timer.start()
    try:
        if frame:  # through the Arrow C stream interface, without loading pyarrow
            rel = con.sql(sql)
            return pl.DataFrame(rel).rechunk() if rel is not None else pl.DataFrame()
        return con.execute(sql).fetchall()
    finally:
        timer.cancel()


def _failure(message: str, exc: duckdb.Error) -> ExpressionError:
    if isinstance(exc, duckdb.PermissionException):
        return Refused(message)
    if isinstance(exc, duckdb.InterruptException):
        return ExpressionError(f"stopped after {TIME_LIMIT_S:g} s: the expressions did not finish")
    return ExpressionError(message)


def _which(con: duckdb.DuckDBPyConnection, every: dict[str, str], unpacked: str, specials_sql: str,
           exc: duckdb.Error) -> str:
    """Name the expression that failed, with DuckDB's first line."""
    for name, expr in every.items():
        try:
            con.execute(f"SELECT (\n{expr}\n) FROM (SELECT {unpacked} {specials_sql} FROM records) LIMIT 0")
        except duckdb.Error as one:
            return f"{name}: {str(one).splitlines()[0]}"
    return str(exc).splitlines()[0]


def _json_row(obj: Any, top: list[str], lookup: Callable[[Any, str], Any]) -> str:
    row = {}
    for k in top:
        v = lookup(obj, k)
        if _is_json_value(v):
            row[k] = v
    text = json.dumps(row, default=str)
    if "NaN" in text or "Infinity" in text:  # not JSON: DuckDB would reject the row
        text = json.dumps(_finite(row), default=str)
    return text


def _is_json_value(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool, list, dict))


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def _structure(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    rows = con.execute("SELECT json_group_structure(j::JSON) FROM records WHERE json_valid(j)").fetchall()
    row = rows[0] if rows else None
    value = json.loads(row[0]) if row and row[0] else {}
    return value if isinstance(value, dict) else {}


def _has(structure: Any, path: Path_) -> bool:
    """Whether some record has ``path`` (a key that is always null counts; a key below it does not)."""
    node = structure
    for i, part in enumerate(path):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
        if node == "NULL" and i < len(path) - 1:
            return False
    return True


def _add(structure: dict[str, Any], path: Path_) -> None:
    """Give ``structure`` a null leaf at ``path`` (a key all-null so far becomes an object)."""
    node = structure
    for part in path[:-1]:
        nxt = node.get(part)
        if nxt is None or nxt == "NULL":
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            return  # a scalar or list: DuckDB will say the path does not apply
        node = nxt
    node.setdefault(path[-1], "NULL")


def _sql_text(s: str) -> str:
    return s.replace("'", "''")


def _sql_ident(s: str) -> str:
    return s.replace('"', '""')


def _plain(v: Any) -> Any:
    if isinstance(v, Decimal):
        return float(v)
    return v

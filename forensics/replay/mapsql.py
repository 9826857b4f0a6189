"""Mapping expressions: DuckDB SQL over the records of one data file.

A mapping field may be ``{ sql = "..." }`` and a section may have ``where = "..."``: expressions over the
record's fields, written as DuckDB SQL (``error.code`` is a nested field, ``"request_goodput:"`` a key that
needs quoting).  Every expression of a section is evaluated in one query over all the file's records:
the records are handed to DuckDB as JSON and typed by the structure of all of them together.

A field an expression names that no record has reads as null (one file of a tool has ``error`` objects,
another release omits the key); the caller decides whether that is an error (an expression none of whose
fields exist reads nothing from this file).  ``"$index"``, ``"$number"``, ``"$source"``, ``"$line"`` (the
record) and ``"$stem"``, ``"$name"``, ``"$parent"`` (the data file) are columns too.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import duckdb
import polars as pl

SPECIAL_COLUMNS = ("$index", "$number", "$source", "$line", "$stem", "$name", "$parent")
Path_ = tuple[str, ...]


class ExpressionError(ValueError):
    """An expression DuckDB cannot parse, or one that is not a single expression."""


@functools.cache
def field_refs(expr: str) -> tuple[Path_, ...]:
    """The field paths ``expr`` reads (``error.code`` -> ("error", "code")), lambda parameters left out.

    Raises ExpressionError with DuckDB's message when ``expr`` is not one valid SQL expression."""
    con = duckdb.connect()
    try:
        text = con.execute("SELECT json_serialize_sql($q)", {"q": f"SELECT {expr}"}).fetchone()
    finally:
        con.close()
    tree = json.loads(text[0]) if text else {"error": True, "error_message": "no result"}
    if tree.get("error"):
        raise ExpressionError(str(tree.get("error_message", "not valid SQL")).splitlines()[0])
    stmts = tree.get("statements", [])
    node = stmts[0].get("node", {}) if len(stmts) == 1 else {}
    if len(node.get("select_list", [])) != 1 or node.get("from_table", {}).get("type") != "EMPTY" \
            or node.get("where_clause") is not None:
        raise ExpressionError("write one SQL expression (no commas at the top level, no FROM or WHERE)")
    refs: list[Path_] = []
    _walk(node["select_list"][0], frozenset(), refs)
    return tuple(dict.fromkeys(refs))


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
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("records", frame)
        structure = _structure(con) if top else {}
        absent = {r for r in refs if not _has(structure, r)}
        for r in absent:
            _add(structure, r)
        unpacked = f"unnest(json_transform(j, '{_sql_text(json.dumps(structure))}'))," if structure else ""
        specials_sql = ", ".join(f'"{k}"' for k in specials) or "1 AS \"$none\""
        selects = ", ".join(f"({e}) AS \"{_sql_ident(n)}\"" for n, e in every.items())
        sql = f"SELECT {selects} FROM (SELECT {unpacked} {specials_sql} FROM records)"
        try:
            rows = con.execute(sql).fetchall()
        except duckdb.Error as exc:
            raise ExpressionError(_which(con, every, unpacked, specials_sql, exc)) from None
    finally:
        con.close()
    names = list(every)
    cols = {n: [_plain(r[i]) for r in rows] for i, n in enumerate(names)}
    keep = [bool(v) for v in cols.pop("$where")] if where is not None else [True] * len(rows)
    return Evaluated(cols, keep, absent)


def _which(con: duckdb.DuckDBPyConnection, every: dict[str, str], unpacked: str, specials_sql: str,
           exc: duckdb.Error) -> str:
    """Name the expression that failed, with DuckDB's first line."""
    for name, expr in every.items():
        try:
            con.execute(f"SELECT ({expr}) FROM (SELECT {unpacked} {specials_sql} FROM records) LIMIT 0")
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
    row = con.execute("SELECT json_group_structure(j::JSON) FROM records").fetchone()
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

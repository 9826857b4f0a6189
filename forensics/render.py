"""Render tabular results for the terminal or for other programs: table, csv or json.

stdout is data: JSON is an array of objects keyed by column name (one per row), CSV has a header row,
and the table is a plain aligned text table (no colour when not writing to a terminal).
"""

from __future__ import annotations

import io
import json
import math
import textwrap
from datetime import date, datetime
from decimal import Decimal
from typing import Any, TextIO

import polars as pl

FORMATS = ("table", "csv", "json")


def _json_value(v: Any) -> Any:
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, datetime):
        return v.isoformat().replace("+00:00", "Z")
    if isinstance(v, date):
        return v.isoformat()
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


def to_json(df: pl.DataFrame) -> str:
    rows = [{k: _json_value(v) for k, v in row.items()} for row in df.iter_rows(named=True)]
    return json.dumps(rows, indent=2, ensure_ascii=False)


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v == int(v) and abs(v) < 1e15:
            return f"{v:.1f}"
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:.1f}"
    if isinstance(v, datetime):
        return v.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return str(v).replace("\n", "\\n")


def _wrap(cell: str, width: int) -> list[str]:
    """A cell as lines of at most ``width`` characters: broken at spaces or commas when it can be, else hard,
    so nothing is ever cut off."""
    if len(cell) <= width:
        return [cell]
    return textwrap.wrap(cell, width, break_on_hyphens=False, drop_whitespace=True) or [cell[:width]]


NAME_COLUMNS = ("run", "alias", "run_a", "run_b")  # names: one line each, cut with an ellipsis (csv/json: whole)


def shorten(name: str, width: int) -> str:
    """``name`` in at most ``width`` characters: its start and its end around an ellipsis (runs of a sweep differ at
    the end: ``...-np4``), the whole name when it fits."""
    if len(name) <= width:
        return name
    tail = (width - 1) // 3
    return f"{name[: width - 1 - tail]}\u2026{name[len(name) - tail:]}"


def to_table(df: pl.DataFrame, *, max_width: int = 60) -> str:
    """An aligned text table; a cell longer than ``max_width`` wraps onto the following lines of its column, and a
    run name longer than that is cut with an ellipsis (csv and json keep it whole)."""
    headers = df.columns
    names = [h in NAME_COLUMNS for h in headers]
    rows = [[[shorten(_cell(v), max_width)] if name else _wrap(_cell(v), max_width) for v, name in zip(row, names, strict=True)]
            for row in df.iter_rows()]
    widths = [max([len(h)] + [len(line) for r in rows for line in r[i]]) for i, h in enumerate(headers)]
    numeric = [df.schema[h].is_numeric() for h in headers]

    def fmt(cells: list[str]) -> str:
        out = []
        for c, w, num in zip(cells, widths, numeric, strict=True):
            out.append(c.rjust(w) if num else c.ljust(w))
        return "  ".join(out).rstrip()

    lines = [fmt(list(headers)), "  ".join("-" * w for w in widths)]
    for r in rows:
        height = max(len(c) for c in r) if r else 1
        lines += [fmt([c[i] if i < len(c) else "" for c in r]) for i in range(height)]
    return "\n".join(lines)


def to_csv(df: pl.DataFrame) -> str:
    buf = io.StringIO()
    flat = df.with_columns(
        [pl.col(c).dt.to_string("%Y-%m-%dT%H:%M:%S%.3fZ") for c, t in df.schema.items() if isinstance(t, pl.Datetime)]
    )
    flat.write_csv(buf)
    return buf.getvalue().rstrip("\n")


def render(df: pl.DataFrame, fmt: str, out: TextIO) -> None:
    """Write ``df`` to ``out`` in ``fmt`` (table, csv or json)."""
    if fmt == "json":
        out.write(to_json(df) + "\n")
    elif fmt == "csv":
        out.write(to_csv(df) + "\n")
    else:
        out.write(to_table(df) + "\n")

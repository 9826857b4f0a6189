"""Event streams: a harness that writes one line per event (``request_start``, ``request_first_token``, a
``tokens`` line per streamed chunk, ``request_end``) read as one attempt per request.

A mapping section with ``layout = "events"`` and ``key = "request_id"`` (any SQL expression over an event)
brings the events of each key together.  Each field is taken from the events that carry it: by default the
first non-null value in the file's order; ``take = "last"``, ``"count"``, ``"sum"``, ``"min"`` or ``"max"``
over the key's events; ``when = "type = 'request_end'"`` limits the events a field is taken from.  Events
without a key (a header, the end of the benchmark) belong to no request and are counted.

Everything runs in bulk: the file's lines go to DuckDB as JSON texts, every field and condition is one
expression of one query, and polars groups the events by key.  The grouped rows then go through the
mapping's usual conversions (units, ``map``, ``default``), so ``started_at = { path = "ts", unit =
"epoch_s", when = "type = 'request_start'" }`` is a time like any other.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import regex

from forensics.errors import MappingError
from forensics.replay import mapsql

KEY = "$key"
IDENT = regex.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Grouped:
    """One row per key: ``rows`` of (the key's values by column, the line of its first event), the section
    rewritten to read those columns, whether the file had events at all, and what ingest says of it."""

    rows: list[tuple[dict[str, Any], int | None]]
    section: Any
    found: bool
    notes: list[str] = field(default_factory=list)


def group(mapping: Any, sec: Any, df: Any, objs: list[tuple[Any, int | None]] | None = None) -> Grouped:
    """The attempts of an events section over data file ``df`` (see the module docstring); ``objs``: the
    events with their lines when the file is not JSONL read whole (None: its lines are read here in bulk)."""
    texts, lines = _texts(df, objs)
    if texts.is_empty():
        return Grouped([], _rewritten(sec, []), False)
    specs = [s for s in sec.fields if _aggregated(s)]
    exprs = {KEY: sec.key}
    for i, spec in enumerate(specs):
        exprs[f"v{i}"] = spec.sql or path_sql(str(spec.path))
        if spec.when:
            exprs[f"w{i}"] = spec.when
    try:
        frame, absent = mapsql.evaluate_texts(exprs, sec.where, texts, {"$index": pl.int_range(0, texts.len(),
                                                                                                eager=True),
                                                                          "$line": lines})
    except mapsql.Refused as exc:
        raise MappingError(f"[attempts] refused: {exc} (reading {df.path})", path=mapping.source,
                           hint="a mapping expression reads only its record's fields") from None
    except mapsql.ExpressionError as exc:
        raise MappingError(f"[attempts] {exc} (reading {df.path})", path=mapping.source,
                           hint="fix the expression; DuckDB SQL over an event's fields") from None
    _check_present(mapping, sec, specs, absent, df)
    if "$where" in frame.columns:
        frame = frame.filter(pl.col("$where").fill_null(False))
    keyless = int(frame[KEY].null_count())
    grouped = _aggregate(frame.filter(pl.col(KEY).is_not_null()).sort("$index"), specs, mapping)
    rows = [({k: v for k, v in r.items() if k != "$line"}, r["$line"]) for r in grouped.to_dicts()]
    notes = [f"{len(rows)} requests from {frame.height - keyless} events"
             + (f" ({keyless} events without a key: not a request's)" if keyless else "")]
    return Grouped(rows, _rewritten(sec, specs), True, notes)


def path_sql(path: str) -> str:
    """A dot path as a SQL expression over a record: ``a.b`` -> ``"a"."b"``, a number indexes a list."""
    out = ""
    for part in path.split("."):
        if part.lstrip("-").isdigit() and out:
            out += f"[{int(part) + 1}]"
        else:
            quoted = '"' + part.replace('"', '""') + '"'
            out += f".{quoted}" if out else quoted
    return out


def _aggregated(spec: Any) -> bool:
    """A field read from the events (not a constant, not the record number)."""
    return spec.sql is not None or (spec.path is not None and spec.path not in mapsql.SPECIAL_COLUMNS
                                    and not spec.path.startswith("$"))


def _texts(df: Any, objs: list[tuple[Any, int | None]] | None) -> tuple[pl.Series, pl.Series]:
    """The file's events as JSON texts with their line numbers: a JSONL file's non-blank lines, untouched, or
    the event objects the section's path found in a JSON or YAML document."""
    if objs is None:
        raw = pl.Series("j", df.text.split("\n"), dtype=pl.String).str.strip_chars("\r")
        keep = raw.str.strip_chars() != ""
        return raw.filter(keep), pl.int_range(1, raw.len() + 1, eager=True).filter(keep).alias("$line")
    return (pl.Series("j", [json.dumps(o, default=str) for o, _ in objs], dtype=pl.String),
            pl.Series("$line", [ln for _, ln in objs], dtype=pl.Int64))


def _check_present(mapping: Any, sec: Any, specs: list[Any], absent: set[tuple[str, ...]], df: Any) -> None:
    """A field none of whose inputs any event has reads nothing from this file: an error unless optional."""
    for spec in specs:
        if spec.optional:
            continue
        refs = [r for r in mapsql.field_refs(spec.sql or path_sql(str(spec.path)))
                if r[0] not in mapsql.SPECIAL_COLUMNS]
        if refs and all(r in absent for r in refs):
            raise MappingError(f"[attempts.fields] {spec.canonical}: no event of {df.path} has "
                               f"{', '.join('.'.join(r) for r in refs)}", path=mapping.source,
                               hint="optional = true reads it as null")
    key_refs = [r for r in mapsql.field_refs(sec.key) if r[0] not in mapsql.SPECIAL_COLUMNS]
    if key_refs and all(r in absent for r in key_refs):
        raise MappingError(f"[attempts] key = {sec.key!r}: no event of {df.path} has it", path=mapping.source,
                           hint="key names what ties an event to its request (request_id, id, ...)")


def _aggregate(frame: pl.DataFrame, specs: list[Any], mapping: Any) -> pl.DataFrame:
    """One row per key, in the order of each key's first event: each field taken as its spec says."""
    aggs = [pl.col("$line").first().alias("$line")]
    for i, spec in enumerate(specs):
        value = pl.col(f"v{i}")
        chosen = pl.col(f"w{i}").fill_null(False) if spec.when else pl.lit(True)
        carried = value.filter(chosen & value.is_not_null())
        take = spec.take or "first"
        agg = {"first": carried.first(), "last": carried.last(), "count": carried.len(), "sum": carried.sum(),
               "min": carried.min(), "max": carried.max()}[take]
        if take == "sum":  # a key none of whose events carries the field has no sum, not 0
            agg = pl.when(carried.len() > 0).then(agg)
        aggs.append(agg.alias(f"f{i}"))
    try:
        return frame.group_by(KEY, maintain_order=True).agg(aggs)
    except pl.exceptions.PolarsError as exc:
        raise MappingError(f"[attempts] cannot take the fields over each key's events: {str(exc).splitlines()[0]}",
                           path=mapping.source, hint="take = sum, min and max need numbers") from None


def _rewritten(sec: Any, specs: list[Any]) -> Any:
    """The section as it reads the grouped rows: each aggregated field from its column, converted as before."""
    index = {id(s): i for i, s in enumerate(specs)}
    fields = tuple(dataclasses.replace(s, path=f"f{index[id(s)]}", sql=None, alternatives=(), sql_alternatives=(),
                                       optional=True, take=None, when=None) if id(s) in index else s
                   for s in sec.fields)
    return dataclasses.replace(sec, fields=fields, layout="records", where=None, key=None, paths=("",))

"""Harness mapping files (TOML): read another tool's output files as canonical replay records.

A mapping says, for each canonical field, where the harness keeps it: a dot path into JSON, a CSV column,
or a DuckDB SQL expression over the record's fields (``{ sql = "..." }``, see ``mapsql``).  It converts
units (s/ms/us/ns durations; epoch, ISO or relative-clock times), maps values, sets constants or
templated defaults (``{stem}``: the data file's name without extensions), filters records (``where``),
and names the files each section reads (``files`` globs).  The mapped objects then go through the same
JSON Schema validation as canonical records.  See docs/replay.md.
"""

from __future__ import annotations

import csv
import dataclasses
import fnmatch
import functools
import io
import json
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import regex

from forensics.errors import InternalError, MappingError
from forensics.paths import file_stem
from forensics.replay import events, mapsql
from forensics.replay.clock import MANIFEST, Relative
from forensics.replay.records import RawRecord, parse_time, read_text, schema_errors

if TYPE_CHECKING:
    import jsonschema

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAPPINGS_DIR = Path(__file__).resolve().parent.parent / "mappings"

ATTEMPT_FIELDS = {
    "run_id": "str", "item": "str", "stage": "str", "attempt": "int", "server": "str", "started_at": "time",
    "ended_at": "time", "http_status": "int", "error": "str", "outcome": "str", "id_slot": "int",
    "tokens_evaluated": "int", "tokens_predicted": "int", "stop_type": "str", "truncated": "bool",
    "prompt_n": "int", "prompt_ms": "ms", "predicted_n": "int", "predicted_ms": "ms", "output_text": "str",
    "output_chars": "int", "max_tokens": "int", "latency_ms": "ms", "ttft_ms": "ms", "itl_ms": "ms",
    "timings": "any",  # the server's timings object as a whole ({prompt_n, prompt_ms, predicted_n, predicted_ms})
}
MANIFEST_FIELDS = {
    "run_id": "str", "started_at": "time", "ended_at": "time", "concurrency": "int", "model": "str",
    "servers": "any", "items": "list", "stages": "list", "stage_items": "any", "every_item_every_stage": "bool",
    "budgets": "any", "config": "any", "ended.how": "str", "ended.detail": "str", "ended.after_s": "float",
    "summary.requests": "int", "summary.ok": "int", "summary.failed": "int", "summary.input_tokens": "int",
    "summary.output_tokens": "int", "summary.duration_s": "float",
}
NESTED = ("ended", "summary", "timings")  # canonical objects a mapping fills field by field (summary.ok, timings.prompt_n)
TIMINGS = ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")
TIME_UNITS = {"iso": None, "epoch_s": 1.0, "epoch_ms": 1e-3, "epoch_us": 1e-6, "epoch_ns": 1e-9}
CLOCK_UNITS = {"mono_s": 1.0, "mono_ms": 1e-3, "mono_us": 1e-6, "mono_ns": 1e-9}  # a monotonic clock's reading
DURATION_UNITS = {"s": 1000.0, "ms": 1.0, "us": 1e-3, "ns": 1e-6}
SPECIALS = ("$index", "$number", "$source", "$line")
DOC = "$doc."  # a path from the document a record is in (a run-level field of a file of nested records)
NULL = "$null"  # as a value in the mapping (set, default, map): null
FORMATS = ("json", "jsonl", "csv", "yaml", "text")  # text: the whole file is one record {text}
LAYOUTS = ("records", "parallel_arrays", "keyed_rows", "events")  # events: one row per key (see replay.events)
FIELD_KEYS = {"path", "sql", "unit", "scale", "map", "default", "optional", "absent", "take", "when"}
TAKES = ("first", "last", "count", "sum", "min", "max")  # how an events layout takes a field over a key's events
_MISSING = object()
REFUSED_HINT = ("a mapping expression reads only its record's fields: files, network, tables, extensions, secrets and "
                "settings are off")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class FieldSpec:
    canonical: str
    path: str | None  # None: a constant or an expression
    unit: str | None = None
    scale: float | None = None
    map: dict[str, Any] | None = None
    default: Any = None
    const: Any = _MISSING
    optional: bool = False  # the data may lack it (older tool versions): no error, the value is null
    alternatives: tuple[str, ...] = ()  # path = [a, b, ...]: the first one the data file has (tool versions)
    sql: str | None = None  # a DuckDB SQL expression over the record's fields
    absent: str | None = None  # optional, and what ingest says once when a data file has none of its inputs
    sql_alternatives: tuple[str, ...] = ()  # sql = [a, b, ...]: the first whose fields the data file has
    take: str | None = None  # layout "events": first (default), last, count, sum, min or max over a key's events
    when: str | None = None  # layout "events": the events the field is taken from (a SQL condition on an event)


@dataclass(frozen=True)
class Section:
    paths: tuple[str, ...]  # where the records (or the object) are; "" = the document root
    layout: str
    fields: tuple[FieldSpec, ...]
    files: tuple[str, ...] = ()  # globs on the data file's name: the section reads matching files only
    where: str | None = None  # keep only the records for which this SQL expression is true
    anchors: tuple[FieldSpec | str, ...] = ()  # wall-clock anchors of relative times (a field, or "manifest")
    key: str | None = None  # keyed_rows: the column naming each row; events: the expression keying each event

    def applies_to(self, data: Path) -> bool:
        return not self.files or any(fnmatch.fnmatch(data.name, g) for g in self.files)


@dataclass(frozen=True)
class Mapping:
    """A loaded mapping file."""

    source: str  # the mapping file
    name: str
    format: str | None
    manifest: Section | None  # the first [manifest] table
    attempts: Section | None  # the first [attempts] table
    extra: dict[str, Any] = field(default_factory=dict)
    tables: tuple[tuple[str, str, Section], ...] = ()  # (label, kind, section) of every table, in file order

    @property
    def sections(self) -> tuple[Section, ...]:
        return tuple(s for _, _, s in self.tables)

    @property
    def has_globs(self) -> bool:
        return any(s.files for s in self.sections)

    def names(self, data: Path) -> bool:
        """The mapping names this file in a ``files`` glob."""
        return any(s.files and s.applies_to(data) for s in self.sections)

    def reads(self, data: Path) -> bool:
        """The mapping reads this file: a glob names it, or the mapping has no globs."""
        return not self.has_globs or self.names(data)

    def fmt_for(self, data: Path) -> str:
        if self.format:
            return self.format
        name = data.name.lower()
        for ext in (".gz", ".zst"):
            name = name.removesuffix(ext)
        if name.endswith(".jsonl") or name.endswith(".ndjson"):
            return "jsonl"
        if name.endswith(".csv"):
            return "csv"
        if name.endswith((".yaml", ".yml")):
            return "yaml"
        return "json"


def shipped_mappings() -> dict[str, Path]:
    """The mappings shipped with forensics, by name (``vllm-bench``, ``guidellm``, ``aiperf``, ...)."""
    return {p.stem: p for p in sorted(MAPPINGS_DIR.glob("*.toml"))}


def load_mapping(path: Path | str) -> Mapping:
    """Read and check a mapping file; ``path`` may also name a shipped mapping (e.g. ``"guidellm"``)."""
    p = Path(path)
    if not p.exists() and str(path) in shipped_mappings():
        p = shipped_mappings()[str(path)]
    src = str(p)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise MappingError(f"cannot read mapping: {exc.strerror or exc}", path=src,
                           hint=f"shipped mappings: {', '.join(shipped_mappings())}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise MappingError(f"not valid TOML: {exc}", path=src, hint="fix the mapping file") from exc
    errors = schema_errors("mapping", data)  # forensics/schemas/mapping.schema.json: the file's shape
    if errors:
        message, hint = _explain(errors[0], data)
        raise MappingError(message, path=src, hint=hint)
    meta = data.get("mapping", {})
    fmt = meta.get("format")
    tables = [*_tables(data.get("manifest"), "manifest", MANIFEST_FIELDS, src),
              *_tables(data.get("attempts"), "attempts", ATTEMPT_FIELDS, src)]
    if not tables:
        raise MappingError("the mapping has neither [manifest] nor [attempts]", path=src,
                           hint="see docs/replay.md, section Mapping files, for the format")
    first = {kind: next((s for _, k, s in tables if k == kind), None) for kind in ("manifest", "attempts")}
    return Mapping(src, str(meta.get("name") or p.stem), fmt, first["manifest"], first["attempts"], meta,
                   tuple(tables))


SECTION_KEYS = "path, layout, key, files, where, anchor, fields, set"
FIELD_SHAPE = "give path or sql, and optionally unit, scale, map, default, optional, take, when"


def _explain(err: jsonschema.ValidationError, data: dict[str, Any]) -> tuple[str, str | None]:
    """A schema error in the words of a mapping file: ``[attempts.fields] ttft_ms: ...``, with a hint."""
    err = _leaf(err)
    at = list(err.absolute_path)
    if not at:
        extra = sorted(set(data) - {"mapping", "manifest", "attempts"})
        return f"unknown section(s) {', '.join(extra)}", "sections are [mapping], [manifest] and [attempts]"
    if at[0] == "mapping":
        key = ".".join(str(p) for p in at[1:])
        if err.validator == "enum":
            return f"[mapping] {key} = {err.instance!r} is not one of {', '.join(map(str, _allowed(err)))}", None
        return f"[mapping] {key or 'must be a table'}{': ' + err.message if key else ''}", None
    many = len(at) > 1 and isinstance(at[1], int)
    label = f"{at[0]} {int(at[1]) + 1}" if many else str(at[0])
    rest = at[2:] if many else at[1:]
    if rest[:1] == ["fields"] and len(rest) > 1:
        name = str(rest[1])
        if name in NESTED and len(rest) > 2 and isinstance(rest[2], str) and rest[2] not in FIELD_KEYS:
            name += f".{rest[2]}"  # ended = { how = ... }: the field ended.how
        return f"[{label}.fields] {name}: {_field_problem(err)}", None
    return _section_problem(err, label, [str(p) for p in rest])


def _leaf(err: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """Of an error under ``anyOf`` (a value that fits none of its shapes), the one of the shape it meant: the
    deepest, and a wrong value rather than a wrong type."""
    while err.validator == "anyOf" and err.context:
        here = len(err.absolute_path)
        # a shape whose type the value does not have says nothing more than that
        wrong_type = {e.relative_schema_path[0] for e in err.context
                      if e.validator == "type" and len(e.absolute_path) == here}
        fits = [e for e in err.context if e.relative_schema_path[0] not in wrong_type]
        if not fits:
            return err
        depth = max(len(e.absolute_path) for e in fits)
        deepest = [e for e in fits if len(e.absolute_path) == depth]
        err = next((e for e in deepest if e.validator != "type"), deepest[0])
    return err


def _allowed(err: jsonschema.ValidationError) -> list[Any]:
    value: Any = err.validator_value  # the stubs allow Unset: an enum error always sets it
    return list(value)


def _field_problem(err: jsonschema.ValidationError) -> str:
    instance: Any = err.instance
    key = str(err.absolute_path[-1]) if err.absolute_path else ""
    if err.validator == "anyOf":
        return "expected a path string, a list of them, or a table"
    if err.validator in ("oneOf", "additionalProperties"):
        bad = sorted(set(instance) - set(FIELD_KEYS)) if isinstance(instance, dict) else []
        return FIELD_SHAPE + (f" (unknown: {', '.join(bad)})" if bad else "")
    if key == "take":
        return f"take = {instance!r} is not one of {', '.join(TAKES)}"
    if key == "absent":
        return "absent must be the sentence to say when a file lacks the field"
    if err.validator == "minItems":
        return "give at least one path (or expression)"
    if err.validator == "type":
        return f"{key} must be {_type_words(err)}, not {instance!r}" if key else f"must be {_type_words(err)}"
    return f"{key}: {err.message}" if key else err.message


def _type_words(err: jsonschema.ValidationError) -> str:
    words = {"string": "a string", "boolean": "true or false", "array": "a list", "object": "a table",
             "number": "a number", "integer": "an integer"}
    value: Any = err.validator_value  # the stubs allow Unset: a type error always sets it
    return " or ".join(words.get(t, t) for t in ([value] if isinstance(value, str) else value))


def _section_problem(err: jsonschema.ValidationError, label: str, rest: list[str]) -> tuple[str, str | None]:
    key = rest[0] if rest else ""
    if err.validator == "additionalProperties":
        instance: Any = err.instance
        extra = sorted(set(instance) - set(SECTION_KEYS.split(", ")))
        return f"[{label}] unknown key(s) {', '.join(extra)}", f"keys: {SECTION_KEYS}"
    if key == "layout":
        return f"[{label}] layout = {err.instance!r} is not one of {', '.join(LAYOUTS)}", None
    if key == "files":
        return f"[{label}] files must be a glob such as \"*.csv\" or a list of globs", None
    if key == "where":
        return f"[{label}] where must be a SQL expression string", None
    if key == "anchor":
        return f"[{label}] anchor: give \"manifest\" or {{ path = ..., unit = ... }} (or a list)", None
    if not key:
        return f"[{label}] must be a table", "or [[" + label.split()[0] + "]] tables, each a table"
    if err.validator == "type":
        return f"[{label}] {'.'.join(rest)} must be {_type_words(err)}, not {err.instance!r}", None
    return f"[{label}] {'.'.join(rest)}: {err.message}", None


def _tables(raw: Any, kind: str, allowed: dict[str, str], src: str) -> list[tuple[str, str, Section]]:
    """``[kind]`` (one table) or ``[[kind]]`` (several, each reading its own files), labelled for messages."""
    if raw is None:
        return []
    many = raw if isinstance(raw, list) else [raw]
    out = []
    for i, one in enumerate(many, start=1):
        label = kind if len(many) == 1 else f"{kind} {i}"
        sec = _section(one, label, allowed, src)
        if sec is not None and kind == "attempts" and sec.layout == "keyed_rows":
            raise MappingError(f"[{label}] layout = \"keyed_rows\" reads one object of run facts: use it in [manifest]",
                               path=src)
        if sec is not None:
            out.append((label, kind, sec))
    return out


def _section(raw: Any, name: str, allowed: dict[str, str], src: str) -> Section | None:
    if raw is None:
        return None
    paths = raw.get("path", "")
    paths_t = (paths,) if isinstance(paths, str) else tuple(paths)
    layout = raw.get("layout", "records")
    specs = [_field_spec(key, spec, name, allowed, src) for key, spec in _flatten(raw.get("fields", {})).items()]
    for key, value in _flatten(raw.get("set", {})).items():
        if key not in allowed:
            raise MappingError(f"[{name}.set] {key} is not a canonical {name} field", path=src,
                               hint=f"fields: {', '.join(allowed)}")
        specs.append(FieldSpec(key, None, const=_null(value)))
    where = raw.get("where")
    if where is not None:
        _check_sql(where, f"[{name}] where", src)
    key_column = _key(raw.get("key"), layout, name, src)
    _check_events(specs, layout, raw.get("anchor"), name, src)
    files = raw.get("files")
    return Section(paths_t, layout, tuple(specs), (files,) if isinstance(files, str) else tuple(files or ()), where,
                   _anchors(raw.get("anchor"), name, src), key_column)


def _key(key: Any, layout: str, name: str, src: str) -> str | None:
    """``key``: a keyed_rows section's column, or what keys an events section's events (a SQL expression)."""
    if key is None:
        if layout == "events":
            raise MappingError(f"[{name}] layout = \"events\" needs key: what ties an event to its request "
                               "(e.g. key = \"request_id\")", path=src)
        return None
    if layout not in ("keyed_rows", "events") or not isinstance(key, str):
        raise MappingError(f"[{name}] key names a column, and only with layout = \"keyed_rows\" or \"events\"",
                           path=src)
    if layout == "events":
        _check_sql(key, f"[{name}] key", src)
    return key


def _check_events(specs: list[FieldSpec], layout: str, anchor: Any, name: str, src: str) -> None:
    """``take`` and ``when`` belong to an events layout, whose anchor can only be the manifest (a field of
    the events is not one value per file)."""
    if layout != "events":
        odd = [s.canonical for s in specs if s.take is not None or s.when is not None]
        if odd:
            raise MappingError(f"[{name}.fields] {odd[0]}: take and when apply to layout = \"events\"", path=src)
        return
    if anchor is not None and any(a != MANIFEST for a in (anchor if isinstance(anchor, list) else [anchor])):
        raise MappingError(f"[{name}] anchor: an events layout is anchored at \"manifest\" only", path=src,
                           hint="map started_at to a wall-clock field of the events instead")


def _anchors(raw: Any, name: str, src: str) -> tuple[FieldSpec | str, ...]:
    """``anchor = "manifest"``, ``{ path = ..., unit = "epoch_s" }`` or a list of those (first found wins)."""
    if raw is None:
        return ()
    out: list[FieldSpec | str] = []
    for a in raw if isinstance(raw, list) else [raw]:
        if a == MANIFEST:
            out.append(MANIFEST)
            continue
        spec = _field_spec("anchor", a, name, {"anchor": "time"}, src)
        if spec.unit in CLOCK_UNITS:
            raise MappingError(f"[{name}] anchor: a wall-clock time is needed (unit {spec.unit!r} is relative)",
                               path=src)
        out.append(spec)
    return tuple(out)


def _field_spec(key: str, spec: Any, name: str, allowed: dict[str, str], src: str) -> FieldSpec:
    if key.startswith("timings.") and key.removeprefix("timings.") in TIMINGS and "timings" in allowed:
        key = key.removeprefix("timings.")  # timings.prompt_n is the attempt's prompt_n (docs: the timings object)
    if key not in allowed:
        raise MappingError(f"[{name}.fields] {key} is not a canonical {name} field", path=src,
                           hint=f"fields: {', '.join(allowed)}")
    if isinstance(spec, str):
        return FieldSpec(key, spec)
    if isinstance(spec, list):
        return FieldSpec(key, spec[0], alternatives=tuple(spec))
    unit = spec.get("unit")
    if unit is not None:
        _check_unit(key, allowed[key], unit, name, src)
    sqls: tuple[str, ...] = ()
    if "sql" in spec:  # a list: the first expression whose fields the data file has (tool versions)
        sqls = tuple(spec["sql"]) if isinstance(spec["sql"], list) and spec["sql"] else (spec["sql"],)
        for expr in sqls:
            _check_sql(expr, f"[{name}.fields] {key}", src)
    path = spec.get("path")
    alts = tuple(path) if isinstance(path, list) else ()
    value_map = {k: _null(v) for k, v in spec["map"].items()} if isinstance(spec.get("map"), dict) else None
    absent = spec.get("absent")
    take, when = spec.get("take"), spec.get("when")
    if when is not None:
        _check_sql(when, f"[{name}.fields] {key} when", src)
    return FieldSpec(key, alts[0] if alts else path, unit, spec.get("scale"), value_map, _null(spec.get("default")),
                     optional=bool(spec.get("optional", False)) or absent is not None, alternatives=alts,
                     sql=sqls[0] if sqls else None, absent=absent, sql_alternatives=sqls if len(sqls) > 1 else (),
                     take=take, when=when)


def _check_unit(key: str, kind: str, unit: str, name: str, src: str) -> None:
    units = {**TIME_UNITS, **CLOCK_UNITS} if kind == "time" else DURATION_UNITS if kind == "ms" else {}
    if unit not in units:
        raise MappingError(f"[{name}.fields] {key}: unit {unit!r} does not apply"
                           + (f" (use one of {', '.join(units)})" if units else
                              " (units apply to times and *_ms durations; use scale)"), path=src)


def _check_sql(expr: Any, where: str, src: str) -> None:
    if not isinstance(expr, str) or not expr.strip():
        raise MappingError(f"{where}: sql must be a non-empty SQL expression", path=src)
    try:
        mapsql.field_refs(expr)
    except mapsql.Refused as exc:
        raise MappingError(f"{where}: refused: {exc}", path=src,
                           hint=REFUSED_HINT) from None
    except mapsql.ExpressionError as exc:
        raise MappingError(f"{where}: not a SQL expression: {exc}", path=src,
                           hint="DuckDB SQL over the record's fields, e.g. \"CASE WHEN code >= 400 THEN 'failed' "
                                "ELSE 'ok' END\"") from None


def _null(value: Any) -> Any:
    return None if value == NULL else value


def _flatten(raw: dict[str, Any]) -> dict[str, Any]:
    """``ended = {how = ...}`` and ``"ended.how" = ...`` both give ``ended.how`` (``summary`` too)."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if k in NESTED and isinstance(v, dict) and not (set(v) & FIELD_KEYS):
            for k2, v2 in v.items():
                out[f"{k}.{k2}"] = v2
        else:
            out[k] = v
    return out


# ---------------------------------------------------------------------------------------------- data access
def get_path(obj: Any, path: str) -> Any:
    """The value at dot ``path`` in ``obj`` (numbers index lists), or ``_MISSING``."""
    if path == "":
        return obj
    if isinstance(obj, _Parallel):
        return obj.get_path(path)
    cur = obj
    for part in path.split("."):
        if isinstance(cur, dict):
            if part not in cur:
                return _MISSING
            cur = cur[part]
        elif isinstance(cur, list) and part.lstrip("-").isdigit():
            i = int(part)
            if not -len(cur) <= i < len(cur):
                return _MISSING
            cur = cur[i]
        else:
            return _MISSING
    return cur


def select(doc: Any, path: str) -> list[tuple[Any, str, int]]:
    """Objects at ``path``, where ``*`` iterates a list (or an object's values); each with the last named
    segment of the path (``$source``) and its position in the first ``*`` (0 without one)."""
    if path == "":
        return [(doc, "", 0)]
    found: list[tuple[Any, str, int]] = [(doc, "", -1)]
    for part in path.split("."):
        nxt: list[tuple[Any, str, int]] = []
        for obj, label, star in found:
            if part == "*":
                values = obj if isinstance(obj, list) else list(obj.values()) if isinstance(obj, dict) else []
                nxt.extend((o, label, star if star >= 0 else i) for i, o in enumerate(values))
            else:
                v = get_path(obj, part)
                if v is not _MISSING:
                    nxt.append((v, part, star))
        found = nxt
    return [(o, label, max(star, 0)) for o, label, star in found]


@dataclass
class _Row:
    obj: Any
    index: int
    source: str
    line: int | None
    group: int = 0  # which run document of the file (a JSON document, or a "*" of the section path)
    doc: Any = None  # the JSON document it is in (``$doc.`` paths read from it)


class _Parallel(dict):
    """Row i of a parallel-arrays layout: the named arrays give their i-th value, other fields broadcast."""

    def __init__(self, root: Any, row: dict[str, Any]) -> None:
        super().__init__(row)
        self.root = root

    def get_path(self, path: str) -> Any:
        head, _, rest = path.partition(".")
        if head in self:
            value = dict.__getitem__(self, head)
            return value if not rest else get_path(value, rest)
        return get_path(self.root, path)


@dataclass
class DataFile:
    """A data file as read: JSON documents (several when a .json file holds one per line), or for JSONL and
    CSV the list of records with their line numbers."""

    path: Path
    fmt: str
    docs: list[Any]
    lines: list[int] | None = None
    text: str = ""  # the file's text (a keyed_rows section reads a CSV's blank-line separated tables from it)

    @property
    def line_records(self) -> bool:
        return self.fmt in ("jsonl", "csv")


def read_data(mapping: Mapping, data: Path) -> DataFile:
    """The parsed data file.  JSON accepts ``Infinity``/``NaN`` and several documents (one per line, as
    tools that append a run per line write under a .json name)."""
    fmt = mapping.fmt_for(data)
    text = read_text(data)
    if fmt == "json":
        return DataFile(data, fmt, _json_documents(text, data, mapping))
    if fmt == "yaml":
        return DataFile(data, fmt, _yaml_documents(text, data, mapping), text=text)
    if fmt == "text":  # a tool's printed report: expressions read it with regexp_extract(text, ...)
        return DataFile(data, fmt, [{"text": text}], text=text)
    if fmt == "jsonl":
        recs: list[Any] = []
        lines: list[int] = []
        for i, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError:
                    recs.append(_Invalid(f"not valid JSON on line {i}"))
                lines.append(i)
        return DataFile(data, fmt, [recs], lines, text)  # the text: an events layout reads the lines in bulk
    reader = csv.DictReader(io.StringIO(text))
    rows: list[Any] = []
    at: list[int] = []
    for row in reader:
        rows.append(dict(row))
        at.append(reader.line_num)
    return DataFile(data, fmt, [rows], at, text)


def keyed_rows(text: str, key: str | None) -> dict[str, Any]:
    """A CSV of tables separated by blank lines (AIPerf's export: statistics per metric, then run totals) as one
    object: each row under the value of its ``key`` column (default: its table's first column), holding the
    row's other cells by its own table's header."""
    out: dict[str, Any] = {}
    for block in regex.split(r"\r?\n[ \t\r]*\n", text.strip("\ufeff\r\n")):
        rows = [r for r in csv.reader(io.StringIO(block.strip("\r\n"))) if any(c.strip() for c in r)]
        if len(rows) < 2:
            continue
        header = rows[0]
        col = header.index(key) if key in header else 0
        for row in rows[1:]:
            if len(row) > col and row[col].strip():
                out.setdefault(row[col].strip(), {h: _cell(v) for i, (h, v) in enumerate(zip(header, row, strict=False))
                                                   if i != col})
    return out


def _cell(text: str) -> Any:
    """A CSV cell as a number when it reads as one, null when empty, else the text."""
    value = text.strip()
    if value == "":
        return None
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return text


def _json_documents(text: str, data: Path, mapping: Mapping) -> list[Any]:
    decoder = json.JSONDecoder()
    docs: list[Any] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos] in " \t\r\n\ufeff":
            pos += 1
        if pos >= end:
            break
        try:
            doc, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise MappingError(f"{data}:{exc.lineno}: not valid JSON ({exc.msg})", path=mapping.source,
                               hint="is this file one the mapping reads? (its files globs, its format)") from exc
        docs.append(doc)
    if not docs:
        raise MappingError(f"{data}: empty file", path=mapping.source, hint="nothing to read")
    return docs


def _yaml_documents(text: str, data: Path, mapping: Mapping) -> list[Any]:
    """The documents of a YAML file: data only, no tags that build objects, except a tuple, read as a list
    (GuideLLM writes ``yaml.dump(report.model_dump())``, and a model's tuple fields come out ``!!python/tuple``)."""
    import yaml

    try:
        docs = [d for d in yaml.load_all(text, Loader=_yaml_loader()) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise MappingError(f"{data}{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})",
                           path=mapping.source, hint="is this file one the mapping reads? (its files globs, its format)"
                           ) from None
    if not docs:
        raise MappingError(f"{data}: empty file", path=mapping.source, hint="nothing to read")
    return docs


@functools.cache
def _yaml_loader() -> Any:
    """PyYAML's safe loader (libyaml's when built with it: ten times faster on a large report) that reads
    ``!!python/tuple`` as a list."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader: Any = type("ReportLoader", (base,), {})
    loader.add_constructor("tag:yaml.org,2002:python/tuple", lambda ld, node: ld.construct_sequence(node))
    return loader


@dataclass
class _Invalid:
    message: str


# ---------------------------------------------------------------------------------------------- rows
def _manifest_rows(sec: Section, df: DataFile) -> list[_Row]:
    if sec.layout == "keyed_rows":
        obj = keyed_rows(df.text, sec.key)
        return [_Row(obj, 0, "", None, 0, obj)] if obj else []
    if df.line_records and sec.paths == ("",):
        recs = df.docs[0]
        ok = [i for i, r in enumerate(recs) if not isinstance(r, _Invalid)][:1]
        return [_Row(recs[i], 0, "", df.lines[i] if df.lines else None) for i in ok]
    rows: list[_Row] = []
    for d, doc in enumerate(_documents(df)):
        for obj, label, star in select(doc, sec.paths[0]):
            if isinstance(obj, dict):
                rows.append(_Row(obj, len(rows), label, None, _group(d, star), doc))
    return rows


def _documents(df: DataFile) -> list[Any]:
    """The run documents: each JSON document, or for JSONL each line (a line holds a whole run)."""
    return df.docs[0] if df.line_records else df.docs


def _group(doc: int, star: int) -> int:
    return doc * 1_000_000 + star


def _record_rows(sec: Section, df: DataFile) -> tuple[list[_Row], bool]:
    """The rows of a records layout, and whether the section's paths exist in the file at all."""
    if df.line_records and sec.paths == ("",):
        recs = df.docs[0]
        return [_Row(o, i, "", df.lines[i] if df.lines else None) for i, o in enumerate(recs)], True
    rows: list[_Row] = []
    found_any = False
    for d, doc in enumerate(_documents(df)):
        for p in sec.paths:
            for found, label, star in select(doc, p):
                found_any = True
                items = found if isinstance(found, list) else [found] if found is not None else []
                rows.extend(_Row(o, len(rows), label, None, _group(d, star), doc) for o in items)
    return rows, found_any


def _parallel_rows(sec: Section, df: DataFile) -> tuple[list[_Row], bool]:
    """Rows of a parallel-arrays layout (row i = element i of each array the mapping reads), and whether
    any of those arrays is in the file (a summary-only result has none)."""
    names = _array_names(sec)
    rows: list[_Row] = []
    found_any = False
    for d, doc in enumerate(_documents(df)):
        for p in sec.paths:
            for root, _, star in select(doc, p):
                arrays = {k: v for k in names if isinstance(v := get_path(root, k), list)}
                if not arrays:
                    continue
                found_any = True
                n = max(len(v) for v in arrays.values())
                for i in range(n):
                    obj = {k: (v[i] if i < len(v) else None) for k, v in arrays.items()}
                    rows.append(_Row(_Parallel(root, obj), len(rows), "", None, _group(d, star), doc))
    return rows, found_any


def _array_names(sec: Section) -> list[str]:
    """Top-level fields a parallel-arrays section reads (its paths' first segments and the fields its
    expressions name)."""
    names: list[str] = []
    for spec in sec.fields:
        for p in spec.alternatives or ((spec.path,) if spec.path and spec.path not in SPECIALS else ()):
            if not p.startswith(DOC):
                names.append(p.split(".")[0])
        if spec.sql:
            names.extend(r[0] for r in mapsql.field_refs(spec.sql) if r[0] not in mapsql.SPECIAL_COLUMNS)
    return list(dict.fromkeys(names))


def _keys(obj: Any) -> list[str]:
    """The fields a record has (a parallel-arrays row: its document's), for an error's hint."""
    if isinstance(obj, _Parallel):
        return _keys(obj.root)
    return list(obj) if isinstance(obj, dict) else []


def _resolve(section: Section, rows: list[_Row]) -> Section:
    """Pick, for each field with alternative paths (or expressions), the first alternative this data file has
    (an expression: the first whose fields are there)."""
    if not any(spec.alternatives or spec.sql_alternatives for spec in section.fields):
        return section
    specs = []
    for spec in section.fields:
        if spec.alternatives:
            found = next((a for a in spec.alternatives
                          if any(_lookup_row(r, a) is not _MISSING for r in rows[:200])), spec.alternatives[0])
            spec = dataclasses.replace(spec, path=found)
        elif spec.sql_alternatives:
            expr = next((e for e in spec.sql_alternatives if _has_refs(e, rows[:200])), spec.sql_alternatives[0])
            spec = dataclasses.replace(spec, sql=expr)
        specs.append(spec)
    return dataclasses.replace(section, fields=tuple(specs))


def _has_refs(expr: str, rows: list[_Row]) -> bool:
    """Every field the expression names is in some record (special columns always are)."""
    refs = [r for r in mapsql.field_refs(expr) if r[0] not in mapsql.SPECIAL_COLUMNS]
    return all(any(_lookup_row(row, ".".join(r)) is not _MISSING for row in rows) for r in refs)


def _check_fields(section: Section, rows: list[_Row], mapping: Mapping, sec: str, data: Path) -> None:
    if not rows:
        return
    for spec in section.fields:
        if spec.path is None or spec.path in SPECIALS or spec.optional:
            continue
        if all(_lookup_row(r, spec.path) is _MISSING for r in rows):
            keys = sorted({k for r in rows[:50] for k in _keys(r.obj)})
            raise MappingError(
                f"[{sec}.fields] {spec.canonical} = {spec.path!r}: no such field in {data}", path=mapping.source,
                hint=f"fields there: {', '.join(keys[:25]) or 'none'}")


# ---------------------------------------------------------------------------------------------- expressions
def _expressions(section: Section, rows: list[_Row], df: DataFile, mapping: Mapping, sec: str
                 ) -> mapsql.Evaluated | None:
    """The section's SQL fields and filter over ``rows`` (None when it has none)."""
    exprs = {s.canonical: s.sql for s in section.fields if s.sql}
    exprs.update({f"$anchor{i}": a.sql for i, a in enumerate(section.anchors)
                  if isinstance(a, FieldSpec) and a.sql})
    if not exprs and section.where is None:
        return None
    data = df.path
    specials: dict[str, list[Any]] = {"$index": [r.index for r in rows], "$number": [r.index + 1 for r in rows],
                "$source": [r.source for r in rows], "$line": [r.line for r in rows],
                "$stem": [file_stem(data.name)] * len(rows), "$name": [data.name] * len(rows),
                "$parent": [data.resolve().parent.name] * len(rows)}
    try:
        res = mapsql.evaluate(exprs, section.where, [r.obj for r in rows], _csv_top if df.fmt == "csv" else _top,
                              specials)
    except mapsql.Refused as exc:
        raise MappingError(f"[{sec}] refused: {exc} (reading {data})", path=mapping.source,
                           hint=REFUSED_HINT) from None
    except mapsql.ExpressionError as exc:
        raise MappingError(f"[{sec}] {exc} (reading {data})", path=mapping.source,
                           hint="fix the expression; DuckDB SQL over the record's fields") from None
    if rows:
        _check_refs(section, res.absent, mapping, sec, data, rows)
    return res


def _top(obj: Any, key: str) -> Any:
    return get_path(obj, key) if key else _MISSING


def _csv_top(obj: Any, key: str) -> Any:
    """A CSV cell as expressions see it: a number when it reads as one, null when empty."""
    value = _top(obj, key)
    return _cell(value) if isinstance(value, str) else value


def _check_refs(section: Section, absent: set[mapsql.Path_], mapping: Mapping, sec: str, data: Path,
                rows: list[_Row]) -> None:
    """An expression none of whose fields any record has reads nothing from this file: an error, unless
    the field is optional."""
    for spec in section.fields:
        if not spec.sql or spec.optional:
            continue
        refs = [r for r in mapsql.field_refs(spec.sql) if r[0] not in mapsql.SPECIAL_COLUMNS]
        if refs and all(r in absent for r in refs):
            keys = sorted({k for r in rows[:50] for k in _keys(r.obj)})
            raise MappingError(
                f"[{sec}.fields] {spec.canonical}: no record of {data} has "
                f"{', '.join('.'.join(r) for r in refs)}", path=mapping.source,
                hint=f"fields there: {', '.join(keys[:25]) or 'none'}; optional = true reads them as null")


# ---------------------------------------------------------------------------------------------- conversion
def _template(value: Any, data: Path) -> Any:
    if not isinstance(value, str) or "{" not in value:
        return value
    return value.format(stem=file_stem(data.name), name=data.name, parent=data.resolve().parent.name)


def _convert(spec: FieldSpec, kind: str, value: Any) -> Any:
    if spec.map is not None:
        key = "$null" if value is None or value is _MISSING else (
            str(value).lower() if isinstance(value, bool) else str(value))
        if key in spec.map:
            value = spec.map[key]
        elif "*" in spec.map and key != "$null":
            value = spec.map["*"]
    if value is _MISSING or value is None or value == "":
        return spec.default
    if kind in ("int", "float", "ms", "time") and isinstance(value, str):
        try:
            value = float(value) if spec.unit not in (None, "iso") or kind != "time" else value
        except ValueError:
            return value  # left for the schema to report
    if spec.scale is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = value * spec.scale
    if kind == "time":
        return _time(spec, value)
    if kind == "ms" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) * DURATION_UNITS[spec.unit or "ms"]
    return _scalar(kind, value)


def _time(spec: FieldSpec, value: Any) -> Any:
    unit = spec.unit or "iso"
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z") if value.tzinfo else \
            value.isoformat()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if unit in CLOCK_UNITS:
        return Relative(float(value) * CLOCK_UNITS[unit])
    if unit in ("epoch_ns", "epoch_us") and isinstance(value, int):  # exact: a float loses the microseconds
        micros = value // 1000 if unit == "epoch_ns" else value
        return (EPOCH + timedelta(microseconds=micros)).isoformat().replace("+00:00", "Z")
    scale = TIME_UNITS[unit]
    if scale is not None:  # every unit but iso
        return datetime.fromtimestamp(value * scale, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    return value


def _scalar(kind: str, value: Any) -> Any:
    if kind == "int" and isinstance(value, float) and value == int(value):
        return int(value)
    if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind == "bool" and isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
    if kind == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


def _value(spec: FieldSpec, row: _Row, data: Path, computed: dict[str, list[Any]] | None) -> Any:
    if spec.sql is not None:
        return computed[spec.canonical][row.index] if computed is not None else None
    if spec.path is None:
        return _template(spec.const, data)
    if spec.path == "$index":
        return row.index
    if spec.path == "$number":
        return row.index + 1
    if spec.path == "$source":
        return row.source
    if spec.path == "$line":
        return row.line
    return _lookup_row(row, spec.path)


def _lookup_row(row: _Row, path: str) -> Any:
    """``path`` in the record, or with ``$doc.`` in the document the record is in."""
    if path.startswith(DOC):
        return get_path(row.doc, path[len(DOC):]) if row.doc is not None else _MISSING
    return get_path(row.obj, path)


def _build(section: Section, kinds: dict[str, str], row: _Row, data: Path,
           computed: dict[str, list[Any]] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for spec in section.fields:
        value = _convert(spec, kinds[spec.canonical], _value(spec, row, data, computed))
        if spec.canonical in obj and value is None:
            continue  # a constant does not erase a mapped value
        if spec.path is None and spec.sql is None and obj.get(spec.canonical) is not None:
            continue  # set = defaults: a mapped value wins
        obj[spec.canonical] = value
    whole = obj.pop("timings", None)
    timings = {**(whole if isinstance(whole, dict) else {}), **{k: v for k in TIMINGS if (v := obj.pop(k, None)) is not None}}
    timings = {k: timings[k] for k in TIMINGS if timings.get(k) is not None}
    if timings:
        obj["timings"] = timings
    for nested in NESTED:
        sub = {k.split(".", 1)[1]: obj.pop(k) for k in list(obj) if k.startswith(f"{nested}.")}
        if any(v is not None for v in sub.values()):
            obj[nested] = sub
    return {k: v for k, v in obj.items() if v is not None}


# ---------------------------------------------------------------------------------------------- apply
@dataclass
class Mapped:
    """What a mapping read from one data file: raw records, how many records ``where`` left out, and
    whether the file holds per-request rows at all (a summary-only file does not)."""

    records: list[RawRecord]
    filtered: int = 0
    per_request: bool = False
    reads_attempts: bool = False  # the attempts section applies to this file (by its files globs)
    notes: list[str] = field(default_factory=list)  # the ``absent`` sentences of fields this file lacks


class ForeignFile(MappingError):
    """A data file that has none of the fields a mapping reads: another tool's file, not a broken one of this tool."""


def apply(mapping: Mapping, data: Path | str, *, by_content: bool = False) -> Mapped:
    """Raw (canonical-shaped, not yet validated) records of ``data`` read through ``mapping``.

    The sections whose ``files`` globs name the file read it.  With ``by_content`` (a file the user named
    with this mapping: a renamed file), a file no glob names is tried against each section in turn, and the
    sections that fit it read it.

    Raises MappingError when the mapping does not fit the file: a field it names that no record has, an
    expression DuckDB rejects, or neither section finding anything there (by content: which sections were
    tried and why each failed); ForeignFile (a MappingError) when the file has none of the fields the mapping
    reads at all."""
    data = Path(data)
    df = read_data(mapping, data)
    named = [name for name, sec in _named_sections(mapping) if sec.applies_to(data)]
    if named or not by_content:
        return _guarded(mapping, data, df, tuple(named))
    failures: list[str] = []
    fits: list[str] = []
    for name, sec in _named_sections(mapping):
        try:
            tried = _guarded(mapping, data, df, (name,))
        except MappingError as exc:
            failures.append(f"[{name}]{_globs_said(sec)}: {_reason(exc)}")
            continue
        if tried.records:
            fits.append(name)
        else:
            failures.append(f"[{name}]{_globs_said(sec)}: nothing there")
    if fits:
        return _guarded(mapping, data, df, tuple(fits))
    raise MappingError(f"{data.name}: no table of mapping {mapping.name} fits it by content: {'; '.join(failures)}",
                       path=mapping.source, hint="is this a file of that tool? (a mapping of your own reads any layout)")


def _named_sections(mapping: Mapping) -> list[tuple[str, Section]]:
    return [(label, s) for label, _, s in mapping.tables]


def _globs_said(sec: Section) -> str:
    return f" (files {', '.join(sec.files)})" if sec.files else ""


def _reason(exc: MappingError) -> str:
    return exc.message.split("] ", 1)[-1] if exc.message.startswith("[") else exc.message


def _guarded(mapping: Mapping, data: Path, df: DataFile, sections: tuple[str, ...]) -> Mapped:
    try:
        return _apply(mapping, data, df, sections)
    except ForeignFile:
        raise
    except MappingError as exc:
        used = [s for n, s in _named_sections(mapping) if n in sections]
        if not any(_top_keys(df, s) & _top_fields(s) for s in used):
            have = set().union(*(_top_keys(df, s) for s in used)) if used else set()
            raise ForeignFile(f"{data.name} has none of the fields mapping {mapping.name} reads (it has: "
                              f"{', '.join(sorted(have)[:12]) or 'none'})", path=mapping.source) from exc
        raise


def _top_keys(df: DataFile, sec: Section) -> set[str]:
    """The top-level keys of the file's documents and of its first records (as the section reads the file)."""
    if sec.layout == "keyed_rows":
        return set(keyed_rows(df.text, sec.key))
    keys: set[str] = set()
    for doc in df.docs[:50]:
        for obj in (doc if isinstance(doc, list) else [doc])[:50]:
            if isinstance(obj, dict):
                keys |= set(obj)
    return keys


def _top_fields(sec: Section) -> set[str]:
    """The first segments of the paths and expression fields a section reads (what a file of its tool has)."""
    names = {p.split(".")[0] for p in sec.paths if p and not p.startswith("*")}
    for spec in sec.fields:
        for p in spec.alternatives or ((spec.path,) if spec.path else ()):
            if not p.startswith("$"):
                names.add(p.split(".")[0])
            elif p.startswith(DOC):
                names.add(p[len(DOC):].split(".")[0])
        if spec.sql:
            names |= {r[0] for r in mapsql.field_refs(spec.sql) if r[0] not in mapsql.SPECIAL_COLUMNS}
    return names


def _apply(mapping: Mapping, data: Path, df: DataFile, sections: tuple[str, ...]) -> Mapped:
    out = Mapped([])
    base = data.resolve().parent
    manifests = 0
    for label, kind, sec in mapping.tables:
        if label not in sections or kind != "manifest":
            continue
        for raw in _apply_manifest(mapping, sec, df, base, out):
            raw.templated_run = _templated_run(sec)
            out.records.append(raw)
            manifests += 1
    for label, kind, sec in mapping.tables:
        if label not in sections or kind != "attempts":
            continue
        out.reads_attempts = True
        before = len(out.records)
        found = _apply_attempts(mapping, sec, df, base, out)
        for raw in out.records[before:]:
            raw.templated_run = _templated_run(sec)
        if not found and not manifests:
            raise MappingError(f"[{label}] path {' or '.join(repr(p) for p in sec.paths)}: nothing there in {data}",
                               path=mapping.source, hint="is this file one the mapping reads? (its files globs)")
    filtered_all = [s for label, kind, s in mapping.tables if label in sections and kind == "manifest" and s.where]
    if not out.records and not out.reads_attempts and filtered_all:
        raise ForeignFile(f"{data.name} is not a {mapping.name} file: its manifest's where leaves nothing of it",
                          path=mapping.source)
    _suffix_runs(out.records)
    return out


def _apply_manifest(mapping: Mapping, sec: Section, df: DataFile, base: Path, out: Mapped) -> list[RawRecord]:
    rows = _manifest_rows(sec, df)
    sec = _resolve(sec, rows)
    _check_fields(sec, rows, mapping, "manifest", df.path)
    ev = _expressions(sec, rows, df, mapping, "manifest")
    out.notes.extend(_absent_notes(sec, rows, ev))
    return [RawRecord("manifest", _build(sec, MANIFEST_FIELDS, row, df.path, ev.values if ev else None),
                      str(df.path), row.line, None, base, row.group)
            for row in rows if ev is None or ev.keep[row.index]]


def _apply_attempts(mapping: Mapping, sec: Section, df: DataFile, base: Path, out: Mapped) -> bool:
    """Append the attempts of ``df`` to ``out``; return whether the file has the section's records at all."""
    if sec.layout == "events":  # one row per key, each field taken from the events that carry it
        objs = None if df.fmt == "jsonl" and sec.paths == ("",) else [
            (r.obj, r.line) for r in _record_rows(sec, df)[0] if isinstance(r.obj, dict)]
        grouped = events.group(mapping, sec, df, objs)
        rows, found, sec = [_Row(o, i, "", ln) for i, (o, ln) in enumerate(grouped.rows)], grouped.found, grouped.section
        out.notes.extend(grouped.notes)
    elif sec.layout == "parallel_arrays":
        rows, found = _parallel_rows(sec, df)
        sec = _resolve(sec, rows)
        _check_fields(sec, rows, mapping, "attempts", df.path)
    else:
        rows, found = _record_rows(sec, df)
        good = [r for r in rows if not isinstance(r.obj, _Invalid)]
        sec = _resolve(sec, good)
        _check_fields(sec, good, mapping, "attempts", df.path)
    valid = [r for r in rows if not isinstance(r.obj, _Invalid)]
    for i, r in enumerate(valid):
        r.index = i
    ev = _expressions(sec, valid, df, mapping, "attempts")
    out.notes.extend(_absent_notes(sec, valid, ev))
    anchors = _anchor_values(sec, valid, df.path, ev)
    hint = ", ".join(a if isinstance(a, str) else (a.path or a.sql or "") for a in sec.anchors)
    for row in rows:
        if isinstance(row.obj, _Invalid):
            out.records.append(RawRecord("invalid", row.obj.message, str(df.path), row.line))
            continue
        if ev is not None and not ev.keep[row.index]:
            out.filtered += 1
            continue
        rec = None if row.line is not None else row.index + 1
        obj = _build(sec, ATTEMPT_FIELDS, row, df.path, ev.values if ev else None)
        out.records.append(RawRecord("attempt", obj, str(df.path), row.line, rec, base, row.group,
                                     anchors.get(row.group, ()), hint))
    out.per_request = out.per_request or found
    return found


def _absent_notes(sec: Section, rows: list[_Row], ev: mapsql.Evaluated | None) -> list[str]:
    """The ``absent`` sentences of the fields none of whose inputs any record of the file has."""
    if not rows:
        return []
    notes = []
    for spec in sec.fields:
        if spec.absent is None:
            continue
        if spec.sql is not None:
            refs = [r for r in mapsql.field_refs(spec.sql) if r[0] not in mapsql.SPECIAL_COLUMNS]
            lacking = ev is not None and bool(refs) and all(r in ev.absent for r in refs)
        else:
            lacking = spec.path is not None and all(_lookup_row(r, spec.path) is _MISSING for r in rows)
        if lacking:
            notes.append(spec.absent)
    return list(dict.fromkeys(notes))


def _anchor_values(sec: Section, rows: list[_Row], data: Path, ev: mapsql.Evaluated | None
                   ) -> dict[int, tuple[Any, ...]]:
    """Group -> its anchors in the mapping's order: epoch seconds from the first record having the field,
    or ``"manifest"``."""
    if not sec.anchors:
        return {}
    out: dict[int, list[Any]] = {}
    for i, a in enumerate(sec.anchors):
        for g in sorted({r.group for r in rows}):
            if a == MANIFEST:
                out.setdefault(g, []).append(MANIFEST)
                continue
            if not isinstance(a, FieldSpec):  # an anchor is the manifest or a field, as parsed
                raise InternalError(f"anchor {a!r} of the section at {sec.paths} is neither a field nor the manifest")
            computed = {"anchor": ev.values[f"$anchor{i}"]} if ev is not None and a.sql else None
            for row in (r for r in rows if r.group == g):
                t = _convert(a, "time", _value(a, row, data, computed))
                if isinstance(t, str):
                    try:
                        at = parse_time(t, "anchor")
                    except ValueError:
                        continue
                    if at is not None:
                        out.setdefault(g, []).append(at.timestamp())
                        break
    return {g: tuple(v) for g, v in out.items()}


def _suffix_runs(raws: list[RawRecord]) -> None:
    """A file holding several runs (documents, or a ``*`` of the path) gives each a run id of its own: a
    templated ``run_id`` gets ``#1``, ``#2``, ... in the file's order."""
    groups = sorted({r.group for r in raws if r.kind in ("manifest", "attempt")})
    if len(groups) < 2:
        return
    number = {g: i + 1 for i, g in enumerate(groups)}
    for r in raws:
        if r.kind in ("manifest", "attempt") and r.templated_run and isinstance(r.obj, dict) and r.obj.get("run_id"):
            r.obj = {**r.obj, "run_id": f"{r.obj['run_id']}#{number[r.group]}"}


def _templated_run(sec: Section) -> bool:
    specs = [s for s in sec.fields if s.canonical == "run_id"]
    return bool(specs) and all(s.path is None and s.sql is None for s in specs)

"""Harness mapping files (TOML): read another tool's per-request records as canonical replay records.

A mapping names, for each canonical field, where the harness keeps it (a dot path into JSON, a CSV
column), converts units (s/ms/us/ns durations, epoch or ISO times), maps status values, and sets
constants or templated defaults (``{stem}``: the data file's name without extensions).  The mapped
objects then go through the same JSON Schema validation as canonical records.  See the README, "Replay runs".
"""

from __future__ import annotations

import csv
import dataclasses
import fnmatch
import io
import json
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from forensics.errors import MappingError
from forensics.paths import file_stem
from forensics.replay.records import RawRecord, read_text

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
    "output_chars": "int", "max_tokens": "int",
}
MANIFEST_FIELDS = {
    "run_id": "str", "started_at": "time", "ended_at": "time", "concurrency": "int", "model": "str",
    "servers": "any", "items": "list", "stages": "list", "budgets": "any", "config": "any",
    "ended.how": "str", "ended.detail": "str", "ended.after_s": "float",
}
TIMINGS = ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")
TIME_UNITS = {"iso": None, "epoch_s": 1.0, "epoch_ms": 1e-3, "epoch_us": 1e-6, "epoch_ns": 1e-9}
DURATION_UNITS = {"s": 1000.0, "ms": 1.0, "us": 1e-3, "ns": 1e-6}
SPECIALS = ("$index", "$number", "$source", "$line")
FORMATS = ("json", "jsonl", "csv")
LAYOUTS = ("records", "parallel_arrays")
_MISSING = object()


@dataclass(frozen=True)
class FieldSpec:
    canonical: str
    path: str | None  # None: a constant
    unit: str | None = None
    scale: float | None = None
    map: dict[str, Any] | None = None
    default: Any = None
    const: Any = _MISSING
    optional: bool = False  # the data may lack it (older tool versions): no error, the value is null
    alternatives: tuple[str, ...] = ()  # path = [a, b, ...]: the first one the data file has (tool versions)


@dataclass(frozen=True)
class Section:
    paths: tuple[str, ...]  # where the records (or the object) are; "" = the document root
    layout: str
    fields: tuple[FieldSpec, ...]
    files: str | None = None  # glob on the data file's name: the section applies to matching files only

    def applies_to(self, data: Path) -> bool:
        return self.files is None or fnmatch.fnmatch(data.name, self.files)


@dataclass(frozen=True)
class Mapping:
    """A loaded mapping file."""

    source: str  # the mapping file
    name: str
    format: str | None
    manifest: Section | None
    attempts: Section | None
    extra: dict[str, Any] = field(default_factory=dict)

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
        return "json"


def shipped_mappings() -> dict[str, Path]:
    """The mappings shipped with forensics, by name (``vllm-bench``, ``guidellm``, ``aiperf``)."""
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
    meta = data.get("mapping", {})
    fmt = meta.get("format")
    if fmt is not None and fmt not in FORMATS:
        raise MappingError(f"[mapping] format = {fmt!r} is not one of {', '.join(FORMATS)}", path=src)
    unknown = set(data) - {"mapping", "manifest", "attempts"}
    if unknown:
        raise MappingError(f"unknown section(s) {', '.join(sorted(unknown))}", path=src,
                           hint="sections are [mapping], [manifest] and [attempts]")
    manifest = _section(data.get("manifest"), "manifest", MANIFEST_FIELDS, src)
    attempts = _section(data.get("attempts"), "attempts", ATTEMPT_FIELDS, src)
    if manifest is None and attempts is None:
        raise MappingError("the mapping has neither [manifest] nor [attempts]", path=src,
                           hint="see the README, section Mapping files, for the format")
    return Mapping(src, str(meta.get("name") or p.stem), fmt, manifest, attempts, meta)


def _section(raw: Any, name: str, allowed: dict[str, str], src: str) -> Section | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise MappingError(f"[{name}] must be a table", path=src)
    paths = raw.get("path", "")
    paths_t = (paths,) if isinstance(paths, str) else tuple(paths)
    layout = raw.get("layout", "records")
    if layout not in LAYOUTS:
        raise MappingError(f"[{name}] layout = {layout!r} is not one of {', '.join(LAYOUTS)}", path=src)
    specs: list[FieldSpec] = []
    for key, spec in _flatten_fields(raw.get("fields", {})).items():
        if key not in allowed:
            raise MappingError(f"[{name}.fields] {key} is not a canonical {name} field", path=src,
                               hint=f"fields: {', '.join(allowed)}")
        if isinstance(spec, str):
            specs.append(FieldSpec(key, spec))
        elif isinstance(spec, list) and spec and all(isinstance(x, str) for x in spec):
            specs.append(FieldSpec(key, spec[0], alternatives=tuple(spec)))
        elif isinstance(spec, dict):
            bad = set(spec) - {"path", "unit", "scale", "map", "default", "optional"}
            if bad or "path" not in spec:
                raise MappingError(f"[{name}.fields] {key}: give path and optionally unit, scale, map, default, "
                                   "optional"
                                   + (f" (unknown: {', '.join(sorted(bad))})" if bad else ""), path=src)
            unit = spec.get("unit")
            kind = allowed[key]
            if unit is not None:
                units = TIME_UNITS if kind == "time" else DURATION_UNITS if kind == "ms" else {}
                if unit not in units:
                    raise MappingError(f"[{name}.fields] {key}: unit {unit!r} does not apply"
                                       + (f" (use one of {', '.join(units)})" if units else
                                          " (units apply to times and *_ms durations; use scale)"), path=src)
            path = spec["path"]
            alts = tuple(path) if isinstance(path, list) else ()
            specs.append(FieldSpec(key, alts[0] if alts else path, unit, spec.get("scale"), spec.get("map"),
                                   spec.get("default"), optional=bool(spec.get("optional", False)),
                                   alternatives=alts))
        else:
            raise MappingError(f"[{name}.fields] {key}: expected a path string or a table", path=src)
    for key, value in _flatten_fields(raw.get("set", {})).items():
        if key not in allowed:
            raise MappingError(f"[{name}.set] {key} is not a canonical {name} field", path=src,
                               hint=f"fields: {', '.join(allowed)}")
        specs.append(FieldSpec(key, None, const=value))
    files = raw.get("files")
    if files is not None and not isinstance(files, str):
        raise MappingError(f"[{name}] files must be a glob string such as \"*.csv\"", path=src)
    return Section(paths_t, layout, tuple(specs), files)


def _flatten_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """``ended = {how = ...}`` and ``"ended.how" = ...`` both give ``ended.how``."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if k == "ended" and isinstance(v, dict) and "path" not in v:
            for k2, v2 in v.items():
                out[f"ended.{k2}"] = v2
        else:
            out[k] = v
    return out


# ---------------------------------------------------------------------------------------------- data access
def get_path(obj: Any, path: str) -> Any:
    """The value at dot ``path`` in ``obj`` (numbers index lists), or ``_MISSING``."""
    if path == "":
        return obj
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


def select(doc: Any, path: str) -> list[tuple[Any, str]]:
    """Objects at ``path``, where ``*`` iterates a list (or an object's values); each with the last
    named segment of the path (``$source``)."""
    if path == "":
        return [(doc, "")]
    found: list[tuple[Any, str]] = [(doc, "")]
    for part in path.split("."):
        nxt: list[tuple[Any, str]] = []
        for obj, label in found:
            if part == "*":
                if isinstance(obj, list):
                    nxt.extend((o, label) for o in obj)
                elif isinstance(obj, dict):
                    nxt.extend((o, label) for o in obj.values())
            else:
                v = get_path(obj, part)
                if v is not _MISSING:
                    nxt.append((v, part))
        found = nxt
    return found


@dataclass
class _Row:
    obj: Any
    index: int
    source: str
    line: int | None


def _rows(doc: Any, section: Section, fmt: str, lines: list[int] | None) -> list[_Row]:
    rows: list[_Row] = []
    if fmt in ("jsonl", "csv") and section.paths == ("",):
        assert isinstance(doc, list)
        return [_Row(o, i, "", lines[i] if lines else None) for i, o in enumerate(doc)]
    for p in section.paths:
        for found, label in select(doc, p):
            if isinstance(found, list):
                rows.extend(_Row(o, len(rows) + j, label, None) for j, o in enumerate(found))
            elif found is not None:
                rows.append(_Row(found, len(rows), label, None))
    return rows


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
        unit = spec.unit or "iso"
        if unit != "iso" and isinstance(value, (int, float)):
            dt = datetime.fromtimestamp(float(value) * TIME_UNITS[unit], tz=timezone.utc)
            return dt.isoformat().replace("+00:00", "Z")
        return value
    if kind == "ms" and isinstance(value, (int, float)):
        return float(value) * DURATION_UNITS[spec.unit or "ms"]
    if kind == "int" and isinstance(value, float) and value == int(value):
        return int(value)
    if kind == "float" and isinstance(value, (int, float)):
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


def _value(spec: FieldSpec, row: _Row, data: Path) -> Any:
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
    return get_path(row.obj, spec.path)


def _check_fields(section: Section, rows: list[_Row], mapping: Mapping, sec: str, data: Path) -> None:
    if not rows:
        return
    for spec in section.fields:
        if spec.path is None or spec.path in SPECIALS or spec.optional:
            continue
        if all(get_path(r.obj, spec.path) is _MISSING for r in rows):
            keys = sorted({k for r in rows[:50] if isinstance(r.obj, dict) for k in r.obj})
            raise MappingError(
                f"[{sec}.fields] {spec.canonical} = {spec.path!r}: no such field in {data}", path=mapping.source,
                hint=f"fields there: {', '.join(keys[:25]) or 'none'}")


def _parallel(section: Section, doc: Any, mapping: Mapping, data: Path) -> list[_Row]:
    roots = [o for p in section.paths for o, _ in select(doc, p)]
    if not roots:
        raise MappingError(f"[attempts] path {section.paths!r}: nothing there in {data}", path=mapping.source)
    rows: list[_Row] = []
    for root in roots:
        arrays: dict[str, list[Any]] = {}
        for spec in section.fields:
            if spec.path is None or spec.path in SPECIALS:
                continue
            v = get_path(root, spec.path)
            if v is _MISSING and spec.optional:
                continue
            if v is _MISSING:
                keys = sorted(root) if isinstance(root, dict) else []
                raise MappingError(
                    f"[attempts.fields] {spec.canonical} = {spec.path!r}: no such field in {data}",
                    path=mapping.source, hint=f"fields there: {', '.join(keys[:25]) or 'none'}")
            if isinstance(v, list):
                arrays[spec.path] = v
        n = max((len(v) for v in arrays.values()), default=0)
        for i in range(n):
            obj = {p: (v[i] if i < len(v) else None) for p, v in arrays.items()}
            rows.append(_Row(_Parallel(root, obj), len(rows), "", None))
    return rows


class _Parallel(dict):  # type: ignore[type-arg]
    """Row i of a parallel-arrays layout: array fields give their i-th value, other fields broadcast."""

    def __init__(self, root: Any, row: dict[str, Any]) -> None:
        super().__init__(row)
        self.root = root


def _lookup(obj: Any, path: str) -> Any:
    if isinstance(obj, _Parallel):
        return dict.__getitem__(obj, path) if path in obj else get_path(obj.root, path)
    return get_path(obj, path)


def read_data(mapping: Mapping, data: Path) -> tuple[Any, list[int] | None]:
    """The parsed data file: a JSON document, or a list of records for JSONL/CSV with their line numbers."""
    fmt = mapping.fmt_for(data)
    text = read_text(data)
    if fmt == "json":
        try:
            return json.loads(text), None
        except json.JSONDecodeError as exc:
            raise MappingError(f"{data}:{exc.lineno}: not valid JSON ({exc.msg})", path=mapping.source,
                               hint="is the mapping's format right?") from exc
    if fmt == "jsonl":
        recs, lines = [], []
        for i, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError:
                    recs.append(_Invalid(f"not valid JSON on line {i}"))
                lines.append(i)
        return recs, lines
    reader = csv.DictReader(io.StringIO(text))
    recs_c: list[Any] = []
    lines_c: list[int] = []
    for row in reader:
        recs_c.append(dict(row))
        lines_c.append(reader.line_num)
    return recs_c, lines_c


@dataclass
class _Invalid:
    message: str


def _resolve(section: Section, objs: list[Any]) -> Section:
    """Pick, for each field with alternative paths, the first alternative that this data file has."""
    if not any(spec.alternatives for spec in section.fields):
        return section
    specs = []
    for spec in section.fields:
        if spec.alternatives:
            found = next((a for a in spec.alternatives
                          if any(_lookup(o, a) is not _MISSING for o in objs[:200])), spec.alternatives[0])
            spec = dataclasses.replace(spec, path=found)
        specs.append(spec)
    return dataclasses.replace(section, fields=tuple(specs))


def apply(mapping: Mapping, data: Path | str) -> list[RawRecord]:
    """Raw (canonical-shaped, not yet validated) records of ``data`` read through ``mapping``."""
    data = Path(data)
    doc, lines = read_data(mapping, data)
    fmt = mapping.fmt_for(data)
    out: list[RawRecord] = []
    base = data.resolve().parent
    if mapping.manifest is not None and mapping.manifest.applies_to(data):
        sec = mapping.manifest
        if fmt in ("jsonl", "csv") and sec.paths == ("",):
            rows = [_Row(doc[0], 0, "", lines[0] if lines else None)] if doc else []
        else:
            rows = [_Row(o, 0, label, None) for o, label in select(doc, sec.paths[0])][:1]
        sec = _resolve(sec, [r.obj for r in rows])
        _check_fields(sec, rows, mapping, "manifest", data)
        for row in rows:
            out.append(RawRecord("manifest", _build(sec, MANIFEST_FIELDS, row, data), str(data), row.line,
                                 None, base))
    if mapping.attempts is not None and mapping.attempts.applies_to(data):
        sec = mapping.attempts
        if sec.layout == "parallel_arrays":
            sec = _resolve(sec, [o for p in sec.paths for o, _ in select(doc, p)])
            rows = _parallel(sec, doc, mapping, data)
        else:
            rows = _rows(doc, sec, fmt, lines)
            sec = _resolve(sec, [r.obj for r in rows if not isinstance(r.obj, _Invalid)])
            _check_fields(sec, [r for r in rows if not isinstance(r.obj, _Invalid)], mapping, "attempts", data)
        for row in rows:
            if isinstance(row.obj, _Invalid):
                out.append(RawRecord("invalid", row.obj.message, str(data), row.line))
                continue
            rec = None if row.line is not None else row.index + 1
            out.append(RawRecord("attempt", _build(sec, ATTEMPT_FIELDS, row, data), str(data), row.line, rec, base))
    return out


def _build(section: Section, kinds: dict[str, str], row: _Row, data: Path) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for spec in section.fields:
        if spec.path is None or spec.path in SPECIALS:
            raw = _value(spec, row, data)
        else:
            raw = _lookup(row.obj, spec.path)
        value = _convert(spec, kinds[spec.canonical], raw)
        if spec.canonical in obj and value is None:
            continue  # a constant does not erase a mapped value
        if spec.path is None and obj.get(spec.canonical) is not None:
            continue  # set = defaults: a mapped value wins
        obj[spec.canonical] = value
    timings = {k: obj.pop(k) for k in TIMINGS if k in obj}
    if any(v is not None for v in timings.values()):
        obj["timings"] = timings
    ended = {k.split(".", 1)[1]: obj.pop(k) for k in list(obj) if k.startswith("ended.")}
    if ended:
        obj["ended"] = ended
    return {k: v for k, v in obj.items() if v is not None}

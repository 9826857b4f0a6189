"""Format definitions as data: load, compile and self-check ``parsers/formats/*.toml``.

A format file declares its line kinds as named regexes whose groups are typed fields (declared once in
``fields.toml``), with sample lines.  The loader refuses a kind without samples, a regex that does not
compile, a group that is not a declared field, and a sample that the engine would not classify as the
kind that carries it.  Adding a llama.cpp version means adding rows to these files, not engine code.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from forensics.errors import FormatDefinitionError

FORMATS_DIR = Path(__file__).parent / "formats"
FIELD_TYPES = {"int", "float", "str", "bool"}


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    description: str


@dataclass(frozen=True)
class Kind:
    """One kind of log line."""

    name: str
    regex: str
    prefilter: str
    samples: tuple[str, ...]
    fields: tuple[str, ...]
    skip: bool = False  # deliberately ignored: counted in lines_skipped, no event row
    fallback: bool = False  # catch-all; exempt from the "sample matches one kind" check
    multiline: bool = False  # unknown lines after it are its continuation
    startup: bool = False  # part of a server's start-up banner
    boundary: bool = False  # the first line a new server process writes
    inherit: str | None = None  # take slot/task from the latest line of this kind (era-4 timing block)
    inherit_next: str | None = None  # take slot/task from the next line of this kind (era-2 timings)
    json_fields: tuple[tuple[str, str], ...] = ()  # (field, JSON path) for JSON-family formats
    kv_fields: tuple[tuple[str, str], ...] = ()  # (field, key) for key=value tails


@dataclass(frozen=True)
class Format:
    name: str
    title: str
    family: str  # text | json | kv
    prefix: str
    detect: tuple[str, ...]
    kinds: tuple[Kind, ...]
    source: str
    message: str | None = None  # JSON family: path of the message; kv family: regex group holding it
    record: str | None = None  # kv family: regex splitting level/function/message/tail
    time_field: str | None = None  # JSON/kv: epoch seconds field
    level_field: str | None = None
    func_field: str | None = None
    extra: dict = field(default_factory=dict)

    def kind(self, name: str) -> Kind:
        for k in self.kinds:
            if k.name == name:
                return k
        raise KeyError(name)


def _read_toml(path: Path) -> dict:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise FormatDefinitionError(f"not valid TOML: {exc}", path=str(path),
                                    hint="fix the syntax of the format file") from exc


@cache
def load_fields() -> dict[str, Field]:
    path = FORMATS_DIR / "fields.toml"
    data = _read_toml(path).get("fields", {})
    out: dict[str, Field] = {}
    for name, spec in data.items():
        if spec.get("type") not in FIELD_TYPES:
            raise FormatDefinitionError(f"field {name!r} has type {spec.get('type')!r}", path=str(path),
                                        hint=f"use one of {sorted(FIELD_TYPES)}")
        out[name] = Field(name, spec["type"], spec.get("description", ""))
    return out


_GROUP = re.compile(r"\(\?P<([A-Za-z_]\w*)>")


def _expand(regex: str, macros: dict[str, str]) -> str:
    for key, value in macros.items():
        regex = regex.replace("{" + key + "}", value)
    return regex


def load_format(path: Path) -> Format:
    data = _read_toml(path)
    fields = load_fields()
    meta = data.get("format") or {}
    if "name" not in meta:
        raise FormatDefinitionError("missing [format] name", path=str(path), hint="add name = \"...\"")
    macros = data.get("macros", {})
    kinds: list[Kind] = []
    seen: set[str] = set()
    for i, raw in enumerate(data.get("kind", [])):
        name = raw.get("name") or f"#{i}"
        where = f"kind {name!r}"
        if name in seen:
            raise FormatDefinitionError(f"{where} is declared twice", path=str(path))
        seen.add(name)
        if "regex" not in raw:
            raise FormatDefinitionError(f"{where} has no regex", path=str(path))
        regex = _expand(raw["regex"], macros)
        try:
            re.compile(regex)
        except re.error as exc:
            raise FormatDefinitionError(f"{where} regex does not compile: {exc}", path=str(path)) from exc
        groups = tuple(dict.fromkeys(_GROUP.findall(regex)))
        json_fields = tuple((k, v) for k, v in (raw.get("json") or {}).items())
        kv_fields = tuple((k, v) for k, v in (raw.get("kv") or {}).items())
        for g in (*groups, *(k for k, _ in json_fields), *(k for k, _ in kv_fields)):
            if g not in fields:
                raise FormatDefinitionError(f"{where} captures {g!r}, which fields.toml does not declare",
                                            path=str(path), hint="declare the field with its type")
        samples = tuple(raw.get("samples", ()))
        if not samples:
            raise FormatDefinitionError(f"{where} has no samples", path=str(path),
                                        hint="every kind needs at least one sample line")
        all_fields = tuple(dict.fromkeys((*groups, *(k for k, _ in json_fields), *(k for k, _ in kv_fields))))
        kinds.append(Kind(
            name=name, regex=regex, prefilter=raw.get("prefilter", ""), samples=samples, fields=all_fields,
            skip=bool(raw.get("skip", False)), fallback=bool(raw.get("fallback", False)),
            multiline=bool(raw.get("multiline", False)), startup=bool(raw.get("startup", False)),
            boundary=bool(raw.get("boundary", False)), inherit=raw.get("inherit"),
            inherit_next=raw.get("inherit_next"), json_fields=json_fields, kv_fields=kv_fields,
        ))
    if not kinds:
        raise FormatDefinitionError("format declares no kinds", path=str(path))
    names = {k.name for k in kinds}
    for k in kinds:
        for ref in (k.inherit, k.inherit_next):
            if ref is not None and ref not in names:
                raise FormatDefinitionError(f"kind {k.name!r} inherits from unknown kind {ref!r}", path=str(path))
    prefix = meta.get("prefix", "")
    re.compile(prefix)
    fmt = Format(
        name=meta["name"], title=meta.get("title", meta["name"]), family=meta.get("family", "text"),
        prefix=prefix, detect=tuple(meta.get("detect", ())), kinds=tuple(kinds), source=str(path),
        message=meta.get("message"), record=_expand(meta["record"], macros) if meta.get("record") else None,
        time_field=meta.get("time_field"), level_field=meta.get("level_field"),
        func_field=meta.get("func_field"), extra={k: v for k, v in meta.items()},
    )
    if fmt.family not in {"text", "json", "kv"}:
        raise FormatDefinitionError(f"unknown family {fmt.family!r}", path=str(path),
                                    hint="use text, json or kv")
    return fmt


@cache
def load_formats() -> dict[str, Format]:
    """All built-in formats by name, in detection priority order (file name order)."""
    out: dict[str, Format] = {}
    for path in sorted(FORMATS_DIR.glob("*.toml")):
        if path.name in {"fields.toml", "wrappers.toml"}:
            continue
        fmt = load_format(path)
        out[fmt.name] = fmt
    return out


def get_format(name: str) -> Format:
    formats = load_formats()
    if name not in formats:
        raise FormatDefinitionError(f"unknown format {name!r}", hint=f"use one of: {', '.join(formats)}")
    return formats[name]

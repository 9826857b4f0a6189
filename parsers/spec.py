"""Formats as data: load, compile and self-check ``parsers/formats/*.toml``.

A format file declares line kinds: a named regex whose groups are typed fields (declared once in
``fields.toml``), sample lines, and a ``role`` that says what the line means for a request (start,
release, timings, error, crash, ...).  Text kinds match the body of a plain line; record kinds
(``frame = "record"``) match the message of a JSON or key=value record (``frames.toml``) and read
their fields from the record's keys, in any order.  Every format is always active (real logs mix
them: a fork's own lines, library lines, a wrapper's lines); ``--format NAME`` restricts the kinds to
one format and the shared ones.  The loader refuses a kind without samples, a regex that does not
compile, a group or key that is not a declared field, an unknown role, and a kind name used twice.
Supporting a new llama.cpp version or fork means adding rows to these files, not engine code.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import regex

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from parsers.errors import FormatDefinitionError

FORMATS_DIR = Path(__file__).parent / "formats"
FIELD_TYPES = {"int", "float", "str", "bool"}
DATA_FILES = {"fields.toml", "wrappers.toml", "frames.toml"}
# What a line can mean for the request it belongs to (parsers/assemble.py reads these).
ROLES = {
    "start", "synth_start", "release", "prompt", "prompt_alt", "truncate", "cache", "kv_trim", "timing_header",
    "timing_prompt", "timing_eval", "timing_total", "progress", "error", "cancel", "context_shift",
    "ctx_train_cap", "http", "proxy_http", "stop", "crash", "crash_detail", "listen", "startup", "failure", "other",
    "general",  # a line of a layout no format knows, read by the general rule (general.toml)
}
IDENTITY = {"slot", "task"}  # fields that say whose a line is, not a fact about it (a skipped line may name them)
# Old format names that still work with --format.
ALIASES = {"llama-2023-json": "llama-2023", "llama-2024-json": "llama-records", "llama-2024-text": "llama-records"}


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    description: str


@dataclass(frozen=True)
class Kind:
    """One kind of log line."""

    name: str
    format: str
    regex: str
    prefilter: str
    samples: tuple[str, ...]
    fields: tuple[str, ...]
    frame: str = "text"  # text: matches the line's body; record: matches a JSON/key=value record's message
    keys: tuple[tuple[str, str], ...] = ()  # record kinds: (field, "key|alternative key") read from the record
    role: str = "other"
    skip: bool = False  # deliberately ignored: counted in lines_skipped, no event row (must carry no field)
    fallback: bool = False  # catch-all, tried after every specific kind; exempt from the "one kind" check
    weak: bool = False  # a catch-all that plain prose can match too: not evidence that a file is a log
    evidence: bool = True  # False: a line of this kind alone does not make a file a log (notes can hold it)
    multiline: bool = False  # unknown lines after it are its continuation
    startup: bool = False  # part of a server's start-up banner
    boundary: bool = False  # the first line a new server process writes
    ends: bool = False  # the process ends here (shutdown, a fatal argument error): a later banner is a new process
    inherit: str | None = None  # take slot/task from the latest line of this kind (era-4 timing block)
    inherit_next: str | None = None  # take slot/task from the next line of this kind (era-2 timings)
    exclude: str = ""  # a line the regex matches is not this kind when this regex also matches (no look-arounds)
    bare: bool = False  # text kinds: the regex covers the whole line (no elapsed/level prefix is put before it)
    loose: bool = False  # the regex may match text after a wrapper: tried only once wrappers are removed
    # (field, regex with one group) searched anywhere in a line the kind's regex matched, in any order (general.toml)
    anywhere: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Format:
    """A set of kinds: one format file, or the union of several (``grammar``)."""

    name: str
    title: str
    kinds: tuple[Kind, ...]
    source: str
    shared: bool = False  # always active, also when another format is forced
    eras: str = ""
    includes: tuple[str, ...] = ()  # formats forced together with this one (lines printed beside its own)

    def kind(self, name: str) -> Kind:
        for k in self.kinds:
            if k.name == name:
                return k
        raise KeyError(name)

    def with_role(self, *roles: str) -> tuple[str, ...]:
        return tuple(k.name for k in self.kinds if k.role in roles)


def _read_toml(path: Path) -> dict[str, Any]:
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


_GROUP = regex.compile(r"\(\?P<([A-Za-z_]\w*)>")


def expand(regex: str, macros: dict[str, str]) -> str:
    for key, value in macros.items():
        regex = regex.replace("{" + key + "}", value)
    return regex


def _kind(raw: dict[str, Any], fmt: str, macros: dict[str, str], path: Path, index: int, check: bool = True) -> Kind:
    name = raw.get("name") or f"#{index}"
    where = f"kind {name!r}"
    if "regex" not in raw:
        raise FormatDefinitionError(f"{where} has no regex", path=str(path))
    regex = expand(raw["regex"], macros)
    if not regex.startswith("^"):
        raise FormatDefinitionError(f"{where} regex is not anchored at the start (^)", path=str(path))
    for pattern in (regex, raw.get("exclude", "")) if check else ():
        _compiles(pattern, where, path)
    groups = tuple(dict.fromkeys(_GROUP.findall(regex)))
    keys = tuple((k, v) for k, v in (raw.get("keys") or {}).items())
    anywhere = tuple((k, expand(v, macros)) for k, v in (raw.get("anywhere") or {}).items())
    for _, pattern in anywhere if check else ():
        _compiles(pattern, where, path)
    fields = load_fields()
    for g in (*groups, *(k for k, _ in keys), *(k for k, _ in anywhere)):
        if g not in fields:
            raise FormatDefinitionError(f"{where} captures {g!r}, which fields.toml does not declare",
                                        path=str(path), hint="declare the field with its type")
    samples = tuple(raw.get("samples", ()))
    if not samples:
        raise FormatDefinitionError(f"{where} has no samples", path=str(path),
                                    hint="every kind needs at least one sample line")
    role = raw.get("role", "other")
    if role not in ROLES:
        raise FormatDefinitionError(f"{where} has unknown role {role!r}", path=str(path),
                                    hint=f"use one of {', '.join(sorted(ROLES))}")
    frame = raw.get("frame", "text")
    if frame not in {"text", "record"}:
        raise FormatDefinitionError(f"{where} has unknown frame {frame!r}", path=str(path), hint="text or record")
    skip = bool(raw.get("skip", False))
    if skip and (set(groups) | {k for k, _ in keys} | {k for k in (raw.get("anywhere") or {})}) - IDENTITY:
        raise FormatDefinitionError(f"{where} is skipped but captures fields", path=str(path),
                                    hint="a skipped line must not hide a fact: drop skip or the fields")
    return Kind(
        name=name, format=fmt, regex=regex, prefilter=raw.get("prefilter", ""), samples=samples,
        fields=tuple(dict.fromkeys((*groups, *(k for k, _ in keys), *(k for k, _ in anywhere)))), frame=frame,
        keys=keys, anywhere=anywhere, role=role, skip=skip,
        fallback=bool(raw.get("fallback", False)), weak=bool(raw.get("weak", False)),
        evidence=bool(raw.get("evidence", not raw.get("weak", False))), multiline=bool(raw.get("multiline", False)), startup=bool(raw.get("startup", False)),
        boundary=bool(raw.get("boundary", False)), ends=bool(raw.get("ends", False)), inherit=raw.get("inherit"), inherit_next=raw.get("inherit_next"),
        exclude=raw.get("exclude", ""), bare=bool(raw.get("bare", False)), loose=bool(raw.get("loose", False)),
    )


def _compiles(pattern: str, where: str, path: Path) -> None:
    """The regex compiles for the engine (Rust's regex crate, through polars: no look-arounds, no
    back-references) and for Python (the tests read samples with it)."""
    import polars as pl

    try:
        regex.compile(pattern)
        pl.Series([""], dtype=pl.String).str.contains(pattern)
    except (regex.error, pl.exceptions.PolarsError) as exc:
        raise FormatDefinitionError(f"{where} regex does not compile: {str(exc).splitlines()[-1]}", path=str(path),
                                    hint="the engine's regex has no look-arounds: use `exclude` instead") from exc


@cache
def load_macros() -> dict[str, str]:
    """Regex macros shared by every format file (``{SLOT}``, ``{SRV}``, ...), from frames.toml."""
    return dict(_read_toml(FORMATS_DIR / "frames.toml").get("macros", {}))


def load_format(path: Path, check: bool = True) -> Format:
    """One format file; ``check``: compile every regex for both engines (most of the cost of loading it)."""
    data = _read_toml(path)
    meta = data.get("format") or {}
    if "name" not in meta:
        raise FormatDefinitionError("missing [format] name", path=str(path), hint="add name = \"...\"")
    macros = {**load_macros(), **data.get("macros", {})}
    kinds = tuple(_kind(raw, meta["name"], macros, path, i, check) for i, raw in enumerate(data.get("kind", [])))
    if not kinds:
        raise FormatDefinitionError("format declares no kinds", path=str(path))
    return Format(name=meta["name"], title=meta.get("title", meta["name"]), kinds=kinds, source=str(path),
                  shared=bool(meta.get("shared", False)), eras=meta.get("eras", ""),
                  includes=tuple(meta.get("includes", ())))


@cache
def load_formats() -> dict[str, Format]:
    """All built-in formats by name (file name order).

    Read from the format files once per content of them: the result is kept beside them (as Python keeps its
    bytecode), under a digest of every format file, of this module and of both regex engines' versions, so an
    edited file, or another polars, reads and checks them again.  A process that finds it reads no TOML and
    compiles no regex here."""
    cache_path = _cache_path()
    cached = _read_cache(cache_path)
    if cached is not None:
        return cached
    out: dict[str, Format] = {}
    for path in sorted(FORMATS_DIR.glob("*.toml")):
        if path.name in DATA_FILES:
            continue
        fmt = load_format(path)
        if fmt.name in out:
            raise FormatDefinitionError(f"format {fmt.name!r} is declared twice", path=str(path))
        out[fmt.name] = fmt
    _check_union(list(out.values()))
    if cache_path is not None:
        _write_cache(cache_path, out)
    return out


def _engine_versions() -> str:
    """The installed polars (its distributions' folder names) and regex: listing a folder costs next to nothing,
    where importing ``importlib.metadata`` costs 0.05 s of every process that reads a log."""
    import importlib.util

    spec = importlib.util.find_spec("polars")
    found = sorted(p.name for p in Path(spec.origin).parent.parent.glob("polars*.dist-info")) \
        if spec is not None and spec.origin else []
    if not found:  # another layout (a system package, an egg): ask the metadata
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = [version("polars")]
        except PackageNotFoundError:  # pragma: no cover - polars is a dependency
            found = ["unknown"]
    return f"{' '.join(found)} regex {regex.__version__}"


def _cache_path() -> Path | None:
    h = hashlib.sha256(_engine_versions().encode())
    h.update(Path(__file__).read_bytes())
    for path in sorted(FORMATS_DIR.glob("*.toml")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return FORMATS_DIR / "__pycache__" / f"formats-{h.hexdigest()[:24]}.pickle"


def _read_cache(path: Path | None) -> dict[str, Format] | None:
    if path is None:
        return None
    try:
        data = pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError):
        return None  # absent, cut short or from an older layout: read the files again
    return data if isinstance(data, dict) and all(isinstance(f, Format) for f in data.values()) else None


def _write_cache(path: Path, formats: dict[str, Format]) -> None:
    try:  # a package folder that cannot be written to only means the next process reads the files again
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(formats, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, path)
    except OSError:
        pass


def _check_union(formats: list[Format]) -> None:
    seen: dict[str, str] = {}
    for f in formats:
        for k in f.kinds:
            if k.name in seen:
                raise FormatDefinitionError(f"kind {k.name!r} is declared in {seen[k.name]} and {f.name}",
                                            path=f.source, hint="kind names are unique across formats")
            seen[k.name] = f.name
    names = {f.name for f in formats}
    for f in formats:
        for inc in f.includes:
            if inc not in names:
                raise FormatDefinitionError(f"format {f.name!r} includes unknown format {inc!r}", path=f.source)
        for k in f.kinds:
            for ref in (k.inherit, k.inherit_next):
                if ref is not None and ref not in seen:
                    raise FormatDefinitionError(f"kind {k.name!r} inherits from unknown kind {ref!r}", path=f.source)


def format_names() -> list[str]:
    """The names ``--format`` takes (the shared formats are always on, so they are not choices)."""
    return [n for n, f in load_formats().items() if not f.shared]


@cache
def grammar(name: str | None = None) -> Format:
    """The kinds one ingest uses: every format (``name`` None), or format ``name`` plus the shared ones.

    Specific kinds come first, then the catch-alls (each file's in file order, the weak ones last), so a
    catch-all of one format never takes a line that another format's specific kind knows.
    """
    formats = load_formats()
    if name is not None:
        name = ALIASES.get(name, name)
        if name not in formats or formats[name].shared:
            raise FormatDefinitionError(f"unknown format {name!r}", hint=f"use one of: {', '.join(format_names())}")
    wanted = {name, *formats[name].includes} if name is not None else set(formats)
    chosen = [f for f in formats.values() if f.name in wanted or f.shared]
    kinds = [k for f in chosen for k in f.kinds]
    ordered = ([k for k in kinds if not k.fallback] + [k for k in kinds if k.fallback and not k.weak]
               + [k for k in kinds if k.fallback and k.weak])
    return Format(name=name or "auto", title=formats[name].title if name else "every format",
                  kinds=tuple(ordered), source=", ".join(f.source for f in chosen))


def get_format(name: str) -> Format:
    """Format ``name`` with the shared kinds (what ``--format NAME`` reads with)."""
    return grammar(name)

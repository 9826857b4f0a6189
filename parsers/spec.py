"""Formats as data: load, compile and self-check ``parsers/formats/*.toml``.

A format file declares line kinds: a named regex whose groups are typed fields (declared once in
``fields.toml``), sample lines, and a ``role`` that says what the line means for a request (start,
release, timings, error, crash, ...).  Text kinds match the body of a plain line; record kinds
(``frame = "record"``) match the message of a JSON or key=value record (``frames.toml``) and read
their fields from the record's keys, in any order.  Every format is always active (real logs mix
them: a fork's own lines, library lines, a wrapper's lines); ``--format NAME`` restricts the kinds to
one format and the shared ones.  The files' shape is a JSON Schema (``parsers/schemas/format.schema.json`` and
``fields.schema.json``, published for editors): the loader checks each file against it (a kind without samples,
an unknown role or key, a value of the wrong type), then refuses a regex that does not compile, a group or key
that is not a declared field, and a kind name used twice, each in one line naming the file and the kind.
Supporting a new llama.cpp version or fork means adding rows to these files, not engine code.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import regex

if TYPE_CHECKING:
    import jsonschema

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from parsers.errors import FormatDefinitionError

FORMATS_DIR = Path(__file__).parent / "formats"
FORMATS_ENV = "FORENSICS_FORMATS"  # the user's own formats folders (os.pathsep between them); `--formats DIR`
APP = "llama-forensics"  # the folder of ours in the user's cache folder
CACHE_ENV = "FORENSICS_CACHE_DIR"  # a folder for the formats cache instead of it; set empty: no cache
CACHE_KEEP = 8  # cache files kept in that folder
SCHEMAS_DIR = Path(__file__).parent / "schemas"  # the JSON Schemas of the format files and of fields.toml
DATA_FILES = {"fields.toml", "wrappers.toml", "frames.toml"}


def schema(name: str) -> dict[str, Any]:
    """The JSON Schema ``name`` (``format`` or ``fields``) of ``parsers/schemas/``."""
    with (SCHEMAS_DIR / f"{name}.schema.json").open("rb") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


# What a line can mean for the request it belongs to (parsers/assemble.py reads these; "general": a line of a
# layout no format knows, read by the general rule of general.toml), and the fields' types: the schemas say which.
ROLES = frozenset(schema("format")["$defs"]["kind"]["properties"]["role"]["enum"])
FIELD_TYPES = frozenset(schema("fields")["properties"]["fields"]["additionalProperties"]["properties"]["type"]["enum"])
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
def _validator(name: str) -> jsonschema.protocols.Validator:
    import jsonschema  # loaded when format files are read, not when their cache is

    data = schema(name)
    return jsonschema.validators.validator_for(data)(data)


def check_schema(data: dict[str, Any], path: Path, name: str) -> None:
    """Raise FormatDefinitionError (one line naming the file, the kind or field, and what is wrong) for the first
    way, in file order, that ``data`` breaks the JSON Schema ``name``."""
    errors = list(_validator(name).iter_errors(data))
    if errors:
        first = min(errors, key=lambda e: [(isinstance(p, str), p) for p in e.absolute_path])
        message, hint = _explain(first, data)
        raise FormatDefinitionError(message, path=str(path), hint=hint)


_TYPE_WORDS = {"string": "a string", "boolean": "true or false", "array": "a list", "object": "a table",
               "integer": "an integer", "number": "a number"}


def _explain(err: jsonschema.ValidationError, data: dict[str, Any]) -> tuple[str, str | None]:
    """A schema error in the words of the format files: where (``kind 'name'``, ``[format]``, ``field 'x'``),
    which key, what is wrong, and a hint."""
    at = list(err.absolute_path)
    value: Any = err.validator_value  # the stubs allow Unset: these validators always set it
    instance: Any = err.instance
    part: Any = err.schema
    if at[:1] == ["kind"] and len(at) >= 2:
        raw = data["kind"][at[1]] if isinstance(data.get("kind"), list) else {}
        where = f"kind {raw.get('name') or '#' + str(at[1])!r}" if isinstance(raw, dict) else f"kind #{at[1]}"
        key = ".".join(str(p) for p in at[2:])
    elif at[:1] == ["fields"] and len(at) >= 2:
        where, key = f"field {at[1]!r}", ".".join(str(p) for p in at[2:])
    else:
        where = f"[{at[0]}]" if at else "the file"
        key = ".".join(str(p) for p in at[1:])
    if err.validator == "required":
        missing = next(r for r in value if r not in instance)
        if where == "[format]" or (at == [] and missing == "format"):
            return "missing [format] name", 'add [format] with name = "..."'
        if at == [] and missing == "kind":
            return "format declares no kinds", "add [[kind]] tables (docs/development.md)"
        hint = "every kind needs at least one sample line" if missing == "samples" else None
        return f"{where} has no {missing}", hint
    if err.validator == "minItems":
        if at == ["kind"]:
            return "format declares no kinds", "add [[kind]] tables (docs/development.md)"
        return f"{where} has no {key}", "every kind needs at least one sample line" if key == "samples" else None
    if err.validator == "enum":
        if where.startswith("field"):
            return f"{where} has type {err.instance!r}", f"use one of {', '.join(sorted(value))}"
        return f"{where} has unknown {key} {err.instance!r}", f"use one of {', '.join(sorted(value))}"
    if err.validator == "additionalProperties":
        known = sorted(part.get("properties", {}))
        extra = sorted(set(instance) - set(known))
        return f"{where} has unknown key {extra[0]!r}", f"keys: {', '.join(known)}" if known else None
    if err.validator == "type":
        wanted = " or ".join(_TYPE_WORDS.get(t, t) for t in ([value] if isinstance(value, str) else value))
        return f"{where}{' ' + key if key else ''} must be {wanted}, not {err.instance!r}", None
    if err.validator == "minLength":
        return f"{where} {key} is empty", None
    return f"{where}{' ' + key if key else ''}: {err.message}", None


def user_dirs() -> tuple[Path, ...]:
    """The user's own formats folders, from ``$FORENSICS_FORMATS`` (``--formats DIR`` sets it): format files of
    a fork's lines, and a ``fields.toml`` of their new fields, read after the built-in ones without editing the
    installed package."""
    raw = os.environ.get(FORMATS_ENV, "")
    return tuple(Path(p).expanduser().resolve() for p in raw.split(os.pathsep) if p.strip())


def _user_files(folder: Path) -> list[Path]:
    """A user's formats folder's TOML files; it must be a folder, and may not replace frames or wrappers."""
    if not folder.is_dir():
        raise FormatDefinitionError("no such formats folder", path=str(folder),
                                    hint=f"--formats DIR and ${FORMATS_ENV} name folders of format files")
    files = sorted(folder.glob("*.toml"))
    for path in files:
        if path.name in DATA_FILES - {"fields.toml"}:
            raise FormatDefinitionError(f"{path.name} cannot be replaced from a formats folder", path=str(path),
                                        hint="a formats folder holds format files and a fields.toml of new fields")
    return files


def load_fields() -> dict[str, Field]:
    """Every typed field: ``fields.toml``'s, and those the user's formats folders add (``user_dirs``)."""
    return _fields(user_dirs())


@cache
def _fields(dirs: tuple[Path, ...]) -> dict[str, Field]:
    out: dict[str, Field] = {}
    for path in [FORMATS_DIR / "fields.toml", *(d / "fields.toml" for d in dirs if (d / "fields.toml").exists())]:
        data = _read_toml(path)
        check_schema(data, path, "fields")
        for name, spec in data["fields"].items():
            if name in out and out[name].type != spec["type"]:
                raise FormatDefinitionError(f"field {name!r} has type {spec['type']!r}, but it is declared as "
                                            f"{out[name].type!r} already", path=str(path),
                                            hint="use the declared type, or another name")
            out.setdefault(name, Field(name, spec["type"], spec.get("description", "")))
    return out


_GROUP = regex.compile(r"\(\?P<([A-Za-z_]\w*)>")


def expand(regex: str, macros: dict[str, str]) -> str:
    for key, value in macros.items():
        regex = regex.replace("{" + key + "}", value)
    return regex


def _kind(raw: dict[str, Any], fmt: str, macros: dict[str, str], path: Path, check: bool = True) -> Kind:
    """One ``[[kind]]`` of a file its schema passed: what a schema cannot say is checked here (the regex is
    anchored and compiles, its groups and keys are declared fields, a skipped kind captures nothing)."""
    name = raw["name"]
    where = f"kind {name!r}"
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
    samples = tuple(raw["samples"])
    role = raw.get("role", "other")
    frame = raw.get("frame", "text")
    skip = bool(raw.get("skip", False))
    if skip and (set(groups) | {k for k, _ in keys} | {k for k in (raw.get("anywhere") or {})}) - IDENTITY:
        raise FormatDefinitionError(f"{where} is skipped but captures fields", path=str(path),
                                    hint="a skipped line must not hide a fact: drop skip or the fields")
    return Kind(
        name=name, format=fmt, regex=regex, prefilter=raw.get("prefilter", ""), samples=samples,
        fields=tuple(dict.fromkeys((*groups, *(k for k, _ in keys), *(k for k, _ in anywhere)))), frame=frame,
        keys=keys, anywhere=anywhere, role=role, skip=skip,
        fallback=bool(raw.get("fallback", False)), weak=bool(raw.get("weak", False)),
        evidence=bool(raw.get("evidence", True)), multiline=bool(raw.get("multiline", False)), startup=bool(raw.get("startup", False)),
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
    check_schema(data, path, "format")
    meta = data["format"]
    macros = {**load_macros(), **data.get("macros", {})}
    kinds = tuple(_kind(raw, meta["name"], macros, path, check) for raw in data["kind"])
    return Format(name=meta["name"], title=meta.get("title", meta["name"]), kinds=kinds, source=str(path),
                  shared=bool(meta.get("shared", False)), eras=meta.get("eras", ""),
                  includes=tuple(meta.get("includes", ())))


def load_formats() -> dict[str, Format]:
    """Every format by name: the built-in ones (file name order), then the user's (``user_dirs``)."""
    return _formats(user_dirs())


def is_users(fmt: Format) -> bool:
    """The format comes from a user's formats folder, not from the package."""
    return Path(fmt.source).parent != FORMATS_DIR


@cache
def _formats(dirs: tuple[Path, ...]) -> dict[str, Format]:
    """The formats of the package's folder and of ``dirs``, by name.

    Read from the format files once per content of them: the result is kept in the user's cache folder
    (``cache_dir``), under a digest of every format file, of this module and of both regex engines' versions, so
    an edited file, or another polars, reads and checks them again.  A process that finds it reads no TOML and
    compiles no regex here."""
    files = [p for p in sorted(FORMATS_DIR.glob("*.toml")) if p.name not in DATA_FILES]
    files += [p for d in dirs for p in _user_files(d) if p.name != "fields.toml"]
    cache_path = _cache_path(dirs)
    cached = _read_cache(cache_path)
    if cached is not None:
        return cached
    out: dict[str, Format] = {}
    for path in files:
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
    where importing ``importlib.metadata`` costs 0.05 s of every process that reads a log.  Found on the path, not
    in ``sys.modules``: a module imported lazily (``forensics.lazy``) would be loaded by being asked for its spec."""
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("polars")
    found = sorted(p.name for p in Path(spec.origin).parent.parent.glob("polars*.dist-info")) \
        if spec is not None and spec.origin else []
    if not found:  # another layout (a system package, an egg): ask the metadata
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = [version("polars")]
        except PackageNotFoundError:  # pragma: no cover - polars is a dependency
            found = ["unknown"]
    return f"{' '.join(found)} regex {regex.__version__}"


def cache_dir() -> Path | None:
    """Where the loaded formats are kept between processes: ``$FORENSICS_CACHE_DIR`` when set (set empty: nowhere),
    else the user's cache folder as each platform has it (``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux and the
    other Unixes, ``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on Windows) with ``llama-forensics`` in it;
    None when there is none.  Never the installed package, so ``pip uninstall`` leaves nothing of ours there."""
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        return Path(env).expanduser() if env.strip() else None
    try:
        if sys.platform == "win32":
            local = os.environ.get("LOCALAPPDATA", "")
            return Path(local) / APP / "Cache" if local else None
        if sys.platform == "darwin":
            return Path.home() / "Library" / "Caches" / APP
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        # the XDG rule: a relative path is invalid and is ignored
        return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / APP
    except RuntimeError:  # no home folder to be found
        return None


def _cache_path(dirs: tuple[Path, ...] = ()) -> Path | None:
    folder = cache_dir()
    if folder is None:
        return None
    h = hashlib.sha256(_engine_versions().encode())
    h.update(str(FORMATS_DIR).encode() + b"\0")  # each format keeps its file's path: one cache per install
    h.update(Path(__file__).read_bytes())
    for path in sorted(SCHEMAS_DIR.glob("*.json")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    for path in [*sorted(FORMATS_DIR.glob("*.toml")), *(p for d in dirs for p in sorted(d.glob("*.toml")))]:
        h.update(str(path if path.parent != FORMATS_DIR else path.name).encode() + b"\0" + path.read_bytes())
    return folder / f"formats-{h.hexdigest()[:24]}.pickle"


def _read_cache(path: Path | None) -> dict[str, Format] | None:
    if path is None:
        return None
    try:
        data = pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError):
        return None  # absent, cut short or from an older layout: read the files again
    return data if isinstance(data, dict) and all(isinstance(f, Format) for f in data.values()) else None


def _write_cache(path: Path, formats: dict[str, Format]) -> None:
    """Keep ``formats`` at ``path``, and at most ``CACHE_KEEP`` such files in its folder (the newest: other
    installs and older format files may share it).  A folder that cannot be made or written to only means the
    next process reads the files again: nothing is written then."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(pickle.dumps(formats, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, path)
        older = sorted(path.parent.glob("formats-*.pickle"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in older[CACHE_KEEP:]:
            old.unlink(missing_ok=True)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


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


def grammar(name: str | None = None) -> Format:
    """The kinds one ingest uses: every format (``name`` None), or format ``name`` plus the shared ones (the
    user's formats folders' included)."""
    return _grammar(name, user_dirs())


@cache
def _grammar(name: str | None, dirs: tuple[Path, ...]) -> Format:
    """``grammar``, for the formats of the package and of ``dirs``.

    Specific kinds come first, then the catch-alls (each file's in file order, the weak ones last), so a
    catch-all of one format never takes a line that another format's specific kind knows.
    """
    formats = _formats(dirs)
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

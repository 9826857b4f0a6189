"""Canonical replay records: detect them by content, validate them against the JSON Schemas, and turn
them into the store's ``runs`` and ``attempts`` frames.

A bad record never stops the load: it becomes a ``RecordIssue`` naming the file, the line (or record
number) and the field, and the good records load.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from forensics import schema
from forensics.errors import RecordError
from forensics.replay.enums import Words

if TYPE_CHECKING:
    import jsonschema

SCHEMAS_DIR = Path(__file__).resolve().parent.parent / "schemas"
MANIFEST_KEYS = ("items", "stages", "servers", "concurrency", "stage_items", "summary")
MAX_WHOLE_FILE = 64 * 1024 * 1024  # a JSON document larger than this is not read whole for detection


@dataclass(frozen=True)
class RecordIssue:
    """One bad record: where it is and what is wrong with it."""

    path: str
    line: int | None
    field: str | None
    message: str
    record: int | None = None  # record number (1-based) when the file has no lines (JSON arrays)

    def one_line(self) -> str:
        where = self.path
        if self.line is not None:
            where += f":{self.line}"
        elif self.record is not None:
            where += f": record {self.record}"
        what = f"{self.field}: " if self.field else ""
        return f"{where}: {what}{self.message}"


@dataclass
class Records:
    """What ``load`` read: ``runs`` and ``attempts`` frames (conformed to the store's tables) and the
    per-record problems."""

    runs: pl.DataFrame = field(default_factory=lambda: schema.empty("runs"))
    attempts: pl.DataFrame = field(default_factory=lambda: schema.empty("attempts"))
    errors: list[RecordIssue] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was merged or kept, worth telling (not errors)

    @property
    def run_ids(self) -> list[str]:
        ids = set(self.runs["run"].drop_nulls().to_list()) | set(self.attempts["run"].drop_nulls().to_list())
        return sorted(ids)


# ---------------------------------------------------------------------------------------------- reading
def read_text(path: Path, limit: int | None = None) -> str:
    """The (decompressed) text of ``path``; at most ``limit`` bytes when given."""
    from parsers.reader import open_binary

    try:
        with open_binary(path) as fh:
            data = fh.read(limit) if limit is not None else fh.read()
    except OSError as exc:
        raise RecordError(f"cannot read: {exc}", path=str(path), hint="check the file") from exc
    return (data or b"").decode("utf-8", errors="replace")


def _is_manifest(obj: Any) -> bool:
    return isinstance(obj, dict) and "run_id" in obj and any(k in obj for k in MANIFEST_KEYS)


def _is_attempt(obj: Any) -> bool:
    return isinstance(obj, dict) and "item" in obj and "stage" in obj and ("outcome" in obj or "run_id" in obj)


def detect(path: Path | str) -> str | None:
    """``"manifest"`` or ``"attempts"`` when ``path`` holds canonical replay records (by content, not
    by name), else None.  Never raises for content it does not understand."""
    path = Path(path)
    try:
        head = read_text(path, 256 * 1024)
    except RecordError:
        return None
    text = head.lstrip("\ufeff \t\r\n")
    if not text.startswith("{"):
        return None
    first = text.split("\n", 1)[0].strip()
    try:
        obj = json.loads(first)
    except json.JSONDecodeError:
        obj = None
    if obj is not None:
        if _is_manifest(obj):
            return "manifest"
        return "attempts" if _is_attempt(obj) else None
    # a pretty-printed document: parse it whole (manifests are small)
    try:
        if path.stat().st_size > MAX_WHOLE_FILE:
            return None
        doc = json.loads(read_text(path) if len(head) >= 256 * 1024 else head)
    except (json.JSONDecodeError, OSError, RecordError):
        return None
    return "manifest" if _is_manifest(doc) else None


# ---------------------------------------------------------------------------------------------- validation
@functools.cache
def _schema(kind: str) -> dict[str, Any]:
    return json.loads((SCHEMAS_DIR / f"{kind}.schema.json").read_text(encoding="utf-8"))


@functools.cache
def validator(kind: str) -> jsonschema.protocols.Validator:
    """The JSON Schema validator for ``manifest`` or ``attempt`` records."""
    data = _schema(kind)
    import jsonschema  # loaded when records are validated, not when a run folder is only looked at

    cls = jsonschema.validators.validator_for(data)
    return cls(data)


@functools.cache
def _fast_check(kind: str) -> Any:
    """A compiled validator (fastjsonschema): most records are valid, and this tells so ~50x faster; the
    jsonschema validator then explains only the records that fail."""
    import fastjsonschema

    return fastjsonschema.compile(_schema(kind))


def _error_field(err: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in err.absolute_path]
    if err.validator == "required" and isinstance(err.instance, dict):
        required: Any = err.validator_value  # the stubs allow Unset: a "required" error always sets it
        missing = [r for r in required if r not in err.instance]
        if missing:
            parts.append(missing[0])
    return ".".join(parts) or "(record)"


def _error_message(err: jsonschema.ValidationError) -> str:
    value: Any = err.validator_value  # the stubs allow Unset: these validators always set it
    if err.validator == "required":
        return "missing required field"
    if err.validator == "enum":
        allowed = ", ".join(str(v) for v in value)
        return f"{err.instance!r} is not one of {allowed} (map other status names with a mapping file)"
    if err.validator == "type":
        want = value if isinstance(value, str) else " or ".join(value)
        return f"{err.instance!r} is not of type {want}"
    return err.message


def schema_errors(kind: str, obj: Any) -> list[jsonschema.ValidationError]:
    """Each way ``obj`` breaks the ``kind`` schema of ``forensics/schemas/`` (``manifest``, ``attempt``,
    ``mapping``), in document order: none at the cost of the compiled check when it is valid."""
    import fastjsonschema

    try:
        _fast_check(kind)(obj)
        return []
    except fastjsonschema.JsonSchemaException:
        pass
    return sorted(validator(kind).iter_errors(obj), key=lambda e: [(isinstance(p, str), p) for p in e.absolute_path])


def schema_issues(kind: str, obj: Any) -> list[tuple[str, str]]:
    """(field, message) for each way ``obj`` breaks the ``kind`` schema, in field order."""
    errs = sorted(schema_errors(kind, obj), key=lambda e: [str(p) for p in e.absolute_path])
    return [(_error_field(e), _error_message(e)) for e in errs]


def parse_time(value: str | None, field_name: str) -> datetime | None:
    """An ISO 8601 time with a UTC offset, as an aware UTC datetime."""
    if value is None:
        return None
    try:
        dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{value!r} is not an ISO 8601 time") from None
    if dt.tzinfo is None:
        raise ValueError(f"{value!r} has no UTC offset (write e.g. {value}Z or {value}+02:00)")
    return dt.astimezone(timezone.utc)


# ---------------------------------------------------------------------------------------------- conversion
def manifest_row(obj: dict[str, Any], source: str, base_dir: Path | None) -> dict[str, Any]:
    """A ``runs`` row from a valid manifest object (raises ValueError naming a bad time field)."""
    row: dict[str, Any] = {"run": obj["run_id"], "source": source}
    for key in ("started_at", "ended_at"):
        try:
            row[key] = parse_time(obj.get(key), key)
        except ValueError as exc:
            raise _FieldError(key, str(exc)) from None
    row["concurrency"] = obj.get("concurrency")
    row["model"] = obj.get("model")
    ended = obj.get("ended") or {}
    row["ended_how"] = ended.get("how") or "unknown"
    detail = ended.get("detail")
    if not detail and ended.get("after_s") is not None:
        detail = f"after {ended['after_s']:g} s"
    row["ended_detail"] = detail
    items = obj.get("items")
    row["items_expected"] = len(items) if items is not None else None
    row["items"] = json.dumps(items) if items is not None else None
    row["stages"] = json.dumps(obj.get("stages")) if obj.get("stages") is not None else None
    row["stage_items"] = _stage_items(obj)
    summary = obj.get("summary") or {}
    for key in SUMMARY_KEYS:
        row[f"summary_{key}"] = summary.get(key)
    config = dict(obj.get("config") or {})
    if obj.get("budgets"):
        config["budgets"] = obj["budgets"]
    row["config"] = json.dumps(config, sort_keys=True)
    servers = []
    for i, s in enumerate(obj.get("servers") or []):
        s = dict(s)
        try:
            launched = parse_time(s.get("launched_at"), "launched_at")
        except ValueError as exc:
            raise _FieldError(f"servers.{i}.launched_at", str(exc)) from None
        s["launched_at"] = launched.isoformat().replace("+00:00", "Z") if launched else None
        log = s.get("log_file")
        if log and base_dir is not None and not Path(log).is_absolute():
            s["log_path"] = str((base_dir / log).resolve())
        elif log:
            s["log_path"] = str(Path(log).resolve())
        servers.append(s)
    row["servers"] = json.dumps(servers)
    return row


MERGE_SKIP = ("run", "source", "alias")  # never a disagreement between two manifests of a run


def _decimals(x: float) -> int:
    text = repr(x)
    return len(text.split(".", 1)[1]) if "." in text and "e" not in text else 0


def _rounded_alike(a: float, b: float) -> bool:
    """``a`` and ``b`` are one number written to two precisions: the finer rounds to the coarser."""
    coarse, fine = sorted((a, b), key=_decimals)
    return round(fine, _decimals(coarse)) == coarse


def _unsaid(value: Any) -> bool:
    """A manifest field with nothing in it (what another manifest of the run may fill in)."""
    return value is None or value in ("[]", "{}", "unknown")
SUMMARY_KEYS = ("requests", "ok", "failed", "input_tokens", "output_tokens", "duration_s")


def _stage_items(obj: dict[str, Any]) -> str | None:
    """The manifest's stage -> items (every stage gets every item with ``every_item_every_stage``)."""
    out = dict(obj.get("stage_items") or {})
    if obj.get("every_item_every_stage"):
        for stage in obj.get("stages") or []:
            out.setdefault(stage, list(obj.get("items") or []))
    return json.dumps(out) if out else None


ATTEMPT_SCALARS = ("server", "http_status", "error", "outcome", "id_slot", "tokens_evaluated", "tokens_predicted",
                   "stop_type", "truncated", "output_text", "output_chars", "max_tokens", "latency_ms", "ttft_ms",
                   "itl_ms", "started_rel_s", "ended_rel_s")
TIMING_KEYS = ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")


class _FieldError(Exception):
    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name
        self.message = message


def attempt_row(obj: dict[str, Any]) -> dict[str, Any]:
    """An ``attempts`` row from a valid attempt object (raises _FieldError for a bad time)."""
    row: dict[str, Any] = {"run": obj["run_id"], "item": obj["item"], "stage": obj["stage"],
                           "attempt": obj.get("attempt")}
    for key in ("started_at", "ended_at"):
        try:
            row[key] = parse_time(obj.get(key), key)
        except ValueError as exc:
            raise _FieldError(key, str(exc)) from None
    for key in ATTEMPT_SCALARS:
        row[key] = obj.get(key)
    timings = obj.get("timings") or {}
    for key in TIMING_KEYS:
        row[key] = timings.get(key)
    if row["output_chars"] is None and isinstance(row["output_text"], str):
        row["output_chars"] = len(row["output_text"])
    if row["started_at"] and row["ended_at"] and row["ended_at"] < row["started_at"]:
        raise _FieldError("ended_at", "ends before started_at")
    return row


# ---------------------------------------------------------------------------------------------- building
@dataclass
class RawRecord:
    """A record object before validation, with where it came from."""

    kind: str  # manifest | attempt
    obj: Any
    path: str
    line: int | None = None
    record: int | None = None
    base_dir: Path | None = None
    group: int = 0  # the run document of the file it came from (a file may hold several runs)
    anchors: tuple[Any, ...] = ()  # wall-clock anchors of its relative times: epoch seconds, or "manifest"
    anchor_hint: str = ""  # what the mapping named as the anchor (for the note when none is found)
    alias: str | None = None  # the run id it carried, when it was tied to another run (forensics.replay.identity)
    templated_run: bool = False  # its run_id came from a template ({stem}): several runs in a file get #1, #2


def build(raw: Iterable[RawRecord], *, run: str | None = None) -> Records:
    """Validate raw records and build the frames.  ``run`` fills a missing ``run_id``."""
    b = _Builder(run)
    for r in raw:
        b.add(r)
    return b.records()


class _Builder:
    """Validates raw records one by one and keeps the rows of the good ones and an issue for each bad one."""

    def __init__(self, run: str | None) -> None:
        self.run = run
        self.errors: list[RecordIssue] = []
        self.notes: list[str] = []
        self.runs_rows: list[dict[str, Any]] = []
        self.att_rows: list[dict[str, Any]] = []
        self.seen: dict[tuple[str, str, str, int], str] = {}
        self.next_attempt: dict[tuple[str, str, str], int] = {}
        self.seen_runs: dict[str, str] = {}
        self.words = Words()  # words a harness invented for an enumerated field, read as listed ones

    def issue(self, r: RawRecord, fld: str | None, msg: str) -> None:
        self.errors.append(RecordIssue(r.path, r.line, fld, msg, r.record))

    def add(self, r: RawRecord) -> None:
        if r.kind == "invalid":
            self.issue(r, None, str(r.obj))
            return
        row = self._row(r)
        if row is None:
            return
        row["alias"] = r.alias
        if r.kind == "manifest":
            self._manifest(r, row)
        else:
            self._attempt(r, row)

    def _row(self, r: RawRecord) -> dict[str, Any] | None:
        obj = r.obj
        if isinstance(obj, dict) and self.run is not None and obj.get("run_id") in (None, ""):
            obj = {**obj, "run_id": self.run}
        kind = "manifest" if r.kind == "manifest" else "attempt"
        obj = self.words.manifest(obj, r.path) if kind == "manifest" else self.words.attempt(obj, r.path)
        problems = schema_issues(kind, obj)
        if problems:
            fld, msg = problems[0]
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            self.issue(r, fld, msg + more)
            return None
        try:
            return manifest_row(obj, r.path, r.base_dir) if kind == "manifest" else attempt_row(obj)
        except _FieldError as exc:
            self.issue(r, exc.field, exc.message)
            return None

    def _manifest(self, r: RawRecord, row: dict[str, Any]) -> None:
        """A second manifest of a run (a harness's manifest and a tool's summary of the same run) fills in
        what the first one left empty; where both say something different, the first one's word stands."""
        first = self.seen_runs.get(row["run"])
        if first is None:
            self.seen_runs[row["run"]] = r.path
            self.runs_rows.append(row)
            return
        kept = next(x for x in self.runs_rows if x["run"] == row["run"])
        said = [k for k, v in row.items() if k not in ("run", "source") and not _unsaid(v)]
        for k in said:  # the same number at two precisions (a CSV's 471.83, a JSON's 471.827992497): the finer
            if isinstance(kept.get(k), float) and isinstance(row[k], float) and _rounded_alike(kept[k], row[k]):
                kept[k] = max(kept[k], row[k], key=_decimals)
        clash = sorted(k for k in said if k not in MERGE_SKIP and not _unsaid(kept.get(k)) and kept[k] != row[k]
                       and not (isinstance(kept[k], float) and isinstance(row[k], float)
                                and _rounded_alike(kept[k], row[k])))
        for k in said:
            if _unsaid(kept.get(k)):
                kept[k] = row[k]
        if clash:
            self.notes.append(f"{r.path}: a second manifest for run {row['run']!r} (first: {first}) says otherwise "
                              f"about {', '.join(clash)}: kept the first's")

    def _attempt(self, r: RawRecord, row: dict[str, Any]) -> None:
        key3 = (row["run"], row["item"], row["stage"])
        if row["attempt"] is None:
            row["attempt"] = self.next_attempt.get(key3, 1)
        key = (*key3, row["attempt"])
        where = f"{r.path}:{r.line}" if r.line is not None else f"{r.path} record {r.record}"
        if key in self.seen:
            self.issue(r, "attempt", f"duplicate attempt {row['attempt']} of {row['item']}/{row['stage']} "
                                     f"in run {row['run']} (first at {self.seen[key]}); kept the first")
            return
        self.seen[key] = where
        self.next_attempt[key3] = max(self.next_attempt.get(key3, 1), row["attempt"] + 1)
        row["source"] = r.path
        row["source_line"] = r.line if r.line is not None else r.record
        self.att_rows.append(row)

    def records(self) -> Records:
        out = Records(errors=self.errors, notes=self.words.notes() + self.notes)
        if self.runs_rows:
            out.runs = schema.conform(pl.DataFrame(self.runs_rows, schema_overrides={
                "started_at": schema.polars_type(schema.TS), "ended_at": schema.polars_type(schema.TS)}, infer_schema_length=None), "runs")
        if self.att_rows:
            out.attempts = schema.conform(pl.DataFrame(self.att_rows, schema_overrides=_attempt_overrides(),
                                                       infer_schema_length=None), "attempts")
        return out


def _attempt_overrides() -> dict[str, pl.DataType]:
    return {c.name: c.dtype for c in schema.ATTEMPTS if c.name not in ("source", "source_line", "alias")}


def canonical_raw(path: Path, kind: str) -> list[RawRecord]:
    """Raw records of a canonical manifest or attempts file (JSON lines that do not parse become issues
    of kind ``invalid``)."""
    text = read_text(path)
    base = path.resolve().parent
    if kind == "manifest":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            return [RawRecord("invalid", f"not valid JSON: {exc.msg}", str(path), exc.lineno)]
        return [RawRecord("manifest", doc, str(path), None, None, base)]
    out: list[RawRecord] = []
    for i, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s:
            continue
        try:
            obj = json.loads(s)
        except json.JSONDecodeError as exc:
            out.append(RawRecord("invalid", f"not valid JSON: {exc.msg}", str(path), i))
            continue
        k = "manifest" if _is_manifest(obj) else "attempt"
        out.append(RawRecord(k, obj, str(path), i, None, base))
    return out

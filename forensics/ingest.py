"""``forensics ingest``: find files, detect their format, parse them in chunks, commit to the store.

Incremental and idempotent: a file already ingested and unchanged is skipped; a file that grew is read
from where the last ingest stopped (only the new tail is parsed; the file's requests are rebuilt from
the kept partial aggregates); a file replaced under the same path (its first 4 KiB changed, or it
shrank) is read anew and its old rows are dropped.  All of one ingest is committed at once.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import itertools
import json
import os
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import regex

from forensics import schema
from forensics.errors import (
    BUG_HINT,
    ExitCode,
    ForensicsError,
    InputError,
    InternalError,
    UnknownFormatError,
    bug_boundary,
)
from forensics.paths import file_id_of, file_stem, resolved, walk_files
from forensics.store import Store, run_of_part
from parsers import assemble, reader
from parsers.engine import Carry, ChunkResult, Engine, check_user_samples
from parsers.reader import compression_of, iter_chunks, read_head
from parsers.spec import Format, grammar, load_formats, user_dirs

if TYPE_CHECKING:
    from forensics.replay.mapping import Mapping

SKIP_NAMES = {".DS_Store"}
Found = tuple[tuple[str, ...], os.stat_result, bool]  # a file found in a folder: its parts below it, stat, link
# Found in a folder and not a log or record by content: a run folder's notes, configs, scripts and pictures,
# passed over (counted, listed under -v) rather than failing the ingest.  Named on the command line, such a
# file is still an error: the user asked for it.
NOT_LOG_SUFFIXES = {".md", ".rst", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".py", ".sh", ".ipynb", ".png",
                    ".jpg", ".jpeg", ".gif", ".svg", ".pdf", ".html", ".css", ".js"}
WORKERS = 2
BATCH = 4  # chunks assembled together
SHAPE_RULES: list[tuple[str, str]] = [  # masking for "most common unknown line shapes", applied in order
    (r"\b[0-9a-f]{7,40}\b", "<hex>"),
    (r"\d+(?:\.\d+)?", "<n>"),
]


@dataclass
class FileReport:
    path: str
    kind: str  # log format name, or "records:<kind>"
    status: str  # ingested, unchanged, appended, replaced, error
    lines: int = 0
    parsed: int = 0
    skipped: int = 0
    unparsed: int = 0
    requests: int = 0
    message: str = ""


@dataclass
class IngestResult:
    files: list[FileReport] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unknown_shapes: list[tuple[str, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    bugs: int = 0  # files not read because of an internal error
    mapping_failed: str = ""  # the --mapping read nothing from any file it names (an error even with --keep-going)
    compacted: str = ""  # what the compaction that followed this ingest did, when the store had many part files
    analysed: Any = None  # what the analysis that followed it did (forensics.analyse.Analysed), when one ran
    general_requests: int = 0  # requests read by the general rule (a line layout no format knows)

    @property
    def totals(self) -> dict[str, int]:
        keys = ("lines", "parsed", "skipped", "unparsed", "requests")
        return {k: sum(getattr(f, k) for f in self.files) for k in keys}


@dataclass
class ParseState:
    """Where parsing a log stopped, so that the next ingest of the grown file continues it: the last line's
    kind, each instance's assembly state, the request numbering, the wrappers seen, the requests counted."""

    last_kind: str | None = None
    keys: dict[int, assemble.KeyState] = field(default_factory=dict)
    wrappers: set[str] = field(default_factory=set)
    tz: str = "UTC"
    seq: dict[str, int] = field(default_factory=dict)
    http_last: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    unterminated_tail: bool = False  # the last line was read without its newline: a grown file is read anew
    req_counts: Counter[tuple[int, int]] = field(default_factory=Counter)  # requests per (ikey, instance_no)

    def to_json(self) -> dict[str, Any]:
        return {"last_kind": self.last_kind, "keys": {str(k): vars(v) for k, v in self.keys.items()},
                "wrappers": sorted(self.wrappers), "tz": self.tz, "seq": self.seq, "http_last": self.http_last,
                "requests": self.requests, "unterminated_tail": self.unterminated_tail,
                "req_counts": {f"{k[0]}/{k[1]}": v for k, v in self.req_counts.items()}}

    @classmethod
    def from_json(cls, meta: dict[str, Any]) -> ParseState:
        known = assemble.KeyState.__dataclass_fields__
        keys = {int(k): assemble.KeyState(**{f: x for f, x in v.items() if f in known})
                for k, v in (meta.get("keys") or {}).items()}
        counts = Counter({(int(k.split("/")[0]), int(k.split("/")[1])): v
                          for k, v in (meta.get("req_counts") or {}).items()})
        return cls(last_kind=meta.get("last_kind"), keys=keys, wrappers=set(meta.get("wrappers") or []),
                   tz=meta.get("tz", "UTC"), seq=dict(meta.get("seq") or {}), http_last=dict(meta.get("http_last") or {}),
                   requests=meta.get("requests", 0), unterminated_tail=bool(meta.get("unterminated_tail")),
                   req_counts=counts)


@dataclass
class FileState:
    """What the store remembers of one file it read, kept as JSON in the manifest's ``files`` entry: the files
    table's row (without the time it was read), where parsing a log stopped (``parse``), and the mapping that
    read a records file.  Keys it does not know are ignored, so the entries of older stores load."""

    path: str = ""
    file_id: str = ""
    run: str | None = None
    format: str | None = None
    compression: str | None = None
    size_bytes: int | None = None
    bytes_read: int = 0
    held_back_bytes: int = 0
    lines_total: int = 0
    lines_parsed: int = 0
    lines_skipped: int = 0
    lines_unparsed: int = 0
    skipped_by_kind: str = "{}"  # JSON object: skipped line counts by kind
    head_sha256: str | None = None  # of the file's first 4 KiB
    mtime: float | None = None
    parse: ParseState | None = None
    mapping: str | None = None

    @classmethod
    def found(cls, path: Path, fid: str, run: str, stat: os.stat_result, head_sha: str) -> FileState:
        """The file as it is now, nothing read yet."""
        return cls(path=str(path), file_id=fid, run=run, compression=compression_of(path), size_bytes=stat.st_size,
                   head_sha256=head_sha, mtime=stat.st_mtime)

    def row(self) -> dict[str, Any]:
        """The files table's columns, in its order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in _FILE_ROW}

    def to_json(self) -> dict[str, Any]:
        out = self.row()
        if self.parse is not None:
            out.update(self.parse.to_json())
        if self.mapping:
            out["mapping"] = self.mapping
        return out

    @classmethod
    def from_json(cls, meta: dict[str, Any]) -> FileState:
        parse = ParseState.from_json(meta) if _PARSE_KEYS & meta.keys() else None
        return cls(**{k: v for k, v in meta.items() if k in _FILE_ROW}, parse=parse, mapping=meta.get("mapping"))

    @property
    def tz(self) -> str:
        return self.parse.tz if self.parse is not None else "UTC"


_FILE_ROW = {f.name for f in dataclasses.fields(FileState)} - {"parse", "mapping"}
_PARSE_KEYS = {f.name for f in dataclasses.fields(ParseState)}


def run_of(path: Path, run: str | None, root: Path | None) -> str:
    """--run, else the folder the file sits in (below the ingested root), else the file name's stem."""
    if run:
        return run
    parent = path.parent
    if root is not None and root.is_dir():
        try:
            rel = resolved(path).relative_to(resolved(root))
        except ValueError:
            rel = None
        if rel is not None and len(rel.parts) > 1:
            return rel.parts[-2]
        if rel is not None and len(rel.parts) == 1:
            return resolved(root).name
    if parent.name and parent.name not in {".", ""} and root is None:
        return parent.name
    return strip_exts(path.name)


def instance_name(label: str) -> pl.Expr:
    """An instance's id from ``ikey``/``instance_no``: the file label, ``:port`` for a router child, ``@N`` for the
    Nth of several servers writing into the log untagged at once (key -N), ``#N`` for the Nth server start."""
    port = (pl.when(pl.col("ikey") >= 0).then(pl.lit(":") + pl.col("ikey").cast(pl.String))
            .when(pl.col("ikey") < -1).then(pl.lit("@") + (-pl.col("ikey")).cast(pl.String)).otherwise(pl.lit("")))
    restart = pl.when(pl.col("instance_no") > 1).then(pl.lit("#") + pl.col("instance_no").cast(pl.String)) \
        .otherwise(pl.lit(""))
    return pl.lit(label) + port + restart


def strip_exts(name: str) -> str:
    return file_stem(name) or "run"


def check_path_text(p: Path) -> None:
    """A path with a NUL byte can name no file: say so, before any file-system call fails on it."""
    if "\x00" in str(p):
        raise InputError(f"{str(p)!r}: a path cannot hold a NUL byte", hint="pass log files or their folders")


def discover(paths: list[Path]) -> tuple[list[tuple[Path, Path | None]], list[Path]]:
    """Files under ``paths`` (recursively), each with the root it was found under; and the hidden files
    (dot files) found in folders, which are not read unless named."""
    files, hidden, _found = discover_stat(paths)
    return files, hidden


def discover_stat(paths: list[Path]) -> tuple[list[tuple[Path, Path | None]], list[Path], dict[Path, Found]]:
    """``discover``, and for each file found in a folder its parts below the folder and its stat, as the
    folder's listing gave them (``unchanged_in_bulk`` compares them with the store without a call a file)."""
    out: list[tuple[Path, Path | None]] = []
    hidden: list[Path] = []
    found: dict[Path, Found] = {}
    for p in paths:
        check_path_text(p)
        if not p.exists():
            raise InputError("no such file or folder", path=str(p), hint="check the path")
        if p.is_dir():
            for f, rel, st, link in walk_files(p):
                if any(part.startswith(".") for part in rel) or f.name in SKIP_NAMES:
                    hidden.append(f)
                else:
                    out.append((f, p))
                    found[f] = (rel, st, link)
        else:
            out.append((p, None))
    return out, hidden, found


HEAD_LINES = 4000
HEAD_BYTES = 256 * 1024


def engine_for(forced: str | None) -> Engine:
    """The engine of one set of kinds (every format's, or a forced format's; the user's formats folders' too), built
    once per process and shared by format detection and parsing: building one costs more than reading a short log,
    and what it learns (the order and routes of the kinds) only makes later files faster."""
    return _engine(forced, user_dirs())


@functools.cache
def _engine(forced: str | None, dirs: tuple[Path, ...]) -> Engine:
    return Engine(grammar(forced))


SETTLED_S = 120.0  # a log not written for this long is not being written: its unterminated last line is read


def settled(stat: os.stat_result) -> bool:
    """The file has not been written for a while: a last line without a newline is the end of it (a pasted log,
    a server killed mid-line), not a line still being written, so it is read, not held back."""
    return time.time() - stat.st_mtime > SETTLED_S


def detect_format(path: Path, head: bytes | None = None) -> str | None:
    """The format most lines of the file's head belong to, or None when no line is a server line.

    Every line of the head (256 KiB, at most 4000 lines) is classified with every format, so a preamble of
    other text (a shell prompt, model output, a user's comment) does not hide the log after it.  Only lines
    of a kind that plain text cannot match count: a file with any such line is a log.  The head is cut into
    lines as the parse cuts the file (``parsers.reader``).
    """
    head = read_head(path, HEAD_BYTES) if head is None else head
    if not head:
        return None
    cut = head.rfind(b"\n")
    block = head[:cut + 1] if cut >= 0 else head + b"\n"  # a line cut by the head's size is left out
    lines = reader.lines_of(block).head(HEAD_LINES)
    eng = engine_for(None)
    return voted_format(eng, eng.classify(lines, 1, Carry()).kind_counts)


def voted_format(eng: Engine, kind_counts: Any) -> str | None:
    """The format the most lines of a head belong to (its own formats before the shared ones), counting only
    kinds that plain text cannot match; None when there is none, or when every such line is of a kind that
    is no evidence of a log by itself."""
    votes: Counter[str] = Counter()
    evidence = False
    for i, n in enumerate(kind_counts if kind_counts is not None else []):
        kind = eng.kinds[i]
        if n and not kind.weak:
            votes[kind.format] += int(n)
            evidence = evidence or kind.evidence
    if not evidence:  # only lines a note can hold too (``evidence = false``): not a log
        return None
    shared = {name for name, f in load_formats().items() if f.shared}
    own = [(n, f) for f, n in votes.items() if f not in shared]
    return max(own)[1] if own else max((n, f) for f, n in votes.items())[1]


def _may_hold_records(path: Path) -> bool:
    """Canonical records are JSON (their text starts with ``{``): any other file is told without loading the
    replay package."""
    try:
        return read_head(path, 4096).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{")
    except (OSError, ForensicsError):
        return True  # the replay package says what is wrong with it


def mask_shape(text: str) -> str:
    for pattern, repl in SHAPE_RULES:
        text = regex.sub(pattern, repl, text)
    return text[:200]


@dataclass
class Progress:
    """Where an ingest is, for a progress bar: files and bytes done out of all, requests rebuilt so far."""

    files_done: int = 0
    files_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    requests: int = 0


@dataclass(frozen=True)
class IngestOptions:
    """How an ingest reads its files (``forensics ingest`` options)."""

    run: str | None = None  # --run: every file's run, else the folder each sits in
    fmt: str | None = None  # --format: the log format, else detected per file
    started_at: datetime | None = None  # --started-at: the wall-clock start of logs that count elapsed time
    keep_going: bool = False  # --keep-going: a file that cannot be read does not fail the others
    mapping: Path | str | None = None  # --mapping: how to read a harness's own records
    tz: str = "UTC"  # --tz: the zone of log times written without one
    exclude: tuple[str, ...] = ()  # --exclude: globs of files not to read (names, or paths below a folder)


class Ingestor:
    def __init__(self, store: Store, options: IngestOptions, progress: Callable[[Progress], None] | None = None) -> None:
        self.store = store
        self.run = options.run
        self.forced = grammar(options.fmt) if options.fmt else None
        self.started_at = options.started_at
        self.progress = progress
        self.at = Progress()
        self.keep_going = options.keep_going
        self.mapping = options.mapping
        self.tz = check_tz(options.tz)
        self.result = IngestResult()
        self.unknown = Counter[str]()
        self.txn = store.transaction()
        self.files_meta: dict[str, Any] = dict(store.meta("files", {}) or {})
        self.records: list[tuple[Path, str, str, str | None]] = []  # (path, kind, folder run, mapping)
        self.named: set[str] = set()  # records files named on the command line (a mapping tries them by content)
        self.loaded_mapping: Mapping | None = None  # the --mapping, loaded (its files globs decide what it reads)
        self.dropped_records: list[str] = []  # stored records files found to be duplicates: their rows go
        self.unchanged_records: list[tuple[Path, str, str, str | None]] = []  # read again if their run changed
        self.at_line: int | None = None  # first line of the chunk being assembled (for an error message)
        # the instance table the requests of the file being read were last named with (see LogParse)
        self.instances_of: str | None = None  # the file it was built for
        self.instance_slots: dict[tuple[int, int], int | None] = {}  # (ikey, instance_no) -> its slot context
        self._inst_keys = pl.DataFrame()
        self._instances_full = pl.DataFrame()
        self.prefetch: Prefetch | None = None  # the small logs classified together (see Prefetch)
        self._reported = 0  # the files of result.files whose requests the progress has counted

    # -------------------------------------------------------------- per file
    def _engine(self) -> Engine:
        return engine_for(self.forced.name if self.forced else None)

    def tick(self, bytes_done: int, *, requests: int = 0, file_done: bool = False) -> None:
        """Tell the progress callback: ``requests`` rebuilt so far in the file being read."""
        # a compressed file counts its decompressed bytes while it is read: never past the whole job's size
        self.at.bytes_done = max(self.at.bytes_done, min(bytes_done, self.at.bytes_total or bytes_done))
        if file_done:  # the requests of the files reported since the last file: not a sum over every file each time
            self.at.files_done += 1
            self.at.requests += sum(f.requests or 0 for f in self.result.files[self._reported:])
            self._reported = len(self.result.files)
        if self.progress:
            self.progress(replace(self.at, requests=self.at.requests + (0 if file_done else requests)))

    def ingest_file(self, path: Path, root: Path | None, done_bytes: list[int]) -> None:
        run = run_of(path, self.run, root)
        fid = file_id_of(path)
        stat = path.stat()
        prev = FileState.from_json(self.files_meta[fid]) if fid in self.files_meta else None
        # as the last ingest left it (size and modification time to the nanosecond, its run, read the same way):
        # unchanged, without opening it (a store of thousands of run folders is re-ingested in a second)
        if prev is not None and stat.st_size == prev.size_bytes and stat.st_mtime == prev.mtime \
                and prev.run == run and prev.tz == self.tz \
                and (self.forced is None or prev.format == self.forced.name) \
                and (self.mapping is None or not str(prev.format).startswith("records")):
            self.result.files.append(FileReport(str(path), str(prev.format), "unchanged"))
            done_bytes[0] += stat.st_size
            self._requeue_records(path, prev, run)
            return
        head = read_head(path, 4096)
        now = FileState.found(path, fid, run, stat, hashlib.sha256(head).hexdigest())
        compression = now.compression
        fmt_name = self.forced.name if self.forced else None
        if fmt_name is None and self._records_kind(path, run, named=root is None):
            return
        if fmt_name is None and root is not None and path.suffix.lower() in NOT_LOG_SUFFIXES:
            # a run folder's notes and configs, even when a README quotes log lines: not read as a log
            self.result.files.append(FileReport(str(path), "not a log", "skipped",
                                                message=f"a {path.suffix} file that is not a log: not read"))
            return
        pre = self.prefetch.take(path) if self.prefetch is not None else None
        if fmt_name is None and pre is not None and pre.result.total <= HEAD_LINES:
            fmt_name = voted_format(self._engine(), pre.result.kind_counts)
        elif fmt_name is None:
            pre = None
            fmt_name = detect_format(path)
        if fmt_name is None and self.mapping is not None and self.loaded_mapping is not None \
                and not self.loaded_mapping.has_globs and not replay_sidefiles().is_dump(path):
            self._queue_records(path, "mapped", run)  # a mapping without globs reads what nothing else does
            return
        if fmt_name is None:
            if stat.st_size == 0 or (compression and not read_head(path, 1)):
                msg = "empty file" if stat.st_size == 0 else "compressed stream yields no data (truncated or damaged)"
                if stat.st_size:
                    self.result.warnings.append(f"{path}: {msg}")
                self.result.files.append(FileReport(str(path), "empty", "ingested", message=msg))
                self._record_file(replace(now, format="empty"))
                return
            if replay_sidefiles().take(self, path, root, now):  # a server dump read, or another file passed over
                return
            raise UnknownFormatError("not a llama-server log or replay record this version knows", path=str(path),
                                     hint="pass --format NAME to force a log format, --mapping FILE for harness "
                                          "records, or --keep-going to load the other files")
        fmt = dataclasses.replace(self.forced or grammar(), name=fmt_name)  # every format's kinds, named as detected
        job = LogRead(now, fmt, final=compression is not None or settled(stat))
        if prev is not None and not self._continue(job, prev, head, done_bytes):
            return
        LogParse(self, job, pre if prev is None else None).run(done_bytes)

    def _continue(self, job: LogRead, prev: FileState, head: bytes, done_bytes: list[int]) -> bool:
        """Compare a file read before with what it is now: False when it is unchanged (nothing to read), else
        set ``job`` to append to the earlier rows (the file grew) or to replace them."""
        now, fid = job.file, job.file.file_id
        # the hash covered at most the first 4 KiB the file had then: compare the same bytes now, so a
        # small log that grew is recognised as grown, not replaced
        covered = min(len(head), int(prev.size_bytes or 0))
        same_head = prev.head_sha256 == hashlib.sha256(head[:covered]).hexdigest()
        size = now.size_bytes or 0
        grew = size >= (prev.size_bytes or 0)
        if same_head and now.size_bytes == prev.size_bytes and now.mtime == prev.mtime \
                and prev.format == job.fmt.name and prev.run == now.run:
            self.result.files.append(FileReport(now.path, job.fmt.name, "unchanged"))
            done_bytes[0] += size
            return False
        # a last line read without its newline may have been cut: a file that grew after is read whole
        if same_head and grew and now.compression is None and prev.format == job.fmt.name \
                and prev.run == now.run and not (prev.parse is not None and prev.parse.unterminated_tail):
            job.status, job.prev = "appended", prev
        else:
            job.status = "replaced" if prev.run == now.run else "ingested"
        job.dropped = self._drop_file_parts(fid)
        if job.status == "appended":  # the earlier rows stay; the carried state and the open requests go
            for table in ("events", "unparsed", "requests"):
                keep = [p for p in job.dropped.get(table, [])
                        if f"/{fid}-req-open-" not in p and f"/{fid}-ev-tail-" not in p]
                self.txn.removes.get(table, set()).difference_update(keep)
        return True

    def _records_kind(self, path: Path, run: str, *, named: bool) -> bool:
        """Queue ``path`` as replay records when it is: canonical records (told by their content, never
        logs), a file the --mapping names in its ``files`` globs, or a file named on the command line that a
        mapping without globs reads (in a folder, such a mapping reads what is neither records nor a log)."""
        kind = None
        if self.loaded_mapping is not None and replay_sidefiles().is_dump(path):
            return False  # llama-server's own /metrics or /slots dump: read as such, never by a mapping
        if _may_hold_records(path):
            from forensics import replay

            kind = replay.detect(path)
        mp = self.loaded_mapping
        reads_text = mp is not None and mp.fmt_for(path) == "text"  # a printed report: a log is still a log
        if kind is None and mp is not None and ((mp.names(path) and not (reads_text and detect_format(path)))
                                                or (named and (not mp.has_globs or detect_format(path) is None))):
            kind = "mapped"  # a file named with --mapping that no glob names is tried by content (a renamed file)
            if named:
                self.named.add(str(path))
        if kind is None and mp is None and not self.forced:
            from forensics.replay.autoread import shipped_reader

            tool = shipped_reader(path)  # a tool's report a shipped mapping tells by its content (GuideLLM's)
            if tool is not None:
                self.result.warnings.append(f"records: {path} read with the shipped mapping {tool} (told by its "
                                            "content)")
                self._queue_records(path, "mapped", run, tool)
                return True
        if kind is not None:
            self._queue_records(path, kind, run)
        return kind is not None

    def _queue_records(self, path: Path, kind: str, run: str, mapping: str | None = None,
                       status: str = "pending") -> None:
        """Replay records are loaded together once every file was seen (see ``_ingest_records``)."""
        self.result.files.append(FileReport(str(path), f"records:{kind}", status))
        self.records.append((path, kind, run, mapping or (str(self.mapping) if kind == "mapped" else None)))

    def _requeue_records(self, path: Path, prev: FileState, run: str) -> None:
        """Remember an unchanged records file: ``requeue_unchanged`` reads it again when another file of its
        run changed (a log that came since ties its records; a manifest anchors their times)."""
        fmt = prev.format or ""
        kind = fmt.removeprefix("records:")
        if not fmt.startswith("records:") or kind not in ("manifest", "attempts", "mapped", "summary"):
            return
        if kind in ("mapped", "summary") and not prev.mapping:
            return  # read by a mapping this store does not remember
        self.unchanged_records.append((path, "mapped" if kind == "summary" else kind, run, prev.mapping))

    def requeue_unchanged(self) -> None:
        """Queue the unchanged records files of the runs that a file of this ingest changed."""
        changed = {run for _, _, run, _ in self.records}
        changed |= {str(self.files_meta.get(file_id_of(Path(f.path)), {}).get("run")) for f in self.result.files
                    if f.status in ("ingested", "appended", "replaced")}
        for path, kind, run, mapping in self.unchanged_records:
            if run in changed:
                self.result.files = [f for f in self.result.files if f.path != str(path)]
                self._queue_records(path, kind, run, mapping, status="unchanged")

    def _drop_file_parts(self, fid: str) -> dict[str, list[str]]:
        """Stage the removal of every part this file wrote before; return them by table."""
        dropped: dict[str, list[str]] = {}
        for table, parts in self.store.manifest["parts"].items():
            mine = [p for p in parts if f"/{fid}-" in p]
            if mine:
                dropped[table] = mine
                self.txn.remove(table, mine)
        return dropped

    def _label(self, path: Path, run: str) -> str:
        return strip_exts(path.name)

    def _instance_facts(self, ev: pl.DataFrame, fmt: Format) -> pl.DataFrame:
        cols: dict[str, pl.DataType | type[pl.DataType]] = {"build": pl.Int64, "commit": pl.String, "model": pl.String, "n_ctx": pl.Int64, "n_slots": pl.Int64,
                "n_ctx_slot": pl.Int64, "n_ctx_train": pl.Int64, "host": pl.String, "port": pl.Int64,
                "n_seq_max": pl.Int64, "slot": pl.Int64, "elapsed_s": pl.Float64,
                "abs_time": pl.Datetime("us", "UTC"), "error": pl.String}
        if ev.height == 0:
            return pl.DataFrame()
        ev = ev.with_columns([(pl.col(c) if c in ev.columns else pl.lit(None, dtype=t)).cast(t).alias(c)
                              for c, t in cols.items()])
        not_router_listen = ~pl.col("kind").is_in(["router_spawn", "router_proxy"])
        listen_kinds = list(fmt.with_role("listen"))
        crash = pl.col("kind").is_in(list(fmt.with_role("crash")))
        keys = ["ikey", "instance_no"]
        # cheap aggregations over every line; the fact columns only over the few lines that carry one
        light = ev.group_by(keys).agg(
            pl.col("line_no").min().alias("line_first"), pl.col("line_no").max().alias("line_last"),
            pl.col("slot").drop_nulls().n_unique().alias("slots_seen"),
            pl.col("slot").max().alias("max_slot"),
            pl.col("elapsed_s").drop_nulls().first().alias("elapsed_first"),
            pl.col("abs_time").min().alias("abs_first"),
            pl.col("abs_time").count().alias("n_abs"),
            pl.col("elapsed_s").count().alias("n_elapsed"),
            crash.any().alias("crashed"),
            pl.col("line_no").filter(crash).min().alias("crash_line"),
            pl.col("error").filter(crash).drop_nulls().first().alias("crash"),
        )
        fact_cols = ["build", "commit", "model", "n_ctx", "n_slots", "n_ctx_slot", "n_ctx_train", "host", "port",
                     "n_seq_max"]
        facts = ev.filter(pl.any_horizontal([pl.col(c).is_not_null() for c in fact_cols]))
        heavy = facts.group_by(keys).agg(
            pl.col("build").drop_nulls().first(), pl.col("commit").drop_nulls().first(),
            pl.col("model").filter(pl.col("kind").is_in(["load_model", "rec_load_model"])).drop_nulls().first()
            .alias("model_path"),
            pl.col("model").filter(not_router_listen).drop_nulls().first().alias("model_any"),
            pl.col("n_ctx").drop_nulls().first(), pl.col("n_slots").drop_nulls().first(),
            pl.col("n_ctx_slot").drop_nulls().first(),
            pl.col("n_ctx_train").drop_nulls().first(),
            pl.col("host").filter(pl.col("kind").is_in(listen_kinds)).drop_nulls().first(),
            pl.col("port").filter(pl.col("kind").is_in(listen_kinds)).drop_nulls().first(),
            pl.col("n_seq_max").drop_nulls().first(),
        )
        return light.join(heavy, on=keys, how="left")

    def _instances(self, rows: list[pl.DataFrame], path: Path, run: str, fmt: Format,
                   label: str, req_counts: Counter) -> pl.DataFrame:
        frames = [r for r in rows if r.height]
        if not frames:
            return schema.empty("instances").drop("run")
        df = collapse_facts(frames)
        multi = df.group_by("ikey").agg(pl.len().alias("n"))
        df = df.join(multi, on="ikey")
        name = instance_name(label)
        counts = pl.DataFrame([{"ikey": k[0], "instance_no": k[1], "requests": v} for k, v in req_counts.items()],
                              schema={"ikey": pl.Int64, "instance_no": pl.Int64, "requests": pl.Int64})
        df = df.join(counts, on=["ikey", "instance_no"], how="left")
        started = pl.col("abs_first") if "abs_first" in df.columns else pl.lit(None)
        if self.started_at is not None:
            started = pl.coalesce(started, pl.lit(self.started_at).cast(pl.Datetime("us", "UTC")))
        basis = (pl.when(pl.col("n_abs") > 0).then(pl.lit("absolute"))
                 .when(pl.col("n_elapsed") > 0).then(pl.lit("elapsed" if self.started_at is None else "anchored"))
                 .otherwise(pl.lit("order")))
        out = df.with_columns(
            name.alias("instance"),
            pl.lit(str(path)).alias("path"),
            pl.lit(fmt.name).alias("format"),
            pl.when(pl.col("ikey") >= 0).then(pl.col("ikey")).alias("router_port"),
            pl.coalesce("model_path", "model_any").alias("model"),
            pl.coalesce("n_slots", "n_seq_max", pl.col("max_slot") + 1).alias("n_slots"),
            started.cast(pl.Datetime("us", "UTC")).alias("started_at"),
            basis.alias("time_basis"),
            pl.col("requests").fill_null(0),
        )
        self._inst_keys = out.select("ikey", "instance_no", "instance")
        keep = out.select([c for c in out.columns if c in schema.polars_schema("instances") or c in
                           ("ikey", "instance_no", "model_path", "model_any", "slots_seen", "max_slot",
                            "elapsed_first", "abs_first", "n_abs", "n_elapsed", "n_seq_max")])
        self._instances_full = keep
        return schema.conform(keep, "instances").drop("run")

    def _requests_frame(self, reqs: pl.DataFrame, path: Path, label: str,
                        instances: pl.DataFrame | None) -> pl.DataFrame:
        if reqs.height == 0:
            return schema.empty("requests").drop("run")
        reqs = reqs.join(self._inst_keys, on=["ikey", "instance_no"], how="left")
        full = self._instances_full.select("ikey", "instance_no", pl.col("n_ctx_slot").alias("inst_n_ctx_slot"))
        reqs = reqs.join(full, on=["ikey", "instance_no"], how="left").with_columns(
            pl.coalesce("n_ctx_slot", "inst_n_ctx_slot").alias("n_ctx_slot"), pl.lit(str(path)).alias("path"))
        reqs = reqs.with_columns(pl.when(pl.col("t_start").is_not_null()).then(pl.lit("log")).alias("clock"))
        if self.started_at is not None:
            anchor = pl.lit(self.started_at).cast(pl.Datetime("us", "UTC"))
            reqs = reqs.with_columns(
                pl.when(pl.col("clock").is_null() & pl.col("elapsed_start_s").is_not_null()).then(pl.lit("anchored"))
                .otherwise("clock").alias("clock"),
                pl.coalesce("t_start", anchor + pl.duration(microseconds=(pl.col("elapsed_start_s") * 1e6).cast(pl.Int64)))
                .alias("t_start"),
                pl.coalesce("t_end", anchor + pl.duration(microseconds=(pl.col("elapsed_end_s") * 1e6).cast(pl.Int64)))
                .alias("t_end"),
            )
        return schema.conform(reqs, "requests").drop("run")

    def _events_frame(self, ev: pl.DataFrame, path: Path, fid: str) -> pl.DataFrame:
        if ev.height == 0:
            return ev
        label = self._label(path, "")
        ev = ev.with_columns(instance_name(label).alias("instance"), pl.lit(str(path)).alias("path"))
        if "abs_time" in ev.columns:
            ev = ev.rename({"abs_time": "ts"})
        drop = [c for c in ("ikey", "instance_no", "abs_raw", "json_time", "json_level", "router_port_raw") if c in ev.columns]
        ev = ev.drop(drop)
        if "level" not in ev.columns:
            ev = ev.with_columns(pl.lit(None, dtype=pl.String).alias("level"))
        return schema.conform(ev, "events").drop("run")

    def _record_file(self, file: FileState) -> None:
        """The file's row in the files table, and what the next ingest needs of it in the manifest."""
        if file.run is None:  # every file is given its run before it is read
            raise InternalError(f"{file.path}: recorded without its run")
        row = {**file.row(), "ingested_at": datetime.now(timezone.utc)}
        self.txn.write("files", schema.conform(pl.DataFrame([row]), "files"), run=file.run, name=f"{file.file_id}-file")
        self.files_meta[file.file_id] = file.to_json()


@dataclass
class LogRead:
    """One log file to parse: the file as found, its format, and whether it is read anew or appended to."""

    file: FileState  # as found now, nothing read yet
    fmt: Format  # every format's kinds, named as detected
    final: bool  # its last line is read even without a newline (compressed, or not written for a while)
    status: str = "ingested"  # ingested, replaced or appended
    prev: FileState | None = None  # what the last ingest left, when appending
    dropped: dict[str, list[str]] = field(default_factory=dict)  # the parts the file wrote before, by table


class LogParse:
    """Parse one log file into the ingest's transaction.  Chunks are classified on worker threads (polars releases
    the GIL) while this thread assembles requests and writes parts in file order; ``state`` is what the next
    ingest of the grown file continues from."""

    def __init__(self, ing: Ingestor, job: LogRead, pre: Prefetched | None = None) -> None:
        self.ing, self.job, self.pre = ing, job, pre
        prev = job.prev
        self.state = prev.parse if prev is not None and prev.parse is not None else ParseState()
        self.state.tz = ing.tz
        self.engine = ing._engine()
        self.carry = Carry(last_kind=self.state.last_kind)
        self.assembly = assemble.AssembleState(keys=self.state.keys)
        saved = self._saved_frames()
        self.builder = assemble.RequestBuilder(open_rows=saved.get("_partials"), http=saved.get("_http"),
                                               http_last=self.state.http_last, seq=self.state.seq)
        self.start_line = prev.lines_total if prev is not None else 0
        self.lines = prev.lines_total if prev is not None else 0
        self.parsed = prev.lines_parsed if prev is not None else 0
        self.unparsed = prev.lines_unparsed if prev is not None else 0
        self.skipped: Counter[str] = Counter(json.loads(prev.skipped_by_kind) if prev is not None else {})
        self.label = ing._label(Path(job.file.path), job.file.run or "")
        self.reference = ing.started_at or datetime.fromtimestamp(job.file.mtime or 0.0, timezone.utc)
        self.read = pre.read if pre is not None else reader.ReadState()
        # what the lines read before said about each instance (model, slots, context: usually at the top)
        facts = saved.get("_facts")
        self.instance_facts: list[pl.DataFrame] = [facts] if facts is not None and facts.height else []
        # trailing lines waiting for the line they take their slot from (era 2); an append continues them
        tail = saved.get("_tail")
        self.tail = tail if tail is not None else pl.DataFrame()
        self.chunk_no = 0

    def _saved_frames(self) -> dict[str, pl.DataFrame]:
        """The carried frames the last ingest of an appended file left: open requests, unmatched HTTP lines,
        instance facts, trailing lines."""
        if self.job.prev is None:
            return {}
        saved = {}
        for name in ("_partials", "_http", "_facts", "_tail"):
            frames = [pl.read_parquet(self.ing.store.root / rel) for rel in self.job.dropped.get(name, [])]
            saved[name] = pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()
        return saved

    @property
    def path(self) -> Path:
        return Path(self.job.file.path)

    @property
    def run_name(self) -> str:
        return self.job.file.run or ""

    def run(self, done_bytes: list[int]) -> None:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=WORKERS) if self.pre is None else None
        last: Any = None
        # Requests are assembled a batch of chunks at a time: every polars call this thread makes waits for
        # a pool thread the workers keep busy, so fewer, larger calls keep the workers fed.
        batches = [[self._typed(self.pre.chunk, self.pre.result)]] if self.pre is not None else self._batches(pool)
        for batch in batches:
            evs = [self.tail] if self.tail.height else []
            for chunk, res, ev in batch:
                self._count(chunk, res, ev, evs)
            ev = pl.concat(evs, how="diagonal_relaxed") if len(evs) > 1 else evs[0] if evs else batch[-1][2]
            # lines that take their slot from a later line (era-2 timings before `slot N released`) wait for
            # the next batch when that line has not come yet
            cut = assemble.waiting_tail(ev, self.job.fmt, self.assembly)
            ev, self.tail = (ev.slice(0, cut), ev.slice(cut)) if cut is not None else (ev, pl.DataFrame())
            last = batch[-1][0]
            self._assemble(ev, last)
            done_bytes[0] += last.end_offset - batch[0][0].first_offset
            self.ing.tick(done_bytes[0], requests=self.state.requests)
        self._keep_tail(last)
        if pool is not None:
            pool.shutdown()
        self._finish()

    def _classify(self, chunk: Any, order: tuple[int, ...]) -> Any:
        return self._typed(chunk, self.engine.classify(chunk.lines, chunk.first_line_no, Carry(), order))

    def _typed(self, chunk: Any, res: Any) -> Any:
        """A classified chunk with its events' wall-clock times."""
        return chunk, res, assemble.parse_abs_time(res.events, reference=self.reference, tz=self.ing.tz,
                                                   reference_is_start=self.ing.started_at is not None)

    def _batches(self, pool: Any) -> Any:
        """The classified chunks in file order, BATCH at a time; at most BATCH + WORKERS + 2 chunks are in memory."""
        chunks = iter_chunks(self.path, start_offset=self.job.prev.bytes_read if self.job.prev is not None else 0,
                             start_line_no=self.start_line, state=self.read, chunk_bytes=reader.CHUNK_BYTES,
                             final=self.job.final)
        pending: list[Any] = []

        def results() -> Any:
            for chunk in chunks:
                pending.append(pool.submit(self._classify, chunk, self.engine.order))
                if len(pending) > WORKERS + 1:
                    yield pending.pop(0).result()
            while pending:
                yield pending.pop(0).result()

        batch: list[Any] = []
        for item in results():
            batch.append(item)
            if len(batch) == BATCH:
                yield batch
                batch = []
        if batch:
            yield batch

    def _count(self, chunk: Any, res: Any, ev: pl.DataFrame, evs: list[pl.DataFrame]) -> None:
        """Take one classified chunk: its counts, the kinds it learnt, its unknown lines (written), its events."""
        ing, run, fid = self.ing, self.run_name, self.job.file.file_id
        ing.at_line = chunk.first_line_no
        self.chunk_no += 1
        self.engine.learn(res)
        self.engine.join_chunks(res, self.carry.last_kind)
        if res.last_kind is not None:
            self.carry.last_kind = res.last_kind
        self.state.wrappers |= res.wrappers_seen
        self.lines += res.total
        self.parsed += res.parsed
        self.unparsed += res.unparsed.height
        self.skipped.update(res.skipped)
        if ev.height:
            evs.append(ev)
        if res.unparsed.height:
            un = res.unparsed.with_columns(
                pl.lit(str(self.path)).alias("path"),
                res.unparsed["text"].map_elements(mask_shape, return_dtype=pl.String).alias("shape"))
            ing.unknown.update(un["shape"].to_list())
            ing.txn.write("unparsed", schema.conform(un, "unparsed"), run=run, name=f"{fid}-{self.chunk_no:05d}")

    def _assemble(self, ev: pl.DataFrame, last: Any) -> None:
        """Events to instances, slots and requests; the requests a batch finished and its events are written."""
        fmt, ing, fid = self.job.fmt, self.ing, self.job.file.file_id
        ev = assemble.assign_instances(ev, fmt, self.assembly)
        ev = assemble.running_tasks(ev, fmt, self.assembly)
        ev = assemble.inherit_slots(ev, fmt, self.assembly)
        part, http = assemble.partial_requests(ev, fmt)
        self.instance_facts.append(ing._instance_facts(ev, fmt))
        if len(self.instance_facts) > 4:  # keep one aggregated frame, not one per batch
            self.instance_facts[:] = [collapse_facts(self.instance_facts)]
        final = self.builder.add(part, http, last.first_line_no + last.n_lines - 1)
        part_name = f"{self.start_line:012d}-{self.chunk_no:05d}"
        if final.height:
            self.state.requests += self._write_requests(final, self.state.req_counts, part_name)
        events_out = ing._events_frame(ev, self.path, fid)
        ing.txn.write("events", events_out, run=self.run_name, name=f"{fid}-{part_name}")

    def _keep_tail(self, last: Any) -> None:
        """The trailing lines still waiting for their slot once the file is read."""
        ing, fid, run = self.ing, self.job.file.file_id, self.run_name
        if self.tail.height and self.job.file.compression and last is not None:  # a compressed file does not grow
            self._assemble(self.tail, last)
        elif self.tail.height:
            # The file may grow: keep the lines for the next ingest, and list them as events meanwhile (in a
            # part of their own that the next ingest replaces, named like the instance they belong to).
            ing.txn.write("_tail", self.tail, run=run, name=f"{fid}-state")
            ev = assemble.assign_instances(self.tail, self.job.fmt, copy.deepcopy(self.assembly))
            ing.txn.write("events", ing._events_frame(ev, self.path, fid), run=run, name=f"{fid}-ev-tail")

    def _finish_requests(self) -> Counter[tuple[int, int]]:
        """Write the requests still open at the end; return the request counts per instance to list."""
        req_counts = self.state.req_counts
        open_counts = Counter(req_counts)
        if self.job.file.compression:  # a compressed file does not grow: what is still open is final
            final = self.builder.finish()
            if final.height:
                self.state.requests += self._write_requests(final, req_counts, f"{self.start_line:012d}-end")
            return req_counts
        # Requests still open at the end (a log still being written, or a server that died mid-request) are
        # listed, in a part of their own that the next ingest of a grown file replaces, while their partial
        # rows stay open so the lines that finish them are merged in.
        still_open = self.builder.peek()
        if still_open.height:
            self._write_requests(still_open, open_counts, "open")
        return open_counts

    def _finish(self) -> None:
        ing, file, run = self.ing, self.job.file, self.run_name
        ing.result.warnings.extend(self.read.warnings)
        if self.read.held_back_bytes:
            ing.result.warnings.append(
                f"{file.path}: last line has no newline yet ({self.read.held_back_bytes} bytes); it will be read by "
                "the next ingest once it is complete")
        open_counts = self._finish_requests()
        # what an append needs to continue: open requests and unmatched HTTP lines
        if self.builder.open.height:
            ing.txn.write("_partials", self.builder.open, run=run, name=f"{file.file_id}-state")
        if self.builder.http.height:
            ing.txn.write("_http", self.builder.http, run=run, name=f"{file.file_id}-state")
        if self.instance_facts:
            ing.txn.write("_facts", collapse_facts(self.instance_facts), run=run, name=f"{file.file_id}-state")
        instances = ing._instances(self.instance_facts, self.path, run, self.job.fmt, self.label, open_counts)
        ing.txn.write("instances", instances, run=run, name=f"{file.file_id}-inst")
        state = self.state
        state.last_kind, state.seq, state.http_last = self.carry.last_kind, self.builder.seq, self.builder.http_last
        state.unterminated_tail = self.read.unterminated
        start_offset = self.job.prev.bytes_read if self.job.prev is not None else 0
        ing._record_file(replace(file, format=self.job.fmt.name, bytes_read=self.read.end_offset or start_offset,
                                 held_back_bytes=self.read.held_back_bytes, lines_total=self.lines,
                                 lines_parsed=self.parsed, lines_skipped=sum(self.skipped.values()),
                                 lines_unparsed=self.unparsed,
                                 skipped_by_kind=json.dumps(dict(sorted(self.skipped.items()))), parse=state))
        wrappers = state.wrappers
        ing.result.files.append(FileReport(
            file.path, self.job.fmt.name + (f" [{', '.join(sorted(wrappers))}]" if wrappers else ""), self.job.status,
            self.lines, self.parsed, sum(self.skipped.values()), self.unparsed,
            sum(open_counts.values()) if not file.compression else state.requests))

    def _write_requests(self, final: pl.DataFrame, req_counts: Counter[tuple[int, int]], part_name: str) -> int:
        ing, file, run = self.ing, self.job.file, self.run_name
        seen = final.group_by("ikey", "instance_no").agg(pl.len().alias("n"))
        for k, i, n in seen.iter_rows():
            req_counts[(int(k), int(i))] += int(n)
        # The requests need only each instance's name and slot context: rebuild the instance table only when
        # an instance appears that the last one did not know, or whose slot context was still unknown.
        known = ing.instance_slots
        wanted = {(int(k), int(i)) for k, i, _ in seen.iter_rows()}
        if file.file_id != ing.instances_of or any(known.get(w) is None for w in wanted):
            instances = ing._instances(self.instance_facts, self.path, run, self.job.fmt, self.label, req_counts)
            ing.instances_of = file.file_id
            ing.instance_slots = {(int(k), int(i)): c for k, i, c in
                                  ing._instances_full.select("ikey", "instance_no", "n_ctx_slot").iter_rows()}
        else:
            instances = None
        out = ing._requests_frame(final, self.path, self.label, instances)
        ing.txn.write("requests", out, run=run, name=f"{file.file_id}-req-{part_name}")
        ing.result.general_requests += out.filter(pl.col("read_by") == "general").height
        return out.height


PACK_FROM = 64  # an ingest of at least this many files (a join of as many runs) writes its small parts as packs
SMALL_LOG = 256 * 1024  # a new log at most this big is classified together with the other small ones
PREFETCH_BYTES = 16 << 20  # small logs classified in one pass


@dataclass
class Prefetched:
    """A small log read and classified ahead of its turn: its one chunk, how reading it went, its kinds."""

    chunk: reader.Chunk
    read: reader.ReadState
    result: ChunkResult


class Prefetch:
    """The small new logs of one ingest, classified together a batch at a time just before their turn: a folder
    of thousands of run logs pays the engine's column operations once a batch instead of once a file (the
    engine gives each file what classifying it alone gives, ``Engine.classify_many``).  Only the reading and
    the kinds are shared; each file is still detected, assembled, committed or undone on its own."""

    def __init__(self, ing: Ingestor, files: list[tuple[Path, Path | None]]) -> None:
        self.ing = ing
        self.queue = [path for path, _ in files if self._eligible(path)]
        self.position = {path: i for i, path in enumerate(self.queue)}
        self.next = 0
        self.done: dict[Path, Prefetched] = {}

    def _eligible(self, path: Path) -> bool:
        try:
            size = path.stat().st_size
        except OSError:
            return False
        return (0 < size <= SMALL_LOG and file_id_of(path) not in self.ing.files_meta
                and compression_of(path) is None and not _may_hold_records(path))

    def take(self, path: Path) -> Prefetched | None:
        at = self.position.get(path)
        if at is not None and at >= self.next and path not in self.done:
            self._classify_from(at)
        return self.done.pop(path, None)

    def _classify_from(self, at: int) -> None:
        read: list[tuple[Path, reader.Chunk, reader.ReadState]] = []
        size = 0
        while at < len(self.queue) and size < PREFETCH_BYTES:
            path = self.queue[at]
            at += 1
            state = reader.ReadState()
            try:
                chunks = list(iter_chunks(path, state=state, final=settled(path.stat())))
            except (OSError, ForensicsError):
                continue  # read on its turn, which says what is wrong with it
            if len(chunks) == 1:
                read.append((path, chunks[0], state))
                size += len(chunks[0].block)
        self.next = at
        if not read:
            return
        eng = self.ing._engine()
        results = eng.classify_many([c.lines for _, c, _ in read], [c.first_line_no for _, c, _ in read],
                                    [Carry() for _ in read], eng.order)
        for (path, chunk, state), res in zip(read, results, strict=True):
            self.done[path] = Prefetched(chunk, state, res)


def collapse_facts(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """Merge per-chunk instance facts into one row per (router key, instance number)."""
    frames = [f for f in frames if f.height]
    if not frames:
        return pl.DataFrame()
    df = pl.concat(frames, how="diagonal_relaxed")
    agg = []
    for c in df.columns:
        if c in ("ikey", "instance_no"):
            continue
        if c in ("line_first", "crash_line"):
            agg.append(pl.col(c).min())
        elif c == "crashed":
            agg.append(pl.col(c).any())
        elif c in ("line_last", "max_slot", "slots_seen"):
            agg.append(pl.col(c).max())
        elif c in ("n_abs", "n_elapsed"):
            agg.append(pl.col(c).sum())
        else:
            agg.append(pl.col(c).drop_nulls().first())
    return df.group_by("ikey", "instance_no", maintain_order=True).agg(agg).sort("ikey", "instance_no")


def _dumped_runs(ing: Ingestor) -> list[str]:
    """The runs a /metrics dump was read into by this ingest."""
    fids = [file_id_of(Path(f.path)) for f in ing.result.files if f.kind == "server:metrics" and f.status == "ingested"]
    return sorted({str(ing.files_meta[fid].get("run")) for fid in fids if fid in ing.files_meta})


def replay_sidefiles() -> Any:
    """forensics.replay.sidefiles: what a run folder holds besides logs and records (imported when needed)."""
    from forensics.replay import sidefiles

    return sidefiles


def check_tz(tz: str) -> str:
    """``tz`` if it is a time zone polars knows (IANA names such as Europe/Berlin, or UTC)."""
    try:
        pl.Series([datetime(2026, 1, 1)]).dt.replace_time_zone(tz)
    except pl.exceptions.PolarsError as exc:  # ComputeError for an unknown zone
        raise InputError(f"unknown time zone {tz!r}", hint="use an IANA name such as Europe/Berlin, or UTC") from exc
    return tz


def ingest(store_path: Path, paths: list[Path], options: IngestOptions | None = None, *,
           progress: Callable[[Progress], None] | None = None, on_wait: Callable[[], None] | None = None,
           ) -> IngestResult:
    """Ingest files and folders into the store at ``store_path`` (created if missing), read as ``options``
    say (the defaults: runs from the folders, formats detected, UTC)."""
    options = options or IngestOptions()
    mapping, keep_going = options.mapping, options.keep_going
    files, hidden, found = discover_stat(paths)
    real = _real_paths(files, found)
    inside = str(store_path.resolve()).rstrip(os.sep) + os.sep
    files = [(f, r) for f, r in files if not (real[f] + os.sep).startswith(inside)]  # the store itself
    left_out = [f for f, r in files if replay_sidefiles().excluded(f, r, options.exclude)] if options.exclude else []
    files = [(f, r) for f, r in files if f not in left_out]
    if not files:
        raise InputError(f"no files to read under {', '.join(str(p) for p in paths)}",
                         hint="pass the log files or the folders that hold them")
    loaded = None
    if mapping is not None:  # a bad mapping fails before anything is read
        from forensics import replay

        loaded = replay.load_mapping(mapping)
        mapping = str(Path(mapping).resolve()) if Path(mapping).exists() else mapping
    if user_dirs():  # so does a formats folder of the user's that does not load, or whose samples read otherwise
        check_user_samples()
    store = Store(store_path, create=True)
    with store.lock(on_wait=on_wait):
        ing = Ingestor(store, replace(options, mapping=mapping), progress)
        ing.loaded_mapping = loaded
        same = _unchanged_in_bulk(ing, files, found, real)
        rest = set(_skip_duplicates(ing, [fr for fr in files if fr[0] not in same]) if len(same) < len(files) else [])
        files = [fr for fr in files if fr[0] in same or fr in rest]
        # a folder of many run folders: their small parts go straight into packs (``forensics.packing``)
        ing.txn.pack_small = len(files) >= PACK_FROM
        if hidden:
            ing.result.warnings.append(f"skipped {len(hidden)} hidden file{'s' if len(hidden) > 1 else ''} "
                                       f"(e.g. {hidden[0]}); name a file to read it")
        if left_out:
            ing.result.warnings.append(f"left out {len(left_out)} file{'s' if len(left_out) > 1 else ''} by --exclude "
                                       f"(e.g. {left_out[0]})")
        _ingest_each(ing, files, same)
        ing.requeue_unchanged()
        if ing.records or ing.dropped_records:
            wanted, ing.keep_going = ing.keep_going, True  # a bad record file is reported, the others load
            try:
                _ingest_records(ing, store)
            finally:
                ing.keep_going = wanted
        passed = replay_sidefiles().skipped_line(ing.result.files)
        if passed:
            ing.result.warnings.append(passed)
        changed = any(f.status in {"ingested", "appended", "replaced"} for f in ing.result.files)
        touched = _join_touched(ing.txn)
        if touched:  # the runs whose join inputs changed: the join after this commit redoes theirs
            ing.txn.meta_updates["join_pending"] = _pending(store.meta("join_pending"), touched)
        if changed or ing.txn.staged or any(ing.txn.adds.values()) or ing.txn.removes or ing.txn.meta_updates or \
                ing.files_meta != (store.meta("files", {}) or {}):
            ing.txn.meta_updates["files"] = ing.files_meta
            ing.txn.commit()
        else:  # nothing changed: the store stays as it is, not even its manifest is written again
            ing.txn.flush()
        ing.result.unknown_shapes = ing.unknown.most_common(10)
        _finish_join(store, ing)
        ing.result.warnings.extend(replay_sidefiles().counter_notes(store, _dumped_runs(ing)))
        ing.result.compacted = _compact_when_many(store)
        if ing.result.errors and (not keep_going or ing.result.bugs or ing.result.mapping_failed):
            raise FilesNotRead(ing.result)
    return ing.result


def _real_paths(files: list[tuple[Path, Path | None]], found: dict[Path, Found]) -> dict[Path, str]:
    """Each file's resolved path: a file found in a folder (not a link) is the resolved folder joined with its
    parts below it, without a system call of its own."""
    roots: dict[Path, str] = {}
    out: dict[Path, str] = {}
    for f, root in files:
        hit = found.get(f)
        if hit is None or root is None or hit[2]:
            out[f] = str(resolved(f))
            continue
        if root not in roots:
            roots[root] = str(resolved(root))
        out[f] = os.path.join(roots[root], *hit[0])
    return out


Unchanged = tuple[dict[str, Any], str, int]  # a file as stored: its stored entry, run, size


def _unchanged_in_bulk(ing: Ingestor, files: list[tuple[Path, Path | None]], found: dict[Path, Found],
                       real: dict[Path, str]) -> dict[Path, Unchanged]:
    """The files as the last ingest left them (found in a folder with the size, modification time, run and time
    zone their stored entries record, read the way this ingest would read them) in runs whose every file is:
    each with its entry, from the folders' listings in one pass, no file opened or stat'ed again.  The other
    files, and every file of a run with one of them, go the whole way (moved files, duplicates, prefetch, each
    file's own check)."""
    out: dict[Path, Unchanged] = {}
    other: set[str | None] = set()  # runs with a file that is not as stored (None: a file outside a folder)
    metas, forced = ing.files_meta, ing.forced.name if ing.forced else None
    for f, root in files:
        hit = found.get(f)
        if hit is None or root is None or hit[2]:  # a file named, or a link: its run is worked out on its own
            other.add(run_of(f, ing.run, root))
            continue
        rel, st, _ = hit
        run = ing.run or (rel[-2] if len(rel) > 1 else Path(real[f]).parent.name)
        m = metas.get(hashlib.sha1(real[f].encode()).hexdigest()[:16])  # its file id (``paths.file_id_of``)
        if m is None or m.get("size_bytes") != st.st_size or m.get("mtime") != st.st_mtime or m.get("run") != run \
                or m.get("tz", "UTC") != ing.tz or (forced is not None and m.get("format") != forced) \
                or (ing.mapping is not None and str(m.get("format")).startswith("records")):
            other.add(run)
            continue
        out[f] = (m, run, st.st_size)
    return {f: u for f, u in out.items() if u[1] not in other}


def _ingest_each(ing: Ingestor, files: list[tuple[Path, Path | None]], same: dict[Path, Unchanged]) -> None:
    """Read the log files one by one, each in a savepoint: a file that fails is undone and reported, and the
    others still load.  The files of ``same`` are reported unchanged as ``Ingestor.ingest_file`` would."""
    sizes = [same[f][2] if f in same else f.stat().st_size for f, _ in files]
    total = sum(sizes)
    ing.prefetch = Prefetch(ing, [fr for fr in files if fr[0] not in same])
    ing.at = Progress(files_total=len(files), bytes_total=total)
    done = [0]
    for k, ((path, root), upto) in enumerate(zip(files, itertools.accumulate(sizes), strict=True)):
        if path in same:  # no requests to count: the progress is told once at the end of a stretch of them
            _report_unchanged(ing, path, *same[path])
            done[0], ing.at.files_done, ing._reported = max(done[0], upto), ing.at.files_done + 1, len(ing.result.files)
            if k + 1 == len(files) or files[k + 1][0] not in same:
                ing.tick(done[0])
            continue
        ing.tick(done[0])
        _ingest_one(ing, path, root, done)
        done[0] = max(done[0], upto)  # a file read in part (skipped, failed, cut) is done all the same
        ing.tick(done[0], file_done=True)


def _report_unchanged(ing: Ingestor, path: Path, meta: dict[str, Any], run: str, size: int) -> None:
    ing.result.files.append(FileReport(str(path), str(meta.get("format")), "unchanged"))
    if str(meta.get("format")).startswith("records:"):  # read again if another file of its run changed
        ing._requeue_records(path, FileState(format=meta.get("format"), mapping=meta.get("mapping")), run)


def _ingest_one(ing: Ingestor, path: Path, root: Path | None, done: list[int]) -> None:
    point = ing.txn.savepoint()
    meta_before = ing.files_meta.get(file_id_of(path))
    try:
        with bug_boundary(path=str(path)):
            ing.ingest_file(path, root, done)
    except ForensicsError as exc:
        if isinstance(exc, InternalError):
            exc.line = exc.line or ing.at_line
            ing.result.bugs += 1
            if os.environ.get("FORENSICS_DEBUG"):  # --debug: the traceback of each file's bug
                traceback.print_exception(exc.__cause__ or exc)
        # the other files still load: undo this file's partial work and go on
        ing.txn.rollback_to(point)
        if meta_before is None:
            ing.files_meta.pop(file_id_of(path), None)
        else:
            ing.files_meta[file_id_of(path)] = meta_before
        ing.result.errors.append(exc.one_line())
        ing.result.files.append(FileReport(str(path), "?", "error", message=exc.one_line()))


def _compact_when_many(store: Store) -> str:
    """Pack the store's part files once there are many of them: each ingest adds a few per run, and a store of
    thousands of runs would open tens of thousands of files per query (``forensics.compact``)."""
    from forensics import compact

    if compact.own_files(store) <= compact.AUTO_PARTS:
        return ""
    return compact.compact_locked(store).line()


class FilesNotRead(InputError):
    """Some files could not be read; the others were ingested (``result`` says which is which)."""

    def __init__(self, result: IngestResult) -> None:
        self.result = result
        n = len(result.errors)
        if result.bugs:
            self.exit_code = ExitCode.INTERNAL
            super().__init__(f"{n} file{'s' if n > 1 else ''} could not be read, {result.bugs} of them because of "
                             "a bug; the others were ingested", hint=BUG_HINT)
            return
        if result.mapping_failed:
            super().__init__(result.mapping_failed, hint="see the errors above; the other files were ingested")
            return
        super().__init__(f"{n} file{'s' if n > 1 else ''} could not be read; the others were ingested",
                         hint="fix or remove them, or pass --keep-going to accept this")


def _skip_duplicates(ing: Ingestor, files: list[tuple[Path, Path | None]]) -> list[tuple[Path, Path | None]]:
    """Leave out the files whose content another file of the same run repeats (``forensics.duplicates``),
    saying which file each repeats; a stored file that a longer newcomer repeats has its rows dropped."""
    from forensics import duplicates

    new = {resolved(f) for f, _ in files}
    runs = {f: run_of(f, ing.run, root) for f, root in files}
    _forget_moved(ing, files, runs)
    in_store = {fid for fid, m in ing.files_meta.items() if m.get("format") not in ("duplicate", "empty", None)}
    # a run whose files are all as the last ingest left them has nothing new to compare
    wanted = {runs[f] for f, _ in files if not _as_stored(ing, f, runs[f])}
    cands = [duplicates.Candidate(f, runs[f], file_id_of(f) in in_store) for f, _ in files if runs[f] in wanted]
    cands += [duplicates.Candidate(p, str(m["run"]), True) for fid, m in ing.files_meta.items()
              if fid in in_store and m.get("run") in wanted and (p := _stored_path(m)) is not None
              and resolved(p) not in new]
    dups = {d.path: d for d in duplicates.find(cands)}
    for d in dups.values():
        ing.result.files.append(FileReport(str(d.path), "duplicate", "duplicate", message=d.describe()))
        fid = file_id_of(d.path)
        if fid in in_store:  # its rows are in the store: they go, the file it repeats is read instead
            ing._drop_file_parts(fid)
            if str(ing.files_meta[fid].get("format", "")).startswith("records"):
                ing.dropped_records.append(str(ing.files_meta[fid].get("path")))
        meta = dict(ing.files_meta.get(fid) or {"path": str(d.path), "file_id": fid, "run": runs.get(d.path)})
        ing.files_meta[fid] = {**meta, "format": "duplicate", "duplicate_of": str(d.of)}
    return [(f, root) for f, root in files if f not in dups]


def _as_stored(ing: Ingestor, path: Path, run: str) -> bool:
    """The file is in the store under this run with the size and modification time it has now."""
    meta = ing.files_meta.get(file_id_of(path))
    if meta is None or meta.get("run") != run:
        return False
    try:
        st = path.stat()
    except OSError:
        return False
    return meta.get("size_bytes") == st.st_size and meta.get("mtime") == st.st_mtime


def _forget_moved(ing: Ingestor, files: list[tuple[Path, Path | None]], runs: dict[Path, str]) -> None:
    """A stored file whose path is gone, and a newcomer of the same run with its size and first 4 KB, are one
    file moved (a run folder archived or renamed): its old rows go and it is read from its new place, so that
    moving a folder never doubles its requests."""
    gone: dict[tuple[str, int, str], str] = {}
    for fid, m in ing.files_meta.items():
        if m.get("format") in ("duplicate", "empty", None) or not m.get("head_sha256"):
            continue
        if not Path(str(m.get("path", ""))).exists():
            gone[(str(m.get("run")), int(m.get("size_bytes") or -1), str(m["head_sha256"]))] = fid
    if not gone:
        return
    moved: list[tuple[str, Path]] = []
    for f, _ in files:
        if file_id_of(f) in ing.files_meta:
            continue
        key = (runs[f], f.stat().st_size, hashlib.sha256(read_head(f, 4096)).hexdigest())
        old = gone.pop(key, None)
        if old is not None:
            moved.append((str(ing.files_meta[old].get("path")), f))
            ing._drop_file_parts(old)
            if str(ing.files_meta[old].get("format", "")).startswith("records"):
                ing.dropped_records.append(str(ing.files_meta[old].get("path")))
            del ing.files_meta[old]
    if moved:
        n = len(moved)
        ing.result.warnings.append(f"{n} file{'s were' if n > 1 else ' was'} moved since read (e.g. {moved[0][0]} -> "
                                   f"{moved[0][1]}): read again from the new place, the old rows replaced")


def _stored_path(meta: dict[str, Any]) -> Path | None:
    """The file a stored entry was read from, if it is still there unchanged."""
    p = Path(str(meta.get("path", "")))
    try:
        st = p.stat()
    except OSError:
        return None
    return p if st.st_size == meta.get("size_bytes") and st.st_mtime == meta.get("mtime") else None


def _join_touched(txn: Any) -> set[str]:
    """The runs (store partitions) whose join inputs a transaction changes."""
    from forensics.replay.scope import JOIN_TABLES

    return {r for t in JOIN_TABLES for rel in [*txn.adds.get(t, []), *txn.removes.get(t, set())]
            if (r := run_of_part(rel)) is not None}


def _pending(before: Any, touched: set[str]) -> Any:
    """``join_pending``: the runs whose join is still to be done (True: every run, as stores before the join was
    scoped recorded it)."""
    if before is True:
        return True
    return sorted(set(before or []) | touched)


def _finish_join(store: Store, ing: Ingestor) -> None:
    """The join runs as a second commit; a crash between the two leaves join_pending set, so the next
    ingest (even of unchanged files) completes it.  A store joined by older rules is joined again whole."""
    from forensics.replay.scope import JOIN_VERSION

    pending = store.meta("join_pending")
    older = store.meta("join_version") != JOIN_VERSION  # joined by other rules (or never): joined again whole
    if not pending and not older:
        return
    if store.parts("attempts"):  # no parts: no rows, and no DuckDB to load
        whole = pending is True or older or not store.meta("join_stored")
        ing.result.warnings.extend(_join_runs(store, None if whole else set(pending)))
    else:
        txn = store.transaction()
        txn.meta_updates.update(join_pending=None, join_stored=True, join_version=JOIN_VERSION)
        txn.commit()


def _ingest_records(ing: Ingestor, store: Store) -> None:
    """Hand replay-record files to forensics.replay, then account for them in the ``files`` table (a file
    that could not be read is not recorded: the next ingest reads it again)."""
    from forensics import replay

    replay.ingest_into(ing, store)
    reports = {f.path: f for f in ing.result.files if f.kind.startswith("records:") or f.status == "error"}
    for path, _kind, run, mapping in ing.records:
        rep = reports.get(str(path))
        if rep is None or rep.status in ("error", "skipped"):
            continue
        stat = path.stat()
        found = FileState.found(path, file_id_of(path), run, stat, hashlib.sha256(read_head(path, 4096)).hexdigest())
        ing._record_file(replace(found, format=rep.kind, bytes_read=stat.st_size, lines_total=rep.parsed + rep.unparsed,
                                 lines_parsed=rep.parsed, lines_unparsed=rep.unparsed, mapping=mapping))


def _join_runs(store: Store, touched: set[str] | None) -> list[str]:
    """Match replay attempts to server requests for the runs ``touched`` and every run that shares a server log
    with them (``replay.scope.component``; None: every run), and store the result: their ``matches`` and their
    logs' requests, with the times the join placed.  Other runs' parts are not touched (packs stay packs)."""
    from forensics.replay import scope
    from forensics.replay.join import join_runs

    runs = scope.store_runs(store) if touched is None else scope.component(store, touched)
    txn = store.transaction()
    txn.pack_small = len(runs) >= PACK_FROM
    txn.meta_updates.update(join_pending=None, join_stored=True, join_version=scope.JOIN_VERSION)
    old_matches = [p for p in store.parts("matches") if run_of_part(p) in runs]
    if not old_matches and not any(run_of_part(p) in runs for p in store.parts("attempts")):
        txn.commit()  # no records among these runs, now or before: their requests are as read
        return []
    res, fids = join_runs(store, runs)
    txn.remove("matches", old_matches)
    for (run,), part in res.matches.group_by("run", maintain_order=True):
        txn.write("matches", schema.conform(part, "matches"), run=str(run), name="join")
    txn.remove("requests", [p for p in store.parts("requests") if run_of_part(p) in runs])
    joined = res.requests.with_columns(pl.coalesce("replay_run", "run").alias("run"))
    for (path, run), sub in joined.group_by("path", "run", maintain_order=True):
        fid = fids.get(str(path)) or file_id_of(Path(str(path)))
        txn.write("requests", schema.conform(sub, "requests"), run=str(run), name=f"{fid}-req-joined")
    txn.commit()
    counts = res.counts()
    return [*res.notes, f"join: {counts.get('matched', 0)} attempts matched, {counts.get('ambiguous', 0)} ambiguous, "
            f"{counts.get('unmatched', 0)} unmatched"]


def parse_time(text: str) -> datetime:
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InputError(f"--started-at {text!r} is not an ISO-8601 time",
                         hint="use e.g. 2026-11-29T15:26:07Z") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc)

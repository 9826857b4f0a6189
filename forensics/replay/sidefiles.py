"""What else a run folder holds: llama-server's own dumps, read; everything else, passed over and counted.

A harness leaves more than logs and records in a run folder: a Prometheus ``/metrics`` dump taken at the end
of the run (``metrics_end.prom``), a ``/slots`` dump (``slots.json``), the truth it was told (``labels.json``),
configs, result JSONs of other tools.  Ingest reads the two server dumps into ``server_metrics`` (the server's
counters and gauges when the dump was taken) and ``slot_states`` (each slot's state then), and passes over
every other file it finds in a folder (JSON, CSV, YAML, binary, text without a llama-server line: command lines,
load notes) with one line counting them and naming a few; ``-v`` lists each with what it is.  A file named on
the command line that nothing reads is still an error: the user asked for it.  ``--exclude GLOB`` leaves files
out.

Recognised by content, never by name: a dump is Prometheus text exposition whose samples parse (at least one
``llamacpp:`` metric), or a JSON array of slot objects (``id`` and ``n_ctx``, with ``id_task``, ``state``,
``is_processing``, ``params`` or ``next_token``) as the server's ``/slots`` returns in every era.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import regex

from forensics import schema
from forensics.replay.records import read_text

MAX_DUMP_BYTES = 16 * 1024 * 1024  # a dump is small; a larger file is not read whole to tell
DATA_SUFFIXES = {".json", ".jsonl", ".ndjson", ".csv", ".tsv", ".yaml", ".yml", ".parquet", ".db", ".sqlite",
                 ".npy", ".npz", ".pkl", ".pickle", ".xlsx", ".html", ".png", ".jpg", ".svg", ".pdf"}
SLOT_KEYS = ("id_task", "state", "is_processing", "params", "next_token")
NAME_WORDS = {"metrics", "metric", "slots", "slot", "prom", "prometheus", "dump", "end", "start", "final", "before",
              "after", "server", "json", "txt"}


class DumpError(ValueError):
    """A file that looked like a dump but is not one after all."""


@dataclass(frozen=True)
class Dump:
    """A server dump read from one file: its kind (``metrics`` or ``slots``), the rows for its table and what
    the ingest line says of it."""

    kind: str
    rows: pl.DataFrame
    message: str

    @property
    def table(self) -> str:
        return "server_metrics" if self.kind == "metrics" else "slot_states"


def excluded(path: Path, root: Path | None, globs: Sequence[str]) -> bool:
    """``path`` matches an ``--exclude`` glob: by its name, or by its path below the folder it was found in."""
    if not globs:
        return False
    rel = path.name
    if root is not None:
        try:
            rel = path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            rel = path.name
    return any(fnmatch.fnmatch(path.name, g) or fnmatch.fnmatch(rel, g) for g in globs)


def read_dump(path: Path, run: str) -> Dump | None:
    """The server dump in ``path``, or None when the file is no dump (nothing raised for that)."""
    try:
        if path.stat().st_size > MAX_DUMP_BYTES:
            return None
        text = read_text(path)
    except (OSError, ValueError):
        return None
    server, taken = server_of(path.name)
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped.startswith("["):
        return _slots(stripped, path, run, server, taken)
    return _metrics(text, path, run, server, taken)


def is_dump(path: Path) -> bool:
    """Whether ``path`` looks like llama-server's own dump by its first bytes (a ``llamacpp:`` sample, or a JSON
    array of slot objects): told before any mapping sees the file."""
    head = _head(path).decode("utf-8", errors="replace")
    start = head.lstrip("\ufeff \t\r\n")
    if start.startswith("["):
        return '"n_ctx"' in head and '"id"' in head
    return any(regex.match(r"(?:#\s*(?:HELP|TYPE)\s+)?llamacpp:", line) for line in head.splitlines()[:50])


def server_of(name: str) -> tuple[str | None, str | None]:
    """The server a dump's file name names (``metrics_main.prom`` -> main) and when it was taken (``end`` in
    ``metrics_end.prom``); None for what the name does not say."""
    words = [w for w in regex.split(r"[^A-Za-z0-9]+", name.lower()) if w]
    taken = next((w for w in words if w in ("start", "end", "final", "before", "after")), None)
    rest = [w for w in words if w not in NAME_WORDS and not w.isdigit()]
    return (rest[0] if len(rest) == 1 else None), {"final": "end", "after": "end", "before": "start"}.get(
        taken or "", taken)


def is_data_file(path: Path, head: bytes) -> bool:
    """A file of data, not text lines: by its extension, a JSON document at its start, or bytes no text has."""
    if path.suffix.lower() in DATA_SUFFIXES:
        return True
    if b"\x00" in head[:4096]:
        return True
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    return start in (b"{", b"[")


# ---------------------------------------------------------------------------------------------- /metrics
def parse_metrics(text: str) -> list[dict[str, Any]]:
    """The samples of a Prometheus text exposition (read by ``prometheus_client``'s parser), each with its name as
    the text writes it, its labels (JSON, keys sorted; None without labels), its family's type (None when no
    ``# TYPE`` line gives one) and help, and its line in the text; raises DumpError naming the first line the
    parser refuses."""
    from prometheus_client.parser import text_string_to_metric_families  # 50 ms: loaded when a dump is read

    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        raise DumpError(_bad_line(text)) from None
    # the parser reads the text line by line (split at \n only) and gives one sample per line that is neither
    # blank nor a comment, in the text's order
    lines = [(n, raw.strip()) for n, raw in enumerate(text.split("\n"), start=1)
             if raw.strip() and not raw.strip().startswith("#")]
    found = [(family, s) for family in families for s in family.samples]
    samples: list[dict[str, Any]] = []
    for (family, s), (n, line) in zip(found, lines, strict=True):
        # a counter whose name lacks _total gets one from the parser (OpenMetrics naming): keep the text's name
        name = family.name if family.type == "counter" and not line.startswith(s.name) else s.name
        samples.append({"name": name, "labels": json.dumps(s.labels, sort_keys=True) if s.labels else None,
                        "value": float(s.value),
                        "sample_ts": None if s.timestamp is None else round(float(s.timestamp) * 1000),
                        "line": n, "type": None if family.type in ("unknown", "untyped") else family.type,
                        "help": family.documentation or None})
    return samples


def _bad_line(text: str) -> str:
    """What is wrong with a text the parser refused: its first line that does not parse alone."""
    from prometheus_client.parser import text_string_to_metric_families

    for n, raw in enumerate(text.split("\n"), start=1):
        try:
            list(text_string_to_metric_families(raw + "\n"))
        except ValueError:
            what = "TYPE or HELP line" if raw.strip().startswith("#") else "sample"
            return f"line {n} is not a Prometheus {what}: {raw.strip()[:80]!r}"
    return "not a Prometheus text exposition"


def _metrics(text: str, path: Path, run: str, server: str | None, taken: str | None) -> Dump | None:
    try:
        samples = parse_metrics(text)
    except DumpError:
        return None
    if not samples or not any(s["name"].startswith("llamacpp:") for s in samples):
        return None
    rows = pl.DataFrame(samples, schema_overrides={"labels": pl.String, "sample_ts": pl.Int64, "type": pl.String,
                                                   "help": pl.String}, infer_schema_length=None)
    rows = rows.with_columns(pl.lit(run).alias("run"), pl.lit(str(path)).alias("path"), pl.lit(server).alias("server"),
                             pl.lit(taken).alias("taken"))
    values = dict(zip(rows["name"].to_list(), rows["value"].to_list(), strict=True))
    shown = [f"{k.removeprefix('llamacpp:')}={values[k]:g}" for k in ("llamacpp:prompt_tokens_total",
                                                                     "llamacpp:tokens_predicted_total",
                                                                     "llamacpp:requests_processing") if k in values]
    message = f"{len(samples)} sample{'s' if len(samples) > 1 else ''}" + (f": {', '.join(shown)}" if shown else "")
    return Dump("metrics", schema.conform(rows, "server_metrics"), message)


# ---------------------------------------------------------------------------------------------- /slots
def _slots(text: str, path: Path, run: str, server: str | None, taken: str | None) -> Dump | None:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(doc, list) or not doc or not all(_is_slot(s) for s in doc):
        return None
    rows = pl.DataFrame([_slot_row(s) for s in doc], infer_schema_length=None)
    rows = rows.with_columns(pl.lit(run).alias("run"), pl.lit(str(path)).alias("path"), pl.lit(server).alias("server"),
                             pl.lit(taken).alias("taken"))
    busy = int(rows["is_processing"].fill_null(False).sum())
    message = f"{len(doc)} slot{'s' if len(doc) > 1 else ''}, {busy} processing"
    return Dump("slots", schema.conform(rows, "slot_states"), message)


def _is_slot(obj: Any) -> bool:
    return isinstance(obj, dict) and "id" in obj and "n_ctx" in obj and any(k in obj for k in SLOT_KEYS)


def _slot_row(s: dict[str, Any]) -> dict[str, Any]:
    """One slot in every era's shape: ``state`` (2024) or ``is_processing``; ``next_token`` an object or (2026) a
    list of them; the cap in ``params.n_predict`` (2025+) or ``n_predict`` (2024)."""
    nxt = s.get("next_token")
    nxt = (nxt[0] if nxt else {}) if isinstance(nxt, list) else (nxt or {})
    params: dict[str, Any] = s["params"] if isinstance(s.get("params"), dict) else {}
    busy = s.get("is_processing")
    if busy is None and s.get("state") is not None:
        busy = s.get("state") == 1
    cap = params.get("n_predict", s.get("n_predict"))
    return {"slot": _int(s.get("id")), "id_task": _int(s.get("id_task")), "n_ctx": _int(s.get("n_ctx")),
            "is_processing": bool(busy) if busy is not None else None,
            "n_prompt_tokens": _int(s.get("n_prompt_tokens")),
            "n_prompt_tokens_processed": _int(s.get("n_prompt_tokens_processed")),
            "n_prompt_tokens_cache": _int(s.get("n_prompt_tokens_cache")),
            "n_decoded": _int(nxt.get("n_decoded")), "n_remain": _int(nxt.get("n_remain")),
            "has_next_token": nxt.get("has_next_token"), "n_predict": _int(cap),
            "max_tokens": _int(params.get("max_tokens", s.get("max_tokens"))),
            "prompt_chars": len(s["prompt"]) if isinstance(s.get("prompt"), str) else None,
            "generated_chars": len(s["generated"]) if isinstance(s.get("generated"), str) else None,
            "raw": json.dumps({k: v for k, v in s.items() if k not in ("prompt", "generated")}, sort_keys=True)}


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# ---------------------------------------------------------------------------------------------- ingest
def take(ing: Any, path: Path, root: Path | None, found: Any) -> bool:
    """Hook for ``forensics ingest`` on a file that is neither a log nor records: read a server dump into its
    table, pass over another data file found in a folder (counted), and return whether the file was dealt
    with (False: the caller reports it as unknown)."""
    from forensics.ingest import FileReport

    dump = read_dump(path, str(found.run))
    if dump is not None:
        ing._drop_file_parts(found.file_id)
        ing.txn.write(dump.table, dump.rows, run=str(found.run), name=f"{found.file_id}-{dump.kind}")
        ing.result.files.append(FileReport(str(path), f"server:{dump.kind}", "ingested", lines=dump.rows.height,
                                           parsed=dump.rows.height, message=dump.message))
        ing._record_file(_state(found, f"server:{dump.kind}", dump.rows.height))
        return True
    doubt = ""
    if ing.loaded_mapping is None:  # no --mapping: a harness's records that mapping init reads with certainty
        from forensics.replay.autoread import proposed_reader

        mapping, doubt = proposed_reader(path, ing.store.root)
        if mapping is not None:
            ing.result.warnings.append(f"records: {path} read with a proposed mapping (`forensics mapping init "
                                       f"{path}` shows it)")
            ing._queue_records(path, "mapped", str(found.run), mapping)
            return True
    if root is None:  # named on the command line: the user asked for it, so it is an error
        return False
    kind = "data" if is_data_file(path, _head(path)) else "text without llama-server lines"
    hint = records_hint(path, doubt)
    ing.result.files.append(FileReport(str(path), "other", "skipped", message=f"{OTHER} ({kind})" + (
        f"; {hint}" if hint else "")))
    if hint:
        ing.result.warnings.append(f"{path}: {hint}")
    return True


def records_hint(path: Path, doubt: str = "") -> str:
    """For a file that looks like a harness's per-request records (JSON lines, CSV or a JSON list whose records
    have fields of the attempt schema), the sentence that says how to read it (and, when ingest tried the
    proposal, why it did not read the file with it); "" otherwise."""
    from forensics.replay.recordlike import looks_like_records

    fields = looks_like_records(path)
    if not fields:
        return ""
    why = f" (not read with it: {doubt})" if doubt else ""
    return (f"looks like a harness's per-request records ({', '.join(fields[:5])}): "
            f"`forensics mapping init {path}` proposes a mapping for it{why} (then ingest with --mapping)")


OTHER = "not a log, replay records or a server dump: passed over"


def skipped_line(files: Sequence[Any]) -> str | None:
    """The one line counting the files of run folders that were passed over (None when there were none)."""
    passed = [f.path for f in files if f.status == "skipped" and f.kind == "other"]  # notes (.md) go unsaid
    if not passed:
        return None
    names = ", ".join(Path(p).name for p in passed[:3]) + (", ..." if len(passed) > 3 else "")
    n = len(passed)
    return (f"passed over {n} file{'s' if n > 1 else ''} of the run folders: not a log, replay records (or a file "
            f"the mapping reads) or a server dump ({names}); -v says why for each, --format NAME reads a log of a "
            "format not detected, --exclude GLOB leaves files out")


def _head(path: Path) -> bytes:
    try:
        with path.open("rb") as fh:
            return fh.read(4096)
    except OSError:
        return b""


def _state(found: Any, fmt: str, rows: int) -> Any:
    import dataclasses

    return dataclasses.replace(found, format=fmt, bytes_read=found.size_bytes or 0, lines_total=rows,
                               lines_parsed=rows)


# ---------------------------------------------------------------------------------------------- counters
COUNTERS = {"llamacpp:prompt_tokens_total": ("prompt_eval_tokens", "prompt tokens evaluated"),
            "llamacpp:tokens_predicted_total": ("gen_tokens", "tokens generated")}


def counter_notes(store: Any, runs: Sequence[str]) -> list[str]:
    """For each of ``runs`` whose server dump (a /metrics text) can be tied to one log instance (the run has one,
    or the dump's file name names it): whether the server's own token counters agree with the requests the log
    shows.  Counters count from the server's start, so more on the server's side means requests the log does not
    show (a log cut short, requests from before the run)."""
    from forensics.store import fetch_pl

    if not runs:
        return []
    con = store.connect(tables=["server_metrics", "requests", "instances"])
    try:
        dumps = fetch_pl(con, "SELECT run, path, server, name, value FROM server_metrics WHERE run IN (SELECT unnest($r)) "
                              "AND name IN (SELECT unnest($n)) AND coalesce(taken, 'end') = 'end' AND labels IS NULL",
                         {"r": list(runs), "n": list(COUNTERS)})
        sums = fetch_pl(con, "SELECT run, instance, sum(prompt_eval_tokens) AS prompt_eval_tokens, "
                             "sum(gen_tokens) AS gen_tokens, count(*) AS requests FROM requests "
                             "WHERE run IN (SELECT unnest($r)) GROUP BY run, instance", {"r": list(runs)})
    finally:
        con.close()
    notes = []
    for (run, path, server), part in dumps.group_by(["run", "path", "server"], maintain_order=True):
        mine = sums.filter(pl.col("run") == run)
        if server is not None and mine.height > 1:
            mine = mine.filter(pl.col("instance") == server)
        if mine.height != 1:
            continue
        said = [_compare(name, value, mine.row(0, named=True)) for name, value in part.select("name", "value").rows()]
        agree = all(ok for ok, _ in said)
        notes.append(f"{Path(path).name}: the server's counters {'agree with' if agree else 'disagree with'} the "
                     f"{mine['requests'][0]} requests of its log ({'; '.join(text for _, text in said)})")
    return notes


def _compare(name: str, value: float, logged: dict[str, Any]) -> tuple[bool, str]:
    column, words = COUNTERS[name]
    log = int(logged[column] or 0)
    n = int(value)
    if n == log:
        return True, f"{n} {words}"
    if n > log:
        return False, f"{words}: {n} by the server, {log} in the log, {n - log} in requests the log does not show"
    return False, f"{words}: {n} by the server, {log} in the log: the log shows more than the server served"

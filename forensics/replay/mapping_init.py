"""``forensics mapping init SAMPLE``: propose a mapping from one sample record file, and check it on the sample.

The sample's records are found where they are (the lines of a JSONL or CSV file; the longest list of objects
in a JSON or YAML document; a JSON object of equal-length arrays, as vLLM writes, is read as parallel arrays).
Each canonical field is matched to the record's fields by name (``prompt_tokens``, ``ttft``, ``start_time``),
by unit (a ``_ms``/``_s``/``_ns`` suffix; an epoch's magnitude: seconds, milliseconds, nanoseconds; small
readings of a monotonic clock) and by shape (an object with ``prompt_n`` is llama-server's ``timings``; an error
field or a boolean success flag gives the outcome).  Fields it cannot place are listed as comments, so the user
sees what was left out.  The proposal is then loaded and applied to the sample, and what it read is reported.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forensics.errors import ForensicsError, InputError
from forensics.replay.mapping import get_path, load_mapping, read_data

# canonical field -> names a record's field may have (compared without case, "-" and "_", last path segment)
NAMES: dict[str, tuple[str, ...]] = {
    "item": ("request_id", "x_request_id", "requestid", "item", "ticker", "prompt_id", "id", "uid", "session_id"),
    "stage": ("stage", "step", "phase", "task"),
    "started_at": ("start_time", "started_at", "request_start_time", "request_start_ns", "request_start", "start",
                   "sent", "send_time", "t0", "timestamp", "start_ts", "begin", "start_times"),
    "ended_at": ("end_time", "ended_at", "request_end_time", "request_end_ns", "request_end", "end", "done",
                 "completed_time", "t1", "end_ts", "finish_time"),
    "latency_ms": ("latency", "e2e_latency", "request_latency", "end_to_end_latency", "e2el", "latency_ms",
                   "latency_s", "end_to_end_latency_s", "duration", "duration_ms", "elapsed", "query_latency"),
    "ttft_ms": ("ttft", "ttfts", "time_to_first_token", "ttft_ms", "ttft_s", "time_to_first_token_ms",
                "first_chunk_latency", "first_token_latency"),
    "itl_ms": ("itl", "itls", "inter_token_latency", "itl_ms", "inter_token_latency_ms", "inter_token_latency_s"),
    "tokens_evaluated": ("prompt_tokens", "input_tokens", "num_input_tokens", "number_input_tokens", "input_len",
                         "input_lens", "isl", "tokens_evaluated", "n_in", "input_sequence_length"),
    "tokens_predicted": ("completion_tokens", "output_tokens", "num_output_tokens", "number_output_tokens",
                         "output_len", "output_lens", "osl", "tokens_predicted", "n_out", "output_sequence_length"),
    "http_status": ("http_status", "status_code", "status", "http", "code", "error_code"),
    "error": ("error", "error_msg", "error_message", "errors", "exception"),
    "id_slot": ("id_slot", "slot", "slot_id"),
    "output_text": ("output", "generated_text", "generated_texts", "text", "content", "completion"),
    "max_tokens": ("max_tokens", "n_predict", "max_new_tokens"),
    "stop_type": ("stop_type", "finish_reason", "stop_reason"),
}
SUCCESS = ("success", "ok", "succeeded", "is_success")
TIME_FIELDS = ("started_at", "ended_at")
DURATION_FIELDS = ("latency_ms", "ttft_ms", "itl_ms")


@dataclass
class Proposal:
    """A proposed mapping (TOML text) and what it read from the sample it was made from."""

    text: str
    attempts: int = 0
    problems: list[str] = field(default_factory=list)
    placed: dict[str, str] = field(default_factory=dict)  # canonical field -> the sample's field


def propose(sample: Path) -> Proposal:
    """Propose a mapping for ``sample`` and check it on the sample (see the module docstring)."""
    if not sample.is_file():
        raise InputError("no such file", path=str(sample), hint="give a sample record file of the harness")
    fmt = _format(sample)
    records, path, layout = _records(sample, fmt)
    if not records:
        raise InputError("no records found in the sample (no lines, no list of objects)", path=str(sample),
                         hint="give a file the harness writes per request")
    fields = _fields(records[:50])
    placed, lines = _place(fields, _units(records[:50]))
    text = _toml(sample, fmt, (path, layout), lines, fields, placed)
    proposal = Proposal(text, placed=placed)
    _check(proposal, sample)
    return proposal


def _format(sample: Path) -> str:
    name = sample.name.lower().removesuffix(".gz").removesuffix(".zst")
    for ext, fmt in ((".jsonl", "jsonl"), (".ndjson", "jsonl"), (".csv", "csv"), (".yaml", "yaml"), (".yml", "yaml")):
        if name.endswith(ext):
            return fmt
    head = sample.read_text(encoding="utf-8", errors="replace")[:65536].lstrip("\ufeff \t\r\n")
    lines = [ln for ln in head.splitlines() if ln.strip()]
    if len(lines) > 1 and all(ln.lstrip().startswith("{") and ln.rstrip().endswith("}") for ln in lines[:-1]):
        return "jsonl"
    return "json" if head[:1] in "{[" else "csv"


def _records(sample: Path, fmt: str) -> tuple[list[dict[str, Any]], str, str]:
    """The sample's records, the section path to them and the layout."""
    with tempfile.TemporaryDirectory(prefix="forensics-init-") as tmp:
        probe = Path(tmp) / "probe.toml"
        probe.write_text(f'[mapping]\nformat = "{fmt}"\n[attempts.set]\noutcome = "ok"\n', encoding="utf-8")
        df = read_data(load_mapping(probe), sample)
    if df.line_records:
        return [r for r in df.docs[0] if isinstance(r, dict)], "", "records"
    doc = df.docs[0]
    arrays = _parallel(doc)
    if arrays:
        n = max(len(v) for v in arrays.values())
        return [{k: (v[i] if i < len(v) else None) for k, v in arrays.items()} for i in range(n)], "", \
            "parallel_arrays"
    best = max(_lists(doc, ""), key=lambda x: len(x[1]), default=("", []))
    return best[1], best[0], "records"


def _parallel(doc: Any) -> dict[str, list[Any]]:
    """Two or more equal-length lists of scalars (or of lists) at the top of an object: parallel arrays."""
    if not isinstance(doc, dict):
        return {}
    lists = {k: v for k, v in doc.items() if isinstance(v, list) and v and not isinstance(v[0], dict)}
    sizes = [len(v) for v in lists.values()]
    common = max(set(sizes), key=sizes.count, default=0)
    same = {k: v for k, v in lists.items() if len(v) == common}
    return same if len(same) >= 2 and common > 1 else {}


def _lists(node: Any, path: str, depth: int = 0) -> list[tuple[str, list[dict[str, Any]]]]:
    """Lists of objects in ``node`` (their path: ``*`` iterates a list on the way)."""
    found: list[tuple[str, list[dict[str, Any]]]] = []
    if isinstance(node, list) and node and all(isinstance(x, dict) for x in node[:20]):
        found.append((path, node))
        if depth < 3:
            for sub_path, sub in _lists(node[0], f"{path}.*" if path else "*", depth + 1):
                rows = [r for x in node for r in (get_path(x, sub_path.split("*.", 1)[-1]) or [])
                        if isinstance(r, dict)] if "*." in sub_path else sub
                found.append((sub_path, rows))
    elif isinstance(node, dict) and depth < 4:
        for k, v in node.items():
            found.extend(_lists(v, f"{path}.{k}" if path else str(k), depth + 1))
    return found


def _fields(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Dot path -> a sample value (the first non-null), objects flattened three levels deep."""
    out: dict[str, Any] = {}
    for rec in records:
        for path, value in _flatten(rec, "", 0):
            if out.get(path) is None:
                out[path] = value
    return out


def _units(records: list[dict[str, Any]]) -> dict[str, str]:
    """Path -> the unit a {value, unit} object states (AIPerf writes every metric so)."""
    out: dict[str, str] = {}

    def walk(node: Any, prefix: str, depth: int) -> None:
        if isinstance(node, dict) and "value" in node and isinstance(node.get("unit"), str):
            out.setdefault(f"{prefix}.value", node["unit"])
        elif isinstance(node, dict) and depth < 4:
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k), depth + 1)

    for rec in records:
        walk(rec, "", 0)
    return out


def _flatten(node: Any, prefix: str, depth: int) -> list[tuple[str, Any]]:
    if isinstance(node, dict) and "value" in node and set(node) <= {"value", "unit", "header"}:
        return [(f"{prefix}.value", node.get("value"))]  # AIPerf's {value, unit}: the unit rides on the name
    if isinstance(node, dict) and depth < 4 and node and not _is_timings(node):
        return [pair for k, v in node.items() for pair in _flatten(v, f"{prefix}.{k}" if prefix else str(k),
                                                                   depth + 1)]
    return [(prefix, node)]


def _is_timings(obj: Any) -> bool:
    return isinstance(obj, dict) and "prompt_n" in obj and "predicted_n" in obj


def _norm(name: str) -> str:
    """The field's own name: its last path segment (the one before ``.value`` in a {value, unit} object)."""
    parts = name.split(".")
    last = parts[-2] if len(parts) > 1 and parts[-1] == "value" else parts[-1]
    return re.sub(r"[-_\s]", "", last.lower())


def _place(fields: dict[str, Any], units: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Canonical field -> sample field, and the TOML lines of the fields section."""
    placed: dict[str, str] = {}
    lines: list[str] = []
    timings = next((p for p, v in fields.items() if _is_timings(v)), None)
    if timings:
        placed["timings"] = timings
        lines.append(f'timings = "{timings}"                      # llama-server\'s timings object')
    for canonical, names in NAMES.items():
        wanted = [_norm(n) for n in names]
        hits = sorted((wanted.index(_norm(p)), p.count("."), p) for p in fields
                      if _norm(p) in wanted and p not in placed.values())
        if not hits:
            continue
        path = hits[0][2]
        line = _line(canonical, path, fields[path], units.get(path))
        lines.append(line)
        if not line.startswith("#"):
            placed[canonical] = path
    if "outcome" not in placed:
        lines.append(_outcome(fields, placed))
    return placed, lines


def _line(canonical: str, path: str, value: Any, stated: str | None = None) -> str:
    if canonical in TIME_FIELDS:
        unit = _time_unit(path, value)
        return f'{canonical} = {{ path = "{path}", unit = "{unit}" }}' + ("   # a monotonic clock: give [attempts] an "
                                                                         "anchor" if unit.startswith("mono") else "")
    if canonical in DURATION_FIELDS:
        sql = f"list_avg({_q(path)})" if isinstance(value, list) else None
        head = f'sql = "{sql}"' if sql else f'path = "{path}"'
        unit = stated if stated in ("s", "ms", "us", "ns") else _duration_unit(path, value)
        return f'{canonical} = {{ {head}, unit = "{unit}" }}'
    if canonical == "http_status" and not isinstance(value, (int, float)):
        return f'# http_status: "{path}" holds {json.dumps(value)[:40]}, not a status number'
    return f'{canonical} = "{path}"'


def _q(path: str) -> str:
    return ".".join(f'\\"{p}\\"' if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) else p for p in path.split("."))


def _time_unit(path: str, value: Any) -> str:
    if isinstance(value, str):
        return "iso"
    v = abs(float(value or 0))
    low = path.lower()
    if low.endswith("_ns") or 1e17 < v < 1e19:
        return "epoch_ns" if v > 1e17 else "mono_ns"
    if low.endswith("_us") or 1e14 < v < 1e16:
        return "epoch_us"
    if low.endswith("_ms") or 1e11 < v < 1e13:
        return "epoch_ms"
    return "epoch_s" if 1e9 < v < 1e10 else "mono_s"


def _duration_unit(path: str, value: Any) -> str:
    low = path.lower()
    for suffix, unit in (("_ns", "ns"), ("_us", "us"), ("_ms", "ms"), ("_s", "s")):
        if low.endswith(suffix):
            return unit
    v = value[0] if isinstance(value, list) and value and not isinstance(value[0], list) else value
    try:
        return "s" if abs(float(v)) < 100 else "ms"
    except (TypeError, ValueError):
        return "ms"


def _outcome(fields: dict[str, Any], placed: dict[str, str]) -> str:
    flag = next((p for p in fields if _norm(p) in SUCCESS and isinstance(fields[p], bool)), None)
    if flag:
        return f"outcome = {{ sql = \"CASE WHEN {_q(flag)} THEN 'ok' ELSE 'failed' END\" }}"
    err = placed.get("error")
    status = placed.get("http_status")
    if err:
        return f"outcome = {{ sql = \"CASE WHEN coalesce(CAST({_q(err)} AS VARCHAR), '') IN ('', '[]') THEN 'ok' " \
               f"ELSE 'failed' END\" }}"
    if status:
        return f"outcome = {{ sql = \"CASE WHEN {_q(status)} < 400 THEN 'ok' ELSE 'failed' END\" }}"
    return '# outcome: no error, status or success field found; every record is set ok below'


def _toml(sample: Path, fmt: str, where: tuple[str, str], lines: list[str], fields: dict[str, Any],
          placed: dict[str, str]) -> str:
    """The proposal: [attempts] at ``where`` (path, layout), its field ``lines``, the unplaced fields as comments."""
    path, layout = where
    rest = [f for f in fields if f not in placed.values()]
    head = [f"# Proposed by `forensics mapping init {sample.name}`: check each field, then keep or change it.",
            "[mapping]", f'name = "{re.sub(r"[^A-Za-z0-9_-]+", "-", sample.stem)}"', f'format = "{fmt}"', "",
            "[attempts]", f'files = "{_glob(sample.name)}"']
    if path:
        head.append(f'path = "{path}"')
    if layout != "records":
        head.append(f'layout = "{layout}"')
    body = ["[attempts.fields]", *lines]
    sets = ["[attempts.set]", 'run_id = "{stem}"']
    if not any(line.startswith("stage ") for line in lines):
        sets.append('stage = "request"')
    if not any(line.startswith("outcome ") for line in lines):
        sets.append('outcome = "ok"')
    if not any(line.startswith("item ") for line in lines):
        body.append('item = "$index"                               # no request id found: the record number')
    unknown = [f"#   {p} = {json.dumps(fields[p], default=str)[:60]}" for p in rest[:40]]
    tail = ["", "# fields not placed (map them if they mean something above):", *unknown] if unknown else []
    return "\n".join([*head, "", *body, "", *sets, *tail]) + "\n"


def _glob(name: str) -> str:
    """A glob for files like the sample: its extension(s), with its name's own words when they look fixed."""
    m = re.match(r"^(.*?)(\.[A-Za-z]+(?:\.gz|\.zst)?)$", name)
    return f"*{m.group(2)}" if m else name


def _check(proposal: Proposal, sample: Path) -> None:
    from forensics import replay

    with tempfile.TemporaryDirectory(prefix="forensics-init-") as folder:
        tmp = Path(folder) / "proposed.toml"
        tmp.write_text(proposal.text, encoding="utf-8")
        try:
            recs = replay.load(sample, mapping=tmp)
        except ForensicsError as exc:
            proposal.problems.append(exc.one_line().replace(str(tmp), "the proposal"))
            return
    proposal.attempts = recs.attempts.height
    proposal.problems.extend(e.one_line() for e in recs.errors[:3])


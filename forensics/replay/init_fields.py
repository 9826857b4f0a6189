"""``mapping init``: which field of a sample's records is which canonical field, and in which unit.

A field is matched by its own name (the last segment of its path, without case, ``-`` and ``_``), ranked by
how surely that name means the canonical field; by unit (a ``_ms``/``_s``/``_ns`` suffix, the unit AIPerf
writes beside each value, an epoch's magnitude); and by what the other fields say (a duration without a unit
is in seconds when it equals end - start, and a time to first token is never longer than the request).

What is decided by a rule is *placed*; what rests on a weaker reading is placed and listed as a *guess* with
its reason; when two readings are equally plausible (two fields that both name the item, a duration whose unit
nothing tells), nothing is placed: a ``Choice`` lists both, and the user picks one (``--pick``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# canonical field -> names a record's field may have, surest first (compared as _norm does)
NAMES: dict[str, tuple[str, ...]] = {
    "run_id": ("run_id", "run_name", "runid", "benchmark_id"),
    "server": ("server", "server_name", "instance", "backend_name"),
    "item": ("item", "ticker", "symbol", "custom_id", "prompt_id", "question_id", "doc_id", "sample_id",
             "case_id", "request_id", "x_request_id", "requestid", "req_id", "uid", "uuid", "id", "id_",
             "session_id"),
    "stage": ("stage", "step", "phase", "task", "label"),
    "attempt": ("attempt", "attempt_no", "attempt_number", "try", "retry", "retries"),
    "started_at": ("started_at", "t_start", "start_time", "request_start_time", "request_start_ns", "request_start",
                   "start", "sent", "send_time", "t0", "timestamp", "start_ts", "begin", "start_times",
                   "timestamp_ns", "created", "created_at"),
    "ended_at": ("ended_at", "t_end", "end_time", "request_end_time", "request_end_ns", "request_end", "end", "done",
                 "completed_time", "t1", "end_ts", "finish_time", "finished_at"),
    "latency_ms": ("latency_ms", "latency_s", "e2e_latency", "request_latency", "end_to_end_latency",
                   "end_to_end_latency_s", "e2el", "response_time", "elapsed", "duration", "duration_ms",
                   "total_time", "latency", "query_latency"),
    "ttft_ms": ("ttft", "ttfts", "time_to_first_token", "ttft_ms", "ttft_s", "time_to_first_token_ms",
                "first_chunk_latency", "first_token_latency"),
    "itl_ms": ("itl", "itls", "inter_token_latency", "itl_ms", "inter_token_latency_ms", "inter_token_latency_s"),
    "tokens_evaluated": ("tokens_evaluated", "prompt_tokens", "input_tokens", "num_input_tokens",
                         "number_input_tokens", "input_len", "input_lens", "isl", "n_in", "input_sequence_length",
                         "prompt_eval_count", "num_prompt_tokens"),
    "tokens_predicted": ("tokens_predicted", "completion_tokens", "output_tokens", "num_output_tokens",
                         "number_output_tokens", "output_len", "output_lens", "osl", "n_out",
                         "output_sequence_length", "eval_count", "generated_tokens"),
    "http_status": ("http_status", "status_code", "http", "http_code", "response_code", "responsecode", "code",
                    "status"),
    "error": ("error", "error_msg", "error_message", "errors", "exception", "error_text", "failure_message",
              "failuremessage", "err"),
    "id_slot": ("id_slot", "slot", "slot_id"),
    "output_chars": ("output_chars", "response_chars"),
    "output_text": ("output_text", "output", "generated_text", "generated_texts", "response_string", "response_text",
                    "text", "content", "completion"),
    "max_tokens": ("max_tokens", "n_predict", "max_new_tokens", "max_completion_tokens", "max_output_tokens"),
    "stop_type": ("stop_type", "finish_reason", "stop_reason"),
    "truncated": ("truncated", "is_truncated"),
}
# names that say "the item" as the user means it, against names that only identify a request
ITEM_NAMES = NAMES["item"][:9]
TIME_FIELDS = ("started_at", "ended_at")
DURATION_FIELDS = ("latency_ms", "ttft_ms", "itl_ms")
NUMBER_FIELDS = ("attempt", "tokens_evaluated", "tokens_predicted", "id_slot", "max_tokens", "output_chars")


@dataclass(frozen=True)
class Sample:
    """The sample's fields: path -> its values in the first records, path -> the first non-null value, and
    path -> the unit a {value, unit} object states."""

    columns: dict[str, list[Any]]
    first: dict[str, Any]
    units: dict[str, str]

    @classmethod
    def of(cls, columns: dict[str, list[Any]], units: dict[str, str]) -> Sample:
        return cls(columns, {p: next((v for v in vs if v is not None), None) for p, vs in columns.items()}, units)


@dataclass
class Choice:
    """A field with two (or more) plausible readings: ``options`` are (label, TOML line), the reason why."""

    canonical: str
    options: list[tuple[str, str]]
    why: str


@dataclass
class Plan:
    """The fields section of a proposal: TOML lines, canonical -> sample path, guesses (with their reason)
    and the choices left to the user."""

    lines: list[str] = field(default_factory=list)
    placed: dict[str, str] = field(default_factory=dict)
    guesses: list[str] = field(default_factory=list)
    choices: list[Choice] = field(default_factory=list)
    used: list[str] = field(default_factory=list)  # fields read for no canonical field of their own

    def reads(self) -> set[str]:
        """The sample's fields the plan reads (``total_tokens@request_end`` is field total_tokens)."""
        return {p.split("@")[0] for v in self.placed.values() for p in v.split(" + ")} | set(self.used)


def norm(name: str) -> str:
    """A field's own name: its last path segment (the one before ``.value`` in a {value, unit} object),
    without case, ``-``, ``_`` and spaces; a list index (``choices.0.x``) is skipped."""
    parts = [p for p in name.split(".") if not p.isdigit()]
    last = parts[-2] if len(parts) > 1 and parts[-1] == "value" else parts[-1] if parts else name
    return re.sub(r"[-_\s]", "", last.lower())


def place(sample: Sample, picks: dict[str, str]) -> Plan:
    """The plan for the sample's fields; ``picks``: canonical -> the path the user chose for it."""
    plan = Plan()
    timings = next((p for p, v in sample.first.items() if is_timings(v)), None)
    if timings:
        plan.placed["timings"] = timings
        plan.lines.append(f'timings = "{timings}"                      # llama-server\'s timings object')
    for canonical, names in NAMES.items():
        hits = _candidates(canonical, names, sample, plan)
        if not hits:
            continue
        unit_pick = dict(_unit_options(canonical, hits[0], sample.columns)).get(picks.get(canonical, ""))
        if unit_pick:  # a unit the user chose for a duration nothing else tells the unit of
            plan.lines.append(unit_pick)
            plan.placed[canonical] = hits[0]
            continue
        if canonical in picks:
            hits = [h for h in hits if h == picks[canonical]] or hits
        elif canonical == "item" and _two_items(hits, sample.columns):
            why = f"{hits[0]!r} and {hits[1]!r} both name an item and differ on the sample"
            plan.choices.append(Choice(canonical, [(p, field_line(canonical, p, sample, plan.placed)[0] or "")
                                                   for p in hits[:2]], why))
            continue
        if canonical not in picks and _coalesced(plan, canonical, hits, sample):
            continue
        _put(plan, canonical, hits[0], sample)
    return plan


COALESCED = ("max_tokens", "tokens_evaluated", "tokens_predicted", "id_slot", "output_chars")


def _coalesced(plan: Plan, canonical: str, hits: list[str], sample: Sample) -> bool:
    """A count two fields of the records carry, each set where the other is not (a harness's ``max_tokens`` on
    its chat requests and ``n_predict`` on its ``/completion`` ones): the first of them that is set."""
    if canonical not in COALESCED or len(hits) < 2:
        return False
    first = sample.columns[hits[0]]
    fill = [h for h in hits[1:] if any(a is None and b is not None for a, b in zip(first, sample.columns[h],
                                                                                   strict=False))]
    if not fill:
        return False
    used = [hits[0], *fill]
    gaps = sum(a is None and any(sample.columns[h][i] is not None for h in fill) for i, a in enumerate(first))
    plan.lines.append(f'{canonical} = {{ sql = "coalesce({", ".join(q(p) for p in used)})" }}')
    plan.placed[canonical] = " + ".join(used)
    plan.guesses.append(f"{canonical} <- {', '.join(used)}: the first of them that is set ({hits[0]} is null on "
                        f"{gaps} of {len(first)} records where {' or '.join(fill)} is not)")
    return True


def _candidates(canonical: str, names: tuple[str, ...], sample: Sample, plan: Plan) -> list[str]:
    """The sample's fields that may be ``canonical``, surest name first (then the shallower path)."""
    columns, first = sample.columns, sample.first
    wanted = [re.sub(r"[-_\s]", "", n) for n in names]
    taken = set(plan.placed.values())
    silent = canonical == "error"  # an error field that never fired on the sample is still the error field
    hits = sorted((wanted.index(norm(p)), p.count("."), p) for p in columns
                  if norm(p) in wanted and p not in taken and (silent or any(v is not None for v in columns[p]))
                  and not (p.startswith(f"{plan.placed.get('timings', chr(0))}.")))
    out = [p for _, _, p in hits]
    if canonical in NUMBER_FIELDS or canonical in DURATION_FIELDS:
        out = [p for p in out if _numeric(columns[p]) or isinstance(first[p], list)]
    if canonical == "http_status":
        out = [p for p in out if _statusish(columns[p])]
    if canonical in ("run_id", "server", "stage"):
        out = [p for p in out if all(isinstance(v, (str, int)) or v is None for v in columns[p])]
    return out


def _two_items(hits: list[str], columns: dict[str, list[Any]]) -> bool:
    """Two fields with item names whose values do not go together one for one."""
    items = [h for h in hits if norm(h) in {re.sub(r"[-_\s]", "", n) for n in ITEM_NAMES}]
    if len(items) < 2:
        return False
    a, b = (list(map(str, columns[h])) for h in items[:2])
    return len(set(zip(a, b, strict=False))) != len(set(a)) or len(set(a)) != len(set(b))


def _put(plan: Plan, canonical: str, path: str, sample: Sample) -> None:
    line, guess = field_line(canonical, path, sample, plan.placed)
    if line is None:
        plan.choices.append(Choice(canonical, _unit_options(canonical, path, sample.columns), guess or ""))
        return
    plan.lines.append(line)
    plan.placed[canonical] = path
    if guess:
        plan.guesses.append(f"{canonical} <- {path}: {guess}")


def field_line(canonical: str, path: str, sample: Sample, placed: dict[str, str]) -> tuple[str | None, str | None]:
    """The TOML line for ``canonical`` read from ``path``, and what was guessed on the way (None: certain).
    A None line: the unit cannot be told (the reason is the second value)."""
    value, values = sample.first[path], sample.columns[path]
    if canonical in TIME_FIELDS:
        unit = time_unit(path, value)
        note = "   # a monotonic clock: give [attempts] an anchor" if unit.startswith("mono") else ""
        return f'{canonical} = {{ path = "{path}", unit = "{unit}" }}{note}', None
    if canonical in DURATION_FIELDS:
        dunit, guess = duration_unit(canonical, path, values, sample.units.get(path), (sample.columns, placed))
        if dunit is None:
            return None, guess
        unit = dunit
        head = f'sql = "list_avg({q(path)})"' if isinstance(value, list) else f'path = "{path}"'
        return f'{canonical} = {{ {head}, unit = "{unit}" }}', guess
    if canonical == "http_status" and not all(_int_like(v) for v in values if v is not None):
        return f'http_status = {{ sql = "TRY_CAST({q(path)} AS INTEGER)" }}', "its non-numeric values are no status"
    if canonical == "attempt" and min((float(v) for v in values if _int_like(v)), default=1) == 0:
        return f'attempt = {{ sql = "{q(path)} + 1" }}', "counts from 0 (a retry count): attempt = it + 1"
    if canonical == "error" and any(isinstance(v, dict) for v in values):
        return f'error = {{ sql = "CAST({q(path)} AS VARCHAR)" }}', None
    return f'{canonical} = "{path}"', None


def duration_unit(canonical: str, path: str, values: list[Any], stated: str | None,
                  context: tuple[dict[str, list[Any]], dict[str, str]]) -> tuple[str | None, str | None]:
    """The unit of a duration field, and the reason when it is not written on the field (None unit: no reason
    to prefer one)."""
    if stated in ("s", "ms", "us", "ns"):
        return stated, None
    low = path.lower()
    for suffix, unit in (("_ns", "ns"), ("_us", "us"), ("_ms", "ms"), ("_s", "s")):
        if low.endswith(suffix):
            return unit, None
    nums = [float(v) for v in _flat_numbers(values)]
    if not nums:
        return "ms", "no value to tell the unit by: milliseconds"
    span = _span_s(*context)
    if span:
        return _by_span(canonical, nums, span)
    if max(nums) >= 1000:
        return "ms", f"values up to {max(nums):g}: milliseconds"
    if max(nums) < 1:
        return "s", "values under 1: seconds"
    return None, (f"{path} has values from {min(nums):g} to {max(nums):g} and no unit in its name; nothing "
                  "else in the record tells seconds from milliseconds")


def _by_span(canonical: str, nums: list[float], span: list[float]) -> tuple[str, str]:
    """Seconds or milliseconds, against each record's end - start (in seconds)."""
    pairs = [(v, s) for v, s in zip(nums, span, strict=False) if s and s > 0]
    if canonical == "latency_ms":
        close_s = sum(abs(v - s) <= 0.01 * s + 0.002 for v, s in pairs)
        close_ms = sum(abs(v / 1000 - s) <= 0.01 * s + 0.002 for v, s in pairs)
        unit = "s" if close_s >= close_ms else "ms"
        return unit, f"equals end - start in {'seconds' if unit == 's' else 'milliseconds'} on " \
                     f"{max(close_s, close_ms)} of {len(pairs)} records"
    over_s = sum(v > s * 1.01 for v, s in pairs)
    unit = "ms" if over_s else "s"
    return unit, (f"longer than its request on {over_s} of {len(pairs)} records if read as seconds: milliseconds"
                  if over_s else f"within end - start on all {len(pairs)} records as seconds")


def _span_s(columns: dict[str, list[Any]], placed: dict[str, str]) -> list[float]:
    """end - start of each record, in seconds, when both are placed and numeric epoch seconds or ISO times."""
    if "started_at" not in placed or "ended_at" not in placed:
        return []
    a, b = (_seconds(columns[placed[k]]) for k in ("started_at", "ended_at"))
    return [y - x if x is not None and y is not None else 0.0 for x, y in zip(a, b, strict=False)]


def _seconds(values: list[Any]) -> list[float | None]:
    from datetime import datetime

    out: list[float | None] = []
    for v in values:
        if isinstance(v, str):
            try:
                out.append(datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp())
            except ValueError:
                out.append(None)
        elif _number(v):
            x = float(v)
            out.append(x / 1e9 if x > 1e17 else x / 1e6 if x > 1e14 else x / 1e3 if x > 1e11 else x)
        else:
            out.append(None)
    return out


def _unit_options(canonical: str, path: str, columns: dict[str, list[Any]]) -> list[tuple[str, str]]:
    head = f'sql = "list_avg({q(path)})"' if any(isinstance(v, list) for v in columns[path]) else f'path = "{path}"'
    return [(f"{path}:{u}", f'{canonical} = {{ {head}, unit = "{u}" }}') for u in ("s", "ms")]


def time_unit(path: str, value: Any) -> str:
    if isinstance(value, str) and not _int_like(value):
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


def is_timings(obj: Any) -> bool:
    return isinstance(obj, dict) and "prompt_n" in obj and "predicted_n" in obj


def q(path: str) -> str:
    """A dot path quoted for a SQL expression inside a TOML string; list indexes are 1-based in SQL."""
    out = ""
    for p in path.split("."):
        if p.isdigit() and out:
            out += f"[{int(p) + 1}]"
            continue
        part = p if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) else f'\\"{p}\\"'
        out += f".{part}" if out else part
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int_like(v: Any) -> bool:
    if _number(v):
        return float(v) == int(v)
    return isinstance(v, str) and v.strip().isdigit()


def _numeric(values: list[Any]) -> bool:
    vals = [v for v in values if v is not None]
    return bool(vals) and all(_number(v) or (isinstance(v, str) and _float(v)) for v in vals)


def _float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _statusish(values: list[Any]) -> bool:
    """Mostly HTTP status numbers (100-599): a JMeter responseCode is one even with a few texts among them."""
    vals = [v for v in values if v is not None and v != ""]
    codes = [v for v in vals if _int_like(v) and 100 <= float(v) <= 599]
    return bool(codes) and len(codes) * 2 > len(vals)


def _flat_numbers(values: list[Any]) -> list[float]:
    out: list[float] = []
    for v in values:
        if _number(v) or (isinstance(v, str) and _float(v)):
            out.append(float(v))
        elif isinstance(v, list):
            out.extend(float(x) for x in v if _number(x))
    return out


def dumps(value: Any) -> str:
    return json.dumps(value, default=str)[:60]

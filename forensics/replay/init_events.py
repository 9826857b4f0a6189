"""``mapping init`` on an event stream: one line per event, the events of a request tied by a key.

A sample is an event stream when its records have a field naming the event (``type``, ``event``, ``kind``)
with a few distinct words, and a key (``request_id``, ``id``) that several events share.  The proposal is an
``layout = "events"`` section (see ``replay.events``): the key is the item; each field is taken from the event
type that carries it (``when``); the start time from the first event of a start type, the end time from the
last event of an end type; the generated tokens from the end event's total when there is one, else the sum of
the chunk counts (and when both are there, how often they agree on the sample is said); the outcome from the
end event's error, ``cancelled`` for a request that never ended.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from forensics.replay.init_fields import NAMES, Choice, Plan, duration_unit, norm, q, time_unit

KINDS = ("type", "event", "kind", "event_type", "eventtype")
KEYS = ("request_id", "requestid", "req_id", "id", "uuid", "request", "rid")
TIMES = ("ts", "timestamp", "time", "t", "at", "event_time")
START = re.compile(r"start|begin|sen[dt]|submit", re.I)
END = re.compile(r"end$|_end|done|finish|complete(?!.*bench)", re.I)
CHUNK = re.compile(r"token|chunk|delta", re.I)
COUNTS = ("count", "n", "n_tokens", "num_tokens", "token_count", "tokens")
TOTALS = ("total_tokens", "completion_tokens", "output_tokens", "tokens_predicted", "generated_tokens")


@dataclass
class Stream:
    """What the sample's events are: the field naming the event, the key, and per event type the fields it
    carries (in the order the types first appear)."""

    kind: str
    key: str
    carried: dict[str, list[str]] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)


def detect(records: list[dict[str, Any]]) -> Stream | None:
    """The stream the records are, or None when they are one record per request."""
    flat = [r for r in records if isinstance(r, dict)]
    kind = next((k for k in KINDS if _words(flat, k)), None)
    if kind is None:
        return None
    for key in KEYS:
        ids = [str(r[key]) for r in flat if r.get(key) is not None]
        if ids and len(set(ids)) < len(ids) and len({r.get(kind) for r in flat if r.get(key) is not None}) > 1:
            stream = Stream(kind, key, records=flat)
            for r in flat:
                if r.get(key) is None:
                    continue
                seen = stream.carried.setdefault(str(r.get(kind)), [])
                seen.extend(k for k, v in r.items() if v is not None and k not in seen)
            return stream
    return None


def _words(records: list[dict[str, Any]], kind: str) -> bool:
    words = {r.get(kind) for r in records if kind in r}
    return 2 <= len(words) <= 30 and all(isinstance(w, str) for w in words)


def plan(stream: Stream, picks: dict[str, str]) -> Plan:
    """The fields of the events section, with what was guessed and what is left to choose."""
    out = Plan(used=[stream.kind])
    out.lines.append(f'item = "{stream.key}"')
    out.placed["item"] = stream.key
    starts = [t for t in stream.carried if START.search(t)]
    ends = [t for t in stream.carried if END.search(t) and not START.search(t)]
    _times(stream, out, starts, ends)
    _tokens(stream, out, ends, picks)
    for canonical in ("tokens_evaluated", "ttft_ms", "itl_ms", "http_status", "error", "stop_type", "id_slot"):
        _single(stream, out, canonical)
    _outcome(out, stream, ends)
    return out


def _when(stream: Stream, types: list[str]) -> str:
    if len(types) == 1:
        return f"{stream.kind} = '{types[0]}'"
    return f"{stream.kind} IN ({', '.join(repr(t) for t in types)})"


def _carrying(stream: Stream, name: str) -> list[str]:
    return [t for t, fields in stream.carried.items() if name in fields]


def _times(stream: Stream, out: Plan, starts: list[str], ends: list[str]) -> None:
    ts = next((n for n in TIMES if _carrying(stream, n)), None)
    if ts is None:
        return
    value = next(r[ts] for r in stream.records if r.get(ts) is not None)
    unit = time_unit(ts, value)
    begin = [t for t in starts if t in _carrying(stream, ts)]
    finish = [t for t in ends if t in _carrying(stream, ts)]
    when_s = f', when = "{_when(stream, begin)}"' if begin else ""
    when_e = f', when = "{_when(stream, finish)}"' if finish else ""
    out.lines.append(f'started_at = {{ path = "{ts}", unit = "{unit}"{when_s} }}')
    out.lines.append(f'ended_at = {{ path = "{ts}", unit = "{unit}"{when_e}, take = "last" }}')
    out.placed.update(started_at=ts, ended_at=ts)
    if not begin:
        out.guesses.append(f"started_at <- {ts}: no start event type: the first event of each request")
    if not finish:
        out.guesses.append(f"ended_at <- {ts}: no end event type: the last event of each request")


def _tokens(stream: Stream, out: Plan, ends: list[str], picks: dict[str, str]) -> None:
    total = next(((n, t) for n in TOTALS for t in ends if t in _carrying(stream, n)), None)
    chunk = next(((n, t) for t in stream.carried if CHUNK.search(t) and t not in ends
                  for n in COUNTS if t in _carrying(stream, n)), None)
    options = []
    if total:
        options.append((f"{total[0]}@{total[1]}", f'tokens_predicted = {{ path = "{total[0]}", when = '
                                                   f'"{stream.kind} = \'{total[1]}\'", take = "last" }}'))
    if chunk:
        options.append((f"{chunk[0]}@{chunk[1]}", f'tokens_predicted = {{ path = "{chunk[0]}", when = '
                                                   f'"{stream.kind} = \'{chunk[1]}\'", take = "sum" }}'))
    if not options:
        return
    chosen = next((o for o in options if o[0] == picks.get("tokens_predicted")), None)
    estimated = chunk is not None and any(r.get("estimated") is True for r in stream.records
                                          if r.get(stream.kind) == chunk[1])
    if chosen is None and len(options) == 2 and estimated:
        out.guesses.append(f"tokens_predicted <- {options[0][0]}: the {chunk[1]} counts say they are estimated "  # type: ignore[index]
                           "(estimated: true), the end event's total is the count")
    elif chosen is None and len(options) == 2:
        agree, both = _agreement(stream, total, chunk)
        if agree < both:
            out.choices.append(Choice("tokens_predicted", options, f"the {total[1]} event's {total[0]} and the sum "  # type: ignore[index]
                                      f"of {chunk[1]} {chunk[0]} differ on {both - agree} of {both} requests"))  # type: ignore[index]
            return
        out.guesses.append(f"tokens_predicted <- {options[0][0]}: equal to the sum of {options[1][0]} on all "
                           f"{both} requests of the sample")
    label, line = chosen or options[0]
    out.lines.append(line)
    out.placed["tokens_predicted"] = label


def _agreement(stream: Stream, total: Any, chunk: Any) -> tuple[int, int]:
    """On how many requests the end total equals the sum of the chunk counts, of those that have both."""
    sums: dict[str, float] = {}
    totals: dict[str, float] = {}
    for r in stream.records:
        key = r.get(stream.key)
        if key is None:
            continue
        if r.get(stream.kind) == chunk[1] and isinstance(r.get(chunk[0]), (int, float)):
            sums[str(key)] = sums.get(str(key), 0) + r[chunk[0]]
        if r.get(stream.kind) == total[1] and isinstance(r.get(total[0]), (int, float)):
            totals[str(key)] = r[total[0]]
    both = [k for k in totals if k in sums]
    return sum(sums[k] == totals[k] for k in both), len(both)


def _single(stream: Stream, out: Plan, canonical: str) -> None:
    """A field carried by the events under one of its names: taken from the first event type carrying it."""
    wanted = [re.sub(r"[-_\s]", "", n) for n in NAMES[canonical]]
    names = sorted({f for fields in stream.carried.values() for f in fields if norm(f) in wanted},
                   key=lambda f: wanted.index(norm(f)))
    if not names:
        return
    name = names[0]
    types = _carrying(stream, name)
    when = f', when = "{_when(stream, types)}"' if len(types) < len(stream.carried) else ""
    if canonical in ("ttft_ms", "itl_ms"):
        values = [r[name] for r in stream.records if r.get(name) is not None]
        unit, guess = duration_unit(canonical, name, values, None, ({}, {}))
        if unit is None:
            return
        out.lines.append(f'{canonical} = {{ path = "{name}", unit = "{unit}"{when} }}')
        if guess:
            out.guesses.append(f"{canonical} <- {name}: {guess}")
    else:
        out.lines.append(f'{canonical} = {{ path = "{name}"{when} }}')
    out.placed[canonical] = name


def _outcome(out: Plan, stream: Stream, ends: list[str]) -> None:
    error = out.placed.get("error")
    if not ends:
        return
    said = f"coalesce(CAST({q(error)} AS VARCHAR), '') <> ''" if error else "false"
    out.lines.append(f'outcome = {{ sql = "CASE WHEN {said} THEN (CASE WHEN {q(error or "x")} ILIKE \'%timeout%\' '
                     f'THEN \'timeout\' ELSE \'failed\' END) ELSE \'ok\' END", when = "{_when(stream, ends)}", '
                     f'take = "last", default = "cancelled" }}'
                     if error else f'outcome = {{ sql = "\'ok\'", when = "{_when(stream, ends)}", '
                                   f'default = "cancelled" }}')
    out.placed["outcome"] = f"{error or stream.kind}@{'/'.join(ends)}"
    out.guesses.append(f"outcome <- the {'/'.join(ends)} event" + (f"'s {error}" if error else "")
                       + ": a request with no such event never ended (cancelled)")

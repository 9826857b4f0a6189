"""Relative clocks: times a harness took from a monotonic clock (Python's ``time.perf_counter()``, Go's or
Rust's monotonic nanoseconds) made wall-clock times.

Such values only have an origin per process, so one offset is found per data file and run: the earliest
relative time of the file's records is put at the anchor, a wall-clock time the mapping names (a field of
the file, such as vLLM's ``benchmark_start_time_unix``, or the run manifest's ``started_at``).  Every
relative time of those records keeps its distance from that earliest one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from forensics.replay.records import RawRecord, parse_time

MANIFEST = "manifest"  # anchor at the run manifest's started_at
TIME_KEYS = ("started_at", "ended_at")
REL_KEYS = {"started_at": "started_rel_s", "ended_at": "ended_rel_s"}  # where an unanchored relative time is kept


@dataclass(frozen=True)
class Relative:
    """A reading of a monotonic clock, in seconds (not yet a wall-clock time)."""

    seconds: float


def iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def resolve(raws: list[RawRecord], run_starts: dict[str, datetime]) -> list[str]:
    """Turn the ``Relative`` times of ``raws`` into ISO times in place; return one note per group of records
    left without an anchor (their relative times become null)."""
    groups: dict[tuple[str, int], list[RawRecord]] = {}
    for r in raws:
        if isinstance(r.obj, dict) and any(isinstance(r.obj.get(k), Relative) for k in TIME_KEYS):
            groups.setdefault((r.path, r.group), []).append(r)
    notes = []
    for (path, _), members in groups.items():
        origin = min(r.obj[k].seconds for r in members for k in TIME_KEYS if isinstance(r.obj.get(k), Relative))
        anchor = _anchor_of(members, run_starts)
        if anchor is None:
            notes.append(f"{path}: times on a relative clock and no wall-clock anchor for them "
                         f"({_wanted(members)}): started_at and ended_at left empty, the times kept on their own "
                         "clock (started_rel_s, ended_rel_s), which throughput, latency and concurrency use")
        for r in members:
            rel = {k: v.seconds - origin for k in TIME_KEYS if isinstance(v := r.obj.get(k), Relative)}
            if anchor is None:
                r.obj = {**r.obj, **{k: None for k in rel}, **{REL_KEYS[k]: t for k, t in rel.items()}}
            else:
                r.obj = {**r.obj, **{k: iso(anchor + t) for k, t in rel.items()}}
    return notes


def _anchor_of(members: list[RawRecord], run_starts: dict[str, datetime]) -> float | None:
    for r in members:
        for a in r.anchors:
            if isinstance(a, (int, float)):
                return float(a)
            if a == MANIFEST:
                start = run_starts.get(str(r.obj.get("run_id")))
                if start is not None:
                    return start.timestamp()
    return None


def _wanted(members: list[RawRecord]) -> str:
    hint = members[0].anchor_hint
    return f"anchor = {hint}: none found" if hint else "give the mapping section an anchor"


def manifest_starts(raws: list[RawRecord], known: dict[str, datetime]) -> dict[str, datetime]:
    """Run -> manifest started_at, from the manifests among ``raws`` (ISO strings) over ``known`` ones."""
    out = dict(known)
    for r in raws:
        if r.kind == "manifest" and isinstance(r.obj, dict) and isinstance(r.obj.get("started_at"), str):
            try:
                t = parse_time(r.obj["started_at"], "started_at")
            except ValueError:
                continue
            if t is not None:
                out[str(r.obj.get("run_id"))] = t
    return out


def has_relative(obj: Any) -> bool:
    return isinstance(obj, dict) and any(isinstance(obj.get(k), Relative) for k in TIME_KEYS)


def clock_notes(throughput: Any) -> list[str]:
    """One note per kind of run in a ``throughput`` table whose records carry no wall-clock time: why the
    wall-clock columns (attempts.started_at, ended_at) are empty and what the rates are measured on."""
    notes = []
    rel = throughput.filter(throughput["time_basis"] == "relative")["run"].to_list()
    if rel:
        notes.append(f"runs {', '.join(rel)}: their records' times are a monotonic clock's (e.g. vLLM's perf_counter "
                     "start_times) with no wall-clock anchor, so started_at/ended_at are empty; wall_s, rates and "
                     "concurrency are on that clock (started_rel_s)")
    dur = throughput.filter(throughput["time_basis"] == "durations")["run"].to_list()
    if dur:
        notes.append(f"runs {', '.join(dur)}: their records carry no send times (durations only), so started_at/"
                     "ended_at are empty; wall_s is the run's duration from its summary, latency each record's own, "
                     "and peak_busy_slots unknown")
    return notes

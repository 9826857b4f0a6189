"""Hand-built server requests and instances for the replay join tests (the log parser is not used)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import polars as pl

from forensics import replay, schema
from forensics.store import Store

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures" / "replay"


def at(base: str, seconds: float | None) -> datetime | None:
    if seconds is None:
        return None
    return datetime.fromisoformat(base).replace(tzinfo=timezone.utc) + timedelta(seconds=seconds)


def requests(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return schema.conform(pl.DataFrame(rows, infer_schema_length=None), "requests")


def instances(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return schema.conform(pl.DataFrame(rows, infer_schema_length=None), "instances")


# run-ms on instance "main": (slot, seq, task, start s, end s after 10:00:00, prompt, gen, stop, truncated, http,
# error, first line, last line)
MS_REQUESTS = [
    (0, 1, 1, 0.05, 3.95, 100, 50, "eos", False, None, None, 10, 20),
    (1, 1, 2, 0.15, 0.20, 9000, 0, "error", False, 500, "the request exceeds the available context size", 21, 24),
    (1, 2, 3, 1.25, 5.15, 120, 60, "eos", False, None, None, 25, 35),
    (0, 2, 4, 4.15, 7.05, 200, 80, "eos", False, None, None, 36, 39),
    (1, 3, 5, 5.50, 35.25, 300, 1400, "cancelled", False, None, None, 40, 52),
    (0, 3, 6, 7.25, 10.15, 210, 512, "limit", True, None, None, 53, 60),
    (0, 4, 7, 10.35, 13.25, 90, 40, "eos", False, None, None, 61, 66),
    (1, 4, 8, 35.50, 80.50, 300, 4096, "limit", True, None, None, 67, 80),
]


def ms_requests(*, timed: bool = True) -> pl.DataFrame:
    rows = []
    for slot, seq, task, s0, s1, p, g, stop, trunc, http, err, l0, l1 in MS_REQUESTS:
        rows.append({"run": "run-ms", "instance": "main", "path": "logs/main.log", "slot": slot, "seq": seq, "task": task,
                     "prompt_tokens": p, "gen_tokens": g, "stop_reason": stop, "truncated": trunc, "http_status": http,
                     "error": err, "total_ms": round((s1 - s0) * 1000, 3), "complete": True,
                     "t_start": at("2026-03-02T10:00:00", s0 if timed else None),
                     "t_end": at("2026-03-02T10:00:00", s1 if timed else None), "line_first": l0, "line_last": l1})
    return requests(rows)


def ms_instances(basis: str = "absolute") -> pl.DataFrame:
    return instances([{"run": "run-ms", "instance": "main", "path": "logs/main.log", "port": 8080, "n_slots": 2,
                       "time_basis": basis}])


def ms_records() -> replay.Records:
    return replay.load([FIX / "multistage" / "manifest.json", FIX / "multistage" / "attempts.jsonl"])


def ms_store(path: Path) -> Store:
    """A store with run-ms's records and its main log's requests (absolute times)."""
    store = Store(path, create=True)
    txn = store.transaction()
    txn.write("requests", ms_requests().drop("run"), run="run-ms", name="main")
    txn.write("instances", ms_instances().drop("run"), run="run-ms", name="main")
    replay.ingest_records(txn, ms_records())
    txn.commit()
    return Store(path)

"""Small hand-built stores for the throughput, chart, report and notebook tests.

Every number the tests expect is worked out by hand in the test files from the rows below.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import polars as pl

from forensics import schema
from forensics.store import Store

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def req(run: str, slot: int, seq: int, task: int, start: float | None, end: float | None, total_ms: float,
        gen: int, gen_ms: float, prompt: int, **extra: Any) -> dict[str, Any]:
    row = {"run": run, "instance": extra.pop("instance", "server"), "path": "server.log", "slot": slot, "seq": seq,
           "task": task, "prompt_tokens": prompt, "gen_tokens": gen, "gen_ms": gen_ms, "total_ms": total_ms,
           "prompt_ms": total_ms - gen_ms, "complete": True, "stop_reason": "eos", "line_first": task * 10}
    if start is not None:
        row["t_start"], row["t_end"] = at(start), at(end if end is not None else start)
    row.update(extra)
    return row


def write(store_dir: Path, tables: dict[str, list[dict[str, Any]]]) -> Store:
    store = Store(store_dir, create=True)
    txn = store.transaction()
    for table, rows in tables.items():
        df = pl.DataFrame(rows, infer_schema_length=None)
        for run in df["run"].unique().to_list():
            part = df.filter(pl.col("run") == run)
            txn.write(table, schema.conform(part, table), run=run, name="test")
    txn.commit()
    return store


# run "abs": np 2 (manifest), absolute times.  slot 0: A 0-10 s, B 10-16 s; slot 1: C 2-8 s, D 8-20 s.
ABS = [
    req("abs", 0, 1, 1, 0, 10, 10000, 101, 9000, 50),
    req("abs", 0, 2, 3, 10, 16, 6000, 51, 5000, 30),
    req("abs", 1, 1, 2, 2, 8, 6000, 61, 4800, 40),
    req("abs", 1, 2, 4, 8, 20, 12000, 201, 10000, 20),
]
# run "order": no time at all; 3 slots logged.  slot 0: 4 s then 2 s; slot 1: 3 s.
ORDER = [
    req("order", 0, 1, 1, None, None, 4000, 11, 3000, 10),
    req("order", 0, 2, 3, None, None, 2000, 21, 1000, 10),
    req("order", 1, 1, 2, None, None, 3000, 5, 2000, 10),
]
# run "rec": client records only.  a1 0-5 s ok (11 tokens in 4000 ms); a2 1-3 s failed.
REC = [
    {"run": "rec", "item": "AAA", "stage": "s1", "attempt": 1, "server": "main", "started_at": at(0),
     "ended_at": at(5), "outcome": "ok", "id_slot": 0, "tokens_evaluated": 7, "tokens_predicted": 11,
     "predicted_n": 11, "predicted_ms": 4000.0, "source_line": 1},
    {"run": "rec", "item": "<script>alert(1)</script>", "stage": "s1", "attempt": 1, "server": "main",
     "started_at": at(1), "ended_at": at(3), "outcome": "failed", "id_slot": 1, "http_status": 500,
     "error": "<script>alert(1)</script>", "source_line": 2},
]


def basic_store(store_dir: Path) -> Store:
    return write(store_dir, {
        "requests": ABS + ORDER,
        "runs": [{"run": "abs", "concurrency": 2}],
        "instances": [{"run": "order", "instance": "server", "n_slots": 3}],
        "attempts": REC,
    })


def sweep_store(store_dir: Path, points: list[tuple[int, float, float]]) -> Store:
    """One run per (np, total seconds per request, tokens per request): np slots each serving 2 back-to-back
    requests of that length, absolute times; manifest with concurrency and a config."""
    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    for np_, secs, tokens in points:
        run = f"np{np_}"
        runs.append({"run": run, "concurrency": np_, "config": f'{{"parallel": {np_}, "model": "m"}}'})
        task = 0
        for slot in range(np_):
            for seq in (1, 2):
                task += 1
                start = (seq - 1) * secs
                rows.append(req(run, slot, seq, task, start, start + secs, secs * 1000, int(tokens),
                                secs * 900, 100))
    return write(store_dir, {"requests": rows, "runs": runs})

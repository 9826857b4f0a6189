"""Where ingest time goes: each stage of the parsing pipeline, one after the other, in CPU seconds.

    python benchmarks/stages.py LOG [--chunks 8]

Runs the stages ``forensics ingest`` runs for every chunk of an (uncompressed) log, one stage at a time on the
first ``--chunks`` chunks, and prints milliseconds per chunk, CPU seconds per GB (every thread counted: polars
runs some stages on several), and the fastest ingest the sum allows with every core busy and no overhead.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import polars as pl  # noqa: E402

from forensics import schema  # noqa: E402
from forensics.ingest import Ingestor, detect_format  # noqa: E402
from parsers import assemble  # noqa: E402
from parsers.engine import Carry, Engine  # noqa: E402
from parsers.reader import iter_chunks  # noqa: E402
from parsers.spec import grammar  # noqa: E402


def best_of(fn: Callable[[], Any], reps: int = 3) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def _chunks(log: Path, n_chunks: int) -> list[Any]:
    out = []
    for i, ch in enumerate(iter_chunks(log)):
        out.append(ch)
        if i + 1 == n_chunks:
            break
    return out


class _Clock:
    """CPU seconds (every thread of the process) per stage, summed over the chunks."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}

    def __call__(self, name: str, fn: Callable[[], Any]) -> Any:
        t = time.process_time()
        out = fn()
        self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - t
        return out


def stages(log: Path, n_chunks: int) -> tuple[list[tuple[str, float]], int, int, int]:
    """(stage, CPU seconds for all chunks) in pipeline order; the chunks' count, bytes and lines.  The stages
    are those ``forensics ingest`` runs per chunk, with the engine it builds for the detected format."""
    fmt = grammar(detect_format(log) or None)
    engine = Engine(fmt)
    chunks = _chunks(log, n_chunks)
    n_bytes = sum(c.end_offset - c.first_offset for c in chunks)
    n_lines = sum(c.n_lines for c in chunks)
    engine.learn(engine.classify(chunks[0].lines, chunks[0].first_line_no, Carry()))  # kinds' order learned
    for c in chunks:
        c._lines = None
    clock = _Clock()
    state, builder = assemble.AssembleState(), assemble.RequestBuilder()
    ing = Ingestor.__new__(Ingestor)
    now = datetime.now(timezone.utc)
    for c in chunks:
        lines = clock("read and split lines", lambda c=c: c.lines)
        res = clock("classify (kinds, fields, events)", lambda c=c, lines=lines: engine.classify(
            lines, c.first_line_no, Carry()))
        ev = clock("wall-clock times", lambda res=res: assemble.parse_abs_time(res.events, reference=now))
        ev = clock("instances and running tasks", lambda ev=ev: assemble.running_tasks(
            assemble.assign_instances(ev, fmt, state), fmt, state))
        ev = clock("slots of slot-less lines", lambda ev=ev: assemble.inherit_slots(ev, fmt, state))
        part, http = clock("request pieces", lambda ev=ev: assemble.partial_requests(ev, fmt))
        clock("instance facts", lambda ev=ev: ing._instance_facts(ev, fmt))
        final = clock("requests across chunks", lambda c=c, part=part, http=http: builder.add(
            part, http, c.first_line_no + c.n_lines - 1))
        clock("encode events as Parquet", lambda ev=ev: _events_parquet(ev))
        clock("encode requests as Parquet", lambda final=final: schema.conform(final, "requests").write_parquet(
            io.BytesIO()) if final.height else None)
    return list(clock.cpu.items()), len(chunks), n_bytes, n_lines


def _events_parquet(ev: pl.DataFrame) -> None:
    e = ev.with_columns(pl.lit("main").alias("instance"), pl.lit("log").alias("path"))
    e = schema.conform(e.rename({"abs_time": "ts"}) if "abs_time" in e.columns else e, "events")
    e.write_parquet(io.BytesIO(), compression="lz4", statistics=False)


FRAME_RE = (r"^([0-9]+)\.([0-9]{2})\.([0-9]{3})\.([0-9]{3}) ([A-Z]) slot +([a-z_]+): id +([0-9]+) \| "
            r"task (-?[0-9]+) \| ")


def duckdb_frame(log: Path, n_bytes: int) -> float:
    """Seconds DuckDB (RE2, every core) takes to pull only the clock, level and slot frame out of each line.

    A reference, not a stage: what the bulk engine the issue suggests costs for a fraction of the work.
    """
    import duckdb

    with tempfile.TemporaryDirectory() as tmp:
        part = Path(tmp) / "head.log"
        with log.open("rb") as src, part.open("wb") as dst:
            dst.write(src.read(n_bytes))
        con = duckdb.connect()
        src_sql = ("read_csv($f, columns = {'line': 'VARCHAR'}, delim = chr(31), quote = '', escape = '', "
                   "header = false, auto_detect = false, strict_mode = false)")
        names = "['m', 's', 'ms', 'us', 'level', 'func', 'slot', 'task']"
        sql = f"SELECT regexp_extract(line, $re, {names}) AS f FROM {src_sql}"
        t, _ = best_of(lambda: con.sql(sql, params={"f": str(part), "re": FRAME_RE}).to_arrow_table())
        con.close()
    return t


def report(rows: list[tuple[str, float]], n_bytes: int, n_lines: int, n_chunks: int,
           frame_s: float | None = None) -> str:
    total = sum(t for name, t in rows if not name.startswith("  "))
    cores = os.cpu_count() or 1
    gb = n_bytes / 1e9
    out = [f"{n_chunks} chunks, {n_bytes / 1e6:.0f} MB, {n_lines:,} lines, one stage at a time (CPU seconds of "
           "every thread)", "",
           "| stage | ms per chunk | CPU s per GB | share |", "|---|---:|---:|---:|"]
    for name, t in rows:
        out.append(f"| {name} | {t * 1000 / n_chunks:.1f} | {t / gb:.1f} | {t / total:.0%} |")
    out.append(f"| **total** | **{total * 1000 / n_chunks:.1f}** | **{total / gb:.1f}** | 100% |")
    out += ["", f"Ceiling with {cores} cores busy and no overhead: {n_bytes / 1e6 / (total / cores):.0f} MB/s."]
    if frame_s is not None:
        out.append(f"Reference: DuckDB's RE2 on {cores} cores pulling only the clock, level and slot frame out of the "
                   f"same lines (no kinds, no fields, no requests): {n_bytes / 1e6 / frame_s:.0f} MB/s.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", type=Path)
    ap.add_argument("--chunks", type=int, default=8)
    args = ap.parse_args(argv)
    rows, n_chunks, n_bytes, n_lines = stages(args.log, args.chunks)
    print(report(rows, n_bytes, n_lines, n_chunks, duckdb_frame(args.log, n_bytes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

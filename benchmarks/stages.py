"""Where ingest time goes: each stage of the parsing pipeline timed alone, single-threaded.

    python benchmarks/stages.py LOG [--chunks 8]

Runs the stages ``forensics ingest`` runs for every chunk of an (uncompressed) log, one after the other on
the first ``--chunks`` chunks, best of three, and prints milliseconds per chunk, CPU seconds per GB, and the
fastest ingest the sum allows with every core busy and no overhead.  ``regex field captures`` is the part
of ``classify`` spent in the kinds' regexes alone (each kind on exactly the lines it claims): the floor of
extracting fields with regexes, whatever the rest of the pipeline does.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import polars as pl  # noqa: E402

from forensics import schema  # noqa: E402
from forensics.ingest import Ingestor, detect_format  # noqa: E402
from parsers import assemble  # noqa: E402
from parsers.engine import Carry, Engine, _prefix_extract, elapsed_seconds  # noqa: E402
from parsers.reader import iter_chunks  # noqa: E402
from parsers.spec import get_format  # noqa: E402


def best_of(fn: Callable[[], Any], reps: int = 3) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def stages(log: Path, n_chunks: int) -> tuple[list[tuple[str, float]], int, int, int]:
    """(stage, seconds for all chunks) in pipeline order; the chunks' count, bytes and lines."""
    fmt = get_format(detect_format(log) or "llama-common")
    engine = Engine(fmt)
    chunks = []
    for i, ch in enumerate(iter_chunks(log)):
        chunks.append(ch)
        if i + 1 == n_chunks:
            break
    n_bytes = sum(c.end_offset - c.first_offset for c in chunks)
    n_lines = sum(c.n_lines for c in chunks)
    for c in chunks[:1]:  # warm up: formats loaded, kind order learned
        engine.learn(engine.classify(c.lines, c.first_line_no, Carry()))

    def read() -> list[pl.Series]:
        out = []
        for c in chunks:
            c._lines = None
            out.append(c.lines)
        return out

    rows: list[tuple[str, float]] = []
    t, lines = best_of(read)
    rows.append(("read and split lines", t))
    t, unwrapped = best_of(lambda: [engine.unwrap(s)[0] for s in lines])
    rows.append(("wrapper scan", t))
    if fmt.family == "text" and fmt.prefix:
        t, framed = best_of(lambda: [_prefix_extract(s, fmt.prefix) for s in unwrapped])
        t2, _ = best_of(lambda: [elapsed_seconds(g["elapsed"]) for g, _ in framed if "elapsed" in g.columns])
        rows.append(("line prefix (clock, level)", t + t2))
    t_cls, results = best_of(lambda: [engine.classify(c.lines, c.first_line_no, Carry()) for c in chunks])
    rows.append(("classify: the rest (kinds, fields, events)", t_cls - sum(x for _, x in rows[1:])))

    # the regex captures alone: each kind's regex on exactly the lines it claimed
    if fmt.family == "text" and fmt.prefix:
        bodies = [b for _, b in framed]
        kinds = [r.events["kind"].cast(pl.String) for r in results]
        rows_of = [r.events["line_no"] - c.first_line_no for r, c in zip(results, chunks, strict=True)]

        def captures() -> None:
            for body, kind, idx in zip(bodies, kinds, rows_of, strict=True):
                for ki, k in enumerate(engine.kinds):
                    sel = idx.filter(kind == k.name)
                    if len(sel):
                        body.gather(sel).str.extract_groups(engine._fast[ki])

        t, _ = best_of(captures)
        rows.append(("  of which regex field captures", t))

    year = 2026
    t, evs = best_of(lambda: [assemble.parse_abs_time(r.events, year_hint=year) for r in results])
    rows.append(("wall-clock times", t))
    ing = Ingestor.__new__(Ingestor)

    def assemble_all() -> list[pl.DataFrame]:
        state = assemble.AssembleState()
        builder = assemble.RequestBuilder()
        out = []
        for ev, c in zip(evs, chunks, strict=True):
            ev = assemble.assign_instances(ev, fmt, state)
            ev = assemble.inherit_slots(ev, fmt, state)
            part, http = assemble.partial_requests(ev)
            ing._instance_facts(ev)
            builder.add(part, http, c.first_line_no + c.n_lines - 1)
            out.append(ev)
        return out

    t, assembled = best_of(assemble_all)
    rows.append(("assemble requests and instances", t))
    with tempfile.TemporaryDirectory() as tmp:
        def write() -> None:
            for i, ev in enumerate(assembled):
                out = schema.conform(ev.with_columns(pl.lit("main").alias("instance"), pl.lit(str(log)).alias("path")),
                                     "events").drop("run")
                out.write_parquet(Path(tmp) / f"{i}.parquet", compression="zstd", compression_level=1,
                                  statistics=False)

        t, _ = best_of(write)
    rows.append(("encode events as Parquet", t))
    return rows, len(chunks), n_bytes, n_lines


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
    out = [f"{n_chunks} chunks, {n_bytes / 1e6:.0f} MB, {n_lines:,} lines, one thread, best of 3", "",
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

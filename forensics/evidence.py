"""The log lines a finding rests on, read back from the files: ``"path:first-last"`` spots as the verdict
and the findings give them (``"main.log:75-493"``, ``"main.log:810"``).

``request_lines`` gives the lines of one request, found through the ``events`` table.  The lines are read
from the files themselves (the store keeps what each line meant, not its text), in the
same chunks the ingest reads, so a spot deep in a large or compressed log costs one pass over the bytes
before it, not a Python step per line.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import polars as pl

from forensics.errors import InputError
from forensics.store import Store
from parsers.reader import iter_chunks

SCHEMA = {"path": pl.String, "line_no": pl.Int64, "text": pl.String}


def parse_spot(spot: str) -> tuple[str, int, int]:
    """``"path:first-last"`` or ``"path:line"`` as (path, first, last)."""
    path, sep, lines = spot.strip().rpartition(":")
    first, _, last = lines.partition("-")
    if not sep or not path or not first.isdigit() or (last and not last.isdigit()):
        raise InputError(f"not a log spot: {spot!r}", hint="write it as path:first-last, e.g. main.log:75-90")
    return path, int(first), int(last or first)


def read_lines(path: Path | str, line_nos: list[int]) -> pl.DataFrame:
    """The lines numbered ``line_nos`` (1-based) of the log at ``path`` (plain, .gz or .zst), in order."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"cannot read {p}: the log is not there any more (moved or deleted since ingest)",
                         path=str(p), hint="run from the folder you ingested from, or ingest the log again")
    want = pl.Series("line_no", sorted(set(line_nos)), dtype=pl.Int64)
    parts, last = [], cast(int, want.max()) if want.len() else 0  # an Int64 series
    for chunk in iter_chunks(p):
        lo = chunk.first_line_no
        mine = want.filter((want >= lo) & (want < lo + chunk.n_lines))
        if mine.len():
            parts.append(pl.DataFrame({"line_no": mine, "text": chunk.lines.gather(mine - lo)}))
        if lo + chunk.n_lines > last:
            break
    body = pl.concat(parts) if parts else pl.DataFrame(schema={"line_no": pl.Int64, "text": pl.String})
    return body.select(pl.lit(str(p)).alias("path"), "line_no", "text")


def _ends(numbers: list[int], max_lines: int) -> list[int]:
    """All of ``numbers``, or its first and last ``max_lines // 2``: the start and the end of what happened."""
    if len(numbers) <= max_lines:
        return numbers
    half = max(1, max_lines // 2)
    return numbers[:half] + numbers[-half:]


def evidence_lines(spots: list[str], *, max_lines: int = 12) -> pl.DataFrame:
    """The lines of each ``path:first-last`` spot (path, line_no, text), at most ``max_lines`` per spot."""
    frames = []
    for spot in spots:
        path, first, last = parse_spot(spot)
        frames.append(read_lines(path, _ends(list(range(first, last + 1)), max_lines)))
    return pl.concat(frames) if frames else pl.DataFrame(schema=SCHEMA)


def request_lines(store: Store, run: str, instance: str, slot: int, task: int, *,
                  max_lines: int = 12) -> pl.DataFrame:
    """The server's own lines about one request (its start, timings, release, errors; not the other slots'
    lines in between), at most ``max_lines`` of them: the first and the last."""
    con = store.connect(tables=["events"])
    try:
        rows = con.execute("SELECT path, line_no FROM events WHERE run = $run AND instance = $instance "
                           "AND slot = $slot AND task = $task ORDER BY path, line_no",
                           {"run": run, "instance": instance, "slot": slot, "task": task}).fetchall()
    finally:
        con.close()
    frames = []
    for path in dict.fromkeys(r[0] for r in rows):
        frames.append(read_lines(path, _ends([r[1] for r in rows if r[0] == path], max_lines)))
    return pl.concat(frames) if frames else pl.DataFrame(schema=SCHEMA)

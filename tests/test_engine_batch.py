"""Many small files classified in one pass give each file exactly what classifying it alone gives: its events
(columns included), unknown lines, counts, wrappers and carried kind.  Run on every fixture log, real ones
included, in several groupings, so that a continuation, a re-joined line or a wrapper never crosses a file's
edge."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from forensics.ingest import engine_for
from parsers.engine import Carry, ChunkResult
from parsers.reader import iter_chunks

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _first_chunks() -> list[tuple[str, object]]:
    out = []
    logs = sorted([*FIXTURES.glob("logs/*.log"), *FIXTURES.glob("real/*.log"), *FIXTURES.glob("server-runs/*/*.log")])
    for log in logs:
        chunk = next(iter(iter_chunks(log, final=True)), None)
        if chunk is not None:
            out.append((log.relative_to(FIXTURES).as_posix(), chunk))
    return out


CHUNKS = _first_chunks()


def _same(alone: ChunkResult, batched: ChunkResult, name: str) -> None:
    assert_frame_equal(batched.events, alone.events, check_column_order=True), name
    assert_frame_equal(batched.unparsed, alone.unparsed), name
    assert (batched.skipped, batched.parsed, batched.total, batched.lead, batched.last_kind, batched.wrappers_seen) \
        == (alone.skipped, alone.parsed, alone.total, alone.lead, alone.last_kind, alone.wrappers_seen), name
    assert (batched.kind_counts == alone.kind_counts).all(), name


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_files_classified_together_give_what_each_gives_alone(seed: int) -> None:
    eng = engine_for(None)
    alone = {name: eng.classify(ch.lines, ch.first_line_no, Carry()) for name, ch in CHUNKS}
    order = list(CHUNKS)
    random.Random(seed).shuffle(order)
    size = (3, 11, len(order))[seed]
    for at in range(0, len(order), size):
        group = order[at:at + size]
        results = eng.classify_many([ch.lines for _, ch in group], [ch.first_line_no for _, ch in group],
                                    [Carry() for _ in group])
        for (name, _), res in zip(group, results, strict=True):
            _same(alone[name], res, name)


def test_a_carried_kind_continues_only_its_own_file() -> None:
    """The second file's first line is unknown: it continues the multi-line record its own carry names, not the
    first file's last line."""
    eng = engine_for(None)
    import polars as pl

    header = "slot print_timing: id  0 | task 3 | "
    first = pl.Series(["slot launch_slot_: id  0 | task 3 | processing task", header], dtype=pl.String)
    second = pl.Series(["nothing any kind knows", "slot launch_slot_: id  1 | task 4 | processing task"],
                       dtype=pl.String)
    a, b = eng.classify_many([first, second], [1, 1], [Carry(), Carry()])
    assert a.parsed == 2 and b.unparsed["text"].to_list() == ["nothing any kind knows"]
    alone = eng.classify(second, 1, Carry(last_kind="timing_header"))
    _, b2 = eng.classify_many([first, second], [1, 1], [Carry(), Carry(last_kind="timing_header")])
    _same(alone, b2, "carried")

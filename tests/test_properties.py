"""Property-based tests: generated valid logs parse back to their records; arbitrary text never raises."""

from __future__ import annotations

import tempfile
from pathlib import Path

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forensics.ingest import ingest
from forensics.store import Store
from parsers.engine import Carry, Engine
from parsers.spec import load_formats

request = st.fixed_dictionaries({
    "prompt": st.integers(1, 30000),
    "gen": st.integers(1, 8000),
    "prompt_ms": st.floats(0.01, 99999, allow_nan=False).map(lambda x: round(x, 2)),
    "gen_ms": st.floats(0.01, 999999, allow_nan=False).map(lambda x: round(x, 2)),
    "truncated": st.booleans(),
})


def era5_lines(reqs: list[dict], n_slots: int, prefix: bool) -> tuple[str, list[dict]]:
    lines, truth = [], []
    t = 1.0
    task = 0
    for i, r in enumerate(reqs):
        slot = i % n_slots
        task += 1 + (i * 7) % 13  # task ids jump
        def ts(x: float) -> str:
            m, s = divmod(x, 60)
            return f"{int(m)}.{int(s):02d}.{int(s * 1000) % 1000:03d}.{int(s * 1e6) % 1000:03d} I " if prefix else ""
        pre = f"slot print_timing: id {slot:2d} | task {task} | "
        tot = r["prompt_ms"] + r["gen_ms"]
        lines += [
            f"{ts(t)}slot launch_slot_: id {slot:2d} | task {task} | processing task, is_child = 0",
            f"{ts(t)}{pre}prompt eval time = {r['prompt_ms']:10.2f} ms / {r['prompt']:5d} tokens (    0.28 ms per token,  3555.17 tokens per second)",
            f"{ts(t)}{pre}       eval time = {r['gen_ms']:10.2f} ms / {r['gen']:5d} tokens (   44.13 ms per token,    22.66 tokens per second)",
            f"{ts(t)}{pre}      total time = {tot:10.2f} ms / {r['prompt'] + r['gen']:5d} tokens",
            f"{ts(t)}slot      release: id {slot:2d} | task {task} | stop processing: n_tokens = {r['prompt'] + r['gen'] - 1}, truncated = {int(r['truncated'])}",
        ]
        t += 0.5
        truth.append({"slot": slot, "task": task, "prompt_eval_tokens": r["prompt"], "gen_tokens": r["gen"],
                      "prompt_ms": r["prompt_ms"], "gen_ms": r["gen_ms"], "truncated": r["truncated"]})
    return "\n".join(lines) + "\n", truth


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(request, min_size=1, max_size=12), st.integers(1, 8), st.booleans())
def test_generated_logs_parse_back(reqs: list[dict], n_slots: int, prefix: bool) -> None:
    text, truth = era5_lines(reqs, n_slots, prefix)
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "server.log"
        log.write_text(text)
        ingest(Path(d) / "store", [log], run="p")
        s = Store(Path(d) / "store")
        got = s.table("requests").sort("line_first").select(list(truth[0])).to_dicts()
        assert got == truth
        f = s.table("files").row(0, named=True)
        assert (f["lines_total"], f["lines_parsed"], f["lines_unparsed"]) == (5 * len(reqs), 5 * len(reqs), 0)


ENGINES = [Engine(f) for f in load_formats().values()]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=200), max_size=30))
def test_arbitrary_text_never_raises_and_accounting_sums(lines: list[str]) -> None:
    lines = [ln.replace("\n", " ").replace("\r", " ") for ln in lines]
    series = pl.Series(lines, dtype=pl.String)
    for eng in ENGINES:
        res = eng.classify(series, 1, Carry())
        assert res.parsed + sum(res.skipped.values()) + res.unparsed.height == len(lines)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=3000))
def test_arbitrary_bytes_ingest(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "x.log"
        log.write_bytes(b"slot launch_slot_: id  0 | task 1 | processing task\n" + data)
        ingest(Path(d) / "store", [log], run="p", fmt="llama-common")
        f = Store(Path(d) / "store").table("files").row(0, named=True)
        assert f["lines_parsed"] + f["lines_skipped"] + f["lines_unparsed"] == f["lines_total"]

"""Property-based tests: generated valid logs parse back to their records; arbitrary text never raises."""

from __future__ import annotations

import tempfile
from pathlib import Path

import polars as pl
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from forensics.ingest import IngestOptions, ingest
from forensics.store import Store
from parsers.engine import Carry, Engine
from parsers.spec import format_names, grammar

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
        ingest(Path(d) / "store", [log], IngestOptions(run="p"))
        s = Store(Path(d) / "store")
        got = s.table("requests").sort("line_first").select(list(truth[0])).to_dicts()
        assert got == truth
        f = s.table("files").row(0, named=True)
        assert (f["lines_total"], f["lines_parsed"], f["lines_unparsed"]) == (5 * len(reqs), 5 * len(reqs), 0)


ENGINES = [Engine(grammar()), *(Engine(grammar(name)) for name in format_names())]


# Few examples of many lines each: every engine's fixed cost is paid per call, the lines are what vary.
@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(max_size=200), max_size=120))
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
        ingest(Path(d) / "store", [log], IngestOptions(run="p", fmt="llama-common"))
        f = Store(Path(d) / "store").table("files").row(0, named=True)
        assert f["lines_parsed"] + f["lines_skipped"] + f["lines_unparsed"] == f["lines_total"]


def _match_http_one_line_at_a_time(req: pl.DataFrame, http: pl.DataFrame) -> list[tuple[int | None, str | None]]:
    """The FIFO rule written out line by line: the specification the vectorised match_http must meet."""
    out: list[tuple[int | None, str | None]] = [(None, None)] * req.height
    queues: dict[tuple[int, int], list[int]] = {}
    closes = [c if c is not None else last for c, last in zip(req["close_line"], req["line_last"], strict=True)]
    for i in sorted(range(req.height), key=lambda i: closes[i]):  # stable: ties keep frame order
        queues.setdefault((req["ikey"][i], req["instance_no"][i]), []).append(i)
    pos = dict.fromkeys(queues, 0)
    for row in sorted(http.filter(pl.col("method") == "POST").iter_rows(named=True), key=lambda r: r["line_no"]):
        key = (row["ikey"], row["instance_no"])
        q = queues.get(key)
        if q and pos[key] < len(q) and closes[q[pos[key]]] <= row["line_no"]:
            out[q[pos[key]]] = (row["status"], row["http_path"])
            pos[key] += 1
    return out


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_http_lines_tied_first_in_first_out(data: st.DataObject) -> None:
    """match_http ties each POST line to the earliest-closed untied request of its instance, as the rule says."""
    from parsers.assemble import match_http

    n_req = data.draw(st.integers(0, 12))
    n_http = data.draw(st.integers(0, 12))
    inst = st.tuples(st.sampled_from([-1, 8081]), st.integers(1, 2))
    reqs = [data.draw(st.tuples(inst, st.one_of(st.none(), st.integers(0, 60)), st.integers(0, 60)))
            for _ in range(n_req)]
    lines = data.draw(st.lists(st.integers(0, 80), min_size=n_http, max_size=n_http, unique=True))
    https = [data.draw(st.tuples(inst, st.sampled_from(["POST", "GET"]), st.sampled_from([200, 500, 404])))
             for _ in range(n_http)]
    req = pl.DataFrame({"ikey": [r[0][0] for r in reqs], "instance_no": [r[0][1] for r in reqs],
                        "close_line": [r[1] for r in reqs], "line_last": [r[2] for r in reqs]},
                       schema={"ikey": pl.Int64, "instance_no": pl.Int64, "close_line": pl.Int64,
                               "line_last": pl.Int64})
    http = pl.DataFrame({"ikey": [h[0][0] for h in https], "instance_no": [h[0][1] for h in https],
                         "line_no": lines, "method": [h[1] for h in https], "status": [h[2] for h in https],
                         "http_path": [f"/p{i}" for i in range(n_http)]},
                        schema={"ikey": pl.Int64, "instance_no": pl.Int64, "line_no": pl.Int64,
                                "method": pl.String, "status": pl.Int64, "http_path": pl.String})
    got = match_http(req, http)
    assert got.height == req.height
    assert list(zip(got["http_status"], got["http_path"], strict=True)) == _match_http_one_line_at_a_time(req, http)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=30),
       st.lists(st.booleans(), max_size=30))
@example([b"a\xcd", b"\x80b"], [])  # a character cut by a newline: valid UTF-8 only across the two lines
def test_lines_split_like_the_text_reading_of_them(lines: list[bytes], crlf: list[bool]) -> None:
    """The bytes-to-lines split (newlines and a CR before one cut out in bulk) gives exactly the lines a text
    reader gives: invalid UTF-8 replaced, a leading CR kept."""
    import numpy as np

    from parsers.reader import _to_series

    if not lines:
        return
    block = b"".join(ln + (b"\r\n" if i < len(crlf) and crlf[i] else b"\n") for i, ln in enumerate(lines))
    nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
    expected = [p[:-1] if p.endswith("\r") else p for p in block.decode("utf-8", errors="replace").split("\n")[:-1]]
    assert _to_series(block, nl).to_list() == expected

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


def _in_flight_closes(req: pl.DataFrame, http: pl.DataFrame, closes: list[int]) -> list[int]:
    """A request's end for the FIFO rule moves up to the first POST line (status < 400) printed while it was the
    only request of its instance in flight, written out line by line."""
    if "line_first" not in req.columns:
        return closes
    out = list(closes)
    began = list(req["line_first"])
    if "slot" in req.columns:  # a slot's first request whose start the text does not show was in flight from the top
        for i in range(req.height):
            same = [j for j in range(req.height) if (req["ikey"][j], req["instance_no"][j], req["slot"][j])
                    == (req["ikey"][i], req["instance_no"][i], req["slot"][i])]
            first = min(same, key=lambda j: (req["line_first"][j], j))
            if req["start_line"][i] is None and req["slot"][i] is not None and first == i:
                began[i] = 0
    posts = http.filter((pl.col("method") == "POST") & (pl.col("status") < 400)).sort("line_no")
    for row in posts.iter_rows(named=True):
        h, key = row["line_no"], (row["ikey"], row["instance_no"])
        live = [i for i in range(req.height) if (req["ikey"][i], req["instance_no"][i]) == key
                and began[i] <= h <= closes[i]]
        if len(live) == 1:
            out[live[0]] = min(out[live[0]], h)
    return out


def _match_http_one_line_at_a_time(req: pl.DataFrame, http: pl.DataFrame) -> list[tuple[int | None, str | None]]:
    """The FIFO rule written out line by line: the specification the vectorised match_http must meet."""
    out: list[tuple[int | None, str | None]] = [(None, None)] * req.height
    queues: dict[tuple[int, int], list[int]] = {}
    closes = [c if c is not None else last for c, last in zip(req["close_line"], req["line_last"], strict=True)]
    closes = _in_flight_closes(req, http, closes)
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
@given(st.data(), st.booleans())
def test_http_lines_tied_first_in_first_out(data: st.DataObject, spans: bool) -> None:
    """match_http ties each POST line to the earliest-ended untied request of its instance, as the rule says; with
    the requests' first lines known, a request alone in flight at a POST line has ended there."""
    from parsers.assemble import match_http

    n_req = data.draw(st.integers(0, 12))
    n_http = data.draw(st.integers(0, 12))
    inst = st.tuples(st.sampled_from([-1, 8081]), st.integers(1, 2))
    reqs = [data.draw(st.tuples(inst, st.one_of(st.none(), st.integers(0, 60)), st.integers(0, 60)))
            for _ in range(n_req)]
    firsts = [data.draw(st.integers(0, min(c if c is not None else last, last))) for _, c, last in reqs]
    lines = data.draw(st.lists(st.integers(0, 80), min_size=n_http, max_size=n_http, unique=True))
    https = [data.draw(st.tuples(inst, st.sampled_from(["POST", "GET"]), st.sampled_from([200, 500, 404])))
             for _ in range(n_http)]
    req = pl.DataFrame({"ikey": [r[0][0] for r in reqs], "instance_no": [r[0][1] for r in reqs],
                        "close_line": [r[1] for r in reqs], "line_last": [r[2] for r in reqs]},
                       schema={"ikey": pl.Int64, "instance_no": pl.Int64, "close_line": pl.Int64,
                               "line_last": pl.Int64})
    if spans:
        starts = [data.draw(st.one_of(st.none(), st.just(f))) for f in firsts]
        req = req.with_columns(pl.Series("line_first", firsts, dtype=pl.Int64),
                               pl.Series("start_line", starts, dtype=pl.Int64),
                               pl.Series("slot", [data.draw(st.one_of(st.none(), st.integers(0, 2))) for _ in reqs],
                                         dtype=pl.Int64))
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


# ------------------------------------------------------------------ forks, wrappers and derived facts

def _read_lines(lines: list[str]) -> Store:
    d = Path(tempfile.mkdtemp())
    log = d / "server.log"
    log.write_text("\n".join(lines) + "\n")
    ingest(d / "store", [log], IngestOptions(run="p"))
    return Store(d / "store")


kobold_request = st.fixed_dictionaries({
    "prompt": st.integers(1, 4000), "cap": st.integers(1, 512), "gen": st.integers(1, 512), "eos": st.booleans(),
    "summary": st.booleans()})


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(kobold_request, min_size=1, max_size=6))
def test_koboldcpp_console_parses_back(reqs: list[dict]) -> None:
    """koboldcpp: one request per Processing Prompt, its progress lines giving the count and the cap, EOS or the
    cap ending it, closed by its summary line when there is one."""
    lines, truth = [], []
    for r in reqs:
        gen = min(r["gen"], r["cap"])
        lines.append(f"Processing Prompt [BLAS] ({r['prompt']} / {r['prompt']} tokens)")
        lines += [f"Generating ({k} / {r['cap']} tokens)" for k in range(1, gen + 1, max(1, gen // 4))]
        lines.append(f"Generating ({gen} / {r['cap']} tokens)")
        if r["eos"] and gen < r["cap"]:
            lines.append("(EOS token triggered! ID:2)")
        if r["summary"]:
            lines.append(f"CtxLimit:{r['prompt'] + gen}/8192, Amt:{gen}/{r['cap']}, Init:0.00s, Process:0.21s "
                         f"(1.6ms/T = 626.82T/s), Generate:5.24s (43.7ms/T = 22.89T/s), Total:5.45s (22.01T/s)")
        # without EOS or a summary the text does not show the end (the count may stand at the cap even so)
        stop = "eos" if r["eos"] and gen < r["cap"] else ("limit" if gen == r["cap"] else "eos") if r["summary"] \
            else "unknown"
        truth.append((gen, r["cap"], stop))
    got = _read_lines(lines).table("requests").sort("line_first").select("gen_tokens", "n_predict", "stop_reason")
    assert got.rows() == truth


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 5000), st.integers(0, 2000),
                          st.sampled_from([200, 500]), st.booleans()), min_size=1, max_size=6))
def test_llama_box_requests_parse_back(reqs: list[tuple[int, int, int, int, bool]]) -> None:
    """llama-box: one request per rid, however the requests' lines interleave; a GET is no request."""
    opened, closed = [], []
    for i, (prompt, cached, gen, status, _) in enumerate(reqs):
        rid = 86116693555 + i
        opened.append(f"0.53.732.880 I srv        log_server_request: rid {rid} | POST /v1/chat/completions 10.0.0.1:5{i}")
        closed += [f"0.58.478.926 I srv oaicompat_completions_res: rid {rid} | prompt_tokens: {prompt}, "
                   f"prompt_cached_tokens: {min(cached, prompt)}, completion_tokens: {gen}, ttft: 35.47ms",
                   f"0.58.479.225 I srv       log_server_response: rid {rid} | POST /v1/chat/completions "
                   f"10.0.0.1:5{i} | status {status} | cost 4.75s"]
    lines = ["0.35.340.664 I srv       log_server_response: rid 1 | GET /v1/models 10.0.0.1:42186 | status 200 | cost 0.00s"]
    together = [r[4] for r in reqs]
    for i in range(len(reqs)):  # all opened first, or each opened and closed in turn
        lines += [opened[i]] if together[0] else [opened[i], *closed[2 * i:2 * i + 2]]
    if together[0]:
        lines += closed
    got = _read_lines(lines).table("requests").sort("task").select(
        "prompt_tokens", "cached_tokens", "gen_tokens", "http_status")
    assert got.rows() == [(p, min(c, p), g, s) for p, c, g, s, _ in reqs]


WRAPPERS = [
    lambda line: f"2026-05-06 21:12:56.159 [Info] (Process) {line}",
    lambda line: f"[2026-07-10][00:14:48][tauri_plugin_llamacpp::router][INFO] [llamacpp-router stdout] {line}",
    lambda line: f"[llama-swap] {line}",
    lambda line: f"....................{line}",
    lambda line: f"- {line}",
    lambda line: f"2026-06-20 19:21:54.976 - {line}",
    lambda line: f"GRPC(m-127.0.0.1:55300): stderr {line}",
    lambda line: f"Sep 11 00:04:26   ollama[]: {line}",
]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(request, min_size=1, max_size=4), st.integers(1, 4), st.booleans(),
       st.sampled_from(range(len(WRAPPERS))))
def test_wrapped_lines_parse_as_they_do_bare(reqs: list[dict], n_slots: int, prefix: bool, which: int) -> None:
    """A wrapper changes nothing of what its lines say: the requests of a wrapped log are those of the bare one."""
    text, truth = era5_lines(reqs, n_slots, prefix)
    lines = [WRAPPERS[which](line) for line in text.splitlines()]
    got = _read_lines(lines).table("requests").sort("line_first").select(list(truth[0])).to_dicts()
    assert got == truth


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.just(-1), st.integers(1, 8000)), st.integers(1, 30))
def test_the_cap_is_the_progress_lines_decoded_plus_remaining(cap: int, n: int) -> None:
    """However many progress lines a request prints, n_decoded + n_remaining is its cap (-1: none; a count past
    the cap, whose remaining stays 0, is the cap the request ran under)."""
    lines = ["slot launch_slot_: id  0 | task 3 | processing task"]
    for k in range(1, n + 1):
        rem = -1 if cap == -1 else max(cap - k, 0)
        lines.append(f"slot process_toke: id  0 | task 3 | n_decoded = {k}, n_remaining = {rem}, next token: 450 ' x'")
    expected = -1 if cap == -1 else max(cap, n)
    got = _read_lines(lines).table("requests")["n_predict"].to_list()
    assert got == [expected]

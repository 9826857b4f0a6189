"""Replay records: canonical loading, items, bad records, mapping files (foreign layout and the shipped
vLLM / GuideLLM / AIPerf mappings), and the ``runs`` / ``missing`` listings and commands."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pytest

from forensics import replay
from forensics.errors import MappingError
from forensics.replay import tables as replay_tables
from tests.replay_helpers import FIX, ms_records, ms_store

UTC = timezone.utc


def test_detect_by_content_not_name(tmp_path: Path) -> None:
    assert replay.detect(FIX / "multistage" / "manifest.json") == "manifest"
    assert replay.detect(FIX / "multistage" / "attempts.jsonl") == "attempts"
    assert replay.detect(FIX / "foreign" / "run-ms.csv") is None
    renamed = tmp_path / "whatever.log"
    renamed.write_bytes((FIX / "multistage" / "attempts.jsonl").read_bytes())
    assert replay.detect(renamed) == "attempts"
    other = tmp_path / "x.json"
    other.write_text('{"run_id": "r", "note": "no items, stages, servers or concurrency"}')
    assert replay.detect(other) is None


def test_canonical_run_loads_runs_and_attempts() -> None:
    recs = ms_records()
    assert recs.errors == []
    run = recs.runs.row(0, named=True)
    assert (run["run"], run["concurrency"], run["items_expected"], run["ended_how"], run["ended_detail"]) == (
        "run-ms", 2, 5, "completed", "after 66 s")
    assert run["started_at"] == datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
    assert json.loads(run["stages"]) == ["extract", "summarize"]
    assert json.loads(run["config"]) == {"max_tokens": 4096, "max_attempts": 2, "budgets": {"max_request_s": 30}}
    assert recs.attempts.height == 9
    ms = recs.attempts.filter((pl.col("item") == "MSFT") & (pl.col("stage") == "summarize")).row(0, named=True)
    assert (ms["outcome"], ms["id_slot"], ms["tokens_predicted"], ms["truncated"], ms["predicted_ms"],
            ms["source_line"]) == ("parse_error", 0, 512, True, 2700.0, 6)


def test_items_one_row_per_expected_item_and_stage() -> None:
    recs = ms_records()
    items = replay.build_items(recs.runs, recs.attempts)
    got = {(r["item"], r["stage"]): (r["attempts"], r["outcome"], r["done"]) for r in items.iter_rows(named=True)}
    assert got == {
        ("AAPL", "extract"): (1, "ok", True), ("AAPL", "summarize"): (1, "ok", True),
        ("MSFT", "extract"): (2, "ok", True), ("MSFT", "summarize"): (1, "parse_error", False),
        ("NVDA", "extract"): (2, "timeout", False), ("NVDA", "summarize"): (0, "never_attempted", False),
        ("TSLA", "extract"): (1, "ok", True), ("TSLA", "summarize"): (1, "failed", False),
        ("AMZN", "extract"): (0, "never_attempted", False), ("AMZN", "summarize"): (0, "never_attempted", False),
    }
    # without a manifest each stage applies to the items sent to it: AMZN is not known to be missing; NVDA,
    # whose extract timed out and which went no further, is expected in summarize, the stage after
    no_manifest = replay.build_items(recs.runs.clear(), recs.attempts)
    assert no_manifest.height == 8
    assert "AMZN" not in no_manifest["item"].to_list()
    assert ("NVDA", "summarize", "never_attempted") in set(no_manifest.select("item", "stage", "outcome").rows())


def test_bad_records_name_file_line_and_field_and_good_ones_load() -> None:
    path = FIX / "bad" / "attempts.jsonl"
    recs = replay.load(path)
    p = str(path)
    assert [e.one_line() for e in recs.errors] == [
        f"{p}:2: stage: missing required field",
        f"{p}:3: attempt: 'two' is not of type integer",
        f"{p}:5: attempt: duplicate attempt 1 of AAPL/extract in run run-bad (first at {p}:1); kept the first",
        f"{p}:6: not valid JSON: Expecting ',' delimiter",
        f"{p}:7: started_at: '2026-03-04T10:00:00' has no UTC offset "
        "(write e.g. 2026-03-04T10:00:00Z or 2026-03-04T10:00:00+02:00)",
        f"{p}:8: timings.prompt_ms: 'slow' is not of type number or null",
        f"{p}:10: ended_at: ends before started_at",
    ]
    # a word the schema does not list is read as the one it surely means, and said once
    assert recs.attempts.select("item", "attempt", "outcome", "source_line").rows() == [
        ("AAPL", 1, "ok", 1), ("TSLA", 1, "ok", 4), ("ORCL", 2, "ok", 9)]
    assert recs.notes == [f"{p}: outcome 'success' read as 'ok' (1 record)"]


def test_foreign_layout_through_a_mapping_gives_the_canonical_tables() -> None:
    canon = ms_records()
    foreign = replay.load([FIX / "foreign" / "run-ms.run.json", FIX / "foreign" / "run-ms.csv"],
                          mapping=FIX / "foreign" / "harness.toml")
    assert foreign.errors == []
    drop = ["source", "source_line"]
    assert foreign.attempts.drop(drop).equals(canon.attempts.drop(drop))
    assert foreign.runs.drop("source", "servers").equals(canon.runs.drop("source", "servers"))
    s_f, s_c = json.loads(foreign.runs["servers"][0]), json.loads(canon.runs["servers"][0])
    assert [{k: v for k, v in s.items() if k != "log_path"} for s in s_f] == \
        [{k: v for k, v in s.items() if k != "log_path"} for s in s_c]


def test_mapping_naming_a_missing_field_is_a_clear_error(tmp_path: Path) -> None:
    text = (FIX / "foreign" / "harness.toml").read_text().replace('item = "ticker"', 'item = "symbol"')
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    data = FIX / "foreign" / "run-ms.csv"
    with pytest.raises(MappingError) as exc:
        replay.load([data], mapping=bad)
    line = exc.value.one_line()
    assert line.startswith(f"{bad}: [attempts.fields] item = 'symbol': no such field in {data} (fields there: ")
    assert "ticker" in line


def test_mapping_file_errors(tmp_path: Path) -> None:
    m = tmp_path / "m.toml"
    m.write_text('[attempts.fields]\nticker = "x"\n')
    with pytest.raises(MappingError, match=r"\[attempts.fields\] ticker is not a canonical attempts field"):
        replay.load_mapping(m)
    m.write_text('[attempts.fields]\nstarted_at = { path = "t", unit = "minutes" }\n')
    with pytest.raises(MappingError, match="unit 'minutes' does not apply"):
        replay.load_mapping(m)
    with pytest.raises(MappingError, match="cannot read mapping"):
        replay.load_mapping(tmp_path / "absent.toml")


def test_vllm_bench_parallel_arrays(tmp_path: Path) -> None:
    recs = replay.load(FIX / "tools" / "vllm-bench-qwen-c2.json", mapping="vllm-bench")
    assert recs.errors == []
    assert recs.runs.select("run", "concurrency", "model", "summary_requests", "summary_failed").row(0) == (
        "vllm-bench-qwen-c2", 2, "qwen2.5-7b", 4, 1)
    assert recs.attempts.select("item", "tokens_evaluated", "tokens_predicted", "outcome", "error", "http_status",
                                "ttft_ms", "itl_ms").rows() == [
        ("0", 150, 100, "ok", None, 200, 110.0, 30.0), ("1", 160, 120, "ok", None, 200, 120.0, 30.0),
        ("2", 140, 110, "ok", None, 200, 130.0, 30.0),
        ("3", 160, 0, "failed", "Bad Request: context length exceeded", None, 0.0, None)]
    # start_times are time.perf_counter() readings: without an anchor they give no wall-clock time
    assert recs.attempts["started_at"].null_count() == 4
    # anchored at the run manifest's start: 95731.125 is the earliest reading, 95731.375 comes 0.25 s later
    run = tmp_path / "vllm-bench-qwen-c2"
    run.mkdir()
    (run / "result.json").write_bytes((FIX / "tools" / "vllm-bench-qwen-c2.json").read_bytes())
    (run / "manifest.json").write_text(json.dumps({"run_id": "result", "started_at": "2026-03-02T10:15:00Z",
                                                   "concurrency": 2}))
    anchored = replay.load([run / "manifest.json", run / "result.json"], mapping="vllm-bench")
    assert anchored.attempts["started_at"].to_list() == [
        datetime(2026, 3, 2, 10, 15, 0, tzinfo=UTC), datetime(2026, 3, 2, 10, 15, 0, 250000, tzinfo=UTC),
        datetime(2026, 3, 2, 10, 15, 3, 500000, tzinfo=UTC), datetime(2026, 3, 2, 10, 15, 4, tzinfo=UTC)]


def test_guidellm_benchmarks_json() -> None:
    recs = replay.load(FIX / "tools" / "guidellm-benchmarks.json", mapping="guidellm")
    assert recs.errors == []
    assert recs.runs.select("run", "concurrency").row(0) == ("guidellm-benchmarks", 2)
    assert recs.attempts.select("item", "outcome", "tokens_evaluated", "tokens_predicted", "error").rows() == [
        ("a1", "ok", 200, 64, None), ("a2", "ok", 210, 80, None),
        ("a3", "failed", 220, None, "HTTP 500: context size exceeded"), ("a4", "cancelled", 230, 12, "cancelled")]
    a2 = recs.attempts.row(1, named=True)
    assert (a2["started_at"], a2["ended_at"]) == (datetime(2026, 3, 2, 10, 20, 0, 100000, tzinfo=UTC),
                                                  datetime(2026, 3, 2, 10, 20, 3, 100000, tzinfo=UTC))


def test_aiperf_profile_export() -> None:
    recs = replay.load(FIX / "tools" / "aiperf-run-c4" / "profile_export.jsonl", mapping="aiperf")
    assert recs.errors == []
    assert recs.attempts.select("run", "item", "http_status", "outcome", "tokens_evaluated", "tokens_predicted",
                                "source_line").rows() == [
        ("aiperf-run-c4", "7609a2e7", 200, "ok", 550, 90, 1),
        # 499 is AIPerf's own code for a request it cancelled: the server sent no status
        ("aiperf-run-c4", "c35e4b1b", None, "cancelled", 550, None, 2),
        ("aiperf-run-c4", "9a1f0c22", 500, "failed", 600, None, 3)]
    first = recs.attempts.row(0, named=True)
    # 1772447100000000000 ns = 10:25:00; request_end_ns 1.5 s later
    assert (first["started_at"], first["ended_at"]) == (datetime(2026, 3, 2, 10, 25, tzinfo=UTC),
                                                        datetime(2026, 3, 2, 10, 25, 1, 500000, tzinfo=UTC))


MISSING = [
    ("AMZN", "extract", "never_attempted", "no attempt was made", ""),
    ("AMZN", "summarize", "never_attempted", "earlier stage extract not done", ""),
    ("MSFT", "summarize", "parse_error", "JSON decode error: unterminated string (attempts: 1)",
     "main slot 0 task 6: 210 prompt + 512 generated tokens, truncated, stop limit [main.log:53-60]"),
    # last attempt ended 10:01:05.4; the server request ran to 10:01:20.5 -> 15.1 s more
    ("NVDA", "extract", "timeout", "client gave up after 30.0 s: read timeout after 30 s (attempts: 2)",
     "server kept generating: main slot 1 for 15.1 s after the client gave up (4096 tokens, stop limit) "
     "[main.log:67-80]"),
    ("NVDA", "summarize", "never_attempted", "earlier stage extract not done", ""),
    ("TSLA", "summarize", "http_error", "HTTP 503: server busy (attempts: 1)",
     "rejected before a slot: no slot request in the log"),
]


def test_missing_explains_every_missing_item(tmp_path: Path) -> None:
    store = ms_store(tmp_path / "store")
    df = replay_tables.missing(store, "run-ms")
    assert df.columns == ["item", "stage", "reason", "detail", "evidence"]
    assert df.rows() == MISSING


def test_runs_listing(tmp_path: Path) -> None:
    store = ms_store(tmp_path / "store")
    assert replay_tables.runs_table(store).rows(named=True) == [{
        "run": "run-ms", "alias": None, "np": 2, "items_expected": 5, "items_done": 1, "items_missing": 4,
        "attempts": 9, "requests": 8, "wall_s": 66.0, "ended": "completed (after 66 s)", "from": "records"}]


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from forensics.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def test_cli_runs_and_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ms_store(tmp_path / "store")
    code, out, err = _main(["runs", "--store", str(tmp_path / "store"), "--format", "csv"], capsys)
    assert (code, err) == (0, "")
    assert out == ("run,alias,np,items_expected,items_done,items_missing,attempts,requests,wall_s,ended,from\n"
                   "run-ms,,2,5,1,4,9,8,66.0,completed (after 66 s),records\n")
    code, out, _ = _main(["missing", "run-ms", "--store", str(tmp_path / "store"), "--format", "json"], capsys)
    assert code == 0
    assert [tuple(r.values()) for r in json.loads(out)] == MISSING
    code, out, err = _main(["missing", "run-42", "--store", str(tmp_path / "store")], capsys)
    assert (code, out) == (2, "")
    assert err == "forensics: error: no run 'run-42' in the store (runs: run-ms)\n"

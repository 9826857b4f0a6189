"""Mappings that compute: SQL expressions over a record's fields, ``where`` filters, null as a value,
relative clocks anchored to a wall-clock field or the manifest, several runs in one file, and a mapping
that rejects every record."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics import replay
from forensics.cli import cli
from forensics.errors import MappingError
from tests.replay_helpers import FIX

UTC = timezone.utc

# A harness that logs one JSON line per request: the outcome takes the HTTP status, the client's timeout
# flag and whether the output parsed; a warm-up request is in the file too.
LINES = [
    {"job": "AAPL", "phase": "extract", "t0": 1772445600.0, "t1": 1772445601.5, "http": 200, "parsed": True,
     "timed_out": False, "msg": None, "warmup": False},
    {"job": "MSFT", "phase": "extract", "t0": 1772445600.2, "t1": 1772445600.4, "http": 500, "parsed": False,
     "timed_out": False, "msg": "context exceeded", "warmup": False},
    {"job": "NVDA", "phase": "extract", "t0": 1772445600.3, "t1": 1772445630.3, "http": None, "parsed": False,
     "timed_out": True, "msg": "read timeout", "warmup": False},
    {"job": "TSLA", "phase": "extract", "t0": 1772445601.0, "t1": 1772445604.0, "http": 200, "parsed": False,
     "timed_out": False, "msg": "bad JSON", "warmup": False},
    {"job": "-", "phase": "extract", "t0": 1772445599.0, "t1": 1772445599.5, "http": 200, "parsed": True,
     "timed_out": False, "msg": None, "warmup": True},
]
MAPPING = """
[attempts]
where = "NOT warmup"
[attempts.fields]
item = "job"
stage = "phase"
started_at = { path = "t0", unit = "epoch_s" }
ended_at = { path = "t1", unit = "epoch_s" }
latency_ms = { sql = "(t1 - t0) * 1000" }
outcome = { sql = "CASE WHEN timed_out THEN 'timeout' WHEN http >= 400 THEN 'failed' WHEN NOT parsed THEN 'parse_error' ELSE 'ok' END" }
http_status = { path = "http", map = { "500" = 503 } }
error = { path = "msg", default = "$null" }
[attempts.set]
run_id = "night"
server = "$null"
"""


def _write(tmp_path: Path, mapping: str = MAPPING, lines: list[dict] | None = None) -> tuple[Path, Path]:
    data = tmp_path / "requests.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in (LINES if lines is None else lines)))
    m = tmp_path / "m.toml"
    m.write_text(mapping)
    return data, m


def test_outcome_from_status_timeout_and_parse_flag_and_latency_from_two_times(tmp_path: Path) -> None:
    data, m = _write(tmp_path)
    recs = replay.load(data, mapping=m)
    assert recs.errors == []
    assert recs.attempts.select("item", "outcome", "http_status", "error", "latency_ms", "server").rows() == [
        ("AAPL", "ok", 200, None, 1500.0, None),
        ("MSFT", "failed", 503, "context exceeded", pytest.approx(200.0), None),
        ("NVDA", "timeout", None, "read timeout", 30000.0, None),
        ("TSLA", "parse_error", 200, "bad JSON", 3000.0, None)]


def test_where_leaves_out_records_and_ingest_says_how_many(tmp_path: Path) -> None:
    data, m = _write(tmp_path)
    res = CliRunner().invoke(cli, ["ingest", str(data), "--mapping", str(m), "--store", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert f"ingested  {data}  records:mapped  where left out 1 of 5 records\n" in res.stderr


def test_expressions_read_a_missing_field_as_null_and_name_a_field_no_record_has(tmp_path: Path) -> None:
    # `cancelled` is in no line: null, so the CASE goes on; `http` alone decides
    text = MAPPING.replace("WHEN timed_out", "WHEN cancelled THEN 'cancelled' WHEN timed_out")
    data, m = _write(tmp_path, text)
    assert replay.load(data, mapping=m).attempts["outcome"].to_list() == ["ok", "failed", "timeout", "parse_error"]
    # an expression none of whose fields any record has reads nothing from this file: the mapping is wrong
    data, m = _write(tmp_path, MAPPING.replace('latency_ms = { sql = "(t1 - t0) * 1000" }',
                                               'latency_ms = { sql = "(t_end - t_start) * 1000" }'))
    with pytest.raises(MappingError) as exc:
        replay.load(data, mapping=m)
    assert exc.value.one_line() == (
        f"{m}: [attempts.fields] latency_ms: no record of {data} has t_end, t_start (fields there: http, job, msg, "
        "parsed, phase, t0, t1, timed_out, warmup; optional = true reads them as null)")


@pytest.mark.parametrize(("sql", "message"), [
    ("CASE WHEN http >= 400 THEN 'failed'", "not a SQL expression: syntax error at or near"),
    ("job, phase", "not a SQL expression: write one SQL expression (no commas at the top level, no FROM or WHERE)"),
])
def test_a_bad_expression_fails_when_the_mapping_loads(tmp_path: Path, sql: str, message: str) -> None:
    m = tmp_path / "m.toml"
    m.write_text(f'[attempts.fields]\noutcome = {{ sql = "{sql}" }}\n')
    with pytest.raises(MappingError) as exc:
        replay.load_mapping(m)
    assert exc.value.one_line().startswith(f"{m}: [attempts.fields] outcome: {message}")


def test_an_expression_duckdb_rejects_on_the_data_names_its_field(tmp_path: Path) -> None:
    data, m = _write(tmp_path, MAPPING.replace("(t1 - t0) * 1000", "t1 - job"))
    with pytest.raises(MappingError) as exc:
        replay.load(data, mapping=m)
    line = exc.value.one_line()
    assert line.startswith(f"{m}: [attempts] latency_ms: ")
    assert line.endswith(f"(reading {data}) (fix the expression; DuckDB SQL over the record's fields)")


def test_a_mapping_that_rejects_every_record_is_one_error_with_three_reasons(tmp_path: Path) -> None:
    text = "\n".join(line if not line.startswith("outcome") else "outcome = { sql = \"NULL\" }"
                     for line in MAPPING.splitlines())
    data, m = _write(tmp_path, text)
    with pytest.raises(MappingError) as exc:
        replay.load(data, mapping=m)
    reason = "outcome: missing required field"
    assert exc.value.one_line() == (f"{data}: all 4 records rejected (first: line 1: {reason}; line 2: {reason}; "
                                    f"line 3: {reason}) (fix the mapping's fields)")
    res = CliRunner().invoke(cli, ["ingest", str(data), "--mapping", str(m), "--store", str(tmp_path / "s")])
    assert res.exit_code == 2
    assert res.stderr.count("missing required field") == 3  # one line for the file, not one per record
    assert res.stderr.splitlines()[-1] == (
        "forensics: error: the mapping read nothing from the 1 file it names (see the errors above; the other files "
        "were ingested)")


def test_monotonic_nanoseconds_anchored_to_a_wall_clock_field(tmp_path: Path) -> None:
    """A harness that keeps time.monotonic_ns() per request and the wall-clock start of the run once, at the
    top of its file (``$doc.``: a field of the document the records are in)."""
    doc = {"started_unix": 1772445600.5, "requests": [
        {"id": "a", "sent_ns": 5_000_000_000_000, "done_ns": 5_001_250_000_000},
        {"id": "b", "sent_ns": 5_000_400_000_000, "done_ns": 5_000_900_000_000}]}
    data = tmp_path / "run.json"
    data.write_text(json.dumps(doc))
    m = tmp_path / "m.toml"
    m.write_text("""
[attempts]
path = "requests"
anchor = { path = "$doc.started_unix", unit = "epoch_s" }
[attempts.fields]
item = "id"
started_at = { path = "sent_ns", unit = "mono_ns" }
ended_at = { path = "done_ns", unit = "mono_ns" }
[attempts.set]
run_id = "r"
stage = "s"
outcome = "ok"
""")
    recs = replay.load(data, mapping=m)
    # the earliest reading (a's send) is the anchor; every other keeps its distance from it
    assert recs.attempts.select("item", "started_at", "ended_at").rows() == [
        ("a", datetime(2026, 3, 2, 10, 0, 0, 500000, tzinfo=UTC), datetime(2026, 3, 2, 10, 0, 1, 750000, tzinfo=UTC)),
        ("b", datetime(2026, 3, 2, 10, 0, 0, 900000, tzinfo=UTC), datetime(2026, 3, 2, 10, 0, 1, 400000, tzinfo=UTC))]


def test_several_runs_in_one_file_each_get_their_own_id(tmp_path: Path) -> None:
    """A GuideLLM sweep: one benchmark per rate, each a run ({stem}#1, #2) with its own requests."""
    doc = json.loads((FIX / "real" / "guidellm" / "benchmarks_stripped.json").read_text())
    second = json.loads(json.dumps(doc["benchmarks"][0]))
    second["args"]["strategy"] = {"type_": "concurrent", "streams": 8}
    second["requests"]["successful"][0]["request_id"] = "second"
    doc["benchmarks"].append(second)
    data = tmp_path / "sweep.json"
    data.write_text(json.dumps(doc))
    recs = replay.load(data, mapping="guidellm")
    assert recs.runs.select("run", "concurrency").rows() == [("sweep#1", 1), ("sweep#2", 8)]
    assert recs.attempts.select("run", "item").rows() == [
        ("sweep#1", "73054dd1-486f-4894-a861-075750b82453"), ("sweep#2", "second")]


def test_csv_cells_are_numbers_in_expressions(tmp_path: Path) -> None:
    data = tmp_path / "r.csv"
    data.write_text("ticker,code,ms\nAAPL,200,1500\nMSFT,503,\nNVDA,99,20\n")
    m = tmp_path / "m.toml"
    m.write_text("""
[attempts.fields]
item = "ticker"
outcome = { sql = "CASE WHEN code >= 400 THEN 'failed' ELSE 'ok' END" }
latency_ms = { sql = "coalesce(ms, -1) + 0.5" }
[attempts.set]
run_id = "r"
stage = "s"
""")
    recs = replay.load(data, mapping=m)
    assert [e.one_line() for e in recs.errors] == [f"{data}:3: latency_ms: -0.5 is less than the minimum of 0"]
    # as strings '99' >= '400' would hold: the cells are compared as numbers
    assert recs.attempts.select("item", "outcome", "latency_ms").rows() == [("AAPL", "ok", 1500.5),
                                                                              ("NVDA", "ok", 20.5)]


def test_null_as_a_value_in_set_map_and_default(tmp_path: Path) -> None:
    data, m = _write(tmp_path, MAPPING.replace('map = { "500" = 503 }', 'map = { "500" = "$null" }'))
    recs = replay.load(data, mapping=m)
    assert recs.attempts["http_status"].to_list() == [200, None, None, 200]
    assert recs.attempts["server"].null_count() == 4


def test_relative_times_without_an_anchor_are_left_empty_and_said_so(tmp_path: Path) -> None:
    data = tmp_path / "vllm.json"
    data.write_bytes((FIX / "tools" / "vllm-bench-qwen-c2.json").read_bytes())
    res = CliRunner().invoke(cli, ["ingest", str(data), "--mapping", "vllm-bench", "--store", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert (f"warning: {data}: times on a relative clock and no wall-clock anchor for them (anchor = "
            "benchmark_start_time_unix, manifest: none found): started_at and ended_at left empty, the times kept on "
            "their own clock (started_rel_s, ended_rel_s), which throughput, latency and concurrency use\n") in res.stderr
    # vLLM's fork that writes benchmark_start_time_unix: its start_times are anchored there
    doc = json.loads(data.read_text())
    doc["benchmark_start_time_unix"] = 1772446500.0
    data.write_text(json.dumps(doc))
    recs = replay.load(data, mapping="vllm-bench")
    assert recs.attempts["started_at"].to_list()[:2] == [datetime(2026, 3, 2, 10, 15, tzinfo=UTC),
                                                         datetime(2026, 3, 2, 10, 15, 0, 250000, tzinfo=UTC)]
    assert recs.runs["started_at"][0] == datetime(2026, 3, 2, 10, 15, tzinfo=UTC)

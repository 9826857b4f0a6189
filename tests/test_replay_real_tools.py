"""The shipped mappings read real output files of the peer benchmark tools exactly.

Every file under fixtures/replay/real/<tool>/ was committed by someone in a public repository; its
``.provenance.toml`` says where from and lists facts counted by hand (requests, failures, token sums, the
first request's start and its unit, the first TTFT and latency and their units, the concurrency).  Those
facts are the expected values here.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from forensics import replay
from forensics.cli import cli
from tests.replay_helpers import FIX

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REAL = FIX / "real"
MAPPING = {"vllm": "vllm-bench", "guidellm": "guidellm", "aiperf": "aiperf", "llmperf": "llmperf", "sglang": "sglang",
           "inference-perf": "inference-perf", "genai-bench": "genai-bench", "trtllm-bench": "trtllm-bench",
           "genai-perf": "genai-perf"}
FILES = sorted(p.with_name(p.name.removesuffix(".provenance.toml")) for p in REAL.rglob("*.provenance.toml"))
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
TO_MS = {"s": 1000.0, "ms": 1.0}


def facts(path: Path) -> dict:
    return tomllib.loads(path.with_name(path.name + ".provenance.toml").read_text())["facts"]


def tool(path: Path) -> str:
    return path.relative_to(REAL).parts[0]


def wall(value: str, unit: str) -> datetime:
    """The provenance's first start as a time, computed from its text (microseconds, like the store)."""
    if unit == "epoch_ns":
        return EPOCH + timedelta(microseconds=int(value) // 1000)
    assert unit == "epoch_s"
    return EPOCH + timedelta(microseconds=int((Decimal(value) * 10**6).to_integral_value()))


def test_every_real_file_has_a_shipped_mapping() -> None:
    assert len(FILES) == 24
    assert {tool(p) for p in FILES} == set(MAPPING)
    assert set(MAPPING.values()) <= set(replay.shipped_mappings())


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REAL)))
def test_shipped_mapping_reads_the_real_file_exactly(path: Path) -> None:
    f = facts(path)
    recs = replay.load(path, mapping=MAPPING[tool(path)])
    assert recs.errors == []
    att = recs.attempts
    assert att.height == f["requests"]
    assert att.filter(pl.col("outcome") != "ok").height == f["failed"]
    assert (att["tokens_evaluated"].sum() or 0) == f["sum_input_tokens"]
    assert (att["tokens_predicted"].sum() or 0) == f["sum_output_tokens"]
    if f["first_start_unit"] == "none":
        assert att.height == 0 or att["started_at"].null_count() == att.height  # the file has no times
    else:
        assert att["started_at"][0] == wall(f["first_start"], f["first_start_unit"])
    if "first_ttft" in f:
        assert att["ttft_ms"][0] == pytest.approx(f["first_ttft"] * TO_MS[f["ttft_unit"]])
    if "first_latency" in f:
        assert att["latency_ms"][0] == pytest.approx(f["first_latency"] * TO_MS[f["first_latency_unit"]])
    if "concurrency" in f:
        assert recs.runs["concurrency"].to_list() == [f["concurrency"]]
    if f["requests"] == 0:  # a summary: no per-request rows, one run per run it describes
        assert recs.runs.height >= 1 and recs.runs["summary_requests"].null_count() == 0
    for key in ("summary_requests", "summary_failed", "summary_input_tokens", "summary_output_tokens",
                "summary_duration_s"):
        if key in f:  # what the summary itself counts, read off the file by hand
            assert recs.runs[key].to_list() == [pytest.approx(f[key])], key


def test_summary_counts_are_the_summary_files_own() -> None:
    """What a summary-only file says lands in ``runs`` (read off the files by hand)."""
    vllm = replay.load(REAL / "vllm" / "concurrency_4_req_rate_inf_gpus_16_ctx_8_gen_8.json", mapping="vllm-bench")
    assert vllm.runs.select("summary_requests", "summary_ok", "summary_failed", "summary_input_tokens",
                            "summary_output_tokens").row(0) == (40, 40, 0, 40960, 40960)
    assert vllm.runs["summary_duration_s"][0] == pytest.approx(89.19548447802663)
    # results.json is JSON Lines under a .json name: 9 appended runs, each its own
    lines = replay.load(REAL / "vllm" / "results.json", mapping="vllm-bench")
    assert lines.runs["run"].to_list() == [f"results#{i}" for i in range(1, 10)]
    assert lines.runs["summary_requests"].to_list() == [300, 900, 900] * 3
    sglang = replay.load(REAL / "sglang" / "agg_n50_in128_out64_c8.jsonl", mapping="sglang")
    assert sglang.runs.select("model", "summary_ok", "summary_input_tokens", "summary_output_tokens").row(0) == (
        "Qwen/Qwen2.5-3B-Instruct", 50, 3019, 1401)
    llmperf = replay.load(REAL / "llmperf" / "groq_70b_summary.json", mapping="llmperf")
    assert llmperf.runs.select("run", "summary_requests", "summary_ok", "summary_failed").row(0) == (
        "groq_70b", 150, 150, 0)
    assert llmperf.runs["ended_at"][0] == EPOCH + timedelta(seconds=1704851704)  # `timestamp`: the run's end


def test_aiperf_outcomes_and_statuses_from_the_error_object() -> None:
    """Early AIPerf: cancelled lines carry AIPerf's own code 499 (no server status), successful ones error: null;
    the end time is max_response_timestamp."""
    recs = replay.load(REAL / "aiperf" / "aiperf-early-run1" / "profile_export.jsonl", mapping="aiperf")
    att = recs.attempts
    assert att["outcome"].value_counts(sort=True).rows() == [("cancelled", 11), ("ok", 2)]
    assert att.filter(pl.col("outcome") == "cancelled")["http_status"].null_count() == 11
    assert att.filter(pl.col("outcome") == "ok")["http_status"].to_list() == [200, 200]
    first_ok = att.filter(pl.col("outcome") == "ok").row(0, named=True)
    assert first_ok["ended_at"] == EPOCH + timedelta(microseconds=1759522427096160677 // 1000)
    assert (first_ok["ttft_ms"], first_ok["latency_ms"]) == (1680.543782, 7936.968269)


def test_guidellm_sampled_lists_are_said_to_be_a_sample(tmp_path: Path) -> None:
    """The v0.2/0.3 file lists 1 request where request_totals counts 47: ingest says so."""
    res = CliRunner().invoke(cli, ["ingest", str(REAL / "guidellm" / "benchmarks_stripped.json"), "--mapping",
                                   "guidellm", "--store", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert ("warning: run 'benchmarks_stripped': its records list 1 of the 47 requests its summary counts (a "
            "sample): items and attempts cover only those\n") in res.stderr


@pytest.mark.parametrize("name", sorted(MAPPING))
def test_a_tool_folder_ingests_in_one_command(tmp_path: Path, name: str) -> None:
    """Each tool's folder of real files, with --mapping: every file read, summaries said to be summaries."""
    # a twin (the same run in another format: GuideLLM's YAML report) would repeat its run's requests
    data = sorted(p for p in (REAL / name).rglob("*") if p.is_file() and not p.name.endswith(".toml")
                  and "twin_of" not in facts(p))
    folder = tmp_path / name
    for p in data:  # the tool's output folder as its user has it (without our provenance notes)
        (folder / p.relative_to(REAL / name)).parent.mkdir(parents=True, exist_ok=True)
        (folder / p.relative_to(REAL / name)).write_bytes(p.read_bytes())
    store = tmp_path / "s"
    res = CliRunner().invoke(cli, ["ingest", str(folder), "--mapping", MAPPING[name], "--store", str(store), "-v"])
    assert res.exit_code == 0, res.output
    listed = {line.split()[1]: line.split()[2] for line in res.stderr.splitlines() if line.startswith("ingested ")}
    assert sorted(listed) == [str(folder / p.relative_to(REAL / name)) for p in data]
    # a tool's summary file says so in its line; a file of run facts named by the mapping is a manifest
    named = {"groq_70b_summary.json", "profile_export_aiperf.json", "profile_export_aiperf.csv",
             "summary_lifecycle_metrics.json", "stage_0_lifecycle_metrics.json", "stage_6_lifecycle_metrics.json",
             "result_128_128_30000.txt", "profile_export_genai_perf.json"}
    assert {Path(p).name for p, kind in listed.items() if kind == "records:summary"} == {
        p.name for p in data if facts(p)["requests"] == 0} - named
    runs = CliRunner().invoke(cli, ["runs", "--store", str(store), "--format", "csv"])
    rows = [line.split(",") for line in runs.stdout.splitlines()[1:]]
    assert sum(int(r[6]) for r in rows) == sum(facts(p)["requests"] for p in data)  # attempts


def test_aiperf_summaries_of_both_layouts_give_their_counts() -> None:
    """Early AIPerf nests the metrics under records{}; 0.8+ puts them at the top level and the concurrency in the
    profiling phase; the CSV export says the same in a Metric,Value table.  Counts read off the files by hand."""
    early = replay.load(REAL / "aiperf" / "aiperf-early-run1" / "profile_export_aiperf.json", mapping="aiperf")
    assert early.runs.select("concurrency", "summary_requests", "summary_ok", "summary_failed").row(0) == (
        100, 100, 89, 11)
    new = REAL / "aiperf" / "qwen36-w0-chatbot-c1"
    recent = replay.load(new / "profile_export_aiperf.json", mapping="aiperf")
    assert recent.runs.select("run", "concurrency", "model", "summary_requests", "summary_ok", "summary_failed",
                              "summary_input_tokens", "summary_output_tokens").row(0) == (
        "qwen36-w0-chatbot-c1", 1, "Qwen3-VL-30B-A3B-Instruct-optimumxt", 20, 20, 0, 11698, 5970)
    assert recent.runs["summary_duration_s"][0] == pytest.approx(471.827992497)
    both = replay.load([new / "profile_export_aiperf.csv", new / "profile_export_aiperf.json"], mapping="aiperf")
    assert both.notes == []  # 471.83 (CSV) and 471.827992497 (JSON) are one number: no disagreement
    assert both.runs.select("summary_requests", "summary_duration_s").row(0) == (20, 471.827992497)


def test_a_vllm_result_without_errors_is_read_and_says_so_once(tmp_path: Path) -> None:
    path = REAL / "vllm" / "atom_mtp_profile_tp4_conc64_isl8192_osl1024.json"
    res = CliRunner().invoke(cli, ["ingest", str(path), "--mapping", "vllm-bench", "--store", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert res.stderr.count("no errors array") == 1
    assert (f"ingested  {path}  records:mapped  no errors array: no failure is recorded, every request counts as ok\n"
            in res.stderr)

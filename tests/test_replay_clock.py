"""Throughput, latency and concurrency of runs whose records carry no wall-clock time.

vLLM, SGLang and llmperf records measure time on the client's own clock (perf_counter start_times) or not at
all (durations only); ``throughput`` still computes on that clock, and says in one note why the wall-clock
columns are empty.  The expected values are the tools' own figures, read off the real files with a plain JSON
reader (fixtures/replay/real): vLLM's output_throughput, llmperf's results_mean_output_throughput_token_per_s.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from tests.replay_helpers import FIX

REAL = FIX / "real"


def forensics(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.stderr


def throughput(store: Path) -> dict[str, dict[str, str]]:
    code, out, err = forensics("throughput", "--store", str(store), "--format", "json")
    assert code == 0, err
    return {r["run"]: r for r in json.loads(out)}


def test_runs_without_send_times_give_the_tools_own_throughput(tmp_path: Path) -> None:
    store = tmp_path / "s"
    vllm = [REAL / "vllm" / "Meta-Llama-3-8B-Instruct_tp1_len2000.json",
            REAL / "vllm" / "atom_mtp_profile_tp4_conc64_isl8192_osl1024.json"]
    assert forensics("ingest", *map(str, vllm), "--mapping", "vllm-bench", "--store", str(store))[0] == 0
    assert forensics("ingest", str(REAL / "llmperf"), "--mapping", "llmperf", "--store", str(store))[0] == 0
    rows = throughput(store)
    docs = {p.stem: json.loads(p.read_text()) for p in vllm}
    for run, doc in docs.items():
        assert rows[run]["time_basis"] == "durations"
        assert rows[run]["wall_s"] == pytest.approx(doc["duration"])
        assert rows[run]["gen_tok_per_s"] == pytest.approx(doc["output_throughput"])
        assert rows[run]["req_per_s"] == pytest.approx(doc["request_throughput"])
    # llmperf keeps 10 of its 150 requests here: the summary's counts stand for the rates
    summary = json.loads((REAL / "llmperf" / "groq_70b_summary.json").read_text())
    assert rows["groq_70b"]["gen_tok_per_s"] == pytest.approx(summary["results_mean_output_throughput_token_per_s"])
    assert rows["groq_70b"]["req_per_s"] * 60 == pytest.approx(summary["results_num_completed_requests_per_min"])
    individual = json.loads((REAL / "llmperf" / "groq_70b_individual_responses.json").read_text())
    assert rows["groq_70b"]["latency_max_s"] == pytest.approx(max(r["end_to_end_latency_s"] for r in individual))
    _, _, err = forensics("throughput", "--store", str(store))
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "their records carry no send times (durations only), so started_at/ended_at are " \
                               "empty; wall_s is the run's duration from its summary" in notes[0]


def test_vllm_latency_is_the_last_chunks_arrival() -> None:
    """ttft + the gaps between chunks is the latency vLLM measures (not saved per request)."""
    from forensics import replay

    path = REAL / "vllm" / "Meta-Llama-3-8B-Instruct_tp1_len2000.json"
    doc = json.loads(path.read_text())
    recs = replay.load(path, mapping="vllm-bench")
    expected = [(t + sum(gaps)) * 1000 for t, gaps in zip(doc["ttfts"], doc["itls"], strict=True)]
    assert recs.attempts["latency_ms"].to_list() == pytest.approx(expected)


def test_a_relative_clock_without_an_anchor_still_gives_throughput(tmp_path: Path) -> None:
    """The shell harness's monotonic send times (fixtures/replay/newharness) without its run.json, which
    anchored them: the run's span is measured on that clock."""
    run = tmp_path / "run-1129"
    run.mkdir()
    shutil.copy(FIX / "newharness" / "run-1129" / "results.csv", run / "results.csv")
    mapping = tmp_path / "bench.toml"
    mapping.write_text((FIX / "newharness" / "bench.toml").read_text())
    store = tmp_path / "s"
    code, _, err = forensics("ingest", str(run), "--mapping", str(mapping), "--store", str(store))
    assert code == 0, err
    assert "started_at and ended_at left empty, the times kept on their own clock (started_rel_s, ended_rel_s)" in err
    rows = [line.split(",") for line in (run / "results.csv").read_text().splitlines()[2:]]  # no header, no warm-up
    starts = [int(r[2]) / 1e9 for r in rows]
    ends = [int(r[2]) / 1e9 + int(r[3]) / 1000 for r in rows]
    row = throughput(store)["run-1129"]
    assert row["time_basis"] == "relative"
    assert row["wall_s"] == pytest.approx(max(ends) - min(starts))
    edges = sorted([(t, 1) for t in starts] + [(t, -1) for t in ends], key=lambda e: (e[0], e[1]))
    in_flight = [sum(d for _, d in edges[: i + 1]) for i in range(len(edges))]
    assert row["peak_busy_slots"] == max(in_flight)
    _, _, err = forensics("throughput", "--store", str(store))
    assert "note: runs run-1129: their records' times are a monotonic clock's" in err

"""The shipped mappings read the load tools' outputs across their releases (fields that moved or were added)."""

from __future__ import annotations

import json
from pathlib import Path

from forensics import replay


def test_guidellm_newer_request_shape(tmp_path: Path) -> None:
    # newer GuideLLM: timings under info.timings, token counts under input/output_metrics
    doc = {"benchmarks": [{"args": {"strategy": {"streams": 4}}, "start_time": 1772446500.0, "end_time": 1772446503.0,
                           "requests": {
        "successful": [{"request_id": "r1", "output": "{}", "info": {"timings": {
            "request_start": 1772446500.0, "request_end": 1772446502.5}},
            "input_metrics": {"text_tokens": 120}, "output_metrics": {"text_tokens": 40}}],
        "errored": [{"request_id": "r2", "info": {"error": "boom", "timings": {
            "request_start": 1772446501.0, "request_end": 1772446501.2}},
            "input_metrics": {"text_tokens": 90}, "output_metrics": {"text_tokens": 0}}],
        "incomplete": []}}]}
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(doc))
    recs = replay.load([path], mapping="guidellm")
    assert recs.errors == []
    rows = recs.attempts.sort("item").select("item", "outcome", "tokens_evaluated", "tokens_predicted", "error",
                                             "started_at", "ended_at").rows()
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [("r1", "ok", 120, 40, None), ("r2", "failed", 90, 0, "boom")]
    assert rows[0][5].isoformat() == "2026-03-02T10:15:00+00:00"
    assert rows[0][6].isoformat() == "2026-03-02T10:15:02.500000+00:00"


def test_vllm_result_without_start_times_or_texts(tmp_path: Path) -> None:
    # older `vllm bench serve --save-detailed`: no start_times, no generated_texts
    doc = {"model_id": "m", "num_prompts": 2, "completed": 1, "max_concurrency": 2, "input_lens": [10, 20],
           "output_lens": [5, 0], "errors": ["", "timeout"]}
    path = tmp_path / "vllm-old.json"
    path.write_text(json.dumps(doc))
    recs = replay.load([path], mapping="vllm-bench")
    assert recs.errors == []
    assert recs.attempts.select("item", "outcome", "tokens_evaluated", "tokens_predicted", "started_at").rows() == [
        ("0", "ok", 10, 5, None), ("1", "timeout", 20, 0, None)]


def test_genai_perf_per_request_export_in_the_shape_its_maintainers_test() -> None:
    """Perf Analyzer's profile_export.json as GenAI-Perf's own parser tests build it (fixtures/replay/tools, not a
    real run: none was found): requests under experiments[], nanosecond times, raw SSE chunks."""
    from tests.replay_helpers import FIX

    path = FIX / "tools" / "genai-perf-parser-test" / "profile_export.json"
    doc = json.loads(path.read_text())
    recs = replay.load(path, mapping="genai-perf")
    assert recs.errors == []
    assert recs.runs.select("run", "concurrency").rows() == [("genai-perf-parser-test", 10)]
    reqs = doc["experiments"][0]["requests"]
    assert recs.attempts["outcome"].to_list() == ["ok"] * len(reqs)
    assert recs.attempts["ttft_ms"].to_list() == [(r["response_timestamps"][0] - r["timestamp"]) / 1e6 for r in reqs]

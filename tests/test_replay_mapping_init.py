"""Mapping ergonomics: ``timings`` maps as docs/replay.md's schema table lists it, and ``forensics mapping init
SAMPLE`` proposes a mapping that reads real samples of harnesses and tools.

fixtures/replay/rundir/b11312-timings/results.jsonl is a real recording (its README): a loop kept llama-server
b11312's whole /completion responses.  The other samples are the real peer-tool files of fixtures/replay/real.
Expected counts come from reading the files with a plain JSON reader here.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from forensics import replay
from forensics.cli import cli
from tests.replay_helpers import FIX

RESULTS = FIX / "rundir" / "b11312-timings" / "results.jsonl"
LINES = [json.loads(x) for x in RESULTS.read_text().splitlines()]


def forensics(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize("fields", [
    'timings = "response.timings"',
    'timings = { prompt_n = "response.timings.prompt_n", predicted_ms = "response.timings.predicted_ms" }',
    '"timings.prompt_n" = "response.timings.prompt_n"\n"timings.predicted_ms" = "response.timings.predicted_ms"',
])
def test_timings_maps_as_the_schema_lists_it(tmp_path: Path, fields: str) -> None:
    mapping = tmp_path / "m.toml"
    mapping.write_text(f'[attempts]\n[attempts.fields]\nitem = "ticker"\nstage = "step"\n{fields}\n'
                       '[attempts.set]\nrun_id = "r"\noutcome = "ok"\n')
    recs = replay.load(RESULTS, mapping=mapping)
    assert recs.errors == []
    got = recs.attempts.select("item", "prompt_n", "predicted_ms").rows()
    assert got == [(x["ticker"], x["response"]["timings"]["prompt_n"], x["response"]["timings"]["predicted_ms"])
                   for x in LINES]


def _records(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    doc = json.loads(path.read_text())
    if isinstance(doc, list):
        return doc
    if "input_lens" in doc:  # vLLM's parallel arrays
        return [{"in": a, "out": b} for a, b in zip(doc["input_lens"], doc["output_lens"], strict=True)]
    return [r for b in doc["benchmarks"] for r in b["requests"]["successful"]]


def _tokens(rec: dict) -> int:
    for path in (("response", "tokens_predicted"), ("number_output_tokens",), ("out",), ("output_tokens",),
                 ("metrics", "output_sequence_length", "value")):
        node = rec
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return int(node)
    raise AssertionError(rec)


SAMPLES = [RESULTS, FIX / "real" / "llmperf" / "groq_70b_individual_responses.json",
           FIX / "real" / "vllm" / "Meta-Llama-3-8B-Instruct_tp1_len2000.json",
           FIX / "real" / "aiperf" / "qwen36-w0-chatbot-c1" / "profile_export.jsonl",
           FIX / "real" / "guidellm" / "Qwen_Qwen3-4B-Thinking-2507_tp4_quant-fp8_benchmarks.json"]


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_mapping_init_proposes_a_mapping_that_reads_the_sample(tmp_path: Path, sample: Path) -> None:
    out = tmp_path / "proposed.toml"
    code, _, err = forensics("mapping", "init", str(sample), "-o", str(out))
    assert code == 0, err
    records = _records(sample)
    assert f"checked on {sample}: {len(records)} attempts read; placed " in err
    recs = replay.load(sample, mapping=out)
    assert recs.attempts.height == len(records)
    assert recs.attempts["tokens_predicted"].sum() == sum(_tokens(r) for r in records)
    text = out.read_text()
    assert "tokens_predicted = " in text and "[attempts.set]" in text


def test_mapping_init_reads_units_and_shapes() -> None:
    code, proposal, _ = forensics("mapping", "init", str(SAMPLES[3]))
    assert code == 0
    # AIPerf states each metric's unit beside its value; the epoch-ns request times are told by magnitude
    assert 'itl_ms = { path = "metrics.inter_token_latency.value", unit = "ms" }' in proposal
    assert 'started_at = { path = "metadata.request_start_ns", unit = "epoch_ns" }' in proposal
    code, proposal, _ = forensics("mapping", "init", str(SAMPLES[0]))
    assert 'timings = "response.timings"' in proposal
    assert 'started_at = { path = "sent", unit = "epoch_s" }' in proposal
    assert "#   response.generation_settings.seed = 4294967295" in proposal  # left for the user, as a comment
    recs = replay.load(SAMPLES[0], mapping=_write(proposal))
    assert recs.attempts.select(pl.col("prompt_n").sum(), pl.col("http_status").max()).row(0) == (
        sum(x["response"]["timings"]["prompt_n"] for x in LINES), 200)


def _write(text: str) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "m.toml"
    path.write_text(text)
    return path


def test_mapping_init_on_what_is_no_record_file_says_so_in_one_line(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("restarted twice\n")
    for path in (notes, tmp_path / "missing.jsonl"):
        code, out, err = forensics("mapping", "init", str(path))
        assert code == 2 and out == "" and len(err.splitlines()) == 1 and err.startswith("forensics: error: ")

"""Ingesting a generated scenario gives exactly the requests the generator reports it wrote."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from forensics.generate import demo_scenarios, generate
from forensics.ingest import IngestOptions, ingest
from forensics.store import Store

KEYS = ["run", "instance", "slot", "task"]


@pytest.mark.parametrize(("fmt", "chunk_bytes"), [("era5", None), ("era4", None), ("era4-prefix", None),
                                                  ("era4", 40_000), ("era5", 40_000)])
def test_ingest_matches_generator_truth(tmp_path: Path, fmt: str, chunk_bytes: int | None,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Also in small chunks: requests, restarts and HTTP lines then span chunks and assembly batches."""
    if chunk_bytes is not None:
        from parsers import reader

        monkeypatch.setattr(reader, "CHUNK_BYTES", chunk_bytes)
    gen = generate(demo_scenarios(), tmp_path / "gen", fmt=fmt, seed=11)
    ingest(tmp_path / "store", [tmp_path / "gen" / "logs"], IngestOptions(keep_going=True))
    got = Store(tmp_path / "store").table("requests")
    truth = gen.truth
    assert got.height == truth.height == gen.requests
    j = truth.join(got, on=KEYS, how="full", suffix="_got", coalesce=True)
    assert j.height == truth.height, "every request is found once, on the same instance, slot and task"
    # Requests whose timings are logged: tokens and times exactly.  Cancelled and failed requests log no
    # timings, so their generated tokens are not known from the log (progress lines give a lower bound).
    timed = j.filter(pl.col("total_ms_got").is_not_null())
    assert timed.height >= truth.height - 20
    for col in ("gen_tokens", "prompt_eval_tokens", "prompt_ms", "gen_ms", "total_ms", "seq", "truncated"):
        bad = timed.filter(pl.col(col).ne_missing(pl.col(f"{col}_got")))
        assert bad.height == 0, (col, bad.select(*KEYS, col, f"{col}_got").head(5).rows())
    # A truncated request's prompt is what the slot held (`input truncated`), or in era 5 not derivable
    # (n_tokens - gen + 1 only holds when nothing was cut); the truth keeps the prompt as sent.
    same_prompt = timed.filter(~pl.col("stop_reason").is_in(["error"]) & pl.col("truncated").not_())
    bad = same_prompt.filter(pl.col("prompt_tokens").ne_missing(pl.col("prompt_tokens_got"))
                             & pl.col("prompt_tokens_got").is_not_null())
    assert bad.height == 0, bad.select(*KEYS, "prompt_tokens", "prompt_tokens_got").rows()
    bad = j.filter(pl.col("stop_reason") != pl.col("stop_reason_got"))
    assert bad.height == 0, bad.select(*KEYS, "stop_reason", "stop_reason_got").rows()
    if fmt != "era5":  # era 5 logs no HTTP lines at the default verbosity
        bad = j.filter(pl.col("http_status").ne_missing(pl.col("http_status_got")))
        assert bad.height == 0, bad.select(*KEYS, "http_status", "http_status_got").rows()

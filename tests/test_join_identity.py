"""The join's outputs are pinned on recorded inputs: the demo store's tables (absolute, elapsed and
order-only logs), the replay fixtures' stores, and generated mixes of slots, tokens, statuses, missing
sends, duplicate instances and several runs, and every reason an attempt stays unmatched.  Each
``fixtures/join/<case>/expected_*`` was first written by the row-by-row join this set-based one replaced, and
rewritten (after review) when the rules changed: runs scoped to their own logs and the logs their manifests
name, server-less attempts, the requests' ``clock``, no zero-length requests, strongest evidence first; a change
to the matching rules shows up here as a diff to review, not as a silent shift."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from forensics import replay

CASES = Path(__file__).resolve().parents[1] / "fixtures" / "join"


@pytest.mark.parametrize("case", sorted(p.name for p in CASES.iterdir()))
def test_join_output_is_unchanged(case: str) -> None:
    d = CASES / case
    inputs = [pl.read_parquet(d / f"{t}.parquet") for t in ("requests", "instances", "runs", "attempts")]
    got = replay.join(*inputs)
    assert_frame_equal(got.matches, pl.read_parquet(d / "expected_matches.parquet"))
    assert_frame_equal(got.requests, pl.read_parquet(d / "expected_requests.parquet"))
    assert got.notes == json.loads((d / "expected_notes.json").read_text())


def test_the_cases_cover_every_outcome() -> None:
    reasons = pl.concat([pl.read_parquet(p, columns=["match", "reason"]) for p in CASES.glob("*/expected_matches.parquet")])
    kinds = set(reasons["match"]) | {r for r in reasons["reason"] if r and "+" not in r and " " not in r}
    assert {"matched", "ambiguous", "unmatched", "no_instance", "rejected_before_slot", "client_timeout",
            "client_cancelled", "no_slot_request", "taken", "evidence_disagrees"} <= kinds

"""Missing per stage: a stage applies to the items the manifest lists for it, else to the items sent to it at
least once, unless the manifest says every item goes through every stage; an item whose last stage reached did
not end ok is expected in the later stages (the example in docs/replay.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forensics import replay
from forensics.replay import tables as replay_tables
from forensics.store import Store

BASE = {"run_id": "r", "items": ["AAPL", "MSFT", "NVDA", "TSLA", "AMZN"], "stages": ["probe", "extract", "summarize"]}
SENT = [  # (item, stage, outcome): a one-ticker probe, then extract and summarize; AMZN was never sent
    ("AAPL", "probe", "ok"),
    ("AAPL", "extract", "ok"), ("MSFT", "extract", "ok"), ("NVDA", "extract", "timeout"), ("TSLA", "extract", "ok"),
    ("AAPL", "summarize", "ok"), ("MSFT", "summarize", "failed"), ("TSLA", "summarize", "ok"),
]


def missing(tmp_path: Path, **manifest: object) -> list[tuple[str, str, str, str]]:
    (tmp_path / "manifest.json").write_text(json.dumps({**BASE, **manifest}))
    (tmp_path / "attempts.jsonl").write_text("".join(
        json.dumps({"run_id": "r", "item": i, "stage": s, "outcome": o}) + "\n" for i, s, o in SENT))
    store = Store(tmp_path / "store", create=True)
    replay.ingest_records(store, replay.load([tmp_path / "manifest.json", tmp_path / "attempts.jsonl"]))
    return [tuple(r) for r in replay_tables.missing(Store(tmp_path / "store"), "r").select(
        "item", "stage", "reason", "detail").rows()]


def test_a_stage_applies_to_the_items_sent_to_it(tmp_path: Path) -> None:
    assert missing(tmp_path) == [
        ("AMZN", "probe", "never_attempted", "no attempt was made"),  # sent nowhere: missing in the first stage
        ("MSFT", "summarize", "http_error", "no response (attempts: 1)"),
        ("NVDA", "extract", "timeout", "client gave up (attempts: 1)"),  # the records have no times
        # its extract failed and it went no further: summarize, the next stage, is missing too
        ("NVDA", "summarize", "never_attempted", "earlier stage extract not done"),
    ]


def test_the_manifest_lists_the_items_of_a_stage(tmp_path: Path) -> None:
    got = missing(tmp_path, stage_items={"probe": ["AAPL", "MSFT"]})
    assert [g[:3] for g in got] == [
        ("AMZN", "extract", "never_attempted"),  # sent nowhere, and not listed for the probe: the next stage
        ("MSFT", "probe", "never_attempted"), ("MSFT", "summarize", "http_error"), ("NVDA", "extract", "timeout"),
        ("NVDA", "summarize", "never_attempted")]


def test_every_item_every_stage(tmp_path: Path) -> None:
    got = missing(tmp_path, every_item_every_stage=True)
    assert [(i, s, r) for i, s, r, _ in got] == [
        ("AMZN", "extract", "never_attempted"), ("AMZN", "probe", "never_attempted"),
        ("AMZN", "summarize", "never_attempted"),
        ("MSFT", "probe", "never_attempted"), ("MSFT", "summarize", "http_error"),
        ("NVDA", "extract", "timeout"), ("NVDA", "probe", "never_attempted"), ("NVDA", "summarize", "never_attempted"),
        ("TSLA", "probe", "never_attempted"),
    ]
    assert ("NVDA", "summarize", "never_attempted", "earlier stage probe not done") in got


@pytest.mark.parametrize(("manifest", "expected"), [({}, 10), ({"every_item_every_stage": True}, 15)])
def test_items_expected_follow_the_rule(tmp_path: Path, manifest: dict, expected: int) -> None:
    missing(tmp_path, **manifest)
    items = Store(tmp_path / "store").table("items")
    assert items.height == expected

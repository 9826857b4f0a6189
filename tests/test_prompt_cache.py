"""The prompt cache as a finding (``prompt_cache.sql``), checked against what the logs print and what was done.

fixtures/server-runs/b11434-cache (its README's truth): two slots, every request pinned to its worker's slot, the
same system prompt for every item and extract continuing analyze's conversation; five requests were sent with
``cache_prompt: false`` (labels.json ``planted``, kind no-cache), the first request on each slot is a cold start.
At ``-lv 4`` the server prints per task ``cached n_tokens = N`` and, before it, the similarity it checked:
``checking sim = 0.602 (476/791)``: 476 tokens of the slot's prompt were there to reuse.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

from forensics.analyse import ingest_and_analyse
from forensics.ingest import IngestOptions
from forensics.session import Analysis
from forensics.sql import run_sql
from forensics.store import Store
from forensics.verdict import verdict

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "server-runs"
CACHE = RUNS / "b11434-cache"
# What each log generation prints of a task's reuse: (slot, task, cached tokens).
PRINTED = [
    re.compile(r"id +(\d+) \| task (\d+) \| (?:kv cache rm \[|(?:cached )?(?:n_past|n_tokens) = \d+, memory_seq_rm \[)"
               r"(\d+), end\)"),
    re.compile(r"kv cache rm \[p0, end\) .*\bid_slot=(\d+) id_task=(\d+) p0=(\d+)"),
]
SIM = re.compile(r"id +(\d+) \| task -1 \| +- checking sim = [\d.]+ \((\d+)/(\d+)\)")


def printed(log: Path) -> dict[tuple[int, int], int]:
    """(slot, task) -> the cached tokens the log prints for the task (its first such line)."""
    out: dict[tuple[int, int], int] = {}
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        m = next((m for rx in PRINTED if (m := rx.search(line))), None)
        if m:
            out.setdefault((int(m[1]), int(m[2])), int(m[3]))
    return out


def with_printed_cache() -> list[Path]:
    """Every real run folder whose one server log prints each task's reuse."""
    out = []
    for folder in sorted(p for p in RUNS.iterdir() if p.is_dir()):
        logs = sorted(folder.glob("*.log"))
        if len(logs) == 1 and printed(logs[0]):
            out.append(folder)
    return out


@pytest.fixture(scope="module")
def cache_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    root = tmp_path_factory.mktemp("cache") / "store"
    ingest_and_analyse(root, [CACHE], IngestOptions(keep_going=True))
    return Store(root)


def test_the_reuse_is_what_the_log_prints_and_the_server_answered(cache_store: Store) -> None:
    facts = run_sql(cache_store, "SELECT * FROM request_facts ORDER BY line_first")
    with Analysis.open(cache_store) as s:
        [row] = s.rows("prompt_cache").iter_rows(named=True)
    answered = {(r["ticker"], r["stage"]): r["timings"]["cache_n"]
                for r in map(json.loads, (CACHE / "client_requests.jsonl").read_text().splitlines())}
    logged = printed(CACHE / "main.log")
    for r in facts.iter_rows(named=True):
        assert r["cached_tokens"] == logged[(r["slot"], r["task"])] == answered[(r["item"], r["stage"])], r
    assert row["cached_tokens"] == sum(logged.values()) == sum(answered.values())
    assert row["prompt_tokens"] == int(facts["prompt_tokens"].sum())
    assert row["reused"] == round(row["cached_tokens"] / row["prompt_tokens"], 3)


def test_the_misses_are_the_requests_sent_without_cache_prompt(cache_store: Store) -> None:
    truth = json.loads((CACHE / "labels.json").read_text())
    no_cache = {(p["ticker"], p["stage"]) for p in truth["planted"] if p["kind"] == "no-cache"}
    facts = run_sql(cache_store, "SELECT * FROM request_facts ORDER BY line_first")
    with Analysis.open(cache_store) as s:
        [row] = s.rows("prompt_cache").iter_rows(named=True)
    sent = pl.DataFrame(sorted(no_cache), schema={"item": pl.String, "stage": pl.String}, orient="row")
    lines = facts.join(sent, on=["item", "stage"], how="semi").sort("line_first")
    assert row["lines"] == ", ".join(f"{a}-{b}" for a, b in lines.select("line_first", "line_last").iter_rows())
    assert (row["misses"], row["misses_measured"], row["not_reused"], row["after_shift"], row["slot_switches"]) == (
        len(no_cache), len(no_cache), len(no_cache), 0, 0)
    assert row["cold_starts"] == truth["np"] == row["slots"]  # the first request on each slot
    assert row["costly"] and row["fix"].startswith("send cache_prompt: true")


def test_the_tokens_recomputed_are_the_ones_the_server_saw_it_could_reuse(cache_store: Store) -> None:
    """Before each request the server printed how much of its slot's prompt matched (``checking sim``, pinned: one
    line, its slot's): the misses' matches are the tokens computed again."""
    text = (CACHE / "main.log").read_text(encoding="utf-8").splitlines()
    facts = run_sql(cache_store, "SELECT * FROM request_facts ORDER BY line_first")
    with Analysis.open(cache_store) as s:
        [row] = s.rows("prompt_cache").iter_rows(named=True)
    firsts = [int(part.split("-")[0]) for part in row["lines"].split(", ")]
    could = 0
    for first in firsts:
        slot = facts.filter(pl.col("line_first") == first)["slot"][0]
        sims = [(i, m) for i, line in enumerate(text[:first], 1) if (m := SIM.search(line)) and int(m[1]) == slot]
        could += int(sims[-1][1][2])
    assert row["recomputed_tokens"] == could


def test_the_verdict_says_it_as_a_note(cache_store: Store) -> None:
    [v] = verdict(cache_store)
    assert v.healthy
    assert [f.kind for f in v.facts] == ["healthy", "prompt_cache"]
    note = v.facts[1]
    assert note.sentence == (
        "Note: the server's prompt cache served 50% of the prompt tokens (2 cold starts); 5 later requests reused "
        "less than half of what their slot held for them (5 not reused): 2,253 prompt tokens (15% of all, 2.2 s) "
        "were computed again: send cache_prompt: true with every request and keep the shared prefix identical.")
    assert [e.rsplit("/", 1)[-1] for e in note.evidence] == ["main.log:214-244", "main.log:290-306",
                                                            "main.log:436-478", "main.log:575-620", "main.log:648-657"]


def test_under_the_threshold_it_is_not_told(cache_store: Store) -> None:
    from forensics.thresholds import thresholds

    with Analysis.open(cache_store) as s:
        [row] = s.rows("prompt_cache", thresholds(cache_waste=0.2)).iter_rows(named=True)
    assert row["recomputed_share"] < 0.2 and not row["costly"]


@pytest.mark.parametrize("folder", with_printed_cache(), ids=lambda p: p.name)
def test_every_real_log_that_prints_its_cache_agrees(folder: Path, tmp_path: Path) -> None:
    """On every real run folder whose log prints each task's reuse (2024 `kv cache rm [p0, end) ... p0=N`, `kv cache
    rm [N, end)`, 2026 `cached n_tokens = N`): the requests and the finding hold the numbers the log prints."""
    [log] = folder.glob("*.log")
    ingest_and_analyse(tmp_path / "store", [log], IngestOptions(run="r"))
    store = Store(tmp_path / "store")
    logged = printed(log)
    got = run_sql(store, "SELECT slot, task, cached_tokens FROM requests WHERE cached_tokens IS NOT NULL")
    with Analysis.open(store) as s:
        rows = s.rows("prompt_cache")
    assert {(slot, task): n for slot, task, n in got.iter_rows()} == logged
    counted = run_sql(store, "SELECT slot, task FROM request_facts WHERE cached_tokens IS NOT NULL AND prompt_tokens > 0")
    assert int(rows["requests"].sum()) == counted.height  # a request whose prompt size is unknown is left out
    assert int(rows["cached_tokens"].sum()) == sum(logged[key] for key in counted.iter_rows())
    assert rows["cold_starts"].sum() == len({slot for slot, _ in logged})

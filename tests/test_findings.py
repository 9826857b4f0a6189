"""Findings on hand-built scenario stores (see fixtures/findings/scenarios.py for the ground truth)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from fixtures.findings import scenarios as S
from forensics import derived, schema
from forensics import findings as F
from forensics.analyse import analyse
from forensics.cli import cli, main
from forensics.errors import NotFoundError
from forensics.session import Analysis
from forensics.store import Store

RUNS = ["dead", "healthy", "one-runaway", "one-token", "overflow", "two-slots"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with pytest.MonkeyPatch.context() as mp:
        if "matches" not in schema.TABLES:  # the matches table is another module's; stand in for it here
            mp.setitem(schema.TABLES, "matches", S.MATCHES)
        yield S.build(tmp_path_factory.mktemp("findings") / "store")


def test_runaways_exact(store: Store) -> None:
    df = F.find_runaways(store)
    got = df.select("run", "slot", "task", "seq", "item", "gen_tokens", "why", "evidence", "followed_by").rows()
    assert got == [
        ("one-runaway", 0, 6, 4, None, 3900, "tokens,context", "52-57", None),
        ("one-token", 2, 11, 4, None, 3600, "tokens,context", "87-92", None),
        ("overflow", 0, 6, 4, "TSLA", 3800, "tokens,context,repetition", "52-57", "item_next_context_error"),
        ("two-slots", 0, 4, 3, None, 3500, "tokens,context", "38-43", "cancel"),
        ("two-slots", 1, 11, 6, None, 2048, "tokens,n_ctx_train_cap", "87-92", "slot_next_http_500"),
    ]
    # seconds = (prompt 196 x 0.3 ms + 3900 tokens x 25 ms) / 1000
    assert df.filter(df["run"] == "one-runaway")["seconds"].to_list() == [97.559]


def test_healthy_run_has_no_findings(store: Store) -> None:
    assert F.find_runaways(store, "healthy").height == 0
    assert F.find_dead_slots(store, "healthy", include_recovered=True).height == 0
    assert F.error_groups(store, "healthy").height == 0


def test_dead_slots_exact(store: Store) -> None:
    df = F.find_dead_slots(store, include_recovered=True)
    got = df.select("run", "slot", "seq", "task", "line", "requests_affected", "recovered", "why").rows()
    assert got == [
        ("dead", 1, 5, 13, 101, 6, False, "long,slow"),  # seq 5..10 on slot 1 all ran 40x slower per token
        ("one-token", 2, 4, 11, 87, 5, False, "runaway,context,long,few_tokens"),  # the runaway, then 4 one-token outputs
    ]
    start = next(r for r in S.dead().rows if r["slot"] == 1 and r["seq"] == 5)["elapsed_start_s"]
    # no wall clock in these logs: dead_from is empty, the server's own clock has a column of its own
    assert (df["dead_from"][0], df["since_start_s"][0]) == (None, round(start, 3))


@pytest.mark.parametrize("run", ["one-runaway", "two-slots", "overflow"])
def test_runaways_alone_do_not_make_a_dead_slot(store: Store, run: str) -> None:
    assert F.find_dead_slots(store, run, include_recovered=True).height == 0


def test_explain_sequence(store: Store) -> None:
    rep = F.dead_slot_report(store, "one-token")
    seq = rep.sequence.select("seq", "gen_tokens", "abnormal", "why").rows()
    assert seq == [(1, S.HEALTHY_TOKENS[19], False, ""), (2, S.HEALTHY_TOKENS[22], False, ""),
                   (3, S.HEALTHY_TOKENS[25], False, ""), (4, 3600, True, "runaway,context,long"),
                   (5, 1, True, "few_tokens"), (6, 1, True, "few_tokens"), (7, 1, True, "few_tokens"),
                   (8, 1, True, "few_tokens")]


def test_recommended_cap_cuts_no_normal_response_and_stops_every_runaway(store: Store) -> None:
    # longest normal response x 1.2, rounded up to a multiple of 64: 395 -> 474 -> 512 (all 48 healthy
    # token counts are in every run but overflow); overflow's extract 355 -> 426 -> 448, score 110 -> 132 -> 192
    expected = {"dead": 512, "healthy": 512, "one-runaway": 512, "one-token": 512, "two-slots": 512,
                "overflow": 448}
    for run in RUNS:
        res = F.recommend_cap(store, run)
        assert res.cap == expected[run], run
        rec = res.whatif.filter(res.whatif["recommended"])
        assert rec["normal_cut"].to_list() == [0] * rec.height, run
        assert rec["runaways_stopped"].to_list() == rec["runaways"].to_list(), run
    res = F.recommend_cap(store, "overflow")
    assert res.per_stage.rows() == [("extract", 7, 355, 1, 448), ("score", 7, 110, 0, 192)]
    assert res.whatif.filter(res.whatif["stage"].is_null())["cap"].to_list() == [128, 256, 448, 512, 1024]


def test_cap_whatif_numbers(store: Store) -> None:
    res = F.recommend_cap(store, "one-runaway")
    row = res.whatif.filter(res.whatif["cap"] == 512).row(0, named=True)
    # the runaway: 3900 - 512 = 3388 tokens at 25 ms each = 84.7 s; no normal response exceeds 512
    assert (row["tokens_saved"], row["seconds_saved"], row["runaways_stopped"]) == (3388, 84.7, 1)
    row = res.whatif.filter(res.whatif["cap"] == 256).row(0, named=True)
    assert row["normal_cut"] == 10  # the counts >= 256 in HEALTHY_TOKENS[5:25] without index 11 (the runaway's place)


def test_cap_warnings(store: Store) -> None:
    assert F.recommend_cap(store, "healthy").warnings == []
    assert F.recommend_cap(store, "one-runaway").warnings == [
        "the logs show no output cap (n_predict unset or -1 everywhere) and 1 runaway(s): "
        "set max_tokens / n_predict to 512"]
    # margin 10: 355 x 11 = 3905 -> 4096; the p95 prompt (2000) plus 4096 does not fit a 4096-token slot
    warns = F.recommend_cap(store, "overflow", margin=10).warnings
    assert "a slot's context (4096 tokens) cannot hold a normal prompt (p95 2000 tokens) plus the cap 4096: " \
           "raise -c or lower -np" in warns


def test_cap_from_the_stored_groups_is_the_cap_worked_out_afresh(store: Store, tmp_path: Path) -> None:
    # the analysis stores cap.sql's requests grouped (cap_facts); a session that reads nothing stored groups them anew
    analysed = Store(shutil.copytree(store.root, tmp_path / "store"))
    with analysed.lock():
        analyse(analysed)
    assert "cap_facts" in derived.state(analysed).tables
    for runs in [None, *([r] for r in RUNS)]:
        with Analysis.open(analysed, runs, stored=False) as fresh:
            want = F.recommend_cap(fresh, runs)
        got = F.recommend_cap(analysed, runs)
        assert (got.cap, got.warnings) == (want.cap, want.warnings), runs
        assert got.per_stage.equals(want.per_stage) and got.whatif.equals(want.whatif), runs


def test_round_cap() -> None:
    assert [F.round_cap(x, 0.2) for x in (10, 395, 426, 800, 1700, 3000)] == [64, 512, 512, 1024, 2048, 4096]
    assert F.round_cap(512, 0.0) == 640  # strictly above the longest normal response (step 128 at 512)


def test_error_groups_exact(store: Store) -> None:
    df = F.error_groups(store, "overflow")
    # the log has no wall clock and nothing anchors it: first and last are empty (a time column holds wall clock
    # or nothing), the lines are in the evidence
    assert df.select("kind", "level", "count", "http_status", "first", "last", "slots", "items", "shape").rows() == [
        ("exception", "E", 2, "", None, None, "", "",
         '{"code":N,"message":"Failed to parse tool call at N","type":"<s>"}'),
        ("send_error", "E", 1, "", None, None, "1", "TSLA",
         "request (N tokens) exceeds the available context size (N tokens), try increasing it"),
        ("http_request", "I", 1, "500", None, None, "", "", "POST HTTP N"),
    ]


def test_mask_rules() -> None:
    assert F.mask_message("model 'qwen' id 0x1f req deadbeef01 took 12.5 ms, \"a b\" \"x-1\"") == \
        "model '<s>' id <hex> req <hex> took N ms, \"a b\" \"<s>\""


def test_unknown_run(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(NotFoundError):
        F.find_runaways(store, "nope")
    with pytest.raises(SystemExit) as exc:
        main(["deadslots", "nope", "--store", str(store.root)])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        "forensics: error: no run 'nope' in the store (runs: " + ", ".join(RUNS) + ")\n")


def test_cli_runaways_table(store: Store) -> None:
    res = CliRunner().invoke(cli, ["runaways", "one-runaway", "--store", str(store.root)])
    assert res.exit_code == 0
    # normal_tokens 362: the 0.9 quantile of the 19 normal token counts (362 + 0.2 x (364 - 362), rounded)
    assert res.stdout == (
        "run          instance  slot  task  seq  gen_tokens  seconds  normal_tokens  why             evidence  followed_by\n"
        "-----------  --------  ----  ----  ---  ----------  -------  -------------  --------------  --------  -----------\n"
        "one-runaway  main         0     6    4        3900   97.559            362  tokens,context  52-57\n")


def test_cli_deadslots_json_and_fail_on(store: Store) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["deadslots", "one-token", "--format", "json", "--fail-on", "any",
                              "--store", str(store.root)])
    assert res.exit_code == 1
    start = next(r for r in S.one_token().rows if r["slot"] == 2 and r["seq"] == 4)["elapsed_start_s"]
    assert json.loads(res.stdout) == [{
        "run": "one-token", "instance": "main", "slot": 2, "dead_from": None, "since_start_s": round(start, 3),
        "seq": 4, "task": 11,
        "line": 87, "requests_affected": 5, "items_lost": None, "recovered": False, "why": "runaway,context,long,few_tokens"}]
    res = runner.invoke(cli, ["deadslots", "healthy", "--fail-on", "any", "--store", str(store.root)])
    assert res.exit_code == 0
    res = runner.invoke(cli, ["runaways", "two-slots", "--fail-on", "any", "--format", "csv",
                              "--store", str(store.root)])
    assert res.exit_code == 1
    assert res.stdout.splitlines()[0] == \
        "run,instance,slot,task,seq,gen_tokens,seconds,normal_tokens,why,evidence,followed_by"
    res = runner.invoke(cli, ["runaways", "healthy", "--fail-on", "any", "--store", str(store.root)])
    assert res.exit_code == 0


def test_cli_explain_json(store: Store) -> None:
    res = CliRunner().invoke(cli, ["deadslots", "dead", "--explain", "--format", "json", "--store", str(store.root)])
    assert res.exit_code == 0
    out = json.loads(res.stdout)
    assert [r["slot"] for r in out] == [1]
    assert [(s["seq"], s["abnormal"]) for s in out[0]["sequence"]] == [(k, k >= 5) for k in range(1, 11)]


def test_without_matches_baselines_per_instance(tmp_path: Path) -> None:
    store = S.build(tmp_path / "store", with_matches=False)
    df = F.find_runaways(store, "overflow")
    # without matches: no item, stage, repetition or next-item signal
    assert df.select("slot", "task", "why", "followed_by").rows() == [(0, 6, "tokens,context", None)]


def _timing(prompt: int, gen: int) -> list[str]:
    return [f"prompt eval time =     400.00 ms / {prompt:5d} tokens (    0.10 ms per token, 10000.00 tokens per second)"
            ,
            f"       eval time =    1280.00 ms / {gen:5d} tokens (   20.00 ms per token,    50.00 tokens per second)"
            ,
            f"      total time =    1680.00 ms / {prompt + gen:5d} tokens"]


def test_a_prompt_over_the_context_is_its_own_finding_not_a_runaway(tmp_path: Path) -> None:
    """An over-long prompt that the server cut (`input truncated`, truncated = 1 at release, n_past at the context)
    answered in 64 tokens, and one the server refused (400): prompts over the context, not runaways."""
    lines = []
    for task in range(10, 16):  # the normal responses of slot 0 (60 tokens)
        lines += [f"slot launch_slot_: id  0 | task {task} | processing task",
                  f"slot update_slots: id  0 | task {task} | new prompt, n_ctx_slot = 4096, n_keep = 0, "
                  "n_prompt_tokens = 500",
                  f"slot      release: id  0 | task {task} | stop processing: n_past = 559, truncated = 0",
                  f"slot print_timing: id  0 | task {task} | ", *_timing(500, 60)]
    lines += ["slot launch_slot_: id  0 | task 1 | processing task",
              "slot update_slots: id  0 | task 1 | new prompt, n_ctx_slot = 4096, n_keep = 0, n_prompt_tokens = 6000",
              "slot update_slots: id  0 | task 1 | input truncated, n_ctx = 4096, n_keep = 0, n_left = 4096, "
              "n_prompt_tokens = 4032",
              "slot      release: id  0 | task 1 | stop processing: n_past = 4095, truncated = 1",
              "slot print_timing: id  0 | task 1 | ", *_timing(4032, 64),
              "slot launch_slot_: id  1 | task 3 | processing task",
              "slot update_slots: id  1 | task 3 | new prompt, n_ctx_slot = 4096, n_keep = 0, n_prompt_tokens = 9344",
              "srv    send_error: task id = 3, error: request (9344 tokens) exceeds the available context size "
              "(4096 tokens), try increasing it",
              "slot      release: id  1 | task 3 | stop processing: n_past = 0, truncated = 0"]
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    from forensics.ingest import IngestOptions, ingest

    ingest(tmp_path / "s", [log], IngestOptions(run="r"))
    store = Store(tmp_path / "s")
    assert F.find_runaways(store, "r").height == 0
    over = F.find_prompt_over_context(store, "r")
    assert over.select("slot", "task", "prompt_tokens", "ctx_slot", "gen_tokens", "how").rows() == [
        (0, 1, 4032, 4096, 64, "truncated"), (1, 3, 9344, 4096, None, "rejected")]
    assert over["evidence"].to_list() == [f"{log}:43-50", f"{log}:51-54"]
    classes = F.request_classes(store, "r").filter(pl.col("class") != "normal")
    assert classes.select("slot", "task", "class").sort("slot").rows() == [(0, 1, "prompt over context"),
                                                                         (1, 3, "prompt over context")]

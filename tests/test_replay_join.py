"""The join of replay attempts to hand-built server requests: absolute, order-only and elapsed-time logs,
two instances, and a log shared by two runs.  Every expected value is worked out by hand in comments."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

from forensics import replay, schema
from tests.replay_helpers import FIX, at, instances, ms_instances, ms_records, ms_requests, requests

MATCH_COLS = ["item", "stage", "attempt", "instance", "slot", "task", "match", "reason"]

# Attempt order in attempts.jsonl; strong attempts (slot/tokens) are matched first, then the rest by send time.
MS_ABSOLUTE = [
    ("AAPL", "extract", 1, "main", 0, 1, "matched", "slot+tokens+time"),
    ("MSFT", "extract", 1, "main", 1, 2, "matched", "status+time"),  # the only 500 in its window
    ("MSFT", "extract", 2, "main", 1, 3, "matched", "slot+tokens+time"),
    ("AAPL", "summarize", 1, "main", 0, 4, "matched", "slot+tokens+time"),
    ("NVDA", "extract", 1, "main", 1, 5, "matched", "time"),  # 5.5 s vs 35.5 s for the other free request
    ("MSFT", "summarize", 1, "main", 0, 6, "matched", "slot+tokens+time"),
    ("TSLA", "extract", 1, "main", 0, 7, "matched", "slot+tokens+time"),
    ("TSLA", "summarize", 1, None, None, None, "unmatched", "rejected_before_slot"),  # 503, nothing starts 12.4-14.45 s
    ("NVDA", "extract", 2, "main", 1, 8, "matched", "time"),
]


def rows(df: pl.DataFrame, cols: list[str]) -> list[tuple]:
    return [tuple(r) for r in df.select(cols).iter_rows()]


def test_absolute_log_matches_every_attempt_exactly() -> None:
    recs = ms_records()
    jr = replay.join(ms_requests(), ms_instances(), recs.runs, recs.attempts)
    assert rows(jr.matches, MATCH_COLS) == MS_ABSOLUTE
    assert jr.counts() == {"matched": 8, "ambiguous": 0, "unmatched": 1}
    assert jr.matches["offset_s"].null_count() == 9
    # times are the log's own; every request belongs to run-ms
    assert jr.requests["replay_run"].to_list() == ["run-ms"] * 8
    assert jr.requests["t_start"].to_list() == ms_requests()["t_start"].to_list()
    assert jr.requests.filter(pl.col("task") == 6).select("item", "stage", "attempt").row(0) == ("MSFT", "summarize", 1)


def test_order_only_log_matches_by_slot_tokens_and_order_and_estimates_times() -> None:
    recs = ms_records()
    jr = replay.join(ms_requests(timed=False), ms_instances("order"), recs.runs, recs.attempts)
    got = {(r[0], r[1][0], r[2]): r[3:] for r in rows(jr.matches, ["item", "stage", "attempt", "task", "match", "reason"])}
    assert got[("AAPL", "e", 1)] == (1, "matched", "slot+tokens+order")
    assert got[("MSFT", "e", 1)] == (2, "matched", "status+order")  # R2 is the only request with HTTP 500
    # no slot, no tokens, no time: the two unused slot-1 requests (tasks 5 and 8) both fit; the order of the
    # tasks narrows attempt 1 (sent between tasks 4 and 6, as task 5 was) to task 5 alone; attempt 2 and TSLA's
    # summarize (sent after task 7) are both left with task 8: ambiguous
    assert got[("NVDA", "e", 1)] == (5, "matched", "order+between")
    assert got[("NVDA", "e", 2)][1:] == ("ambiguous", "2 candidates (order)")
    assert got[("TSLA", "e", 1)] == (7, "matched", "slot+tokens+order")
    summarize = {r[0]: r[1:] for r in rows(jr.matches.filter(pl.col("stage") == "summarize"),
                                           ["item", "task", "match"])}
    assert summarize == {"AAPL": (4, "matched"), "MSFT": (6, "matched"), "TSLA": (5, "ambiguous")}
    # times: a matched request starts at its attempt's send and lasts total_ms (task 5: NVDA's first attempt, sent
    # at 5.3 s, for 29.75 s -> 35.05 s); unmatched ones follow the previous request on their slot: task 8 after
    # task 5 for 45 s -> 80.05 s.
    t = {r[0]: (r[1], r[2]) for r in jr.requests.select("task", "t_start", "t_end").iter_rows()}
    base = "2026-03-02T10:00:00"
    assert t[1] == (at(base, 0.0), at(base, 3.9))
    assert t[2] == (at(base, 0.1), at(base, 0.15))
    assert t[3] == (at(base, 1.2), at(base, 5.1))
    assert t[5] == (at(base, 5.3), at(base, 35.05))
    assert t[8] == (at(base, 35.05), at(base, 80.05))
    assert jr.requests["t_start"].null_count() == 0


def _ha_requests(main_basis: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    # main: elapsed since 08:59:00 (launched_at in the manifest); backup: elapsed since its own start,
    # unknown to the harness; a warm-up request at 5.0 s precedes the run.
    main = [(0, 1, 1, 60.05, 61.95, 50, 20, "eos"), (1, 1, 2, 60.20, 95.20, 80, 4096, "limit"),
            (0, 2, 3, 62.15, 64.05, 60, 25, "eos")]
    backup = [(0, 1, 1, 5.0, 5.1, 5, 1, "limit"), (0, 2, 2, 50.25, 53.15, 70, 30, "eos")]
    rs = []
    for inst, lst in (("main", main), ("backup", backup)):
        for slot, seq, task, e0, e1, p, g, stop in lst:
            rs.append({"run": "run-ha", "instance": inst, "path": f"logs/{inst}.log", "slot": slot, "seq": seq,
                       "task": task, "prompt_tokens": p, "gen_tokens": g, "stop_reason": stop,
                       "elapsed_start_s": e0, "elapsed_end_s": e1, "total_ms": round((e1 - e0) * 1000, 3)})
    inst = instances([{"run": "run-ha", "instance": "main", "path": "logs/main.log", "port": 8080, "time_basis": main_basis},
                      {"run": "run-ha", "instance": "backup", "path": "logs/backup.log", "port": 8081,
                       "time_basis": "elapsed"}])
    return requests(rs), inst


def test_two_instances_elapsed_time_anchored_by_launch_and_by_alignment() -> None:
    recs = replay.load([FIX / "two-instance" / "manifest.json", FIX / "two-instance" / "attempts.jsonl"])
    req, inst = _ha_requests("elapsed")
    jr = replay.join(req, inst, recs.runs, recs.attempts)
    assert rows(jr.matches, MATCH_COLS) == [
        ("AAA", "analyze", 1, "main", 0, 1, "matched", "slot+tokens+time"),
        ("BBB", "analyze", 1, "main", 1, 2, "matched", "time"),  # timed out on main ...
        ("CCC", "analyze", 1, "main", 0, 3, "matched", "slot+tokens+time"),
        ("BBB", "analyze", 2, "backup", 0, 2, "matched", "slot+tokens+time"),  # ... retried on backup
    ]
    launch = datetime(2026, 3, 3, 8, 59, tzinfo=timezone.utc).timestamp()
    # backup: the one token-identified pair (send 09:00:20.200, elapsed 50.25) fixes the offset
    backup_off = datetime(2026, 3, 3, 9, 0, 20, 200000, tzinfo=timezone.utc).timestamp() - 50.25
    offs = dict(zip(jr.matches["instance"].to_list(), jr.matches["offset_s"].to_list(), strict=True))
    assert offs["main"] == launch
    assert abs(offs["backup"] - backup_off) < 1e-6
    t = {(r[0], r[1]): (r[2], r[3], r[4]) for r in
         jr.requests.select("instance", "task", "t_start", "t_end", "replay_run").iter_rows()}
    base = "2026-03-03T09:00:00"
    assert t[("main", 2)] == (at(base, 0.2), at(base, 35.2), "run-ha")
    assert t[("backup", 2)] == (at(base, 20.2), at(base, 23.1), "run-ha")
    # the warm-up request ran 45.25 s before the backup request: 08:59:34.95, before the run -> no run
    assert t[("backup", 1)] == (at(base, -25.05), at(base, -24.95), None)


def _naming(runs: list[str], log_path: str) -> pl.DataFrame:
    """Manifests of ``runs`` that list one server, ``srv``, whose log is ``log_path`` (no times, no items)."""
    servers = json.dumps([{"name": "srv", "log_file": Path(log_path).name, "log_path": log_path}])
    return schema.conform(pl.DataFrame({"run": runs, "servers": [servers] * len(runs)}), "runs")


def test_shared_log_is_split_between_runs_by_time() -> None:
    # one absolute log, read into a run of its own ("logs"), serves run-a (10:00-10:01) and run-b (10:05-10:06),
    # whose manifests name it; an unmatched request falls in each run's window, one falls in neither.
    runs = _naming(["run-a", "run-b"], "logs/srv.log")
    att = []
    for run, m in (("run-a", 0), ("run-b", 5)):
        att.append({"run_id": run, "item": "X", "stage": "s", "attempt": 1, "server": "srv", "outcome": "ok",
                    "started_at": f"2026-03-05T10:{m:02d}:00Z", "ended_at": f"2026-03-05T10:{m:02d}:10Z",
                    "id_slot": 0, "tokens_evaluated": 10, "tokens_predicted": 5})
        att.append({"run_id": run, "item": "Y", "stage": "s", "attempt": 1, "server": "srv", "outcome": "ok",
                    "started_at": f"2026-03-05T10:{m:02d}:50Z", "ended_at": f"2026-03-05T10:{m:02d}:59Z"})
    from forensics.replay.records import RawRecord, build

    recs = build([RawRecord("attempt", a, "mem", i) for i, a in enumerate(att, 1)])
    base = "2026-03-05T10:00:00"
    rs = requests([
        {"run": "logs", "instance": "srv", "path": "logs/srv.log", "slot": 0, "seq": i, "task": i,
         "prompt_tokens": p, "gen_tokens": g, "t_start": at(base, s0), "t_end": at(base, s0 + 5)}
        for i, (s0, p, g) in enumerate([(0.1, 10, 5), (30.0, 7, 7), (300.1, 10, 5), (320.0, 8, 8), (200.0, 9, 9)], 1)])
    inst = instances([{"run": "logs", "instance": "srv", "path": "logs/srv.log", "time_basis": "absolute"}])
    jr = replay.join(rs, inst, runs, recs.attempts)
    # X of each run matches by slot+tokens; Y (no slot, no tokens) finds nothing starting in 50-60 s
    assert rows(jr.matches, ["run", "item", "task", "match", "reason"]) == [
        ("run-a", "X", 1, "matched", "slot+tokens+time"), ("run-a", "Y", None, "unmatched", "no_slot_request"),
        ("run-b", "X", 3, "matched", "slot+tokens+time"), ("run-b", "Y", None, "unmatched", "no_slot_request")]
    # run windows (no manifest): first send .. last end = 10:00:00-10:00:59 and 10:05:00-10:05:59
    assert jr.requests.select("task", "replay_run").rows() == [
        (1, "run-a"), (2, "run-a"), (3, "run-b"), (4, "run-b"), (5, None)]
    # without a manifest naming it, another run's log is out of reach, however its instance is named
    alone = replay.join(rs, inst, replay.load([]).runs, recs.attempts)
    assert set(alone.matches["reason"]) == {"no_instance"}
    assert alone.requests["replay_run"].null_count() == 5


def test_attempts_without_a_server_log_are_unmatched_no_instance() -> None:
    recs = ms_records()
    jr = replay.join(requests([]), instances([]), recs.runs, recs.attempts)
    assert set(jr.matches["reason"].to_list()) == {"no_instance"}
    assert jr.requests.height == 0


def _reasons_case() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """One absolute log (run-x, instance main) and attempts that each end unmatched for another reason."""
    base = "2026-03-06T10:00:00"
    rs = requests([
        {"run": "run-x", "instance": "main", "path": "run-x/main.log", "slot": s, "seq": q, "task": t,
         "prompt_tokens": p, "gen_tokens": g, "http_status": h, "t_start": at(base, a), "t_end": at(base, b)}
        for s, q, t, p, g, h, a, b in [(0, 1, 1, 100, 50, 200, 0.0, 2.0), (1, 1, 2, 300, None, 500, 10.0, 10.1),
                                       (0, 2, 3, 10, 10, 200, 40.0, 45.0)]])
    inst = instances([{"run": "run-x", "instance": "main", "path": "run-x/main.log", "time_basis": "absolute"}])
    from forensics.replay.records import RawRecord, build

    def att(run: str, item: str, a: float, b: float, outcome: str = "ok", **kw: object) -> dict:
        return {"run_id": run, "item": item, "stage": "s", "attempt": 1, "server": "main", "outcome": outcome,
                "started_at": at(base, a).isoformat(), "ended_at": at(base, b).isoformat(), **kw}

    recs = build([RawRecord("attempt", a, "mem", i) for i, a in enumerate([
        att("run-x", "A1", 0.0, 2.0, id_slot=0, tokens_evaluated=100, tokens_predicted=50),
        att("run-x", "A2", 0.05, 2.0, id_slot=0, tokens_evaluated=100, tokens_predicted=50),
        att("run-x", "A3", 10.0, 10.2, "failed", http_status=500, tokens_evaluated=999),
        att("run-x", "A4", 20.0, 20.1, "failed", http_status=503),
        att("run-x", "A5", 40.1, 40.2, "failed", http_status=500),
        att("run-x", "A6", 100.0, 130.0, "timeout"),
        att("run-x", "A7", 140.0, 141.0, "cancelled"),
        att("run-x", "A8", 150.0, 151.0),
        att("run-y", "A9", 0.0, 1.0)], 1)])
    return rs, inst, replay.load([]).runs, recs.attempts


def test_an_unmatched_attempt_says_why_no_request_was_tied() -> None:
    jr = replay.join(*_reasons_case())
    assert rows(jr.matches, ["item", "task", "match", "reason"]) == [
        ("A1", 1, "matched", "slot+tokens+time"),
        ("A2", None, "unmatched", "taken"),  # R1 fits it as well, and served A1 (sent first)
        ("A3", None, "unmatched", "evidence_disagrees"),  # R2 has its HTTP 500 but 300 prompt tokens, not 999
        ("A4", None, "unmatched", "rejected_before_slot"),  # nothing starts in 19-21.1 s
        ("A5", None, "unmatched", "rejected_before_slot"),  # R3 starts in its window, but answered 200, not 500
        ("A6", None, "unmatched", "client_timeout"),
        ("A7", None, "unmatched", "client_cancelled"),
        ("A8", None, "unmatched", "no_slot_request"),
        ("A9", None, "unmatched", "no_instance"),  # run-y read no log; run-x's is not its own
    ]
    # every attempt names its server; only the one with no instance in reach has none to show
    assert jr.matches.select("item", "server").filter(pl.col("server").is_null())["item"].to_list() == []

"""The replay join scoped to the runs it concerns, on real run folders (fixtures/server-runs; their READMEs give the
truth): a run's answer is the same alone as beside unrelated runs, whatever their logs are called and whether or
not their lines carry time; an ingest rewrites the join of the runs whose inputs changed and of the runs that share
a server log with them, and no other run's parts; a run with one server needs no ``server`` field; a log without
time never gets a request of zero length; an unmatched attempt says why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from forensics.ingest import IngestOptions, ingest
from forensics.replay import tables as replay_tables
from forensics.store import Store, run_of_part
from tests.conftest import ROOT

RUNS = ROOT / "fixtures" / "server-runs"
# logs named main.log, most without time on the lines (b4747): the case that once made answers depend on the store
OTHERS = ["b4747-healthy", "b4747-deadslot", "b3605-healthy"]


def _copy(tmp: Path, name: str, dest: str | None = None) -> Path:
    out = tmp / "runs" / (dest or name)
    shutil.copytree(RUNS / name, out)
    return out


def _ingest(store: Path, *folders: Path, mapping: Path | None = None) -> None:
    ingest(store, list(folders), IngestOptions(keep_going=True, mapping=mapping))


def _of_run(store: Path, run: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The run's matches and the requests the join gave it, in a stable order."""
    s = Store(store)
    m = s.table("matches").filter(pl.col("run") == run).sort("item", "stage", "attempt")
    r = s.table("requests").filter(pl.col("run") == run).sort("path", "instance", "slot", "seq", "line_first")
    return m, r


def _parts(store: Path, run: str) -> dict[str, list[str]]:
    s = Store(store)
    return {t: sorted(p for p in s.parts(t) if run_of_part(p) == run) for t in ("requests", "matches", "instances")}


@pytest.mark.parametrize("run", ["b4747-runaway-timeouts", "b4747-runaway-nocs", "b11312-failover"])
def test_a_run_joins_the_same_alone_and_beside_unrelated_runs(run: str, tmp_path: Path) -> None:
    mine = _copy(tmp_path, run)
    others = [_copy(tmp_path, o) for o in OTHERS]
    _ingest(tmp_path / "alone", mine)
    _ingest(tmp_path / "after", *others)
    _ingest(tmp_path / "after", mine)
    _ingest(tmp_path / "before", mine)
    before = _parts(tmp_path / "before", run)
    _ingest(tmp_path / "before", *others)
    _ingest(tmp_path / "together", mine, *others)
    alone = _of_run(tmp_path / "alone", run)
    assert alone[0].height > 40 and alone[1].height > 40
    for store in ("after", "before", "together"):
        got = _of_run(tmp_path / store, run)
        assert got[0].equals(alone[0]), store
        assert got[1].equals(alone[1]), store
    # ingesting the others did not touch this run's parts: not even rewritten with the same rows
    assert _parts(tmp_path / "before", run) == before


def test_an_ingest_leaves_other_runs_parts_and_packs_alone(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _ingest(store, *[_copy(tmp_path, o) for o in OTHERS])
    from forensics.compact import compact

    compact(Store(store))
    s = Store(store)
    packs = {t: s.packs(t) for t in ("requests", "matches")}
    kept = {o: _parts(store, o) for o in OTHERS}
    _ingest(store, _copy(tmp_path, "b4747-runaway-timeouts"))
    s = Store(store)
    assert {t: s.packs(t) for t in ("requests", "matches")} == packs
    assert {o: _parts(store, o) for o in OTHERS} == kept
    assert not s.meta("join_pending") and s.meta("join_stored") is True


def _split_run(tmp: Path) -> tuple[Path, Path, Path]:
    """b11312-healthy's one log in a folder of its own, its records split into two runs whose manifests both
    name that log (a long-running server that served two replay runs)."""
    src = RUNS / "b11312-healthy"
    logs = tmp / "runs" / "server"
    logs.mkdir(parents=True)
    shutil.copy(src / "main.log", logs / "main.log")
    manifest = json.loads((src / "manifest.json").read_text())
    lines = (src / "attempts.jsonl").read_text().splitlines()
    half = sorted(lines, key=lambda ln: json.loads(ln)["started_at"])
    folders = []
    for name, part in (("part-a", half[:24]), ("part-b", half[24:])):
        d = tmp / "runs" / name
        d.mkdir()
        recs = [{**json.loads(ln), "run_id": name} for ln in part]
        (d / "attempts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        m = {**manifest, "run_id": name, "started_at": recs[0]["started_at"],
             "ended_at": max(r["ended_at"] for r in recs),
             "servers": [{**s, "log_file": "../server/main.log"} for s in manifest["servers"]]}
        (d / "manifest.json").write_text(json.dumps(m))
        folders.append(d)
    return logs, folders[0], folders[1]


def test_runs_that_share_a_log_are_joined_together(tmp_path: Path) -> None:
    logs, a, b = _split_run(tmp_path)
    _ingest(tmp_path / "one-go", logs, a, b)
    _ingest(tmp_path / "steps", logs, a)
    _ingest(tmp_path / "steps", b)  # part-a shares the log: its join is done again with part-b's
    for run in ("part-a", "part-b"):
        m, r = _of_run(tmp_path / "one-go", run)
        assert m["match"].to_list() == ["matched"] * 24, run
        assert r.height == 24 and set(r["replay_run"]) == {run}
        got = _of_run(tmp_path / "steps", run)
        assert got[0].equals(m) and got[1].equals(r), run
    # the log's requests are all given to one of the two runs; none is left behind in the log's own folder
    assert Store(tmp_path / "steps").table("requests").filter(pl.col("run") == "server").height == 0


def _without_server(folder: Path) -> None:
    path = folder / "attempts.jsonl"
    recs = [json.loads(ln) for ln in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "server"}) + "\n" for r in recs))


NO_SERVER_MAPPING = """[attempts]
files = "results.jsonl"
[attempts.fields]
item = "item"
stage = "stage"
attempt = "attempt"
started_at = "started_at"
ended_at = "ended_at"
http_status = "http_status"
id_slot = "id_slot"
tokens_evaluated = "tokens_evaluated"
tokens_predicted = "tokens_predicted"
outcome = "outcome"
"""


def test_a_run_with_one_server_needs_no_server_field(tmp_path: Path) -> None:
    run = "b11312-healthy"
    _ingest(tmp_path / "with", _copy(tmp_path, run, "with"))
    bare = _copy(tmp_path, run, "bare")
    _without_server(bare)
    _ingest(tmp_path / "bare", bare)
    mapped = _copy(tmp_path, run, "mapped")
    (mapped / "attempts.jsonl").rename(mapped / "results.jsonl")  # read by the mapping, not as canonical records
    (tmp_path / "noserver.toml").write_text(NO_SERVER_MAPPING)
    _ingest(tmp_path / "mapped", mapped, mapping=tmp_path / "noserver.toml")
    want = Store(tmp_path / "with").table("matches").select("item", "stage", "attempt", "slot", "task", "match",
                                                             "server").sort("item", "stage", "attempt")
    assert want["match"].to_list() == ["matched"] * 48 and set(want["server"]) == {"main"}
    for store in ("bare", "mapped"):
        got = Store(tmp_path / store).table("matches").select(want.columns).sort("item", "stage", "attempt")
        assert got.equals(want), store


def test_a_failover_run_without_server_names_the_server_of_every_attempt_it_tied(tmp_path: Path) -> None:
    truth = {(r["item"], r["stage"], r["attempt"]): r["server"] for r in
             map(json.loads, (RUNS / "b11312-failover" / "attempts.jsonl").read_text().splitlines())}
    bare = _copy(tmp_path, "b11312-failover")
    _without_server(bare)
    _ingest(tmp_path / "store", bare)
    store = Store(tmp_path / "store")
    m = store.table("matches")
    tied = m.filter(pl.col("match") == "matched")
    assert tied.height == 52  # the 48 that succeeded (44 on main, 4 on backup) and 4 timeouts placed by time
    assert {(r["item"], r["stage"], r["attempt"]): r["server"] for r in tied.iter_rows(named=True)} == \
        {k: truth[k] for k in zip(tied["item"], tied["stage"], tied["attempt"], strict=True)}
    # the others are not given a server they cannot be shown to have reached
    # the 4 ambiguous ones' candidates are all on main; the 4 unmatched could have been on either server
    assert m.filter(pl.col("match") == "ambiguous")["server"].to_list() == ["main"] * 4
    assert m.filter(pl.col("server").is_null())["match"].to_list() == ["unmatched"] * 4
    runs = replay_tables.runs_table(store)
    assert runs.select("attempts", "requests", "items_missing").row(0) == (60, 60, 0)


@pytest.mark.parametrize("run", ["b4747-runaway-timeouts", "b4747-runaway-nocs", "b4747-deadslot", "b4747-healthy"])
def test_no_request_of_a_log_without_time_lasts_zero_seconds(run: str, tmp_path: Path) -> None:
    _ingest(tmp_path / "store", _copy(tmp_path, run))
    req = Store(tmp_path / "store").table("requests")
    assert req.filter(pl.col("t_end") <= pl.col("t_start")).height == 0
    # every time is the join's estimate, and says so
    assert set(req.filter(pl.col("t_start").is_not_null() | pl.col("t_end").is_not_null())["clock"]) <= {"attempt", "order"}
    assert req.filter(pl.col("t_start").is_null() & pl.col("t_end").is_null())["clock"].null_count() == \
        req.filter(pl.col("t_start").is_null() & pl.col("t_end").is_null()).height
    # a request whose length the log does not give, and that served no attempt, gets no end
    unknown = req.filter(pl.col("total_ms").is_null() & pl.col("clock").ne_missing("attempt"))
    assert unknown["t_end"].null_count() == unknown.height


def test_the_runaway_that_finished_is_tied_by_its_tokens_not_the_cancelled_one_before_it(tmp_path: Path) -> None:
    # README: "CRM timed out twice and its third attempt completed (835 generated tokens, truncated, HTTP 200)";
    # the cancelled try before it on slot 0 had the same 189-token prompt and logged no generated count
    _ingest(tmp_path / "store", _copy(tmp_path, "b4747-runaway-timeouts"))
    store = Store(tmp_path / "store")
    crm = store.table("matches").filter((pl.col("item") == "CRM") & (pl.col("attempt") == 3)).row(0, named=True)
    assert (crm["match"], crm["slot"], crm["task"]) == ("matched", 0, 2318)
    req = store.table("requests").filter(pl.col("task") == 2318).row(0, named=True)
    assert req["gen_tokens"] == 835 and req["clock"] == "attempt"
    assert round((req["t_end"] - req["t_start"]).total_seconds(), 2) == 108.93  # its own total_ms
    # the timed-out tries: on a log without time, the order of the tasks between the tied requests and the cancel
    # lines tie each to its attempt (README: "The server cancelled each abandoned task when its client went"),
    # never "rejected before a slot"
    missing = replay_tables.missing(store, "b4747-runaway-timeouts").filter(pl.col("reason") == "timeout")
    assert missing["evidence"].str.starts_with("server stopped with the client: main slot ").all()
    assert not missing["evidence"].str.contains("rejected").any()
    tied = store.table("matches").filter(pl.col("item").is_in(["NVDA", "JPM", "KO"]) & (pl.col("stage") == "analyze"))
    assert tied["match"].to_list() == ["matched"] * 9


def test_missing_says_unknown_rather_than_zero(tmp_path: Path) -> None:
    # README: ADBE's last analyze attempt was still running when the server was killed; its log has no timings
    _ingest(tmp_path / "store", _copy(tmp_path, "b3605-deadslot-timeouts"))
    missing = replay_tables.missing(Store(tmp_path / "store"), "b3605-deadslot-timeouts")
    adbe = missing.filter((pl.col("item") == "ADBE") & (pl.col("stage") == "analyze"))["evidence"].item()
    assert "(unknown tokens, stop unknown)" in adbe and "0 tokens" not in adbe
    assert not any("?" in e or "None" in e for e in missing["evidence"])


def test_a_store_joined_by_older_rules_is_joined_again_at_its_next_ingest(tmp_path: Path) -> None:
    folder = _copy(tmp_path, "b4747-runaway-timeouts")
    _ingest(tmp_path / "store", folder)
    want = _of_run(tmp_path / "store", "b4747-runaway-timeouts")
    s = Store(tmp_path / "store")
    txn = s.transaction()  # as a store of the previous version leaves it: no join_version, no clock
    txn.meta_updates["join_version"] = None
    txn.commit()
    before = _parts(tmp_path / "store", "b4747-runaway-timeouts")
    _ingest(tmp_path / "store", folder)  # nothing changed, but the join's rules did
    assert Store(tmp_path / "store").meta("join_version") is not None
    assert _parts(tmp_path / "store", "b4747-runaway-timeouts")["matches"] != before["matches"]
    got = _of_run(tmp_path / "store", "b4747-runaway-timeouts")
    assert got[0].equals(want[0]) and got[1].equals(want[1])
    after = _parts(tmp_path / "store", "b4747-runaway-timeouts")
    _ingest(tmp_path / "store", folder)  # and then not again
    assert _parts(tmp_path / "store", "b4747-runaway-timeouts") == after


CASES = ROOT / "fixtures" / "join"


def _case(name: str, tag: str = "") -> list[pl.DataFrame]:
    """A recorded join case's inputs; with ``tag``, its runs and log paths renamed apart (another run folder)."""
    frames = [pl.read_parquet(CASES / name / f"{t}.parquet") for t in ("requests", "instances", "runs", "attempts")]
    if not tag:
        return frames
    out = []
    for df in frames:
        df = df.with_columns(*[(pl.lit(tag) + pl.col(c)).alias(c) for c in ("run", "replay_run", "path") if c in df.columns])
        if "servers" in df.columns:
            df = df.with_columns(pl.col("servers").str.replace_all('"log_path": "', f'"log_path": "{tag}'))
        out.append(df)
    return out


@pytest.mark.parametrize(("mine", "other"), [("demo-order", "deadslot-order"), ("order-only", "demo-order"),
                                             ("deadslot-order", "mixed-1003"), ("two-instances-elapsed", "demo"),
                                             ("shared-log", "order-only"), ("mixed-7", "mixed-11")])
def test_a_runs_join_does_not_depend_on_other_runs_given_with_it(mine: str, other: str) -> None:
    from forensics import replay

    alone = replay.join(*_case(mine))
    both = replay.join(*[pl.concat([a, b], how="diagonal_relaxed") for a, b in
                         zip(_case(mine), _case(other, "x-"), strict=True)])
    runs = set(alone.matches["run"])
    assert both.matches.filter(pl.col("run").is_in(runs)).equals(alone.matches)
    assert both.requests.filter(~pl.col("path").str.starts_with("x-")).equals(alone.requests)
    assert set(alone.notes) <= set(both.notes)

"""Issue 31's "What goes wrong", one test per item, on the real run folders of fixtures/server-runs (their truth:
labels.json and README.md, read by ``tests.real_runs.normalise``; never this project's output).

1. a run whose records name no server joins fully, and what-if/recommend answer;
2. runs of several builds never pool: one throughput table per setup;
3. durations are never 0 and close to what the client measured; a log without time gives each runaway its item
   and a duration, ``missing`` never says "rejected before a slot" for a request that ran, a dead slot's lost items
   are the truth's, and a runaway's own HTTP 500 is its own;
4. the verdict tells every HTTP error, a cancelled request's tokens are never 0, and it says what stopped each
   runaway (the client, the shutdown) and that ``--context-shift`` is why it did not stop;
5. the cap table never counts as cut a response that stopped at the harness's own cap;
6. an instance has one name everywhere, time columns are wall clock or empty, and the report's failed count is
   the verdict's.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from forensics import findings, metrics, report
from forensics.analyse import ingest_and_analyse
from forensics.cli import cli
from forensics.ingest import IngestOptions
from forensics.session import read_derived
from forensics.store import Store
from forensics.verdict import verdict
from tests.real_runs import FIXTURES, RunFolder, folders

BY_NAME = {f.path.name: f for f in folders(FIXTURES)}
_STORES: dict[str, Store] = {}
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("one-truth-real")


def store_of(name: str, base: Path) -> Store:
    """The folder ``name`` of fixtures/server-runs ingested (and analysed) into a store of its own, once."""
    if name not in _STORES:
        ingest_and_analyse(base / name, [BY_NAME[name].path], IngestOptions(keep_going=True))
        _STORES[name] = Store(base / name)
    return _STORES[name]


def cli_json(store: Store | Path, *args: str) -> list[dict]:
    root = store.root if isinstance(store, Store) else store  # (a Path's own .root is "/")
    res = CliRunner().invoke(cli, ["--store", str(root), *args, "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def close(got: float, want: float) -> bool:
    """Within 15 % or 2 s of what the client measured (the client's time includes the HTTP round trip)."""
    return abs(got - want) <= max(0.15 * want, 2.0)


def runaway_facts(store: Store, run: str) -> pl.DataFrame:
    """The runaways with their attempt, what stopped them and the server's error (the request facts of the same
    requests)."""
    facts = read_derived(store, "request_facts", [run]).select("instance", "slot", "task", "attempt", "stop_cause",
                                                               "error")
    return findings.find_runaways(store, run).drop("stop_cause", "error", strict=False) \
        .join(facts, on=["instance", "slot", "task"], how="left")


# ---------------------------------------------------------------------------------------- 1: no server field
@pytest.mark.parametrize(("name", "records"), [("b11434-sweep-np2", "client_requests.jsonl"),
                                               ("b11312-healthy", "attempts.jsonl")])
def test_records_that_name_no_server_join_fully(name: str, records: str, tmp_path: Path) -> None:
    """A one-server run folder whose records carry no ``server`` field (the manifest still lists its server) joins
    every attempt, and what-if and recommend answer on it."""
    folder = tmp_path / name
    shutil.copytree(BY_NAME[name].path, folder)
    lines = [json.loads(x) for x in (folder / records).read_text("utf-8").splitlines() if x.strip()]
    assert all("server" in r for r in lines)
    (folder / records).write_text("".join(json.dumps({k: v for k, v in r.items() if k != "server"}) + "\n"
                                          for r in lines), encoding="utf-8")
    ingest_and_analyse(tmp_path / "store", [folder], IngestOptions(keep_going=True))
    store = Store(tmp_path / "store")
    m = store.table("matches")
    assert m.height == len(lines)
    assert m.filter(pl.col("match") != "matched").height == 0, m.group_by("match", "reason").len()
    [run] = m["run"].unique().to_list()
    # what-if at the run's own np: one run measures one np, and the cost of an extra slot cannot be told from one
    # np (what-if refuses another np then, with exit 2 and a line saying so)
    [np] = metrics.throughput(store, [run])["np"].to_list()
    for args in (["whatif", run, "--np", str(np)], ["recommend", "--max-run", "600s"]):
        res = CliRunner().invoke(cli, ["--store", str(store.root), *args])
        assert res.exit_code == 0, (args, res.output)
        assert "no run has request timings" not in res.output


# ---------------------------------------------------------------------------------------- 2: never pooled
SWEEPS = ("b11312-sweep-np1", "b11312-sweep-np2", "b11312-sweep-np4", "b11312-sweep-np8", "b4747-healthy",
          "b3605-healthy", "b11434-sweep-np1", "b11434-sweep-np2", "b11434-sweep-np4", "b11434-sweep-np6",
          "b11434-sweep-np8", "b4579-sweep-np1", "b4579-sweep-np2", "b4579-sweep-np4")


def test_throughput_of_several_builds_is_one_table_per_setup(tmp_path: Path) -> None:
    ingest_and_analyse(tmp_path / "store", [BY_NAME[n].path for n in SWEEPS], IngestOptions(keep_going=True))
    rows = cli_json(tmp_path / "store", "throughput", "--by", "np")
    by_setup: dict[str, list[int]] = {}
    for r in rows:
        assert r["runs"] == 1, r  # each np measured once per setup: nothing of another build averaged in
        by_setup.setdefault(r["setup"], []).append(r["np"])
    builds = {s.split(" · ")[0]: nps for s, nps in by_setup.items()}
    assert len(builds) == len(by_setup) == 5, by_setup  # one setup per build: five tables, never a pool
    assert builds["b11312"] == [1, 2, 4, 8]
    assert builds["b11434"] == [1, 2, 4, 6, 8]
    assert builds["b4579"] == [1, 2, 4]
    assert builds["b4747"] == [4] and builds["b3605"] == [4]


# ---------------------------------------------------------------------------------------- 3: durations, items
def test_context_shift_runaways_last_what_the_client_waited(base: Path) -> None:
    """b11434-ctxshift-runaway: NVDA and JPM stopped by 25 s client timeouts, MA by its 30 s timeout during the
    shutdown, HD ran until the server was killed 45 s after it started; none is 0 s."""
    name = "b11434-ctxshift-runaway"
    truth, store = BY_NAME[name].facts, store_of(name, base)
    rows = runaway_facts(store, name)
    assert rows.height == len(truth.client_s) == 4
    for r in rows.iter_rows(named=True):
        want = truth.client_s[(r["item"], r["stage"], r["attempt"])]
        assert r["seconds"] and close(r["seconds"], want), (r["item"], r["seconds"], want)
    stopped = {r["item"]: r["stop_cause"] for r in rows.iter_rows(named=True)}
    assert stopped == {"NVDA": "client", "JPM": "client", "MA": "client", "HD": "shutdown"}


UNTIMED = ("b4579-nots-runaway", "b4579-nots-deadslot", "b4747-runaway-timeouts", "b4747-runaway-nocs")


@pytest.mark.parametrize("name", UNTIMED)
def test_a_log_without_time_gives_each_runaway_its_item_and_duration(name: str, base: Path) -> None:
    folder: RunFolder = BY_NAME[name]
    truth, store = folder.facts, store_of(name, base)
    rows = runaway_facts(store, name)
    assert rows.height >= truth.runaway_attempts and rows["item"].null_count() == 0, rows
    assert rows.filter(pl.col("seconds").is_null() | (pl.col("seconds") <= 0)).height == 0, rows
    assert {(i, s) for i, s in rows.select("item", "stage").iter_rows()} <= truth.runaways_may
    for r in rows.iter_rows(named=True):  # the 2026-12 labels give each one's client time
        want = truth.client_s.get((r["item"], r["stage"], r["attempt"]))
        if want is not None:
            assert close(r["seconds"], want), (r["item"], r["attempt"], r["seconds"], want)
    # a runaway's own HTTP 500 is its own: not the server's cleanup after it called a cancel, and not "the slot's
    # next request failed" when that request is the next runaway with its own 500
    own = rows.filter(pl.col("error").is_not_null())
    assert not own["followed_by"].fill_null("").str.contains("cancel").any(), own
    nxt = rows.sort("instance", "slot", "seq").with_columns(
        pl.col("seq").shift(-1).over("instance", "slot").alias("next_seq"))
    seqs = read_derived(store, "request_facts", [name]).select("instance", "slot", "seq")
    after = nxt.join(seqs.rename({"seq": "following"}), on=["instance", "slot"]) \
        .filter(pl.col("following") > pl.col("seq")).group_by("instance", "slot", "seq") \
        .agg(pl.col("following").min()).join(nxt, on=["instance", "slot", "seq"])
    assert after.filter(pl.col("following") == pl.col("next_seq")
                        & pl.col("followed_by").fill_null("").str.contains("slot_next_http")).height == 0
    # missing never says a request that ran on a slot was rejected before one
    missing = cli_json(store, "missing", name)
    ran = set(rows["item"].to_list())
    assert not [m for m in missing if m["item"] in ran and "rejected before a slot" in (m["evidence"] or "")]


@pytest.mark.parametrize("name", ["b4579-nots-deadslot", "b4747-deadslot", "b3605-deadslot"])
def test_a_dead_slot_loses_the_items_the_truth_says(name: str, base: Path) -> None:
    truth, store = BY_NAME[name].facts, store_of(name, base)
    assert truth.dead_slot is not None
    [row] = findings.find_dead_slots(store, name).iter_rows(named=True)
    assert (row["slot"], row["items_lost"]) == (truth.dead_slot.slot, len(truth.dead_slot.items_lost))
    [fact] = [f for f in verdict(store, name)[0].facts if f.kind == "dead_slot"]
    assert all(it in fact.sentence for it in truth.dead_slot.items_lost), fact.sentence


# ---------------------------------------------------------------------------------------- 4: the verdict
@pytest.mark.parametrize("name", ["b11434-client-errors", "b4579-client-errors", "b11434-jsonl-lv4"])
def test_the_verdict_tells_every_http_error(name: str, base: Path) -> None:
    """b11434-client-errors: 8 HTTP 400s and 2 HTTP 500s; b4579-client-errors: 6 HTTP 500s (a bad body, a batch
    that failed to decode, a free-text output that ran to the context) and 2 HTTP 400s."""
    truth, store = BY_NAME[name].facts, store_of(name, base)
    [v] = verdict(store, name)
    told: dict[int, int] = {}
    for f in v.facts:
        for status, n in (f.fields.get("http") or {}).items():
            told[int(status)] = told.get(int(status), 0) + int(n)
    assert told == truth.http, v.paragraph()
    if truth.http.get(500):
        assert "HTTP 500" in v.paragraph() or "context shift is disabled" in v.paragraph()


def test_a_cancelled_request_never_shows_0_tokens(base: Path) -> None:
    """b11312-failover: the requests the client abandoned while main was stopped generated tokens before the
    cancel (n_past at release is past their prompt): their tokens are that, or unknown, never 0."""
    store = store_of("b11312-failover", base)
    cancelled = read_derived(store, "request_facts", ["b11312-failover"]).filter(pl.col("stop_cause") == "client")
    assert cancelled.height == 12
    assert cancelled.filter(pl.col("gen_tokens") == 0).height == 0
    known = cancelled.filter(pl.col("prompt_tokens").is_not_null() & (pl.col("n_past_end") > pl.col("prompt_tokens")))
    assert known.height and (known["gen_tokens"] == known["n_past_end"] - known["prompt_tokens"]).all()


def test_the_verdict_says_context_shift_and_what_stopped_each_runaway(base: Path) -> None:
    store = store_of("b11434-ctxshift-runaway", base)
    [v] = verdict(store, "b11434-ctxshift-runaway")
    [fact] = [f for f in v.facts if f.kind == "runaway"]
    assert fact.fields["context_shift"] is True and "`--context-shift`" in fact.sentence
    assert "3 until the client gave up" in fact.sentence and "1 until the server shut down" in fact.sentence


# ---------------------------------------------------------------------------------------- 5: the cap table
@pytest.mark.parametrize("name", ["b11434-caps", "b11312-runaway"])
def test_the_cap_table_cuts_only_what_a_cap_would_shorten(name: str, base: Path) -> None:
    """b11434-caps capped analyze at 96 and 14 analyze stopped exactly there; b11312-runaway capped analyze at 64.
    A candidate cap counts a normal response as cut only when the response is longer than the cap: never one that
    stopped at its own cap at or below the candidate."""
    store = store_of(name, base)
    facts = read_derived(store, "request_facts", [name])
    runaways = findings.find_runaways(store, name).select("instance", "slot", "task")
    normal = facts.join(runaways, on=["instance", "slot", "task"], how="anti").filter(~pl.col("failed"))
    at_own_cap = normal.filter(pl.col("cap_sent").is_not_null() & (pl.col("gen_tokens") == pl.col("cap_sent")))
    assert at_own_cap.height >= 14
    for row in cli_json(store, "cap", name):
        mine = normal if not row["stage"] else normal.filter(pl.col("stage") == row["stage"])
        assert row["normal_cut"] == mine.filter(pl.col("gen_tokens") > row["cap"]).height, row
        own = at_own_cap if not row["stage"] else at_own_cap.filter(pl.col("stage") == row["stage"])
        if own.height and row["cap"] >= own["cap_sent"].max():
            assert row["normal_cut"] == 0 or not row["stage"], row


# ---------------------------------------------------------------------------------------- 6: names and units
def test_one_name_per_instance_and_wall_clock_times(tmp_path: Path) -> None:
    """b11312-deadslot with its log renamed server.log (the manifest names the server `main` and its log
    server.log): every output says `main`; every time column is wall clock or empty; the report's failed count is
    the verdict's."""
    folder = tmp_path / "b11312-deadslot"
    shutil.copytree(BY_NAME["b11312-deadslot"].path, folder)
    (folder / "main.log").rename(folder / "server.log")
    manifest = json.loads((folder / "manifest.json").read_text("utf-8"))
    manifest["servers"][0]["log_file"] = "server.log"
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    ingest_and_analyse(tmp_path / "store", [folder], IngestOptions(keep_going=True))
    store = Store(tmp_path / "store")
    [run] = read_derived(store, "run_facts", None)["run"].to_list()
    [v] = verdict(store, run)
    assert "`main`" in v.paragraph() or "Slot 2 of `main`" in v.paragraph()
    for command in ("deadslots", "runaways"):
        rows = cli_json(store, command, run)
        assert rows and {r["instance"] for r in rows} == {"main"}, command
    missing = cli_json(store, "missing", run)
    assert all(m["evidence"].startswith("main slot ") for m in missing if "slot" in (m["evidence"] or "")), missing
    res = CliRunner().invoke(cli, ["--store", str(store.root), "summary"])
    assert res.exit_code == 0 and " main " in res.stdout and " server " not in res.stdout, res.stdout
    for command, cols in (("deadslots", ("dead_from",)), ("errors", ("first", "last"))):
        for r in cli_json(store, command, run):
            for c in cols:
                assert r[c] in (None, "") or ISO.match(r[c]), (command, c, r[c])
    # the report's "Failed requests" lists the failed requests the run metrics count (4 extracts that did not
    # parse: README), never "none" beside "failed 4"
    page = report.write_report(store, run, tmp_path / "r.html").path.read_text(encoding="utf-8")
    section = page[page.index("<h3>Failed requests</h3>"):]
    section = section[:section.index("</table>")] if "</table>" in section else section[:200]
    metrics = cli_json(store, "throughput", run)[0]["failed"]
    assert metrics == 4 and section.count("<tr><td") == metrics, section[:300]

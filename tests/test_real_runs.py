"""Real run folders of several llama-server builds (fixtures/server-runs, see tests/real_runs.py): the verdict
tells the truth the harness wrote down, and every way of asking gives the same counts.

The truth is `labels.json` (what the harness sent and received, never the tool's output) or, for the two folders
recorded before it existed, their README.  A healthy run gets the healthy line and nothing else but notes; every
dead slot, runaway, missing item, crash, client timeout and failover is named with the right cause and nothing
is named that did not happen.  "One truth everywhere": compare, the report, the notebook's API, watch and the
CLI count each finding the same way on every folder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from forensics import compare, findings, registry, report
from forensics.cli import cli
from forensics.ingest import IngestOptions, ingest
from forensics.session import Analysis
from forensics.store import Store
from forensics.verdict import FINDING, RunVerdict, verdict
from tests.real_runs import FIXTURES, RunFolder, folders

FOLDERS = [f for f in folders() if f.truth]  # REAL_RUNS_ROOT may hold a folder still being recorded
IDS = [f.id for f in FOLDERS]
_STORES: dict[str, Store] = {}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real-runs")


def store_of(folder: RunFolder, base: Path) -> Store:
    """The folder ingested into a store of its own (once per session)."""
    if folder.id not in _STORES:
        root = base / folder.id.replace("/", "-")
        ingest(root, [folder.path], IngestOptions(keep_going=True))
        _STORES[folder.id] = Store(root)
    return _STORES[folder.id]


def _run(store: Store) -> str:
    from forensics.runs import all_runs

    names = all_runs(store)
    assert len(names) == 1, names
    return names[0]


def test_the_folders_are_there() -> None:
    """The real folders of the fixtures (two builds' logs at least); REAL_RUNS_ROOT may add others."""
    fixtures = folders(FIXTURES)
    assert {f.scenario for f in fixtures} >= {"real-2026", "real-b4747"}
    assert all(f.truth for f in fixtures), [f.id for f in fixtures if not f.truth]


@pytest.mark.parametrize("folder", FOLDERS, ids=IDS)
def test_the_verdict_tells_the_truth(folder: RunFolder, base: Path) -> None:
    store = store_of(folder, base)
    run = _run(store)
    [v] = verdict(store, run)
    t = folder.truth
    kinds = {f.kind for f in v.facts if f.severity == FINDING}
    if folder.healthy:
        assert v.healthy, v.paragraph()
        assert v.facts[0].kind == "healthy" and v.facts[0].sentence.endswith(" nothing abnormal found.")
        assert all(f.kind == "healthy" or f.severity != FINDING for f in v.facts), v.paragraph()
    else:
        assert not v.healthy, v.paragraph()
    _no_false_alarm(folder, kinds, v)
    with Analysis.open(store, run) as s:
        _dead_slot(t, s, v)
        _runaways(t, s.rows("runaway"), v)
        prompts = s.rows("prompt_over_context")
        if folder.prompts:
            how, n = folder.prompts
            assert prompts.filter(pl.col("how").str.contains(how)).height == n == prompts.height, v.paragraph()
        else:
            assert prompts.height == 0, v.paragraph()
        got_missing = set(s.rows("missing").select("item", "stage").iter_rows())
        assert got_missing == {(m["item"], m["stage"]) for m in t.get("missing") or []}, v.paragraph()
        fo = s.rows("failover")
        assert int((fo["outcome"] == "timeout").sum()) == len(t.get("timeouts") or []), v.paragraph()
        assert fo.filter(pl.col("failed_over")).height == len(t.get("failovers") or []), v.paragraph()
        crashes = s.rows("crash")
        stalls = s.rows("kv_stall")
    _crash_phase(t, crashes, v)
    # a KV-cache stall: hundreds of "no free space" lines (as the README counts them) are named, never more lines
    # than the log has; a few retries that succeed are not
    assert int(stalls["lines"].sum()) <= folder.kv_warnings, v.paragraph()
    if folder.kv_warnings >= 100:
        assert "kv_stall" in {f.kind for f in v.facts}, v.paragraph()


def test_the_cost_is_what_the_truth_says(base: Path) -> None:
    """The run's span is the harness's wall time, and for a dead slot whose items stayed on it (every request
    pinned to its worker's slot) the run needed what the healthy workers needed: the end of their last attempt,
    from the harness's own records (attempts.jsonl).  Both within 10 %."""
    checked = 0
    for folder in FOLDERS:
        t = folder.truth
        if not t.get("run_wall_s") or not (folder.path / "attempts.jsonl").is_file():
            continue
        store = store_of(folder, base)
        [v] = verdict(store, _run(store))
        cost = next((f.fields for f in v.facts if f.kind == "cost"), {})
        if t.get("dead_slot"):
            assert "needed_s" in cost, v.paragraph()  # a dead slot that cost nothing would not be one
        if "run_s" in cost:
            assert cost["run_s"] == pytest.approx(t["run_wall_s"], rel=0.10), folder.id
        if t.get("dead_slot") and t.get("worker_items"):
            healthy = {it for w, items in t["worker_items"].items() if int(w) != t["dead_slot"]["slot"]
                       for it in items}
            att = pl.read_ndjson(folder.path / "attempts.jsonl").with_columns(
                pl.col("started_at").str.to_datetime(time_zone="UTC"), pl.col("ended_at").str.to_datetime(time_zone="UTC"))
            start = att["started_at"].min()
            done = att.filter(pl.col("item").is_in(sorted(healthy)))["ended_at"].max()
            needed = (done - start).total_seconds()  # type: ignore[operator]
            assert cost["needed_s"] == pytest.approx(needed, rel=0.10), (folder.id, cost, needed)
            checked += 1
    assert checked or not any(f.truth.get("dead_slot") and f.truth.get("worker_items") for f in FOLDERS)


@pytest.mark.parametrize("folder", [f for f in FOLDERS if f.truth.get("tokens_predicted_total")],
                         ids=[f.id for f in FOLDERS if f.truth.get("tokens_predicted_total")])
def test_throughput_is_the_clients(folder: RunFolder, base: Path) -> None:
    """Generated tokens per second of wall time, as the harness measured them: within 5 %."""
    from forensics import metrics

    store = store_of(folder, base)
    [row] = metrics.throughput(store, [_run(store)]).iter_rows(named=True)
    truth = folder.truth["tokens_predicted_total"] / folder.truth["run_wall_s"]
    assert row["gen_tok_per_s"] == pytest.approx(truth, rel=0.05)


def _no_false_alarm(folder: RunFolder, kinds: set[str], v: RunVerdict) -> None:
    """Nothing is named that the truth does not have."""
    t = folder.truth
    allowed = {"healthy", "cost"}
    allowed |= {"dead_slot"} if t.get("dead_slot") else set()
    allowed |= {"runaway"} if t.get("uncapped_requests") else set()
    allowed |= {"failover"} if t.get("timeouts") or t.get("failovers") else set()
    allowed |= {"missing", "failed"} if t.get("missing") or set(t.get("outcomes") or {}) - {"ok"} else set()
    allowed |= {"prompt_over_context"} if folder.prompts else set()
    allowed |= {"kv_stall"} if folder.kv_warnings >= 20 else set()
    allowed |= {"crash"} if any(code not in (0, -6) for code in (t.get("server_exit") or {}).values()) else set()
    assert kinds <= allowed, (sorted(kinds - allowed), v.paragraph())


def _runaways(t: dict[str, Any], rows: pl.DataFrame, v: RunVerdict) -> None:
    """Every uncapped item x stage ran away (random weights never sample EOS), and nothing else did.  A request
    the client gave up on and sent again ran away each time: more runaway requests than uncapped item x stages,
    each on one of them (or not tied to the records by the join)."""
    want = {(u["item"], u["stage"]) for u in t.get("uncapped_requests") or []}
    matched = {(i, st) for i, st in rows.select("item", "stage").iter_rows() if i is not None} \
        if "item" in rows.columns else set()
    assert rows.height >= len(want), v.paragraph()
    assert matched <= want, v.paragraph()  # the join may leave a runaway untied to its attempt, never tie it wrong
    if not want:
        assert rows.height == 0, v.paragraph()


def _dead_slot(t: dict[str, Any], s: Analysis, v: RunVerdict) -> None:
    dead = findings.find_dead_slots(s)
    want = [t["dead_slot"]["slot"]] if t.get("dead_slot") else []
    assert dead["slot"].to_list() == want, v.paragraph()
    if want:
        fact = next(f for f in v.facts if f.kind == "dead_slot")
        assert f"Slot {want[0]} of " in fact.sentence


def _crash_phase(t: dict[str, Any], crashes: pl.DataFrame, v: RunVerdict) -> None:
    """An abort after SIGINT with nothing in flight is the shutdown phase: one note, no crash, no advice."""
    exits = t.get("server_exit") or {}
    if t.get("stop_signal") == "SIGINT" and all(code in (0, -6) for code in exits.values()):
        assert crashes.filter(pl.col("phase") != "shutdown").height == 0, v.paragraph()
        notes = [f for f in v.facts if f.kind == "crash"]
        assert all(f.severity != FINDING and "advice" not in f.fields for f in notes), v.paragraph()
        assert len(notes) == crashes.height <= sum(code == -6 for code in exits.values())


# ---------------------------------------------------------------------------------------- one truth everywhere
def _report_rows(page: str, anchor: str) -> int:
    """How many rows the report's section ``anchor`` lists (its table's body rows)."""
    start = page.index(f'<h3 id="{anchor}">')
    end = page.find("<h3 ", start + 1)
    section = page[start:end if end > 0 else len(page)]
    return 0 if '<p class="na">none</p>' in section else section.count("<tr><td")


def _cli_rows(store: Store, command: str) -> int:
    res = CliRunner().invoke(cli, [command, "--store", str(store.root), "--format", "json"])
    assert res.exit_code == 0, res.output
    return len(json.loads(res.stdout))


def _watch_counts(store: Store, run: str) -> dict[str, int]:
    from forensics.watch import detect

    li = detect.LiveInputs(now=0.0, followed={}, clocks={}, first_seen={}, servers=[], few_tokens=3)
    cands, _ = detect.evaluate(store.root, [run], li, detect.Identity({}), {})
    out: dict[str, int] = {}
    for c in cands:
        out[c.alert["kind"]] = out.get(c.alert["kind"], 0) + 1
    return out


@pytest.mark.parametrize("folder", FOLDERS, ids=IDS)
def test_one_truth_everywhere(folder: RunFolder, base: Path, tmp_path: Path) -> None:
    """The count of every finding of the run is the same in compare, the report, the notebook's API (the public
    finding functions), watch, the finding's command and the verdict's fields."""
    store = store_of(folder, base)
    run = _run(store)
    with Analysis.open(store, run) as s:
        counts = compare.finding_counts(s, [run])[run]
    page = report.write_report(store, run, tmp_path / "r.html").path.read_text(encoding="utf-8")
    api = {"dead slots": findings.find_dead_slots(store, run).height,
           "runaways": findings.find_runaways(store, run).height,
           "prompts over the context": findings.find_prompt_over_context(store, run).height,
           "items missing": findings.missing_items(store, [run])["item"].n_unique()}
    for f in compare.compared():
        rows = findings.rows(store, f.name, run)
        assert f.count_rows(rows).height == counts[str(f.compare)], f.name
        if str(f.compare) in api:
            assert api[str(f.compare)] == counts[str(f.compare)], f.name
        if f.report and f.detail is None:
            assert _report_rows(page, f.anchor) == rows.height, f.name
        if f.command:
            assert _cli_rows(store, f.command) == rows.height, f.name
    watched = _watch_counts(store, run)
    for f in registry.findings(watch=True):
        assert watched.get(f.name, 0) == f.count_rows(findings.rows(store, f.name, run)).height, f.name
    [v] = verdict(store, run)
    told = {f.kind: f for f in v.facts}
    if "dead_slot" in told:
        assert sum(f.kind == "dead_slot" for f in v.facts) == counts["dead slots"]
    if counts["runaways"]:
        cost = told["cost"].fields
        assert cost["runaway_tokens"] == int(findings.find_runaways(store, run)["gen_tokens"].sum())
    assert re.search(r"<p><span class=\"run (healthy|sick)\">", page)

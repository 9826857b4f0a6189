"""One truth per run: every count, duration and token sum that two outputs both show is the same number.

Over the generator's scenarios (the demo's sweep with a dead slot, runaways, a failover and a killed run; the
errors scenario) and the real run folders of fixtures/server-runs, each run's figures are read through every output
that shows them (the verdict, summary, runaways, deadslots, missing, runs, cap, compare, throughput, the report and
SQL over the store) and compared.  A disagreement names the run, the figure and each output's value.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from forensics.analyse import ingest_and_analyse
from forensics.cli import cli
from forensics.generate import errors, generate
from forensics.ingest import IngestOptions
from tests.conftest import ROOT

REAL = ("b11312-deadslot", "b11312-failover", "b11312-runaway", "b11312-overlong", "b11312-healthy",
        "b4747-runaway", "b4747-deadslot", "b3605-deadslot-timeouts", "b3605-runaway", "b4747-runaway-nocs")


def _cli(store: Path, *args: str) -> Any:
    res = CliRunner().invoke(cli, ["--store", str(store), *args, "--format", "json"])
    assert res.exit_code in (0, 1), res.output
    return json.loads(res.stdout) if res.stdout.strip() else []


@pytest.fixture(scope="module", params=["demo", "errors", "real"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, demo: tuple[Path, Any]) -> Path:
    if request.param == "demo":
        return demo[0] / "store"
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "errors":
        generate(errors(), root / "logs", fmt="era5", seed=3)
        paths = [root / "logs"]
    else:
        paths = [ROOT / "fixtures" / "server-runs" / f for f in REAL]
    ingest_and_analyse(root / "store", paths, IngestOptions(keep_going=True))
    return root / "store"


def _per_run(rows: list[dict[str, Any]], key: str = "run") -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        out[r[key]] = out.get(r[key], 0) + 1
    return out


def _agree(run: str, figure: str, **seen: Any) -> None:
    values = {name: v for name, v in seen.items() if v is not None}
    assert len(set(values.values())) <= 1, f"{run}: {figure} differs: {values}"


def test_counts_agree_across_outputs(store: Path) -> None:
    verdicts = {v["run"]: v for v in _cli(store, "verdict")}
    summary = _cli(store, "summary")
    requests = {r["run"]: r for r in summary["requests"]}
    tput = {r["run"]: r for r in _cli(store, "throughput")}
    runaways = _per_run(_cli(store, "runaways"))
    dead = _per_run(_cli(store, "deadslots"))
    runs_table = {r["run"]: r for r in _cli(store, "runs")}
    failed_sql = {r["run"]: r["n"] for r in _cli(store, "sql", "select run, count(*) n from finding_failed group by run")}
    reqs_sql = {r["run"]: r["n"] for r in _cli(store, "sql", "select run, count(*) n from requests group by run")}
    for run, v in verdicts.items():
        facts = {f["kind"]: f for f in v["facts"]}
        _agree(run, "server requests", verdict=v["requests"], summary=requests.get(run, {}).get("requests", 0),
               sql=reqs_sql.get(run, 0))
        _agree(run, "failed", summary=requests.get(run, {}).get("failed"), sql=failed_sql.get(run, 0),
               throughput=tput.get(run, {}).get("failed"))
        _agree(run, "dead slots", deadslots=dead.get(run, 0),
               verdict=sum(f["kind"] == "dead_slot" for f in v["facts"]))
        cmp_runaways = None
        if run in runs_table and "cost" in facts:
            _agree(run, "items lost", runs=runs_table[run]["items_missing"],
                   verdict=facts["cost"].get("items_lost", 0))
        if "runaway" in facts:
            told = facts["runaway"]["runaways"]
            assert told <= runaways.get(run, 0), f"{run}: the verdict tells {told} runaways, the listing has fewer"
        del cmp_runaways
        if run in runs_table and runs_table[run]["items_expected"]:
            listed = _cli(store, "missing", run)
            _agree(run, "items missing", runs=runs_table[run]["items_missing"],
                   missing=len({r["item"] for r in listed}),
                   verdict=len(facts["missing"]["items_missing"]) + sum(
                       len(f.get("items_lost", [])) for f in v["facts"] if f["kind"] == "dead_slot")
                   if "missing" in facts else None)
        for f in v["facts"]:
            if f["kind"] == "dead_slot":
                row = [d for d in _cli(store, "deadslots", run) if d["slot"] == f["slot"]
                       and d["instance"] == f["instance"]]
                _agree(run, "items lost on a dead slot", verdict=len(f["items_lost"]),
                       deadslots=row[0].get("items_lost") if row else None)


def test_compare_counts_what_the_finding_commands_list(store: Path) -> None:
    runs = [r["run"] for r in _cli(store, "verdict")]
    if len(runs) < 2:
        pytest.skip("one run: nothing to compare")
    a, b = runs[0], runs[-1]
    res = CliRunner().invoke(cli, ["--store", str(store), "compare", a, b, "--format", "json"])
    assert res.exit_code == 0, res.output
    table = {r["metric"]: r for r in json.loads(res.stdout)}
    for metric, command in (("runaways", "runaways"), ("dead slots", "deadslots")):
        listed = _per_run(_cli(store, command))
        if metric in table:
            _agree(a, metric, compare=table[metric][a], listing=listed.get(a, 0))
            _agree(b, metric, compare=table[metric][b], listing=listed.get(b, 0))
    failed = _per_run(_cli(store, "sql", "select run from finding_failed"))
    if "failed requests" in table:
        _agree(a, "failed", compare=table["failed requests"][a], finding=failed.get(a, 0))


def test_durations_and_tokens_are_the_request_facts(store: Path) -> None:
    facts = pl.DataFrame(_cli(store, "sql", "select run, instance, slot, task, seconds, gen_tokens from request_facts"))
    rows = _cli(store, "runaways")
    for r in rows:
        mine = facts.filter((pl.col("run") == r["run"]) & (pl.col("instance") == r["instance"])
                            & (pl.col("slot") == r["slot"]) & (pl.col("task") == r["task"]))
        assert mine.height == 1, r
        assert mine["gen_tokens"][0] == r["gen_tokens"], r
        secs = mine["seconds"][0]
        assert (secs is None and r["seconds"] is None) or round(secs, 3) == pytest.approx(r["seconds"]), r
        assert r["seconds"] is None or r["seconds"] > 0, f"a runaway that ran shows {r['seconds']} s"
    summary = {r["run"]: r["gen_tokens"] for r in _cli(store, "summary")["requests"]}
    sums = facts.group_by("run").agg(pl.col("gen_tokens").sum())
    for run, total in sums.iter_rows():
        assert summary[run] == total, run


def test_the_report_says_what_the_commands_say(store: Path, tmp_path: Path) -> None:
    verdicts = {v["run"]: v for v in _cli(store, "verdict")}
    run = sorted(verdicts, key=lambda r: (-len(verdicts[r]["facts"]), r))[0]
    out = tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["--store", str(store), "report", run, "-o", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text(encoding="utf-8")
    text = re.sub(r"<[^>]+>", "", page)
    for fact in verdicts[run]["facts"]:
        assert fact["sentence"][:60] in text.replace("&#x27;", "'").replace("&quot;", '"').replace("&amp;", "&"), \
            fact["sentence"]
    failed = page[page.index("<h3>Failed requests</h3>"):]
    failed = failed[:failed.index("<h2")] if "<h2" in failed else failed
    n_failed = len(re.findall(r"<tr>", failed)) - (1 if "<th" in failed else 0)
    count = _per_run(_cli(store, "sql", "select run from finding_failed")).get(run, 0)
    assert n_failed == count, (run, n_failed, count)

"""Incidents across runs (forensics.incidents, `forensics incidents`): every incident one row, and the precursors
that set each kind's onsets apart.

Generated scenarios plant a cause: in several runs a slot dies on a request sent with it (no output cap, or a
prompt of 90 % of the slot's context), among noise (parse errors, HTTP 500s, normal prompts whose jitter sometimes
fills the context, a run where nothing dies); the planted feature must come first, the incidents must be the
generator's dead slots.  Real runs (fixtures/server-runs): the incidents are what the harness did (labels.json).
Too few incidents, or none: the sentence says so, and no feature is named.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from forensics import findings
from forensics import incidents as inc
from forensics.cli import cli
from forensics.generate import generate
from forensics.generate.model import DeadSlot, Faults, Run, Scenario, Server, tickers
from forensics.generate.presets import deadslot, healthy
from forensics.ingest import IngestOptions, ingest
from forensics.store import Store
from tests.real_runs import FIXTURES


def planted(cause: str, runs: int = 6, seed: int = 3) -> Scenario:
    """``runs`` runs on servers of their own; in all but the last a slot dies on a request sent with ``cause``."""
    rng = random.Random(seed)
    servers, rr = [], []
    for i in range(runs):
        name = f"srv{i}"
        servers.append(Server(name=name, port=8080 + i, np=4, n_ctx_slot=4096, launch_s=i * 400.0))
        dead = (DeadSlot(name, slot=rng.randrange(4), from_request=rng.randrange(3, 6), mode="slow", slow_factor=8.0,
                         cause=cause),) if i < runs - 1 else ()
        rr.append(Run(run_id=f"{cause}-{i}", servers=(name,), items=tickers(40), concurrency=4, start_s=i * 400.0 + 5,
                      max_tokens=1024, prompt_tokens=(1800, 2400), gen_tokens=(150, 260), timeout_s=120.0,
                      faults=Faults(dead_slots=dead, parse_error_rate=0.05, http_500_rate=0.03)))
    return Scenario(name=f"planted-{cause}", servers=tuple(servers), runs=tuple(rr))


def _store(tmp: Path, scenario: Scenario, seed: int = 5) -> tuple[Store, pl.DataFrame]:
    gen = generate(scenario, tmp / "gen", seed=seed)
    ingest(tmp / "store", [tmp / "gen" / "logs"], IngestOptions(keep_going=True))
    return Store(tmp / "store"), gen.truth


@pytest.fixture(scope="module", params=["uncapped", "full_prompt"])
def planted_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                  ) -> tuple[str, Store, pl.DataFrame]:
    store, truth = _store(tmp_path_factory.mktemp(f"planted-{request.param}"), planted(request.param))
    return request.param, store, truth


FEATURE_OF = {"uncapped": "no_cap", "full_prompt": "prompt_fills"}


def test_the_incidents_are_the_generators_dead_slots(planted_store: tuple[str, Store, pl.DataFrame]) -> None:
    """Each dead-slot incident is a slot the generator killed, from the request it died on; enough of them are
    found to tell a precursor."""
    _, store, truth = planted_store
    dead = inc.incidents(store).filter(pl.col("kind") == "dead_slot")
    killed = truth.filter(pl.col("dead_slot")).group_by("run", "instance", "slot").agg(pl.col("seq").min())
    got = dead.select("run", "instance", "slot", "seq")
    assert got.join(killed, on=["run", "instance", "slot", "seq"], how="anti").height == 0, got
    assert dead.height >= inc.MIN_INCIDENTS
    assert not dead["recovered"].any()


def test_the_planted_cause_comes_first(planted_store: tuple[str, Store, pl.DataFrame]) -> None:
    cause, store, _ = planted_store
    res = inc.precursors(store)
    dead = res.table.filter(pl.col("kind") == "dead_slot")
    first = dead.row(0, named=True)
    assert first["feature"] == FEATURE_OF[cause], dead
    assert first["onsets_with"] == first["onsets"] == first["incidents"]
    assert first["separation"] >= inc.SEPARATES
    assert dead.filter(pl.col("rank") > 1)["separation"].max() < first["separation"]  # type: ignore[operator]
    n = first["incidents"]
    what = inc.FEATURES[FEATURE_OF[cause]][0]
    assert (f"{n} dead slots. In {n} of {n} dead-slot onsets {what}; {first['normal_with']} of {first['normal']} "
            "normal requests did.") in res.sentences


def test_too_few_incidents_name_no_precursor(tmp_path: Path) -> None:
    """One dead slot (the generator's deadslot scenario): a sentence, no feature."""
    store, _ = _store(tmp_path, deadslot())
    res = inc.precursors(store)
    assert "1 dead slot: too few to tell what sets their onsets apart (at least 3 are needed)." in res.sentences
    assert res.table.filter(pl.col("kind") == "dead_slot")["feature"].to_list() == [None]
    assert res.found() == 0 or res.table.filter(pl.col("separation") >= inc.SEPARATES)["kind"].is_in(
        [k for k, n in inc.incidents(store).group_by("kind").len().iter_rows() if n >= inc.MIN_INCIDENTS]).all()


def test_no_incidents_exact_cli(tmp_path: Path) -> None:
    store, _ = _store(tmp_path, healthy())
    runner = CliRunner()
    res = runner.invoke(cli, ["incidents", "--store", str(store.root)])
    assert res.exit_code == 0, res.output
    assert res.stdout == "run  kind  instance  recovered\n---  ----  --------  ---------\n"
    assert res.stderr == "No incidents in the run.\n"
    res = runner.invoke(cli, ["incidents", "--store", str(store.root), "--precursors", "--format", "json"])
    assert (res.exit_code, res.stdout, res.stderr) == (0, "[]\n", "No incidents in the run: nothing to compare.\n")
    res = runner.invoke(cli, ["incidents", "--store", str(store.root), "--fail-on", "any"])
    assert res.exit_code == 0
    res = runner.invoke(cli, ["incidents", "no-such-run", "--store", str(store.root)])
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.startswith("forensics: error: ")


def test_the_cli_lists_and_gates(tmp_path: Path) -> None:
    """The deadslot scenario's one dead slot, exactly; --fail-on any exits 1; --precursors says too few."""
    store, truth = _store(tmp_path, deadslot())
    runner = CliRunner()
    res = runner.invoke(cli, ["incidents", "--store", str(store.root), "--format", "json", "--fail-on", "any"])
    assert res.exit_code == 1, res.output
    rows = json.loads(res.stdout)
    [dead] = [r for r in rows if r["kind"] == "dead_slot"]
    first = truth.filter(pl.col("dead_slot")).sort("seq").row(0, named=True)
    assert (dead["run"], dead["instance"], dead["slot"], dead["seq"], dead["task"]) == (
        first["run"], first["instance"], first["slot"], first["seq"], first["task"])
    assert dead["recovered"] is False
    assert res.stderr.startswith(f"{len(rows)} incident")
    res = runner.invoke(cli, ["incidents", "--store", str(store.root), "--precursors"])
    assert res.exit_code == 0
    assert "1 dead slot: too few to tell what sets their onsets apart (at least 3 are needed).\n" in res.stderr
    assert "dead_slot" not in res.stdout


# ---------------------------------------------------------------------------------------- real runs
REAL = ["b11434-deadslot", "b11434-deadslot-fullprompt", "b4579-nots-deadslot", "b4579-deadslot-fullprompt",
        "b4579-nots-runaway", "b11434-crash-failover"]


@pytest.fixture(scope="module")
def real_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    root = tmp_path_factory.mktemp("real-incidents") / "store"
    ingest(root, [FIXTURES / name for name in REAL], IngestOptions(keep_going=True))
    return Store(root)


def _labels(name: str) -> dict[str, object]:
    return json.loads((FIXTURES / name / "labels.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", REAL)
def test_real_incidents_are_what_the_harness_did(real_store: Store, name: str) -> None:
    """The slot the harness killed has its first incident on the request it planted (at that request's start,
    within 50 ms), and no other slot has one; every runaway tied to an item was one the harness sent uncapped; the
    crash is the main server's, on a request it had in flight, and it did not come back."""
    t = _labels(name)
    rows = inc.incidents(real_store, name)
    uncapped = {(p["ticker"], p["stage"]) for p in t["planted"] if p["n_predict"] is None}  # type: ignore[index,union-attr]
    runaways = rows.filter(pl.col("kind") == "runaway")
    assert {(i, s) for i, s in runaways.select("item", "stage").iter_rows() if i is not None} <= uncapped
    assert runaways.height >= len({s for s in uncapped if s[1] == "analyze"})
    slot_truth = t.get("dead_slot") or t.get("fullprompt_slot")
    on_slots = rows.filter(pl.col("kind").is_in(["dead_slot", "runaway"]))
    if t.get("fullprompt_slot") and not t.get("dead_slot"):
        # the harness padded the slot's prompts to fill it (labels: no dead slot): the prompts filled the slot, not
        # a slot that went bad or an output that ran away; the prompt-over-context finding tells them, from the
        # planted request on (tests/test_real_runs.py checks how many)
        bad = t["fullprompt_slot"]["first_bad_request"]  # type: ignore[index]
        assert on_slots.height == 0, on_slots
        filled = findings.find_prompt_over_context(real_store, name).filter(
            pl.col("slot") == t["fullprompt_slot"]["slot"]).sort("seq")  # type: ignore[index]
        assert filled.height and filled.row(0, named=True)["item"] == bad["ticker"], filled
        assert filled.row(0, named=True)["stage"] == bad["stage"], filled
    elif slot_truth:
        bad = slot_truth["first_bad_request"]  # type: ignore[index]
        assert set(on_slots["slot"].to_list()) == {slot_truth["slot"]}  # type: ignore[index]
        first = on_slots.sort("onset").row(0, named=True)
        assert (first["item"], first["stage"]) == (bad["ticker"], bad["stage"])
        want = pl.Series([bad["t_start"]]).str.to_datetime(time_zone="UTC")[0]
        assert abs((first["onset"] - want).total_seconds()) < 0.05
    crashes = rows.filter(pl.col("kind") == "crash")
    exits = t.get("server_exit") or {}
    assert crashes.height == sum(1 for code in exits.values() if code not in (0, -2)), crashes  # type: ignore[union-attr]
    for row in crashes.iter_rows(named=True):
        moved = {f["ticker"] for f in t["failovers"]}  # type: ignore[union-attr,index]
        assert row["instance"] == "main" and row["item"] in moved and row["recovered"] is False


def test_real_runaways_were_the_uncapped_requests(real_store: Store) -> None:
    """The harness capped every request it did not plant (caps analyze 64, extract 192): every runaway onset carried
    no cap and no normal request did."""
    res = inc.precursors(real_store)
    first = res.table.filter(pl.col("kind") == "runaway").row(0, named=True)
    assert (first["feature"], first["onsets_with"], first["normal_with"]) == ("no_cap", first["onsets"], 0)


def test_the_stored_analysis_and_a_fresh_one_agree(real_store: Store) -> None:
    """One truth: the incidents and precursors read from the store's analysis are those worked out afresh."""
    from forensics.session import Analysis

    stored = inc.incidents(real_store)
    with Analysis.open(real_store, stored=False) as fresh:
        again = inc.incidents(fresh)
        pre = inc.precursors(fresh)
    assert stored.height and stored.equals(again)
    assert pre.table.equals(inc.precursors(real_store).table)


def test_the_incidents_read_registered_findings() -> None:
    """The findings the incidents read are the registry's (a renamed finding breaks this, not a user's store)."""
    from forensics import registry

    assert set(inc.FINDINGS) <= set(registry.FINDINGS)
    assert set(inc.KINDS) <= set(registry.FINDINGS)

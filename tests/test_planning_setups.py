"""Planning over the store's setups and its healthy runs (issue 31, item 8 and "planning reads the same tables"):

* measured figures come from healthy runs of one setup only: on the quiet sweep with its runaway pair
  (``fixtures/server-runs/b11312q-*``), "measured np 4" was mean(2.605, 7.246, 2.587) = 4.1 s of longest request,
  the runaway run's averaged in, and no np met 30 s / 3 s; it is the sweep's own np 4 now, which meets both;
* runs of several setups get one answer each, never a refusal, each naming the runs it rests on (the loaded
  b11312 sweep beside b4747 and b3605 runs: three builds, two contexts, context shift or not);
* candidates stop at twice the widest np measured, and an extrapolated np is never picked over a measured or
  interpolated one that meets the budgets (with np 1, 2 and 4 measured it recommended np 16);
* a prediction between two measured np never beats both unless the model says why (``predict.sanity`` by hand);
* the planner reads a bounded, deterministic sample of runs per np (``predict.sample``), whatever the store holds.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json

import polars as pl
import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.planning import predict, recommendation
from forensics.store import Store
from tests.planning_helpers import REAL_RUNS, build_store, real_store, sweep_scenario

QUIET = [f"b11312q-sweep-np{n}" for n in (1, 2, 4, 8)] + ["b11312q-runaway-uncapped", "b11312q-runaway-capped"]
SWEEP_SETUP = "b11312 · tiny-llama-spm · caps analyze=64,extract=192"
MIXED = [f"b11312-sweep-np{n}" for n in (1, 2, 4, 8)] + [f"b4747-{k}" for k in ("healthy", "runaway", "deadslot")] \
    + [f"b3605-{k}" for k in ("healthy", "runaway", "deadslot")]

pytestmark = pytest.mark.skipif(not (REAL_RUNS / QUIET[0]).is_dir(), reason="the real run folders of fixtures/")


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """The six quiet folders in one store (their loaded namesakes kept out: the same run ids)."""
    return real_store(tmp_path_factory.mktemp("quiet-all"), QUIET)


def test_measured_np4_is_the_healthy_sweeps_own_and_meets_both_budgets(quiet: Store) -> None:
    res = CliRunner().invoke(cli, ["recommend", "--max-run", "30s", "--max-request", "3s", "--format", "csv",
                                   "--store", str(quiet.root)])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    sweep = {int(r["np"]): r for r in rows if r["setup"] == SWEEP_SETUP}
    assert sweep[4]["basis"] == "measured" and sweep[4]["from_runs"] == "b11312q-sweep-np4"
    assert float(sweep[4]["run_s"]) == pytest.approx(25.784, abs=0.001)
    assert float(sweep[4]["latency_max_s"]) == pytest.approx(2.587, abs=0.001)  # not 4.146
    assert [n for n, r in sweep.items() if r["recommended"] == "true"] == [4]
    assert (sweep[4]["run_verdict"], sweep[4]["request_verdict"]) == ("pass", "pass")
    err = res.stderr.splitlines()
    assert (f"note: setup {SWEEP_SETUP}: b11312q-runaway-uncapped teaches the model but no measured figure: 6 outputs "
            "ran to the context (323–327 tokens where normal responses stay under 64).") in err
    assert (f"setup {SWEEP_SETUP}: Recommended np 4 (measured on b11312q-sweep-np4: run time 26 s against 30 s, "
            "request latency 2.6 s against 3.0 s), from a model fitted on b11312q-sweep-np1, b11312q-sweep-np2, "
            "b11312q-sweep-np4, b11312q-runaway-uncapped, b11312q-sweep-np8.") in err
    # the capped rerun sent other caps: another setup, answered on its own from its own run
    capped = [r for r in rows if r["setup"] != SWEEP_SETUP]
    assert [(r["np"], r["basis"], r["from_runs"], r["recommended"]) for r in capped] == \
        [("4", "measured", "b11312q-runaway-capped", "true")]


def test_the_runaway_run_teaches_the_model_but_measures_nothing(quiet: Store) -> None:
    p = predict.planner(quiet, ["b11312q-sweep-np4"])
    assert "b11312q-runaway-uncapped" in p.pool and "b11312q-runaway-uncapped" in p.model.runs
    assert p.measured_runs(4) == ["b11312q-sweep-np4"]
    assert set(p.runaway) == {"b11312q-runaway-uncapped"} and p.left_out == {}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return real_store(tmp_path_factory.mktemp("mixed"), MIXED)


def test_one_answer_per_setup_never_a_refusal(mixed: Store) -> None:
    """Four setups: the b11312 sweep (np 1-8), b4747 healthy (-c 2048), b4747 with context shift (its runaway run
    and a dead slot), b3605.  Each gets its line; the sweep's is measured np 4; a setup of one np says which np it
    cannot predict; the b3605 setup whose runs are broken or have no clock says what to record.  Exit 1: some
    setup meets the budgets at no np."""
    res = CliRunner().invoke(cli, ["recommend", "--max-run", "400s", "--max-request", "60s", "--format", "csv",
                                   "--store", str(mixed.root)])
    assert res.exit_code == 1, res.output
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    setups = list(dict.fromkeys(r["setup"] for r in rows))
    assert setups[0] == SWEEP_SETUP and len(setups) == 4
    err = res.stderr.splitlines()
    answers = [ln for ln in err if not ln.startswith("note: ") and " fails on " not in ln]
    assert len(answers) == 5, err  # one per setup: four with a table, one that cannot be predicted
    assert answers[0].startswith(f"setup {SWEEP_SETUP}: Recommended np 4 (measured on b11312-sweep-np4: ")
    assert answers[0].endswith("from a model fitted on b11312-sweep-np1, b11312-sweep-np2, b11312-sweep-np4, "
                               "b11312-sweep-np8.")
    assert "setup b4747 · tiny-llama-spm · -c 2048 · caps analyze=64,extract=192: np 4 does not meet every budget " \
           "(a model fitted on b4747-healthy)." in answers
    assert any(a.endswith("no prediction: no run has request timings on a clock (left out as broken: "
                          "b3605-deadslot, b3605-runaway) (record the harness's per-request send and end times, or "
                          "start llama-server with --log-timestamps (or --log-prefix), so each request's time can be "
                          "placed)") for a in answers)
    assert ("note: setup b4747 · tiny-llama-spm · -c 2048 · caps analyze=64,extract=192: np 1, 2, 8 not predicted: "
            "only np 4 has timed runs (b4747-healthy), and the cost of an extra slot cannot be told from one np; "
            "record the same workload at another np as well") in err
    shifted = [r for r in rows if "context shift" in r["setup"]]
    assert [r["from_runs"] for r in shifted] == ["b4747-runaway"]  # never the dead-slot run's workload


def test_whatif_and_the_report_go_through_each_runs_own_setup(mixed: Store) -> None:
    res = CliRunner().invoke(cli, ["whatif", "b11312-sweep-np2", "b4747-healthy", "--np", "4", "--format", "json",
                                   "--store", str(mixed.root)])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["run"] for r in rows] == ["b11312-sweep-np2"] * 5 + ["b4747-healthy"] * 5
    assert rows[0]["measured_run"] == "b11312-sweep-np4" and rows[0]["band"] == "interpolated"
    assert "fitted on 256 requests of 4 runs (np 1, 2, 4, 8)" in res.stderr  # the sweep's own setup, all of it
    from forensics import report

    page = report.build_report(mixed, ["b11312-sweep-np2", "b4747-healthy"])[0]
    section = page[page.index('<h2 id="whatif">'):]
    assert f"<h3>{SWEEP_SETUP}</h3>" in section and "<h3>b4747 · tiny-llama-spm · -c 2048" in section
    assert 'id="chart-whatif"' in section and 'id="chart-whatif-2"' in section


@pytest.fixture(scope="module")
def np124(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return real_store(tmp_path_factory.mktemp("quiet-124"), QUIET[:3])


def test_extrapolation_is_bounded_and_never_beats_a_measured_answer(np124: Store) -> None:
    """np 1, 2 and 4 measured: the candidates stop at 8 (it recommended np 16 from such a sweep), an np beyond
    twice the widest is shown and never recommended, and np 8 (extrapolated) is not picked while measured np 4
    meets the budget."""
    rec = recommendation.recommend(np124, None, recommendation.Budgets(run=3600.0))
    assert rec.table["np"].to_list() == [1, 2, 4, 8]
    assert rec.table["kind"].to_list() == ["measured", "measured", "measured", "extrapolated"]
    assert rec.np == 4
    wide = recommendation.recommend(np124, None, recommendation.Budgets(run=3600.0), np_range=[4, 8, 16])
    assert dict(zip(wide.table["np"].to_list(), wide.table["kind"].to_list(), strict=True)) == \
        {4: "measured", 8: "extrapolated", 16: "beyond"}
    assert wide.np == 4 and "np 16 is beyond 2x the widest np measured (4): shown, never recommended" in wide.notes
    only = recommendation.recommend(np124, None, recommendation.Budgets(run=3600.0), np_range=[8, 16])
    assert only.np == 8 and only.sentence.startswith("Recommended np 8 (not measured, extrapolated: predicted: ")


# ---------------------------------------------------------------------------------------- by hand
FIG = dict.fromkeys(predict.FIGURES, 1.0)


def _figs(run_s: float, tok: float) -> dict[str, float]:
    return {**FIG, "run_s": run_s, "gen_tok_per_s": tok}


def test_a_prediction_beating_both_neighbours_is_moved_between_them() -> None:
    """np 12 between 8 and 16.  The model's curve rises (its own np 8: 100 tok/s, np 16: 140) and puts np 12 at 130,
    above both measured (110, 112): moved to where its curve places it between its own figures, on the measured
    ones: 110 + (130 - 100) / (140 - 100) x (112 - 110) = 111.5, with a band reaching 130."""
    got, notes = predict.sanity(12, (8, 16), _figs(40.0, 130.0), (_figs(50.0, 100.0), _figs(30.0, 140.0)),
                                (_figs(45.0, 110.0), _figs(44.0, 112.0)))
    tok = got["gen_tok_per_s"]
    assert tok.adjusted and tok.value == pytest.approx(111.5) and tok.band(105.0, 115.0) == (105.0, 130.0)
    assert got["run_s"].adjusted and 44.0 <= got["run_s"].value <= 45.0  # 40 s beat 45 and 44 s too
    assert notes == [
        "np 12 (between the measured np 8 and 16): the model's run time 40 s beat both measured neighbours (45 s, "
        "44 s), which sit -10.0% and +46.7% off its curve (noisy runs, or a shape the model misses): shown at 44 s, "
        "between them, with a band reaching the model's figure; the model's throughput (generated tokens/s) 130.0 "
        "tok/s beat both measured neighbours (110.0 tok/s, 112.0 tok/s), which sit +10.0% and -20.0% off its curve "
        "(noisy runs, or a shape the model misses): shown at 111.5 tok/s, between them, with a band reaching the "
        "model's figure"]


def test_a_peak_of_the_models_own_curve_is_kept_and_said() -> None:
    got, notes = predict.sanity(6, (4, 8), _figs(30.0, 130.0), (_figs(33.0, 120.0), _figs(32.0, 118.0)),
                                (_figs(34.0, 121.0), _figs(31.0, 117.0)))
    assert not got["gen_tok_per_s"].adjusted and got["gen_tok_per_s"].value == 130.0
    assert "throughput (generated tokens/s) 130.0 tok/s beats both measured neighbours (121.0 tok/s, 117.0 tok/s) " \
           "because the model's curve peaks between them (its own 120.0 tok/s and 118.0 tok/s)" in notes[0]


def test_a_prediction_between_its_neighbours_is_left_alone() -> None:
    got, notes = predict.sanity(6, (4, 8), _figs(30.0, 115.0), (_figs(33.0, 100.0), _figs(28.0, 125.0)),
                                (_figs(34.0, 101.0), _figs(27.0, 127.0)))
    assert got == {} and notes == []


def test_the_sample_is_bounded_representative_and_deterministic() -> None:
    """np 4: five runs (one broken, one of half the usual size); np 8: two.  Three of np 4: the healthy ones
    nearest the median first (by name on a tie), never the odd one while a usual one is left; both of np 8."""
    facts = pl.DataFrame({"run": ["a", "b", "c", "d", "e", "f", "g"], "requests": [30, 30, 15, 30, 30, 30, 30],
                          "gen_tokens": [900, 900, 450, 900, 950, 900, 900], "prompt_tokens": [9000] * 7})
    nps = {"a": 4, "b": 4, "c": 4, "d": 4, "e": 4, "f": 8, "g": 8}
    got = predict.sample(list("gfedcba"), nps, facts, healthy=["b", "c", "d", "e", "f", "g"])
    assert got == ["b", "d", "e", "f", "g"]
    assert predict.sample(list("abcdefg"), nps, facts, healthy=["b", "c", "d", "e", "f", "g"], k=1) == ["b", "f"]


def test_a_planner_reads_a_bounded_sample_of_a_big_store(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Eight generated runs at np 2 and at np 4 (the same workload, their own noise): the model rests on three of
    each, the folds on those, and recommend replays them only."""
    sc = sweep_scenario((2, 4), runaways=False)
    runs = tuple(dataclasses.replace(r, run_id=f"{r.run_id}-{k}", start_s=r.start_s + 5000.0 * k)
                 for k in range(8) for r in sc.runs)
    servers = tuple(dataclasses.replace(s, name=f"{s.name}-{k}", launch_s=s.launch_s + 5000.0 * k)
                    for k in range(8) for s in sc.servers)
    runs = tuple(dataclasses.replace(r, servers=tuple(f"{s}-{r.run_id.rsplit('-', 1)[1]}" for s in r.servers))
                 for r in runs)
    store = build_store(tmp_path_factory.mktemp("big"), dataclasses.replace(sc, runs=runs, servers=servers))
    p = predict.planner(store, ["sweep-np2-0"])
    assert len(p.runs) == 16 and len(p.healthy) == 16
    assert sorted(p.np_of(r) for r in p.pool) == [2, 2, 2, 4, 4, 4]
    assert set(p.folds["run"].unique()) <= set(p.pool) and p.fold_kind == "leave-one-run-out"
    rec = recommendation.recommend_with(p, p.targets, recommendation.Budgets(run=3600.0))
    assert len(p.workloads) <= 7  # the sample and the run asked about
    assert rec.table.filter(pl.col("np") == 4)["from_runs"].to_list() == \
        [", ".join(p.measured_runs(4)[:4]) + ", 4 more"]

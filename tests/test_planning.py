"""forensics.planning: the step-function integrals and the fit worked by hand, the replay's event arithmetic on
hand-made workloads, the fit recovering the costs a replay ran on, and the whole pipeline on generated sweeps:
leave-one-run-out errors, ``recommend`` naming np 4 (measured or never run) and saying why np 2 and np 8 fail,
``whatif --cap`` naming exactly the runaways it cuts, and one clear line when the store cannot support a model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.planning import costmodel, predict, recommendation, simulate, what_if, workload
from forensics.planning.costmodel import CostModel, NotEnoughData
from forensics.planning.workload import Harness, Workload
from forensics.store import Store
from tests.planning_helpers import RUNAWAY_CAP, build_store, sweep_scenario


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """np 1, 2, 4, 8 of one workload, and runaway-np4 with its rerun capped at 1024."""
    return build_store(tmp_path_factory.mktemp("sweep"), sweep_scenario())


@pytest.fixture(scope="module")
def sweep_without_np4(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return build_store(tmp_path_factory.mktemp("no4"), sweep_scenario(),
                       skip=("sweep-np4", "runaway-np4", "capped-np4"))


# ---------------------------------------------------------------------------------------- by hand
def test_step_integral_by_hand() -> None:
    """Intervals [0, 2) and [1, 3): the level is 1, 2, 1 on [0,1), [1,2), [2,3) and 0 outside."""
    s, e, w = np.array([0.0, 1.0]), np.array([2.0, 3.0]), np.ones(2)
    qa, qb = np.array([0.0, 0.5, 3.0, -1.0]), np.array([3.0, 1.5, 5.0, 0.0])
    assert costmodel.step_integral(s, e, w, qa, qb).tolist() == [4.0, 1.5, 0.0, 0.0]
    got = costmodel.step_integral(s, e, w, qa, qb, lambda b: 1.0 / (1.0 + b))
    assert got == pytest.approx([1 / 2 + 1 / 3 + 1 / 2, 0.5 / 2 + 0.5 / 3, 2.0, 1.0])


def test_nnls_never_returns_a_negative_cost() -> None:
    x = np.column_stack([np.ones(4), [0.0, 1.0, 2.0, 3.0]])
    assert costmodel.nnls(x, np.array([3.0, 5.0, 7.0, 9.0]), np.ones(4)) == pytest.approx([3.0, 2.0])
    falling = costmodel.nnls(x, np.array([9.0, 7.0, 5.0, 3.0]), np.ones(4))
    assert falling[1] == 0.0 and falling[0] == pytest.approx(6.0)  # the slope would be negative: flat at the mean


MODEL = CostModel(step_ms=10.0, marginal_ms=4.0, stall_share=0.0, prefill_base_ms=0.0,
                  prefill_ms_per_token=1.0, prefill_busy_ms=0.0, runs=(), nps=(), requests=0)


def _jobs(rows: list[dict[str, object]]) -> pl.DataFrame:
    base = {"item": None, "stage": None, "stage_idx": 0, "attempt": 1, "instance": "s", "slot": 0, "task": 0,
            "prev": -1, "lag_s": float("nan"), "prompt_tokens": 0, "simulated": True, "fixed_s": 0.0,
            "deadline_s": None, "failed": False, "outcome": "ok", "send_s": 0.0, "end_s": 0.0, "latency_s": 0.0,
            "prompt_ms": None, "gen_ms": None, "ord": 0}
    full = [{**base, "order": i, **r} for i, r in enumerate(rows)]
    for r in full:
        r.setdefault("target", r["gen_tokens"])
    return pl.DataFrame(full, schema_overrides={"deadline_s": pl.Float64, "prompt_ms": pl.Float64,
                                                "gen_ms": pl.Float64, "item": pl.String, "stage": pl.String})


def _workload(jobs: pl.DataFrame, *, policy: str = "chain", concurrency: int = 1, slots: int | None = None) -> Workload:
    """A recorded run of ``jobs`` on ``slots`` slots (default: as many as the harness's workers)."""
    return Workload("hand", "s", "records", slots or concurrency, Harness(concurrency, policy, 0.0, 0.0, 0.0), jobs)


def test_one_slot_two_chained_requests_by_hand() -> None:
    """A: 1000 prompt tokens (1 s), 101 tokens (100 steps x 10 ms = 1 s), ends at 2 s.  B waits for A and 0.5 s
    of think time: sent at 2.5 s, 500 tokens (0.5 s), 51 tokens (0.5 s), ends at 3.5 s."""
    jobs = _jobs([{"item": "X", "prompt_eval": 1000, "gen_tokens": 101},
                  {"item": "X", "prompt_eval": 500, "gen_tokens": 51, "prev": 0, "lag_s": 0.5}])
    sim = simulate.simulate(_workload(jobs), MODEL, slots=1)
    assert sim.send.tolist() == pytest.approx([0.0, 2.5])
    assert sim.client_end.tolist() == pytest.approx([2.0, 3.5])
    assert sim.wall_s == pytest.approx(3.5)


def test_prompts_waiting_together_are_prefilled_in_one_batch_then_decode_at_the_marginal_cost() -> None:
    """A (1000 prompt tokens) and B (500) arrive together: one prefill of 1500 tokens, 1.5 s.  Then both decode at
    14 ms a step: B's 50 steps end at 2.2 s; A's last 50 steps run alone at 10 ms: A ends at 2.7 s."""
    jobs = _jobs([{"item": "A", "prompt_eval": 1000, "gen_tokens": 101},
                  {"item": "B", "prompt_eval": 500, "gen_tokens": 51}])
    sim = simulate.simulate(_workload(jobs, concurrency=2), MODEL, slots=2)
    assert sim.gen_start.tolist() == pytest.approx([1.5, 1.5])
    assert sim.server_end.tolist() == pytest.approx([2.7, 2.2])
    assert sim.busy.rows() == [(0.0, 2), (pytest.approx(2.2), 1), (pytest.approx(2.7), 0)]


def test_a_request_waits_for_a_free_slot_and_the_client_gives_up_at_its_timeout() -> None:
    """One slot, two workers: B queues until A ends at 2 s.  C never stops by itself; its client gives up after
    1 s, the slot is freed and the answer's tokens are not counted (the client never got them)."""
    jobs = _jobs([{"item": "A", "prompt_eval": 1000, "gen_tokens": 101},
                  {"item": "B", "prompt_eval": 0, "gen_tokens": 11},
                  {"item": "C", "prompt_eval": 0, "gen_tokens": 5000, "deadline_s": 1.0, "outcome": "timeout"}])
    sim = simulate.simulate(_workload(jobs, concurrency=2, slots=1), MODEL, slots=1)
    assert sim.assign.tolist() == pytest.approx([0.0, 2.0, 2.1])
    assert sim.latency.tolist() == pytest.approx([2.0, 2.1, 1.0])
    assert sim.gave_up.tolist() == [False, False, True] and sim.gen_tokens.tolist() == [101, 11, 0]


def test_a_barrier_holds_the_next_stage_until_the_stage_before_has_ended_for_every_item() -> None:
    """Two workers, two items, two stages.  A/1 and B/1 are prefilled together (1.5 s); A/1 ends there, B/1 decodes
    100 steps more (1 s).  With a barrier A/2 waits for B/1 (2.5 s); in a chain it is sent as A/1 ends (1.5 s)."""
    rows = [{"item": "A", "prompt_eval": 500, "gen_tokens": 1}, {"item": "B", "prompt_eval": 1000, "gen_tokens": 101},
            {"item": "A", "stage_idx": 1, "prompt_eval": 0, "gen_tokens": 1, "prev": 0, "lag_s": 0.0},
            {"item": "B", "stage_idx": 1, "prompt_eval": 0, "gen_tokens": 1, "prev": 1, "lag_s": 0.0}]
    chain = simulate.simulate(_workload(_jobs(rows), concurrency=2), MODEL, slots=2)
    barrier = simulate.simulate(_workload(_jobs(rows), policy="barrier", concurrency=2), MODEL, slots=2)
    assert chain.send.tolist() == pytest.approx([0.0, 0.0, 1.5, 2.5])
    assert barrier.send.tolist() == pytest.approx([0.0, 0.0, 2.5, 2.5])


def test_the_harness_policy_is_read_from_its_records(sweep: Store) -> None:
    w = workload.read_workload(sweep, "sweep-np4")
    assert (w.harness.policy, w.harness.concurrency, w.np) == ("chain", 4, 4)
    assert w.harness.gap_s == pytest.approx(0.015, abs=0.002)  # the generator's client think time
    stage_wise = _jobs([{"item": i, "stage": s, "stage_idx": k, "send_s": 10.0 * k + j, "end_s": 10.0 * k + j + 1,
                         "latency_s": 1.0, "prompt_eval": 1, "gen_tokens": 1}
                        for k, s in enumerate(("a", "b")) for j, i in enumerate("WXYZ")])
    assert workload.infer_policy(workload._chains(stage_wise.drop("prev", "lag_s")), 2) == "barrier"


# ---------------------------------------------------------------------------------------- the fit
def test_the_fit_recovers_the_costs_a_replay_ran_on(sweep: Store) -> None:
    """Timings written by the replay with known costs are fitted back to those costs."""
    true = CostModel(step_ms=30.0, marginal_ms=5.0, stall_share=0.6, prefill_base_ms=0.0,
                     prefill_ms_per_token=0.4, prefill_busy_ms=0.0, runs=(), nps=(), requests=0)
    loads = []
    for run in ("sweep-np1", "sweep-np2", "sweep-np8"):
        w = workload.read_workload(sweep, run)
        sim = simulate.simulate(w, true, slots=w.np)
        jobs = w.jobs.with_columns(pl.Series("end_s", sim.server_end),
                                   pl.Series("gen_ms", (sim.server_end - sim.gen_start) * 1000),
                                   pl.Series("prompt_ms", (sim.gen_start - sim.prefill_start) * 1000))
        loads.append(dataclasses.replace(w, jobs=jobs))
    got = costmodel.fit(loads)
    assert got.step_ms == pytest.approx(30.0, rel=0.02) and got.marginal_ms == pytest.approx(5.0, rel=0.02)
    assert got.prefill_ms_per_token == pytest.approx(0.4, rel=0.05)
    # the busy count's token weighting does not know the slots stood still during prefills: a little off there
    assert got.stall_share == pytest.approx(0.6, rel=0.15)


def test_the_fit_on_a_generated_sweep_finds_the_generators_costs(sweep: Store) -> None:
    """The generator decodes at 20 ms + 7 ms per extra slot and prefills at 0.25 ms a token.  Its slots hold about
    1300 tokens each (a prompt of 900-1400 and half an output): the fitted step time there is the generator's."""
    m = predict.planner(sweep, ["sweep-np2"]).model
    for b in (1, 2, 4, 8):
        assert m.step(b, 1300 * b) == pytest.approx(20.0 + 7.0 * (b - 1), rel=0.05)
    assert m.prefill_ms_per_token == pytest.approx(0.25, rel=0.05)
    assert m.nps == (1, 2, 4, 8)


def test_leave_one_run_out_meets_the_targets_on_a_generated_sweep(sweep: Store) -> None:
    folds = predict.planner(sweep, ["sweep-np2"]).folds
    runs = folds.filter(pl.col("run").str.starts_with("sweep-"))
    assert sorted(runs["run"].unique()) == ["sweep-np1", "sweep-np2", "sweep-np4", "sweep-np8"]
    t = runs.filter(pl.col("figure") == "run_s")
    assert t.filter(pl.col("kind") == "interpolated")["error"].abs().max() < 0.10
    assert t.filter(pl.col("kind") == "extrapolated")["error"].abs().max() < 0.15
    assert runs.filter(pl.col("figure") == "latency_p95_s")["error"].abs().max() < 0.25


# ---------------------------------------------------------------------------------------- recommend
BUDGETS = recommendation.Budgets(run=150.0, request=30.0)  # np 2 misses on run time, np 8 on request latency


@pytest.mark.parametrize("store_name", ["sweep", "sweep_without_np4"])
def test_recommend_names_np4_and_why_np2_and_np8_fail(store_name: str, request: pytest.FixtureRequest) -> None:
    store = request.getfixturevalue(store_name)
    runs = ["sweep-np1", "sweep-np2", "sweep-np8"] + (["sweep-np4"] if store_name == "sweep" else [])
    rec = recommendation.recommend(store, runs, BUDGETS)
    assert rec.np == 4
    rows = {r["np"]: r for r in rec.table.to_dicts()}
    assert sorted(rows) == [1, 2, 4, 8, 16]
    assert rows[4]["basis"] == ("measured" if store_name == "sweep" else "predicted")
    assert (rows[2]["run_verdict"], rows[2]["request_verdict"]) == ("fail", "pass")
    assert (rows[8]["run_verdict"], rows[8]["request_verdict"]) == ("pass", "fail")
    if store_name == "sweep":
        assert rec.sentence == ("Recommended np 4 (measured on sweep-np4: run time 2m08s against 2m30s, request latency "
                                "20 s against 30 s), from a model fitted on sweep-np1, sweep-np2, sweep-np4, "
                                "sweep-np8.")  # the runs named span four np: the model rests on them alone
    else:
        assert rec.sentence.startswith("Recommended np 4 (predicted: the median of sweep-np1, sweep-np2 and "
                                       "sweep-np8's workloads: run time 2m")
        assert rec.sentence.endswith("), from a model fitted on sweep-np1, sweep-np2, sweep-np8.")
    assert any(d.startswith("np 2 fails on run time (2m52s > 2m30s)") for d in rec.details)
    assert any(d.startswith("np 8 fails on request latency (40 s > 30 s)") for d in rec.details)


def test_recommend_on_the_command_line(sweep_without_np4: Store) -> None:
    res = CliRunner().invoke(cli, ["recommend", "--max-run", "2.5m", "--max-request", "30s", "--np-range", "1,2,4,8",
                                   "--format", "csv", "--store", str(sweep_without_np4.root)])
    assert res.exit_code == 0, res.output
    table = pl.read_csv(res.stdout.encode())
    assert table["np"].to_list() == [1, 2, 4, 8]
    assert table["basis"].to_list() == ["measured", "measured", "predicted", "measured"]
    assert table.filter(pl.col("recommended"))["np"].to_list() == [4]
    err = res.stderr.splitlines()
    assert err[0].startswith("Recommended np 4 (predicted: the median of sweep-np1, sweep-np2 and sweep-np8's "
                             "workloads: run time 2m")
    assert err[1:] == ["np 1 fails on run time (4m54s > 2m30s)", "np 2 fails on run time (2m52s > 2m30s)",
                       "np 8 fails on request latency (40 s > 30 s)"]


def test_recommend_exits_1_when_no_np_meets_the_budgets(sweep_without_np4: Store, tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["recommend", "--max-run", "10s", "-o", str(tmp_path / "np.json"),
                                   "--store", str(sweep_without_np4.root)])
    assert res.exit_code == 1
    assert "No np in 1–16 meets every budget (a model fitted on sweep-np1, sweep-np2, sweep-np8)." in res.stderr
    spec = (tmp_path / "np.json").read_text()
    assert '"measured"' in spec and '"low"' in spec  # the measured points and the bands are drawn


# ---------------------------------------------------------------------------------------- whatif and the cap
def test_whatif_cap_names_exactly_the_runaways_and_predicts_the_reruns_saving(sweep: Store) -> None:
    from forensics import findings, metrics

    truth = findings.find_runaways(sweep, "runaway-np4")
    res = what_if.whatif(sweep, "runaway-np4", cap=RUNAWAY_CAP)
    got = res.cuts.select("item", "stage", "class").sort("item", "stage")
    assert got.filter(pl.col("class") == "runaway").height == truth.height == 4
    assert set(got.select("item", "stage").iter_rows()) == {("AMZN", "extract"), ("PG", "score")}
    assert got.filter(pl.col("class") == "normal").height == 0
    m = {r["run"]: r["run_s"] for r in metrics.throughput(sweep, ["runaway-np4", "capped-np4"]).to_dicts()}
    measured = m["runaway-np4"] - m["capped-np4"]
    assert res.figure("time_saved_s")["predicted"] == pytest.approx(measured, rel=0.15)
    assert "Cap 1024 cuts 4 runaway(s) (AMZN/extract, PG/score), 0 normal response(s); it saves" in res.sentences[1]


def test_whatif_recommended_cap_cuts_no_normal_response_and_a_low_cap_names_them(sweep: Store) -> None:
    from forensics import findings

    cap = findings.recommend_cap(sweep, ["runaway-np4"]).cap
    assert cap is not None
    assert what_if.whatif(sweep, "runaway-np4", cap=cap).cuts.filter(pl.col("class") == "normal").height == 0
    low = what_if.whatif(sweep, "runaway-np4", cap=256).cuts
    normal = low.filter(pl.col("class") == "normal")
    assert normal.height > 0 and normal["gen_tokens"].min() >= 256  # the cap finding's rule: at or above the cap
    assert low.filter(pl.col("class") == "runaway").height == 4


def test_whatif_on_the_command_line(sweep: Store) -> None:
    res = CliRunner().invoke(cli, ["whatif", "sweep-np2", "--np", "4", "--format", "json",
                                   "--store", str(sweep.root)])
    assert res.exit_code == 0, res.output
    rows = {r["figure"]: r for r in __import__("json").loads(res.stdout)}
    assert list(rows) == ["run time (s)", "latency p50 (s)", "latency p95 (s)", "latency max (s)",
                          "throughput (generated tokens/s)"]
    run = rows["run time (s)"]
    assert run["measured_run"] == "sweep-np4" and run["low"] < run["predicted"] < run["high"]
    assert run["predicted"] == pytest.approx(run["measured"], rel=0.10)
    assert res.stderr.splitlines()[0].startswith("sweep-np2 at np 4 (it ran at np 2): run time ")
    errors = CliRunner().invoke(cli, ["whatif", "sweep-np2", "--errors", "--format", "csv", "--store",
                                      str(sweep.root)])
    assert errors.stdout.splitlines()[0] == "run,np,kind,speed,figure,measured,predicted,error"


# ---------------------------------------------------------------------------------------- not enough data
def test_one_np_only_says_what_to_record_and_still_predicts_a_cap_at_that_np(tmp_path: Path) -> None:
    """Two runs at np 4 only: another np cannot be predicted (one line: what to record); the runaway run with a cap
    at its own np can, and leave-one-run-out still gives its band."""
    store = build_store(tmp_path, sweep_scenario((4,)), skip=("capped-np4",))
    res = CliRunner().invoke(cli, ["whatif", "sweep-np4", "--np", "8", "--store", str(store.root)])
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr == ("forensics: error: only np 4 has timed runs (runaway-np4, sweep-np4): the cost of an extra "
                          "slot cannot be told from one np, so np 8 cannot be predicted (record the same workload at "
                          "another np as well (e.g. np 2 and np 8))\n")
    capped = what_if.whatif(store, "runaway-np4", cap=RUNAWAY_CAP)
    assert capped.cuts.filter(pl.col("class") == "runaway").height == 4
    assert capped.figure("time_saved_s")["band_pct"] is not None


def test_a_log_without_time_says_what_to_record(tmp_path: Path) -> None:
    from forensics.ingest import IngestOptions, ingest

    log = Path(__file__).resolve().parents[1] / "fixtures" / "server-runs" / "real-b4747" / "server.log"
    ingest(tmp_path / "store", [log], IngestOptions(run="b4747"))
    with pytest.raises(NotEnoughData, match="no run has request timings on a clock"):
        what_if.whatif(Store(tmp_path / "store"), "b4747", np_=8)
    res = CliRunner().invoke(cli, ["recommend", "--max-run", "5m", "--store", str(tmp_path / "store")])
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1 and "--log-timestamps" in res.stderr


def test_bad_options_are_one_line_and_exit_2(sweep: Store) -> None:
    for args in (["whatif", "sweep-np2", "--np", "0"], ["whatif", "nope"], ["recommend"],
                 ["recommend", "--max-run", "5m", "--np-range", "8-2"], ["recommend", "--max-run", "5m", "--cap", "x"]):
        res = CliRunner().invoke(cli, [*args, "--store", str(sweep.root)])
        assert res.exit_code == 2, (args, res.output)
        assert res.stdout == ""

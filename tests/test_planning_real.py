"""forensics.planning on real llama-server runs (``fixtures/server-runs/b11312-*``, recorded for the project on a
shared, heavily loaded 2-core machine; each folder's README has the command lines, the load and the truth).

The sweep is one workload (32 tickers x 2 stages) at np 1, 2, 4 and 8; the runaway pair is 6 uncapped analyze
requests that ran to the slot context, and the same workload rerun with a cap of 128.  The machine's load moved each
run's speed by up to 3x, so what is asserted is what holds there: the replay at a run's own speed, the
recommendation (measured, and with np 4 never run), the cap's cuts by item, and the line that says what to record.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.planning import predict, recommendation, what_if
from forensics.store import Store
from tests.planning_helpers import REAL_RUNS, held_out, real_store

SWEEP = [f"b11312-sweep-np{n}" for n in (1, 2, 4, 8)]
BUDGETS = recommendation.Budgets(run=400.0, request=60.0)  # np 2 misses on run time (466 s), np 8 on latency (89 s)

pytestmark = pytest.mark.skipif(not (REAL_RUNS / SWEEP[0]).is_dir(),
                                reason="the real runs come with the realruns branch (fixtures/server-runs/b11312-*)")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return real_store(tmp_path_factory.mktemp("real-sweep"), SWEEP)


@pytest.fixture(scope="module")
def sweep_without_np4(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return real_store(tmp_path_factory.mktemp("real-no4"), [f for f in SWEEP if not f.endswith("np4")])


def test_each_run_replayed_at_its_own_speed_by_a_model_fitted_without_it(sweep: Store) -> None:
    """Leave-one-run-out at the run's own speed: run time within 15 %, p95 within 45 % on every np.  The speeds
    themselves show the machine: the runs went from about a third to one and a half times the model's step times."""
    p = predict.planner(sweep, ["b11312-sweep-np4"])
    assert p.pool == SWEEP and p.model.nps == (1, 2, 4, 8)
    folds = p.folds
    assert sorted(folds["np"].unique()) == [1, 2, 4, 8]
    assert folds.filter(pl.col("figure") == "run_s")["error"].abs().max() < 0.15
    assert folds.filter(pl.col("figure") == "latency_p95_s")["error"].abs().max() < 0.45
    speeds = folds.filter(pl.col("figure") == "run_s")["speed"]
    assert speeds.min() < 0.5 and speeds.max() > 1.3


@pytest.mark.parametrize("store_name", ["sweep", "sweep_without_np4"])
def test_recommend_names_np4_and_says_why_np2_and_np8_fail(store_name: str, request: pytest.FixtureRequest) -> None:
    store = request.getfixturevalue(store_name)
    rec = recommendation.recommend(store, None, BUDGETS)
    assert rec.np == 4
    rows = {r["np"]: r for r in rec.table.to_dicts()}
    assert rows[4]["basis"] == ("measured" if store_name == "sweep" else "predicted")
    assert (rows[2]["run_verdict"], rows[2]["request_verdict"]) == ("fail", "pass")
    assert (rows[8]["run_verdict"], rows[8]["request_verdict"]) == ("pass", "fail")
    assert rec.details[:2] == ["np 2 fails on run time (7m46s > 6m40s)", "np 8 fails on request latency (89 s > 60 s)"]
    if store_name == "sweep_without_np4":  # np 1 passed too and ran fast: ranked at the sweep's typical speed
        assert rows[1]["verdict"] == "pass" and rows[1]["gen_tok_per_s"] > rows[4]["gen_tok_per_s"]
        assert rows[4]["ranked_tok_per_s"] > rows[1]["ranked_tok_per_s"]
        assert rec.sentence.startswith("Recommended np 4 (predicted: the median of b11312-sweep-np1, "
                                       "b11312-sweep-np2 and b11312-sweep-np8's workloads: run time ")


@pytest.fixture(scope="module")
def runaway_pair(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return real_store(tmp_path_factory.mktemp("real-cap"), [*SWEEP, "b11312-runaway-uncapped", "b11312-runaway-capped"])


def test_whatif_cap_names_exactly_the_six_runaways_and_finds_the_rerun(runaway_pair: Store) -> None:
    """The README's truth: the analyze requests of NVDA, JPM, KO, CRM, INTC and BAC ran to the 512-token context;
    a cap of 128 cuts exactly those and no normal response; b11312-runaway-capped is the rerun with it."""
    from forensics import findings

    assert findings.recommend_cap(runaway_pair, ["b11312-runaway-uncapped"]).cap == 128
    res = what_if.whatif(runaway_pair, "b11312-runaway-uncapped", cap=128)
    cut = res.cuts.select("item", "stage", "class").sort("item")
    assert cut.rows() == [(i, "analyze", "runaway") for i in ("BAC", "CRM", "INTC", "JPM", "KO", "NVDA")]
    saved = res.figure("time_saved_s")
    assert saved["measured_run"] == "b11312-runaway-capped" and saved["measured"] == pytest.approx(111.7, abs=0.1)
    assert 0 < saved["predicted"] < saved["measured"]
    assert any(n.startswith("b11312-runaway-capped (the rerun with the cap) went at 0.") for n in res.notes)


def test_one_np_only_says_what_to_record(tmp_path: Path) -> None:
    store = real_store(tmp_path, ["b11312-healthy"])
    res = CliRunner().invoke(cli, ["whatif", "b11312-healthy", "--np", "8", "--store", str(store.root)])
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr == ("forensics: error: only np 4 has timed runs (b11312-healthy): the cost of an extra slot "
                          "cannot be told from one np, so np 8 cannot be predicted (record the same workload at "
                          "another np as well (e.g. np 2 and np 8))\n")


B11434 = {n: f"b11434-sweep-np{n}" for n in (1, 2, 4, 6, 8)}
# leave-one-np-out run time error (recommend's prediction: the other runs' workloads, each at its own speed) of the
# model before the knee, measured on this sweep: what the model with a knee must not do worse than (within noise)
B11434_BEFORE = {1: -0.015, 2: 0.183, 4: -0.203, 6: 0.159, 8: -0.187}


@pytest.fixture(scope="module")
def b11434(tmp_path_factory: pytest.TempPathFactory) -> predict.Planner:
    return predict.planner(real_store(tmp_path_factory.mktemp("b11434"), list(B11434.values())), [B11434[4]])


@pytest.mark.parametrize("np_", list(B11434))
def test_the_knee_does_no_worse_on_a_cpu_sweep(b11434: predict.Planner, np_: int) -> None:
    """b11434's CPU sweep (np 1, 2, 4, 6, 8; a loaded machine, so noisy): each np left out, run time within 3 points
    of the model before the knee.  Measured -1.5 %, +16.6 %, -22.8 %, +15.8 %, -18.7 % (before: -1.5 %, +18.3 %,
    -20.3 %, +15.9 %, -18.7 %): the fit without np 4 takes a knee at 5 slots (it predicts the other left-out np
    30 % better) and misses np 4 by 2.5 points more; np 2 gains 1.7."""
    median, _ = held_out(b11434, B11434, np_)
    error = median["run_s"] / b11434.measured[B11434[np_]]["run_s"] - 1
    assert abs(error) <= abs(B11434_BEFORE[np_]) + 0.03

"""The capacity-planning targets on a real sweep recorded on a quiet machine (``fixtures/server-runs/b11312q-*``:
a real llama-server b11312, CPU, one thread; nothing else running, 1-minute load 1.0-1.7 on 2 cores; each
folder's README has the command lines, the load and the truth).

The sweep is one workload (32 tickers x 2 stages, capped outputs) at np 1, 2, 4 and 8, measured 30.6 s, 34.7 s,
25.8 s and 20.9 s of run time; the runaway pair is 6 uncapped analyze requests that ran to the 512-token slot
context (29.8 s) and the same workload rerun with a cap of 128 (24.3 s).  The targets are the ones the planning
work set itself, checked as stated:

* leave one np out, predict it from the other three (``recommend``'s prediction for an np with no run: the median of
  the other runs' workloads replayed there, at their own speed; the left-out run's speed is unknown): run time
  within 10 % (np 2, 4: interpolated) and 15 % (np 1, 8: extrapolated), p95 latency within 25 %;
* budgets that np 4 meets, np 2 misses on run time and np 8 on request latency: ``recommend`` names np 4 and says
  why np 2 and np 8 fail, also when np 4 was never run;
* ``whatif --cap K`` at the recommended cap names exactly the runaways and no normal response, and its time saved is
  within 15 % of the rerun with the cap.

Two of them are missed on this data and the tests below assert what is measured, marked TARGET MISSED: np 1
predicted from np 2, 4 and 8 (no run of those ever decodes one sequence alone, and on this CPU one sequence alone runs
another, much cheaper kernel), and the cap's time saved (the model replays the run with six runaways faster than it
went).  docs/metrics.md gives the figures.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics import findings, report
from forensics.cli import cli
from forensics.planning import recommendation, what_if
from forensics.store import Store
from tests.planning_helpers import REAL_RUNS, real_store

NPS = (1, 2, 4, 8)
SWEEP = {n: f"b11312q-sweep-np{n}" for n in NPS}
PAIR = ["b11312q-runaway-uncapped", "b11312q-runaway-capped"]
# measured on the quiet sweep (metrics.throughput: run time, p95 of the client's latency), in seconds
MEASURED = {1: (30.595, 0.646), 2: (34.680, 1.304), 4: (25.784, 2.080), 8: (20.885, 3.233)}
KIND = {1: "extrapolated", 2: "interpolated", 4: "interpolated", 8: "extrapolated"}
RUN_TARGET = {"interpolated": 0.10, "extrapolated": 0.15}
P95_TARGET = 0.25

pytestmark = pytest.mark.skipif(not (REAL_RUNS / SWEEP[1]).is_dir(),
                                reason="the quiet real runs come with fixtures/server-runs/b11312q-*")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return real_store(tmp_path_factory.mktemp("quiet-sweep"), list(SWEEP.values()))


_WITHOUT: dict[int, Store] = {}


def without(np_: int, tmp_path_factory: pytest.TempPathFactory) -> Store:
    """The quiet sweep less its np ``np_`` run (ingested once per session)."""
    if np_ not in _WITHOUT:
        _WITHOUT[np_] = real_store(tmp_path_factory.mktemp(f"quiet-no{np_}"),
                               [f for n, f in SWEEP.items() if n != np_])
    return _WITHOUT[np_]


def left_out_prediction(np_: int, tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    """``recommend``'s row for ``np_`` from a store of the other three runs (a budget no run misses)."""
    rec = recommendation.recommend(without(np_, tmp_path_factory), None, recommendation.Budgets(run=3600.0),
                                   np_range=[np_])
    (row,) = rec.table.to_dicts()
    assert row["basis"] == "predicted"
    assert row["from_runs"] == ", ".join(f for n, f in SWEEP.items() if n != np_)
    return row


def test_the_sweep_is_what_its_readmes_say(sweep: Store) -> None:
    from forensics import metrics

    m = {r["run"]: r for r in metrics.throughput(sweep, list(SWEEP.values())).to_dicts()}
    for n, (run_s, p95) in MEASURED.items():
        assert m[SWEEP[n]]["run_s"] == pytest.approx(run_s, abs=0.001)
        assert m[SWEEP[n]]["latency_p95_s"] == pytest.approx(p95, abs=0.001)
        assert m[SWEEP[n]]["requests"] == 64


@pytest.mark.parametrize("np_", [2, 4, 8])
def test_leave_one_np_out_meets_the_targets(np_: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Run time within 10 % (np 2, 4) and 15 % (np 8), p95 within 25 %: measured -2.5 %, +3.6 %, -7.2 % and
    -1.2 %, +2.1 %, +4.9 %."""
    row = left_out_prediction(np_, tmp_path_factory)
    run_s, p95 = MEASURED[np_]
    assert abs(row["run_s"] / run_s - 1) < RUN_TARGET[KIND[np_]]
    assert abs(row["latency_p95_s"] / p95 - 1) < P95_TARGET
    assert row["run_s_low"] <= run_s <= row["run_s_high"]  # the band holds the measurement


def test_np1_from_np2_4_8_misses_the_target(tmp_path_factory: pytest.TempPathFactory) -> None:
    """TARGET MISSED (run time within 15 %, p95 within 25 %): +68 % and +50 %.  One sequence alone decodes at
    4.3 ms a step on this CPU, a batch of two at about 10 ms; no request of np 2, 4 or 8 decoded alone for more than
    the moments another slot prefilled, so a model fitted on them cannot tell the single-sequence step from the
    batched one (it fits no ``batch_ms``) and prices np 1's steps as batched ones.  With np 1 in the pool the term
    is fitted (+5.3 ms once two or more decode) and np 2, 4 and 8 are met."""
    row = left_out_prediction(1, tmp_path_factory)
    run_s, p95 = MEASURED[1]
    assert 0.60 < row["run_s"] / run_s - 1 < 0.76
    assert 0.40 < row["latency_p95_s"] / p95 - 1 < 0.60
    assert not row["run_s_low"] <= run_s <= row["run_s_high"]  # the band (from runs sharing the gap) misses it too
    # so a prediction at np 1 without a run at np 1 says so, in whatif and in recommend
    store = without(1, tmp_path_factory)
    note = ("note: np 1 was never run (the model saw np 2, 4, 8): one sequence decoding alone runs other kernels "
            "than a batch and may be much faster or slower per step than the model has it, which its band does not "
            "cover; record a run at np 1 to predict it\n")
    res = CliRunner().invoke(cli, ["whatif", SWEEP[2], "--np", "1", "--store", str(store.root)])
    assert res.exit_code == 0 and note in res.stderr
    res = CliRunner().invoke(cli, ["recommend", "--max-run", "1h", "--store", str(store.root)])
    assert res.exit_code == 0 and res.stderr.startswith(note)


def test_a_lone_run_is_replayed_at_its_own_np(tmp_path: Path) -> None:
    """np 2 alone: a model of one np cannot split the one-slot step from the per-slot cost and fits the step at
    ~0 ms.  The replay must still end (it once waited forever for steps shorter than the clock's resolution) and
    the busy count must not let a moment alone count as thousands of steps (it replayed the run at +136 %)."""
    store = real_store(tmp_path, [SWEEP[2]])
    res = what_if.whatif(store, SWEEP[2])
    run = res.figure("run_s")
    assert run["measured_run"] == SWEEP[2]
    assert abs(run["predicted"] / run["measured"] - 1) < 0.15
    page = report.write_report(store, SWEEP[2], tmp_path / "r.html").path.read_text(encoding="utf-8")
    assert "b11312q-sweep-np2 at np 2: run time 39 s (no band)" in page  # the report's What if section


BUDGET_ARGS = ["--max-run", "30s", "--max-request", "3s"]  # np 4: 26 s, 2.6 s; np 2: 35 s; np 8: 4.3 s


def test_recommend_names_measured_np4_and_why_np2_and_np8_fail(sweep: Store) -> None:
    res = CliRunner().invoke(cli, ["recommend", *BUDGET_ARGS, "--format", "csv", "--store", str(sweep.root)])
    assert res.exit_code == 0
    table = {int(r["np"]): r for r in csv.DictReader(io.StringIO(res.stdout))}
    assert [(n, table[n]["basis"], table[n]["run_verdict"], table[n]["request_verdict"]) for n in sorted(table)] == [
        (1, "measured", "fail", "pass"), (2, "measured", "fail", "pass"), (4, "measured", "pass", "pass"),
        (8, "measured", "pass", "fail"), (16, "predicted", "pass", "fail")]
    assert res.stderr == (
        "Recommended np 4 (measured on b11312q-sweep-np4: run time 26 s against 30 s, request latency 2.6 s against "
        "3.0 s), from a model fitted on b11312q-sweep-np1, b11312q-sweep-np2, b11312q-sweep-np4, b11312q-sweep-np8.\n"
        "np 1 fails on run time (31 s > 30 s)\n"
        "np 2 fails on run time (35 s > 30 s)\n"
        "np 8 fails on request latency (4.3 s > 3.0 s)\n"
        "np 16 fails on request latency (7.8 s > 3.0 s)\n")


def test_recommend_names_np4_never_run(tmp_path_factory: pytest.TempPathFactory) -> None:
    """np 4 predicted from np 1, 2 and 8: 27 s and 2.5 s against the measured 26 s and 2.6 s."""
    store = without(4, tmp_path_factory)
    res = CliRunner().invoke(cli, ["recommend", *BUDGET_ARGS, "--store", str(store.root)])
    assert res.exit_code == 0
    assert res.stderr == (
        "Recommended np 4 (predicted: the median of b11312q-sweep-np1, b11312q-sweep-np2 and b11312q-sweep-np8's "
        "workloads: run time 27 s (21 s–33 s) against 30 s, request latency 2.5 s (2.0 s–3.0 s) against 3.0 s; run "
        "time and request latency hold only inside the band), from a model fitted on b11312q-sweep-np1, "
        "b11312q-sweep-np2, b11312q-sweep-np8.\n"
        "np 1 fails on run time (31 s > 30 s)\n"
        "np 2 fails on run time (35 s > 30 s)\n"
        "np 8 fails on request latency (4.3 s > 3.0 s)\n"
        "np 16 fails on request latency (7.7 s > 3.0 s)\n")
    rec = recommendation.recommend(store, None, recommendation.Budgets(run=30.0, request=3.0))
    row = {r["np"]: r for r in rec.table.to_dicts()}[4]
    assert row["run_s_low"] <= MEASURED[4][0] <= row["run_s_high"]
    assert row["latency_max_s_low"] <= 2.587 <= row["latency_max_s_high"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return real_store(tmp_path_factory.mktemp("quiet-cap"), [*SWEEP.values(), *PAIR])


def test_the_recommended_cap_cuts_exactly_the_six_runaways(pair: Store) -> None:
    """The README's truth: NVDA, JPM, KO, CRM, INTC and BAC's analyze ran to the slot context; every normal output
    is at most 96 tokens, so a cap of 128 cuts those six and nothing else."""
    assert findings.recommend_cap(pair, [PAIR[0]]).cap == 128
    res = CliRunner().invoke(cli, ["whatif", PAIR[0], "--cap", "128", "--cuts", "--format", "csv",
                                   "--store", str(pair.root)])
    assert res.exit_code == 0
    cut = sorted((r["item"], r["stage"], r["attempt"], r["class"]) for r in csv.DictReader(io.StringIO(res.stdout)))
    assert cut == [(i, "analyze", "1", "runaway") for i in ("BAC", "CRM", "INTC", "JPM", "KO", "NVDA")]
    assert ("Cap 128 cuts 6 runaway(s) (BAC/analyze, CRM/analyze, INTC/analyze, JPM/analyze, KO/analyze, "
            "NVDA/analyze), 0 normal response(s)") in res.stderr


def test_the_cap_time_saved_against_the_rerun_misses_the_target(pair: Store) -> None:
    """TARGET MISSED (within 15 % of the rerun): 3.8 s predicted against 5.5 s measured, -31 %.  The rerun went at
    the same speed (no note); what the model misses is the uncapped run, which it replays too fast: six runaways
    holding up to 512 tokens each slow every batch more than the context term says, and that error is a quarter of
    the saving.  (It was -24 % when the pool held the rerun itself; the rerun is another setup now, its caps
    differ, found as the same setup less its caps.  On the same fitted costs the replays draw the runs' noise in
    the pool's order, which moved with the sample: -28 % to -31 %, the nine replays' own spread.)"""
    res = what_if.whatif(pair, PAIR[0], cap=128)
    saved = res.figure("time_saved_s")
    assert saved["measured_run"] == PAIR[1]
    assert saved["measured"] == pytest.approx(29.848 - 24.346, abs=0.01)
    assert not any("rerun with the cap" in n for n in res.notes)  # same speed: nothing to explain
    error = saved["predicted"] / saved["measured"] - 1
    assert -0.35 < error < -0.15
    assert saved["low"] <= saved["measured"] <= saved["high"]

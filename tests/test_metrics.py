"""Per-run metrics, the scaling fit and knee, and smoke budgets, on hand-built stores.

Every expected number is worked out by hand in the comments from the rows in throughput_helpers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics import metrics
from forensics.cli import cli, main
from forensics.errors import InputError, NotFoundError
from tests.throughput_helpers import basic_store, req, sweep_store, write

SWEEP = [(1, 10.0, 100), (2, 11.0, 100), (4, 13.0, 100), (8, 20.0, 100)]


def _row(df, run: str) -> dict:
    return df.filter(df["run"] == run).row(0, named=True)


def test_absolute_run_metrics_by_hand(store_dir: Path) -> None:
    m = _row(metrics.throughput(basic_store(store_dir)), "abs")
    # A 0-10 s, B 10-16 s (slot 0); C 2-8 s, D 8-20 s (slot 1)
    assert (m["np"], m["np_source"], m["source"], m["time_basis"], m["estimated"]) == (
        2, "manifest", "server", "absolute", False)
    assert (m["requests"], m["failed"], m["wall_s"], m["run_s"]) == (4, 0, 20.0, None)
    assert (m["gen_tokens"], m["prompt_tokens"]) == (101 + 51 + 61 + 201, 50 + 30 + 40 + 20)
    assert m["gen_tok_per_s"] == pytest.approx(414 / 20)
    assert m["req_per_s"] == pytest.approx(4 / 20)
    # latencies sorted 6, 6, 10, 12; linear interpolation at (n-1)q
    assert m["latency_mean_s"] == pytest.approx(8.5)
    assert m["latency_p50_s"] == pytest.approx(8.0)  # 6 + 0.5 * (10 - 6)
    assert m["latency_p90_s"] == pytest.approx(11.4)  # 10 + 0.7 * 2
    assert m["latency_p95_s"] == pytest.approx(11.7)
    assert m["latency_p99_s"] == pytest.approx(11.94)
    assert m["latency_max_s"] == 12.0
    # TPOT: 9000/100, 5000/50, 4800/60, 10000/200 = 90, 100, 80, 50
    assert m["tpot_mean_ms"] == pytest.approx(80.0)
    assert m["tpot_p50_ms"] == pytest.approx(85.0)
    # (10 + 6 + 6 + 12) / 20; at t=8 and t=10 one request ends as another starts: never 3 at once
    assert m["effective_concurrency"] == pytest.approx(1.7)
    assert m["peak_busy_slots"] == 2


def test_order_based_run_is_an_estimate(store_dir: Path) -> None:
    m = _row(metrics.throughput(basic_store(store_dir)), "order")
    # slot 0: 4 s then 2 s back to back = 6 s; slot 1: 3 s; wall = max = 6 s
    assert (m["np"], m["np_source"], m["time_basis"], m["estimated"]) == (3, "n_slots", "order", True)
    assert m["wall_s"] == 6.0
    assert m["effective_concurrency"] == pytest.approx(9 / 6)
    assert m["gen_tok_per_s"] == pytest.approx(37 / 6)
    assert m["peak_busy_slots"] == 2
    ri = metrics.request_intervals(basic_store(store_dir.with_name("s2")), ["order"])
    assert ri.select("slot", "seq", "start_s", "end_s").rows() == [(0, 1, 0.0, 4.0), (0, 2, 4.0, 6.0),
                                                                  (1, 1, 0.0, 3.0)]


def test_records_only_run_uses_client_latency(store_dir: Path) -> None:
    m = _row(metrics.throughput(basic_store(store_dir)), "rec")
    # a1 0-5 s ok, 11 tokens in 4000 ms; a2 1-3 s failed
    assert (m["source"], m["np"], m["np_source"], m["requests"], m["failed"]) == ("records", 2, "peak_busy", 2, 1)
    assert m["wall_s"] == 5.0
    assert m["req_per_s"] == pytest.approx(1 / 5)
    assert m["gen_tok_per_s"] == pytest.approx(11 / 5)
    assert m["latency_p50_s"] == pytest.approx(3.5)
    assert m["tpot_mean_ms"] == pytest.approx(400.0)
    assert m["effective_concurrency"] == pytest.approx(7 / 5)


def test_elapsed_instances_are_aligned_at_their_first_request(store_dir: Path) -> None:
    rows = [
        req("el", 0, 1, 1, None, None, 4000, 10, 3000, 5, instance="a", elapsed_start_s=100.0, elapsed_end_s=104.0),
        req("el", 1, 1, 2, None, None, 2000, 10, 1000, 5, instance="a", elapsed_start_s=101.0, elapsed_end_s=103.0),
        req("el", 0, 1, 1, None, None, 6000, 10, 5000, 5, instance="b", elapsed_start_s=50.0, elapsed_end_s=56.0),
    ]
    m = _row(metrics.throughput(write(store_dir, {"requests": rows})), "el")
    # a: [0,4] [1,3]; b: [0,6] -> wall 6, all three busy during 1-3 s
    assert (m["time_basis"], m["wall_s"], m["peak_busy_slots"], m["np"]) == ("elapsed", 6.0, 3, 3)
    assert m["effective_concurrency"] == pytest.approx(12 / 6)


def test_fit_recovers_a_known_slope() -> None:
    fit = metrics.fit_line([1, 2, 4, 8], [3 + 0.5 * x for x in (1, 2, 4, 8)])
    assert fit is not None
    assert (fit.a, fit.b, fit.r2, fit.n) == (pytest.approx(3.0), pytest.approx(0.5), pytest.approx(1.0), 4)
    # mean x 2, mean y 2, Sxy = 1, Sxx = 2 -> b 0.5, a 1
    noisy = metrics.fit_line([1, 2, 3], [1, 3, 2])
    assert noisy is not None and (noisy.a, noisy.b) == (pytest.approx(1.0), pytest.approx(0.5))
    assert metrics.fit_line([2, 2], [1, 3]) is None
    assert metrics.fit_line([1], [1]) is None


def test_scaling_knee_and_sentence(store_dir: Path) -> None:
    store = sweep_store(store_dir, SWEEP)
    sc = metrics.scaling(metrics.throughput(store), by="np")
    # throughput: 2 x np x 100 tokens over 2 x secs: 10, 400/22, 800/26, 1600/40
    assert sc.table["np"].to_list() == [1, 2, 4, 8]
    assert sc.table["gen_tok_per_s"].to_list() == pytest.approx([10.0, 400 / 22, 800 / 26, 40.0])
    # gain per extra slot: 0.818, (1.6923 - 1) / 2 = 0.346, (1.3 - 1) / 4 = 0.075 < 10 % -> knee at np 4
    assert sc.table["throughput_gain_per_step"].to_list()[1:] == pytest.approx([0.81818, 0.34615, 0.075], rel=1e-4)
    assert sc.knee == 4
    # the measured knee is np 4, and the fitted model (latency = 8.087 + 1.443 np below) puts it at np 5, which no
    # run measured: one knee, said as the interval between the measured np 4 and 8; (20/13 - 1) / 4 latency
    assert sc.knee_between == (4, 8) and sc.model_knee == 5 and sc.model_sentence is None
    assert sc.sentence == ("fitted latency = 8.09 s + 1.44 s × np: the knee is between np 4 and 8: from 4 to 8 each "
                           "extra slot added 8 % throughput and 13 % latency")
    assert metrics.knee([1, 2, 4, 8], [None, 0.818, 0.346, 0.075], [None, 0.1, 0.09, 0.135])[1] == \
        "above np 4 each extra slot adds 8 % throughput and 14 % latency"  # without a model: the measured knee
    # latency 10, 11, 13, 20 vs 1, 2, 4, 8: Sxy 41.5, Sxx 28.75
    assert sc.fit is not None
    assert sc.fit.b == pytest.approx(41.5 / 28.75)
    assert sc.fit.a == pytest.approx(13.5 - 41.5 / 28.75 * 3.75)
    by_config = metrics.scaling(metrics.throughput(store), by="parallel", store=store)
    assert by_config.knee == 4 and by_config.table["parallel"].to_list() == [1, 2, 4, 8]


def test_no_knee_and_too_few_points() -> None:
    assert metrics.knee([1, 2], [None, 0.5], [None, 0.1])[0] is None
    assert metrics.knee([1, 2], [None, 0.5], [None, 0.1])[1] == (
        "throughput still grows by 10 % or more per step up to np 2: no knee yet")
    assert metrics.knee([4], [None], [None]) == (None, "need runs at two or more values of np to find a knee")


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90.0), ("20m", 1200.0), ("1h", 3600.0),
                                                ("1500ms", 1.5), ("45", 45.0), ("2.5m", 150.0), (30, 30.0)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert metrics.parse_duration(text) == seconds


def test_parse_duration_rejects_garbage() -> None:
    with pytest.raises(InputError, match="cannot read duration 'ten minutes'"):
        metrics.parse_duration("ten minutes")


def test_unknown_run_is_a_clear_error(store_dir: Path) -> None:
    with pytest.raises(NotFoundError, match="no run 'nope'"):
        metrics.throughput(basic_store(store_dir), ["nope"])


def test_smoke_cli_verdicts_and_exit_codes(store_dir: Path) -> None:
    basic_store(store_dir)
    runner = CliRunner()
    res = runner.invoke(cli, ["smoke", "--store", str(store_dir), "abs", "rec", "order", "--max-run", "10s",
                              "--max-request", "11s", "--format", "csv"])
    assert res.exit_code == 1
    # abs: wall 20 s > 10 s and longest request 12 s > 11 s; rec 5 s / 5 s; order 6 s / 4 s
    assert res.stdout == (
        "run,np,run_s,max_run_s,run_verdict,request_s,max_request_s,request_verdict,verdict\n"
        "abs,2,20.0,10.0,fail,12.0,11.0,fail,FAIL\n"
        "rec,2,5.0,10.0,pass,5.0,11.0,pass,PASS\n"
        "order,3,6.0,10.0,pass,4.0,11.0,pass,PASS\n")
    assert res.stderr == "smoke: FAIL (abs)\n"
    res = runner.invoke(cli, ["smoke", "--store", str(store_dir), "abs", "--max-run", "1m", "--max-request",
                              "90s", "--max-p95", "12s", "--format", "json"])
    assert res.exit_code == 0
    assert json.loads(res.stdout) == [{
        "run": "abs", "np": 2, "run_s": 20.0, "max_run_s": 60.0, "run_verdict": "pass", "request_s": 12.0,
        "max_request_s": 90.0, "request_verdict": "pass", "p95_s": 11.7, "max_p95_s": 12.0, "p95_verdict": "pass",
        "verdict": "PASS"}]
    with pytest.raises(SystemExit) as exc:
        main(["smoke", "--store", str(store_dir), "abs", "--max-run", "soon"])
    assert exc.value.code == 2


def test_throughput_cli_table_json_and_knee_sentence(store_dir: Path) -> None:
    sweep_store(store_dir, SWEEP)
    runner = CliRunner()
    res = runner.invoke(cli, ["throughput", "--store", str(store_dir), "np1", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [(r["run"], r["np"], r["wall_s"], r["gen_tok_per_s"], r["peak_busy_slots"]) for r in rows] == [
        ("np1", 1, 20.0, 10.0, 1)]
    res = runner.invoke(cli, ["throughput", "--store", str(store_dir), "--by", "np", "--format", "csv"])
    assert res.exit_code == 0
    assert res.stdout.splitlines()[0] == (
        "setup,np,runs,gen_tok_per_s,req_per_s,latency_p50_s,latency_p90_s,effective_concurrency,peak_busy_slots,"
        "throughput_gain_per_step,latency_growth_per_step")
    # the runs log no build, model or workload: one setup, the same for all four
    assert [line.rsplit('",', 1)[1].split(",")[0] for line in res.stdout.splitlines()[1:]] == ["1", "2", "4", "8"]
    assert {line.rsplit('",', 1)[0] for line in res.stdout.splitlines()[1:]} == {'"no build, model or workload logged'}
    # fitted: T(c) = c / (8.087 + 1.443 c); T6/T5 - 1 = 9.7 % < 10 % at np 5, which no run measured: one knee,
    # between the measured np 4 and 8 (the step from 4 to 8 adds (1.3 - 1) / 4 = 7.5 % per slot)
    assert res.stderr.splitlines()[-1] == ("fitted latency = 8.09 s + 1.44 s × np: the knee is between np 4 and 8: "
                                           "from 4 to 8 each extra slot added 8 % throughput and 13 % latency")
    assert sum("knee" in line or "above np" in line for line in res.stderr.splitlines()) == 1
    assert res.stderr.splitlines()[0] == ("note: setup no build, model or workload logged: every run of the store: "
                                          "np1, np2, np4, np8")
    assert res.stderr.splitlines()[1].startswith("fit: latency_p50_s = 8.087 + 1.443 x np")


def test_model_knee_from_the_fitted_latency() -> None:
    # latency = 4 + 1 x np; throughput ~ c / (4 + c): gains per extra slot 67 %, 29 %, 17 %, 11 %, then
    # (6/10) / (5/9) - 1 = 8 % < 10 % at np 5, while latency grows 10/9 - 1 = 11 %
    fit = metrics.fit_line([1, 2, 4, 8], [5.0, 6.0, 8.0, 12.0])
    assert fit is not None and (fit.a, fit.b) == pytest.approx((4.0, 1.0))
    knee, sentence = metrics.model_knee(fit, [1, 2, 4, 8])
    assert knee == 5
    assert sentence == ("fitted latency = 4.00 s + 1.00 s × np: above np 5 each extra slot adds 8 % throughput "
                        "and 11 % latency")
    assert metrics.model_knee(fit, [1, 2]) == (None, None)  # too few points to trust a model
    flat = metrics.fit_line([1, 2, 3], [5.0, 5.0, 5.0])
    assert metrics.model_knee(flat, [1, 2, 3]) == (None, None)  # no marginal cost: no knee

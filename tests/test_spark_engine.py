"""DuckDB and Spark give the same answers: every named query, through the library function that runs it, on a
generated fleet of three hosts' stores (a dead slot, runaways, failures, a failover, a watchdog kill, the same run
names on every host) and on the real-log corpus store; then the verdict's facts and the fleet commands.

Spark runs on one local[2] session for the whole test run (two shuffle partitions, no UI, bound to 127.0.0.1):
the tests are marked ``spark`` and kept in this one file, which `make test` gives to one xdist worker
(``--dist loadfile``); they skip only when Java is absent.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner
from polars.testing import assert_frame_equal

from forensics import findings, incidents, metrics, otel
from forensics.cli import cli
from forensics.fleet import Fleet, open_fleet
from forensics.generate.fleet import FLEET_HOSTS, generate_fleet
from forensics.ingest import IngestOptions, ingest
from forensics.replay import tables
from forensics.sql import QUERIES_DIR, load_query
from forensics.store import Store, fetch_pl
from tests import real_corpus

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900),
              pytest.mark.skipif(shutil.which("java") is None, reason="Java is absent: Spark cannot start")]


# ---------------------------------------------------------------------------------------------- stores
@pytest.fixture(scope="session")
def fleet_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three hosts' stores, each ingested from its own generated logs."""
    root = tmp_path_factory.mktemp("fleet")
    dirs = []
    for host, logs in generate_fleet(root).items():
        ingest(root / host / "forensics-store", [logs], IngestOptions())
        dirs.append(root / host / "forensics-store")
    return dirs


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_corpus.ingest_corpus(real_corpus.corpus(), tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def spark_engine() -> Any:
    """The test run's one Spark session."""
    from forensics.spark import SMALL_DATA, SparkEngine

    return SparkEngine("local[2]", partitions=2, conf=SMALL_DATA)


def _pair(spark_engine: Any, open_: Callable[[], Store]) -> tuple[Store, Store]:
    duck, spark = open_(), open_()
    spark.engine = spark_engine
    return duck, spark


@pytest.fixture(scope="module")
def fleet(fleet_dirs: list[Path], spark_engine: Any) -> tuple[Store, Store]:
    return _pair(spark_engine, lambda: open_fleet([str(d) for d in fleet_dirs]))


@pytest.fixture(scope="module")
def corpus(corpus_dir: Path, spark_engine: Any) -> tuple[Store, Store]:
    return _pair(spark_engine, lambda: Store(corpus_dir))


# ---------------------------------------------------------------------------------------------- comparing
def _sortable(df: pl.DataFrame) -> list[pl.Expr]:
    return [pl.col(c).round(3) if t.is_float() else pl.col(c).cast(pl.String) if not t.is_numeric() else pl.col(c)
            for c, t in df.schema.items()]


def same_rows(duck: pl.DataFrame, spark: pl.DataFrame) -> None:
    """The same columns, types and rows (in any order); floats to 1e-6 absolute or 1e-4 relative: a wall-clock
    time as epoch seconds in a double carries 2.4e-7 s, the engines round it differently, and a rate over a
    12 ms window (a real log's) inherits 2e-5 of that."""
    assert duck.columns == spark.columns
    assert duck.dtypes == spark.dtypes, [(c, a, b) for c, a, b in zip(duck.columns, duck.dtypes, spark.dtypes,
                                                                       strict=True) if a != b]
    key = [f"_k{i}" for i in range(duck.width)]
    a = duck.with_columns(e.alias(k) for e, k in zip(_sortable(duck), key, strict=True)).sort(key, nulls_last=True)
    b = spark.with_columns(e.alias(k) for e, k in zip(_sortable(spark), key, strict=True)).sort(key, nulls_last=True)
    assert_frame_equal(a.drop(key), b.drop(key), check_exact=False, rel_tol=1e-4, abs_tol=1e-6)


def _missing(store: Store) -> pl.DataFrame:
    """The missing items of two runs that have them (each run is one more query)."""
    runs = tables.runs_table(store).filter(pl.col("items_missing") > 0)["run"].to_list()[:2]
    frames = [tables.missing(store, r).with_columns(pl.lit(r).alias("run")) for r in runs]
    return pl.concat(frames) if frames else pl.DataFrame()


def _failovers(store: Store) -> pl.DataFrame:
    from forensics import runs

    con = otel._replay_con(store)
    try:
        return fetch_pl(con, load_query("failovers").text, {"runs": runs.all_runs(store)})
    finally:
        con.close()


def _spans(store: Store) -> pl.DataFrame:
    from forensics import runs

    return otel.request_rows(store, runs.all_runs(store))


def _verdict(session: Any) -> pl.DataFrame:
    """The verdict's facts: every sentence, with the instance names and the runs' requests and slots it reads."""
    from forensics.verdict import verdict

    return pl.DataFrame([{"run": v.run, "kind": f.kind, "sentence": f.sentence} for v in verdict(session)
                         for f in v.facts], schema={"run": pl.String, "kind": pl.String, "sentence": pl.String})


def _planning_requests(store: Store) -> pl.DataFrame:
    from forensics import runs
    from forensics.planning.workload import requests_frame

    return requests_frame(store, runs.all_runs(store))


def _request_facts(session: Any) -> pl.DataFrame:
    session.prepare(session.runs)
    return session.query("request_facts", runs=session.runs)


def _run_setup(session: Any) -> pl.DataFrame:
    session.prepare(session.runs, requests=False)
    return session.query("run_setup", runs=session.runs)


def _class_tokens(session: Any) -> pl.DataFrame:
    from forensics import compare

    got = compare.useful_tokens(session, session.runs)
    return pl.DataFrame([{"run": r, "normal": a, "all": b} for r, (a, b) in got.items()])


# Each named query, through the library function that runs it (findings_base is under every finding); the finding
# cases are given the analysis session all of them share, as the verdict's do.
CASES: dict[str, tuple[tuple[str, ...], Callable[[Any], pl.DataFrame]]] = {
    "runaways": (("findings_base", "runaways"), lambda s: findings.find_runaways(s)),
    "prompt_over_context": (("prompt_over_context",), lambda s: findings.find_prompt_over_context(s)),
    "deadslots": (("deadslots",), lambda s: findings.dead_slot_report(s, include_recovered=True).sequence),
    "dead_slots": (("deadslots",), lambda s: findings.dead_slot_report(s).slots),
    "cap_whatif": (("cap", "attempts_capped"), lambda s: findings.recommend_cap(s).whatif),
    "caps_by_run": (("cap",), lambda s: findings.caps_by_run(s)),
    "errors": (("errors", "crashes"), lambda s: findings.error_groups(s)),
    "crashes": (("crashes",), lambda s: findings.rows(s, "crash")),
    "kv_stall": (("kv_stall",), lambda s: findings.rows(s, "kv_stall")),
    "prompt_cache": (("prompt_cache",), lambda s: findings.rows(s, "prompt_cache")),
    "client_timeouts": (("client_timeouts",), lambda s: findings.rows(s, "failover")),
    "missing_items": (("missing_items",), lambda s: findings.missing_items(s)),
    "failed_requests": (("failed_requests",), lambda s: findings.rows(s, "failed")),
    "run_ends": (("run_ends",), lambda s: findings.rows(s, "ended")),
    "run_cost": (("run_cost",), lambda s: findings.rows(s, "cost")),
    "request_classes": (("request_keys",), lambda s: findings.request_classes(s)),
    "class_tokens": (("class_tokens",), _class_tokens),
    "verdict": (("request_locations", "run_stats", "instance_names"), _verdict),
    "request_intervals": (("request_intervals",), lambda s: metrics.request_intervals(s)),
    "throughput": (("throughput",), lambda s: metrics.throughput(s)),
    "replay_runs": (("replay_runs",), lambda s: tables.runs_table(s)),
    "missing": (("missing",), _missing),
    "failovers": (("failovers",), _failovers),
    "otel_spans": (("otel_spans",), _spans),
    "planning_requests": (("planning_requests",), _planning_requests),
    "request_facts": (("request_facts",), _request_facts),
    "run_setup": (("run_setup",), _run_setup),
    "incidents": (("incidents",), lambda s: incidents.incidents(s)),
    "precursors": (("precursors",), lambda s: incidents.precursors(s).table),
}


def test_every_named_query_is_compared() -> None:
    named = {p.stem for p in QUERIES_DIR.glob("*.sql")}
    covered = {q for queries, _ in CASES.values() for q in queries}
    assert named == covered, f"named queries without a Spark comparison: {sorted(named - covered)}"


def _answers(store: Store, cases: list[str]) -> dict[str, pl.DataFrame | BaseException]:
    """Each case's frame (or the error it raised), the findings sharing one session as the verdict's do."""
    from forensics import runs
    from forensics.session import Analysis

    out: dict[str, pl.DataFrame | BaseException] = {}
    with Analysis.open(store, runs.all_runs(store)) as session:
        for case in cases:
            try:
                out[case] = CASES[case][1](session if case in SESSION_CASES else store)
            except Exception as exc:  # reported by the case's own test
                out[case] = exc
    return out


# The cases computed through the one analysis session (the others read the store themselves).
SESSION_CASES = {"runaways", "prompt_over_context", "deadslots", "dead_slots", "cap_whatif", "caps_by_run", "errors",
                 "crashes", "kv_stall", "client_timeouts", "missing_items", "failed_requests", "run_ends", "run_cost",
                 "request_classes", "class_tokens", "verdict", "request_facts", "run_setup", "incidents",
                 "precursors", "prompt_cache"}


def _compare(answers: tuple[dict[str, Any], dict[str, Any]], case: str) -> pl.DataFrame:
    duck, spark = answers[0][case], answers[1][case]
    for got in (duck, spark):
        if isinstance(got, BaseException):
            raise got
    same_rows(duck, spark)
    return duck


CORPUS_CASES = ["errors", "throughput"]  # the real logs' error lines and their three kinds of clock


@pytest.fixture(scope="module")
def fleet_answers(fleet: tuple[Store, Store]) -> tuple[dict[str, Any], dict[str, Any]]:
    return _answers(fleet[0], sorted(CASES)), _answers(fleet[1], sorted(CASES))


@pytest.fixture(scope="module")
def corpus_answers(corpus: tuple[Store, Store]) -> tuple[dict[str, Any], dict[str, Any]]:
    return _answers(corpus[0], CORPUS_CASES), _answers(corpus[1], CORPUS_CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fleet_store_same_rows(fleet_answers: tuple[dict[str, Any], dict[str, Any]], case: str) -> None:
    rows = _compare(fleet_answers, case)
    if case in ("dead_slots", "runaways", "errors", "failovers", "missing", "prompt_over_context", "incidents"):
        assert rows.height > 0, f"the fleet was built to have {case}"


@pytest.mark.parametrize("case", CORPUS_CASES)
def test_real_corpus_store_same_rows(corpus_answers: tuple[dict[str, Any], dict[str, Any]], case: str) -> None:
    rows = _compare(corpus_answers, case)
    assert rows.height > 0, f"the real-log corpus has {case}"


def test_fleet_runs_stay_apart_by_host(fleet: tuple[Store, Store],
                                      fleet_answers: tuple[dict[str, Any], dict[str, Any]]) -> None:
    duck, _ = fleet
    assert isinstance(duck, Fleet)
    expected = [f"{h}:run-{i}" for h in FLEET_HOSTS for i in (1, 2)]  # the same run names on every host
    one = [metrics.throughput(Store(s.root)).select("run", "requests")
           .with_columns((pl.lit(h + ":") + pl.col("run")).alias("run")) for h, s in duck.members]
    for answers in fleet_answers:
        assert answers["replay_runs"]["run"].to_list() == expected
        assert_frame_equal(answers["throughput"].select("run", "requests").sort("run"), pl.concat(one).sort("run"))


@pytest.mark.parametrize("args", [["verdict", "--format", "json"], ["throughput", "--by", "np"]])
def test_fleet_commands_answer_the_same_on_both_engines(fleet_dirs: list[Path], spark_engine: Any,
                                                        args: list[str]) -> None:
    """One command across the three hosts: the verdict's facts (as JSON) and throughput against np."""
    stores = [a for d in fleet_dirs for a in ("--store", str(d))]
    duck = CliRunner().invoke(cli, [*args, *stores])
    spark = CliRunner().invoke(cli, [*args, *stores, "--engine", "spark", "--spark-master", "local[2]"])
    assert duck.exit_code == 0, duck.output
    assert spark.exit_code == 0, spark.output
    assert spark.stdout == duck.stdout
    if args[0] == "throughput":  # only the runs of a working server, each host its own setup: np 2 gpu-a:run-2,
        # np 4 gpu-b:run-2 (never pooled: two hosts)
        rows = [re.split(r"\s{2,}", line.strip())[:3] for line in duck.stdout.splitlines()[2:]]
        assert [(r[0].split(" · ")[0], r[1], r[2]) for r in rows] == [("gpu-a", "2", "1"), ("gpu-b", "4", "1")]
        assert "left out gpu-c:run-2 (it measures a broken server)" in duck.stderr
    else:
        assert "gpu-a:run-1" in duck.stdout and "gpu-c:run-2" in duck.stdout
        kinds = {f["kind"] for v in json.loads(duck.stdout) for f in v["facts"]}
        assert {"dead_slot", "runaway", "missing", "ended", "prompt_over_context", "cap"} <= kinds, kinds

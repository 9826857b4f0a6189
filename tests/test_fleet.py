"""Several stores read as one (DuckDB), the one-line refusals around it, and the DuckDB → Spark SQL rewriting
(``forensics.spark.FIXES``) as text: none of these start Spark."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import StoreError
from forensics.fleet import Fleet, host_label, open_fleet
from forensics.store import run_of_part
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same generated run ingested into two hosts' stores."""
    root = tmp_path_factory.mktemp("hosts")
    gen = CliRunner().invoke(cli, ["generate", str(root / "gen"), "--scenario", "healthy"])
    assert gen.exit_code == 0, gen.output
    for host in ("gpu-a", "gpu-b"):
        res = CliRunner().invoke(cli, ["ingest", str(root / "gen" / "logs"), "--store", str(root / host / "forensics-store")])
        assert res.exit_code == 0, res.output
    return root


def _stores(root: Path) -> list[str]:
    return ["--store", str(root / "gpu-a" / "forensics-store"), "--store", str(root / "gpu-b" / "forensics-store")]


def test_runs_are_named_by_host(two_hosts: Path) -> None:
    res = CliRunner().invoke(cli, ["sql", "SELECT run, count(*) AS n FROM requests GROUP BY run ORDER BY run",
                                   "--format", "csv", *_stores(two_hosts)])
    assert res.exit_code == 0, res.output
    assert res.stdout == "run,n\ngpu-a:run-healthy,48\ngpu-b:run-healthy,48\n"


def test_a_pattern_and_named_hosts(two_hosts: Path) -> None:
    by_glob = CliRunner().invoke(cli, ["runs", "--format", "csv", "--store", str(two_hosts / "*" / "forensics-store")])
    named = CliRunner().invoke(cli, ["runs", "--format", "csv", "--store", f"a={two_hosts / 'gpu-a' / 'forensics-store'}",
                                     "--store", f"b={two_hosts / 'gpu-b' / 'forensics-store'}"])
    assert by_glob.exit_code == 0 and named.exit_code == 0, by_glob.output + named.output
    assert [line.split(",")[0] for line in by_glob.stdout.splitlines()] == ["run", "gpu-a:run-healthy",
                                                                          "gpu-b:run-healthy"]
    assert [line.split(",")[0] for line in named.stdout.splitlines()] == ["run", "a:run-healthy", "b:run-healthy"]


def test_one_run_of_a_fleet_by_its_name(two_hosts: Path) -> None:
    res = CliRunner().invoke(cli, ["deadslots", "gpu-b:run-healthy", "--format", "csv", *_stores(two_hosts)])
    assert res.exit_code == 0, res.output
    both = CliRunner().invoke(cli, ["deadslots", "run-healthy", *_stores(two_hosts)])
    assert both.exit_code == 2
    assert both.stderr == ("forensics: error: run 'run-healthy' is on 2 hosts: gpu-a:run-healthy, gpu-b:run-healthy "
                           "(name it with its host: HOST:RUN)\n")
    unknown = CliRunner().invoke(cli, ["deadslots", "run-42", *_stores(two_hosts)])
    assert unknown.exit_code == 2
    assert unknown.stderr.startswith("forensics: error: no run 'run-42' in the store (runs: gpu-a:run-healthy, "
                                     "gpu-b:run-healthy)\n")


@pytest.fixture(scope="module")
def real_hosts(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Two real runs (fixtures/server-runs), each in a store of its own: sA holds the dead slot, sB a healthy run."""
    root = tmp_path_factory.mktemp("real-hosts")
    for host, run in (("sA", "b11312-deadslot"), ("sB", "b11312-healthy")):
        res = CliRunner().invoke(cli, ["ingest", str(ROOT / "fixtures" / "server-runs" / run),
                                       "--store", str(root / host)])
        assert res.exit_code == 0, res.output
    return ["--store", f"sA={root / 'sA'}", "--store", f"sB={root / 'sB'}"]


def test_a_run_name_unique_across_the_stores_is_accepted_bare(real_hosts: list[str]) -> None:
    bare = CliRunner().invoke(cli, ["deadslots", "b11312-deadslot", "--format", "csv", *real_hosts])
    full = CliRunner().invoke(cli, ["deadslots", "sA:b11312-deadslot", "--format", "csv", *real_hosts])
    assert bare.exit_code == 0 and full.exit_code == 0, bare.output + full.output
    assert bare.stdout == full.stdout and bare.stdout.count("sA:b11312-deadslot") >= 1


def test_runs_of_a_fleet_show_their_requests(real_hosts: list[str]) -> None:
    # requests.replay_run is qualified like run, so each run meets the requests the join gave it
    res = CliRunner().invoke(cli, ["runs", "--format", "csv", *real_hosts])
    assert res.exit_code == 0, res.output
    rows = [line.split(",") for line in res.stdout.splitlines()]
    cols = rows[0]
    got = {r[0]: (r[cols.index("attempts")], r[cols.index("requests")]) for r in rows[1:]}
    assert got == {"sA:b11312-deadslot": ("48", "48"), "sB:b11312-healthy": ("48", "48")}


def test_parts_name_the_fleet_run(two_hosts: Path) -> None:
    fleet = open_fleet([str(two_hosts / h / "forensics-store") for h in ("gpu-a", "gpu-b")])
    assert isinstance(fleet, Fleet) and fleet.hosts == ["gpu-a", "gpu-b"]
    assert {run_of_part(p) for p in fleet.parts("requests")} == {"gpu-a:run-healthy", "gpu-b:run-healthy"}
    assert host_label(two_hosts / "gpu-a" / "forensics-store") == "gpu-a"


def test_writers_take_one_store(two_hosts: Path) -> None:
    for args in (["ingest", str(two_hosts / "gen" / "logs")], ["compact"], ["check"]):
        res = CliRunner().invoke(cli, [*args, *_stores(two_hosts)])
        assert res.exit_code == 2, (args, res.output)
        assert res.stderr.count("\n") == 1 and "pass one --store" in res.stderr, res.stderr


def test_two_stores_for_one_host_are_refused(two_hosts: Path) -> None:
    with pytest.raises(StoreError, match="two stores stand for host 'x'"):
        open_fleet([f"x={two_hosts / 'gpu-a' / 'forensics-store'}", f"x={two_hosts / 'gpu-b' / 'forensics-store'}"])
    with pytest.raises(StoreError, match="no store matches"):
        open_fleet([str(two_hosts / "nothing-*")])


def test_spark_without_java_is_one_line(two_hosts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    res = CliRunner().invoke(cli, ["verdict", "--engine", "spark", *_stores(two_hosts)])
    assert res.exit_code == 2
    assert res.stderr == ("forensics: error: --engine spark needs Java, and none was found (install Java 17 or newer "
                          "(Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME)\n")


def test_spark_without_pyspark_is_one_line(two_hosts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pyspark", None)  # import pyspark raises ImportError
    res = CliRunner().invoke(cli, ["runs", "--engine", "spark", "--store", str(two_hosts / "gpu-a" / "forensics-store")])
    assert res.exit_code == 2
    assert res.stderr == ("forensics: error: --engine spark needs pyspark, which is not installed "
                          "(pip install 'llama-forensics[spark]')\n")


def test_ingest_ignores_the_engine_variable_but_refuses_the_option(two_hosts: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    logs = str(two_hosts / "gen" / "logs")
    refused = CliRunner().invoke(cli, ["ingest", logs, "--store", str(tmp_path / "s"), "--engine", "spark"])
    assert refused.exit_code == 2 and "does not run on --engine spark" in refused.stderr
    monkeypatch.setenv("FORENSICS_ENGINE", "spark")  # meant for the reading commands
    assert CliRunner().invoke(cli, ["ingest", logs, "--store", str(tmp_path / "s")]).exit_code == 0


@pytest.mark.parametrize(("duck", "spark"), [
    ("SELECT epoch(t) FROM x", "SELECT CAST(UNIX_MICROS(t) AS DOUBLE) / 1000000 FROM x"),
    ("SELECT quantile_cont(v, 0.9) FROM x", "SELECT PERCENTILE(v, 0.9) FROM x"),
    ("SELECT list_position(l, s) FROM x", "SELECT NULLIF(ARRAY_POSITION(l, s), 0) FROM x"),
    ("SELECT printf('%d', n) FROM x", "SELECT IF('%d' IS NULL OR n IS NULL, NULL, FORMAT_STRING('%d', n)) FROM x"),
    ("SELECT from_json(s, '[\"VARCHAR\"]') FROM x", "SELECT FROM_JSON(s, 'ARRAY<STRING>') FROM x"),
    ("SELECT n / 1000.0 FROM x", "SELECT n / CAST(1000.0 AS DOUBLE) FROM x"),
    ("SELECT CAST(a / b AS BIGINT) FROM x", "SELECT CAST(ROUND(a / b) AS BIGINT) FROM x"),
    ("WITH r AS NOT MATERIALIZED (SELECT 1 AS a) SELECT a FROM r", "WITH r AS (SELECT 1 AS a) SELECT a FROM r"),
])
def test_duckdb_constructs_mean_the_same_on_spark(duck: str, spark: str) -> None:
    from forensics.spark import spark_sql

    assert spark_sql(duck) == spark


def test_parameters_become_typed_literals() -> None:
    from forensics.spark import spark_sql

    assert spark_sql("SELECT * FROM t WHERE run IN (SELECT unnest($runs)) AND n > $n", {"runs": ["a", "b'c"], "n": 2.5}) == (
        "SELECT * FROM t WHERE run IN (SELECT EXPLODE(CAST(ARRAY('a', 'b\\'c') AS ARRAY<STRING>))) "
        "AND n > CAST(2.5 AS DOUBLE)")
    assert spark_sql("SELECT count(*) FROM t WHERE run IN (SELECT unnest(?))", [[]]) == (
        "SELECT COUNT(*) FROM t WHERE run IN (SELECT EXPLODE(CAST(ARRAY() AS ARRAY<STRING>)))")

"""A shared mapping cannot read, write or attach anything outside the records it is given.

Mapping files travel between users, so their SQL expressions are untrusted.  Every way out that DuckDB
offers is tried here through a mapping: reading a file (each reader, a bare path, a glob, DuckDB's own temp
folder), the network, another database, COPY/EXPORT, extensions, secrets, settings and environment, Python
variables of the caller, statements smuggled after the expression.  Each is refused with one line, exit 2,
and the store and the report stay as they were.  Both walls are tested: the check when the mapping loads,
and the connection the expressions run on (with the first wall taken down).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import duckdb
import polars as pl
import pytest
from click.testing import CliRunner

from forensics import replay
from forensics.cli import cli
from forensics.errors import MappingError
from forensics.replay import mapsql
from tests.replay_helpers import FIX

TOKEN = "s3cr3t-8d1f0c"  # the secret's content: it must appear nowhere (store, report, messages)
HARNESS = FIX / "newharness"

# {secret}: a file outside the records; {tmpdir_secret}: one in DuckDB's default temp folder (./.tmp), which
# DuckDB lets a connection read even with external access off unless the temp folder is unset.
READS = [
    "(SELECT string_agg(content) FROM read_text('{secret}'))",
    "(SELECT string_agg(content) FROM READ_TEXT('{secret}'))",
    "(SELECT string_agg(content) FROM main.read_text('{secret}'))",
    "(SELECT count(*) FROM read_blob('{secret}'))",
    "(SELECT string_agg(column0) FROM read_csv('{secret}', header = false))",
    "(SELECT count(*) FROM read_csv_auto('{secret}'))",
    "(SELECT count(*) FROM read_json('{secret}'))",
    "(SELECT count(*) FROM read_json_auto('{secret}'))",
    "(SELECT count(*) FROM read_ndjson_objects('{secret}'))",
    "(SELECT count(*) FROM read_parquet('{secret}'))",
    "(SELECT count(*) FROM parquet_scan('{secret}'))",
    "(SELECT count(*) FROM parquet_metadata('{secret}'))",
    "(SELECT count(*) FROM sniff_csv('{secret}'))",
    "(SELECT count(*) FROM '{secret}')",
    "(SELECT string_agg(file) FROM glob('{folder}/*'))",
    "(SELECT string_agg(content) FROM read_text('{tmpdir_secret}'))",
    "(SELECT string_agg(content) FROM read_text('.tmp/secret.txt'))",
    "(SELECT string_agg(content) FROM read_text('https://example.com/'))",
    "(SELECT count(*) FROM read_duckdb('{folder}/other.duckdb', table_name = 't'))",
    "(SELECT count(*) FROM sqlite_scan('{folder}/other.db', 't'))",
    "(WITH t AS (SELECT content FROM read_text('{secret}')) SELECT content FROM t)",
    "(SELECT * FROM unnest((SELECT list(content) FROM read_text('{secret}'))))",
    "list_transform([1], x -> (SELECT content FROM read_text('{secret}')))[1]",
    "coalesce(NULL, (SELECT content FROM read_text('{secret}')))",
]
HOST = [
    "getenv('HOME')",
    "current_setting('secret_directory')",
    "current_setting('home_directory')",
    "(SELECT string_agg(value) FROM duckdb_settings()) || ticker",
    "(SELECT count(*) FROM duckdb_secrets())",
    "(SELECT count(*) FROM which_secret('s3://bucket/x', 's3'))",
    "(SELECT count(*) FROM duckdb_extensions())",
    "(SELECT string_agg(path) FROM duckdb_databases())",
    "(SELECT count(*) FROM query('SELECT 1'))",
    "(SELECT count(*) FROM query_table('records'))",
    "(SELECT string_agg(j) FROM records)",  # the other records' raw text: only fields are readable
    "(SELECT count(*) FROM frame)",  # a Python variable of the caller (a replacement scan)
    "(SELECT platform FROM pragma_platform())",
    "pg_sleep(60)",
]
# statements after (or around) the expression: a mapping holds one expression, never a statement
STATEMENTS = [
    "1; ATTACH '{folder}/other.duckdb' AS other",
    "1) AS x FROM records; COPY (SELECT 1) TO '{folder}/written.csv'; SELECT (1",
    "1; COPY (SELECT 1) TO '{folder}/written.csv'",
    "1; INSTALL httpfs",
    "1; LOAD httpfs",
    "1; SET enable_external_access = true",
    "1; SET lock_configuration = false",
    "1; PRAGMA enable_profiling",
    "1; CREATE SECRET s (TYPE s3, KEY_ID 'k', SECRET 'v')",
    "1; EXPORT DATABASE '{folder}/exported'",
    "1; CALL checkpoint()",
    "1 --\n; COPY (SELECT 1) TO '{folder}/written.csv'",
]


def _attacks() -> list[tuple[str, str]]:
    return [("read", e) for e in READS] + [("host", e) for e in HOST] + [("statement", e) for e in STATEMENTS]


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A secret file outside the records, one in ./.tmp, another database; the working directory is tmp_path."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "private"
    folder.mkdir()
    (folder / "secret.txt").write_text(TOKEN + "\n")
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "secret.txt").write_text(TOKEN + "\n")
    con = duckdb.connect(str(folder / "other.duckdb"))
    con.execute(f"CREATE TABLE t AS SELECT '{TOKEN}' AS v")
    con.close()
    return {"secret": str(folder / "secret.txt"), "folder": str(folder),
            "tmpdir_secret": str(tmp_path / ".tmp" / "secret.txt")}


def _mapping(tmp_path: Path, expr: str, where: str = "outcome") -> Path:
    """The harness's own mapping (fixtures/replay/newharness) with one expression replaced by ``expr``."""
    text = (HARNESS / "bench.toml").read_text()
    toml_expr = expr.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    if where == "outcome":
        text = re.sub(r'^outcome = \{ sql = ".*" \}$', lambda _: f'outcome = {{ sql = "{toml_expr}" }}', text,
                      flags=re.M)
    else:  # the where filter
        text = text.replace('where = "phase <> \'warmup\'"', f'where = "{toml_expr}"')
    path = tmp_path / "shared.toml"
    path.write_text(text)
    return path


def _snapshot(store: Path) -> dict[str, str]:
    return {str(p.relative_to(store)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(store.rglob("*")) if p.is_file() and p.name != ".lock"}


def _report(store: Path, out: Path) -> str:
    res = CliRunner().invoke(cli, ["report", "--store", str(store), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return re.sub(r"written \d{4}-\d\d-\d\dT[\d:]+Z", "written <t>", out.read_text())


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A store holding the harness's run, read with its own mapping (every attack is tried on it)."""
    store = tmp_path_factory.mktemp("sandbox") / "store"
    res = CliRunner().invoke(cli, ["ingest", str(HARNESS / "run-1129"), "--mapping", str(HARNESS / "bench.toml"),
                                   "--store", str(store)])
    assert res.exit_code == 0, res.output
    return store, _snapshot(store)


def _attempt(tmp_path: Path, store: Path, expr: str) -> tuple[Path, list[str]]:
    mapping = _mapping(tmp_path, expr)
    res = CliRunner().invoke(cli, ["ingest", str(HARNESS / "run-1129"), "--mapping", str(mapping), "--store",
                                   str(store)])
    assert res.exit_code == 2, res.output
    assert res.stdout == ""
    assert TOKEN not in res.output
    return mapping, res.stderr.splitlines()


@pytest.mark.parametrize(("kind", "expr"), _attacks(), ids=[f"{k}-{i}" for i, (k, _) in enumerate(_attacks())])
def test_a_shared_mapping_that_reaches_out_is_refused_in_one_line(
        tmp_path: Path, place: dict[str, str], stored: tuple[Path, dict[str, str]], kind: str, expr: str) -> None:
    store, before = stored
    mapping, lines = _attempt(tmp_path, store, expr.format(**place))
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"forensics: error: {mapping}: [attempts.fields] outcome: ")
    said = "refused: " if kind != "statement" else "not a SQL expression: "
    assert said in lines[0], lines[0]
    assert _snapshot(store) == before
    assert not (Path(place["folder"]) / "written.csv").exists()
    assert not (Path(place["folder"]) / "exported").exists()


def test_the_issues_example_leaves_the_store_and_the_report_as_they_were(
        tmp_path: Path, place: dict[str, str], stored: tuple[Path, dict[str, str]]) -> None:
    store, before = stored
    report = _report(store, tmp_path / "before.html")
    mapping, lines = _attempt(tmp_path, store, "(SELECT string_agg(content) FROM read_text('/etc/hostname'))")
    assert lines == [f"forensics: error: {mapping}: [attempts.fields] outcome: refused: read_text(...) reaches "
                     f"outside the record ({replay.mapping.REFUSED_HINT})"]
    assert _snapshot(store) == before
    assert _report(store, tmp_path / "after.html") == report


def test_the_where_filter_is_held_to_the_same_rule(tmp_path: Path, place: dict[str, str]) -> None:
    mapping = _mapping(tmp_path, "phase <> (SELECT content FROM read_text('{secret}'))".format(**place), "where")
    res = CliRunner().invoke(cli, ["ingest", str(HARNESS / "run-1129"), "--mapping", str(mapping), "--store",
                                   str(tmp_path / "s")])
    assert res.exit_code == 2
    assert res.stderr == (f"forensics: error: {mapping}: [attempts] where: refused: read_text(...) reaches outside "
                          f"the record ({replay.mapping.REFUSED_HINT})\n")
    assert not (tmp_path / "s").exists()  # refused before the store is opened


def test_a_harmless_subquery_over_the_records_own_list_still_works(tmp_path: Path) -> None:
    """What a mapping legitimately computes from its record (a list's values) stays allowed."""
    data = tmp_path / "r.jsonl"
    data.write_text('{"job": "A", "gaps": [0.5, 1.5, 1.0]}\n')
    mapping = tmp_path / "m.toml"
    mapping.write_text('[attempts]\n[attempts.fields]\nitem = "job"\n'
                       'latency_ms = { sql = "(SELECT sum(g) FROM unnest(gaps) AS t(g)) * 1000" }\n'
                       'itl_ms = { sql = "(SELECT max(value::DOUBLE) FROM json_each(to_json(gaps)))", unit = "s" }\n'
                       '[attempts.set]\nrun_id = "r"\nstage = "s"\noutcome = "ok"\n')
    recs = replay.load(data, mapping=mapping)
    assert recs.errors == []
    assert recs.attempts.select("latency_ms", "itl_ms").row(0) == (3000.0, 1500.0)


# ------------------------------------------------------------------------------------- the second wall
RUNTIME = [e for e in READS + HOST if "pg_sleep" not in e]
# What the connection still answers with the first wall down: its own catalog, version and settings (which name
# the working directory), never a file's content.  The first wall refuses each of these.
OWN_STATE = {"(SELECT count(*) FROM query('SELECT 1'))", "(SELECT count(*) FROM query_table('records'))",
             "(SELECT string_agg(j) FROM records)", "(SELECT platform FROM pragma_platform())",
             "(SELECT string_agg(path) FROM duckdb_databases())", "current_setting('home_directory')",
             "current_setting('secret_directory')", "(SELECT string_agg(value) FROM duckdb_settings()) || ticker",
             "(SELECT count(*) FROM duckdb_secrets())", "(SELECT count(*) FROM which_secret('s3://bucket/x', 's3'))"}
NOT_FOUND = ("(SELECT count(*) FROM '{secret}')", "(SELECT count(*) FROM frame)", "getenv('HOME')",
             "(SELECT count(*) FROM sqlite_scan('{folder}/other.db', 't'))")  # no such table or function here


@pytest.mark.parametrize("expr", RUNTIME, ids=[f"runtime-{i}" for i in range(len(RUNTIME))])
def test_the_connection_refuses_what_the_load_check_would_miss(
        tmp_path: Path, place: dict[str, str], monkeypatch: pytest.MonkeyPatch, expr: str) -> None:
    """With the load-time check taken down, the sandboxed connection still lets nothing out."""
    monkeypatch.setattr(mapsql, "_outside_reach", lambda node: "")
    mapsql.field_refs.cache_clear()
    frame = pl.DataFrame({"v": [TOKEN]})  # noqa: F841 -- a caller's variable that a replacement scan would find
    mapping = _mapping(tmp_path, expr.format(**place))
    try:
        recs = replay.load(HARNESS / "run-1129" / "results.csv", mapping=mapping)
    except MappingError as exc:
        text = exc.one_line()
        assert TOKEN not in text
        assert "\n" not in text
        if expr in NOT_FOUND:
            assert "Catalog Error" in text, text
        elif expr not in OWN_STATE:
            assert "refused: " in text and "Permission Error" in text, text
        return
    finally:
        mapsql.field_refs.cache_clear()
    outcomes = " ".join(str(v) for v in recs.attempts["outcome"].to_list() + [e.message for e in recs.errors])
    assert TOKEN not in outcomes
    assert expr in OWN_STATE, f"{expr} ran and gave {outcomes[:200]}"


def test_the_connection_cannot_be_unlocked() -> None:
    con = mapsql.sandbox()
    try:
        for stmt in ("SET enable_external_access = true", "SET lock_configuration = false",
                     "SET temp_directory = '.tmp'", "SET memory_limit = '64GB'", "SET autoload_known_extensions = true",
                     "SET allow_persistent_secrets = true"):
            with pytest.raises(duckdb.InvalidInputException, match="the configuration has been locked"):
                con.execute(stmt)
        for stmt in ("INSTALL httpfs", "LOAD httpfs", "ATTACH 'x.duckdb' AS x", "COPY (SELECT 1) TO 'x.csv'",
                     "EXPORT DATABASE 'exported'", "SELECT * FROM read_text('x.csv')"):
            with pytest.raises(duckdb.PermissionException):
                con.execute(stmt)
        with pytest.raises(duckdb.InvalidInputException):  # no secret type without an extension, none loadable
            con.execute("CREATE PERSISTENT SECRET s (TYPE s3, KEY_ID 'k', SECRET 'v')")
        assert con.execute("SELECT current_setting('enable_external_access'), current_setting('lock_configuration'),"
                           " current_setting('allowed_directories')").fetchone() == (False, True, [])
    finally:
        con.close()


def test_an_expression_that_never_ends_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mapsql, "TIME_LIMIT_S", 0.5)
    mapping = _mapping(tmp_path, "CASE WHEN (SELECT count(*) FROM range(100000000000)) > 0 THEN 'ok' END")
    with pytest.raises(MappingError, match=r"stopped after 0.5 s: the expressions did not finish"):
        replay.load(HARNESS / "run-1129" / "results.csv", mapping=mapping)

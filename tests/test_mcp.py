"""``forensics mcp``: the MCP SDK's own client, in-process, end to end on a store of a real dead-slot run.

The run (fixtures/server-runs/b11312-deadslot, its README's truth): slot 2 of `main` went bad from UNH/analyze and
stayed bad; UNH, PG, ABBV and ADBE are missing at extract.  Every tool must return what its command prints with
``--format json``: the same library call, the same rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from mcp import Client  # the SDK's own client (the [mcp] extra, in dev)

from forensics import mcp_server, registry
from forensics.cli import cli
from forensics.readonly import SqlLimits

RUN_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "server-runs" / "b11312-deadslot"
RUN = "b11312-deadslot"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp") / "store"
    res = CliRunner().invoke(cli, ["ingest", str(RUN_DIR), "--store", str(path)])
    assert res.exit_code == 0, res.output
    return path


def cli_out(store: Path, *args: str) -> str:
    res = CliRunner().invoke(cli, [*args, "--store", str(store)])
    assert res.exit_code in (0, 1), res.output
    return res.stdout


def ask(store: Path, calls: list[tuple[str, dict[str, Any]]], limits: SqlLimits | None = None) -> list[Any]:
    """Each (tool, arguments) through the SDK's client against the server of ``store``: the results."""
    srv = mcp_server.server(mcp_server.open_store([store]), limits)

    async def main() -> list[Any]:
        async with Client(srv) as client:
            return [await client.call_tool(name, args) for name, args in calls]

    return anyio.run(main)


def texts(result: Any) -> list[str]:
    return [c.text for c in result.content]


def files(store: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(store)): (p.stat().st_size, p.stat().st_mtime_ns) for p in store.rglob("*")}


def test_lists_every_tool_read_only(store: Path) -> None:
    srv = mcp_server.server(mcp_server.open_store([store]))

    async def main() -> Any:
        async with Client(srv) as client:
            return await client.list_tools()

    listed = anyio.run(main).tools
    findings = [f"finding_{f.name}" for f in registry.findings()]
    assert [t.name for t in listed] == ["runs", "verdict", *findings, "missing", "throughput", "whatif", "recommend",
                                        "compare", "sql"]
    assert all(t.annotations.read_only_hint and not t.annotations.destructive_hint for t in listed)
    runaway = next(t for t in listed if t.name == "finding_runaway")
    assert set(runaway.input_schema["properties"]) == {"runs", *registry.RUNAWAY_OPTIONS}


def test_verdict_is_the_commands(store: Path) -> None:
    (res,) = ask(store, [("verdict", {})])
    assert not res.is_error
    rows, paragraph = texts(res)
    assert rows + "\n" == cli_out(store, "verdict", "--format", "json")
    assert paragraph + "\n" == cli_out(store, "verdict")
    facts = json.loads(rows)[0]["facts"]
    dead = next(f for f in facts if f["kind"] == "dead_slot")
    assert dead["sentence"].startswith("Slot 2 of `main` died at ")
    assert " on UNH/analyze and never recovered" in dead["sentence"]
    assert dead["evidence"][0] == f"{RUN_DIR / 'main.log'}:128-227"  # the line where slot 2 took UNH/analyze


def test_every_finding_is_its_commands_rows(store: Path) -> None:
    with_command = [f for f in registry.findings() if f.command]
    results = ask(store, [(f"finding_{f.name}", {"runs": [RUN]}) for f in with_command])
    for f, res in zip(with_command, results, strict=True):
        assert not res.is_error, texts(res)
        assert texts(res)[0] + "\n" == cli_out(store, str(f.command), RUN, "--format", "json"), f.name
    slots = json.loads(texts(results[[f.name for f in with_command].index("dead_slot")])[0])
    assert [(s["instance"], s["slot"], s["recovered"]) for s in slots] == [("main", 2, False)]


def test_thresholds_and_explain_reach_the_finding(store: Path) -> None:
    explained, strict = ask(store, [("finding_dead_slot", {"explain": True}),
                                    ("finding_runaway", {"min_tokens": 1000})])
    assert texts(explained)[0] + "\n" == cli_out(store, "deadslots", "--explain", "--format", "json")
    assert texts(strict)[0] + "\n" == cli_out(store, "runaways", "--min-tokens", "1000", "--format", "json")
    # 255-328 tokens are under 1000: each still ran away, by reaching the slot's context alone
    assert {r["why"] for r in json.loads(texts(strict)[0])} == {"context"}


def test_the_other_tools_are_their_commands(store: Path) -> None:
    runs, missing, tput, sql = ask(store, [("runs", {}), ("missing", {"run": RUN}), ("throughput", {}),
                                           ("sql", {"query": "select slot, count(*) n from requests group by slot "
                                                             "order by slot"})])
    assert texts(runs)[0] + "\n" == cli_out(store, "runs", "--format", "json")
    assert texts(missing)[0] + "\n" == cli_out(store, "missing", RUN, "--format", "json")
    assert sorted((r["item"], r["stage"]) for r in json.loads(texts(missing)[0])) == [
        ("ABBV", "extract"), ("ADBE", "extract"), ("PG", "extract"), ("UNH", "extract")]
    assert texts(tput)[0] + "\n" == cli_out(store, "throughput", "--format", "json")
    assert texts(sql)[0] + "\n" == cli_out(store, "sql", "select slot, count(*) n from requests group by slot "
                                                          "order by slot", "--format", "json")


@pytest.mark.parametrize(("query", "said"), [
    ("copy (select 1) to 'out.csv'", "only SELECT is allowed here, got COPY"),
    ("create table t as select 1", "only SELECT is allowed here, got CREATE"),
    ("insert into requests select * from requests", "only SELECT is allowed here, got INSERT"),
    ("attach 'other.duckdb'", "only SELECT is allowed here, got ATTACH"),
    ("set enable_external_access = true", "only SELECT is allowed here, got SET"),
    ("select 1; select 2", "one statement at a time, got 2"),
    ("select * from read_csv('/etc/hostname')", "file system operations are disabled"),
    ("select * from glob('/*')", "file system operations are disabled"),
    ("select * from read_parquet('https://example.com/x.parquet')", "disabled"),
])
def test_sql_refuses_writes_and_files_outside_the_store(store: Path, query: str, said: str) -> None:
    before = files(store)
    (res,) = ask(store, [("sql", {"query": query})])
    assert res.is_error
    assert said in texts(res)[0]
    assert files(store) == before


def test_sql_row_and_time_limits(store: Path) -> None:
    limits = SqlLimits(max_rows=3, timeout_s=0.5)
    rows, slow = ask(store, [("sql", {"query": "select * from requests order by line_first"}),
                             ("sql", {"query": "select count(*) from range(100000) a, range(1000000) b "
                                               "where a.range * b.range = -1"})], limits)
    assert len(json.loads(texts(rows)[0])) == 3
    assert texts(rows)[1] == "note: only the first 3 rows are shown; narrow the query"
    assert slow.is_error
    assert texts(slow)[0].startswith("the query ran past 0.5 s and was stopped")


def test_nothing_is_written_and_errors_are_one_line(store: Path) -> None:
    before = files(store)
    bad_run, unknown, extra = ask(store, [("verdict", {"runs": ["no-such-run"]}), ("nope", {}),
                                          ("missing", {"run": RUN, "path": "/etc/passwd"})])
    assert bad_run.is_error and "no-such-run" in texts(bad_run)[0]
    assert unknown.is_error and texts(unknown)[0].startswith("no tool 'nope'; tools: runs, verdict, ")
    assert extra.is_error and texts(extra)[0] == "missing takes no argument 'path' (its arguments: run)"
    assert files(store) == before


def test_a_stale_analysis_is_worked_out_in_memory_not_written(store: Path, tmp_path: Path) -> None:
    """A store derived by another analysis version: the CLI would derive it again under the lock; the server
    works it out in memory and writes nothing, with the same answer."""
    import shutil

    from forensics import derived
    from forensics.session import VERSION
    from forensics.store import MANIFEST

    copy = tmp_path / "stale"
    shutil.copytree(store, copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    entry = manifest[derived.KEY]
    entry["version"] = -1
    for batch in entry["batches"]:
        batch["version"] = -1
    (copy / MANIFEST).write_text(json.dumps(manifest))
    assert derived.state(mcp_server.open_store([copy])).needs([RUN], VERSION) == [RUN]
    before = files(copy)
    (res,) = ask(copy, [("verdict", {})])
    assert files(copy) == before
    assert json.loads(texts(res)[0]) == json.loads(cli_out(store, "verdict", "--format", "json"))


def test_forensics_mcp_serves_over_stdio(store: Path) -> None:
    """The command itself, as an MCP client starts it: a process speaking JSON-RPC on stdin/stdout."""
    import sys

    from mcp import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "forensics", "mcp", "--store", str(store)])

    async def main() -> Any:
        async with Client(params, mode="legacy") as client:
            listed = await client.list_tools()
            return listed, await client.call_tool("finding_missing", {"runs": [RUN]})

    listed, missing = anyio.run(main)
    assert [t.name for t in listed.tools][:2] == ["runs", "verdict"]
    assert not missing.is_error
    assert sorted((r["item"], r["stage"]) for r in json.loads(texts(missing)[0])) == [
        ("ABBV", "extract"), ("ADBE", "extract"), ("PG", "extract"), ("UNH", "extract")]


def test_the_store_is_opened_read_only(store: Path) -> None:
    """What would write it (the lock every writer takes, a transaction, a new store) is refused, one line saying
    why; the analysis is never derived through it."""
    from forensics import analyse
    from forensics.errors import StoreError
    from forensics.readonly import ReadOnlyStore

    ro = ReadOnlyStore(store)
    for write in (ro.transaction, lambda: ro.lock().__enter__(), lambda: analyse.analyse(ro, force=True)):
        with pytest.raises(StoreError) as err:
            write()
        assert err.value.one_line().endswith("(this store was opened read-only (forensics mcp): run `forensics "
                                             "ingest` or `forensics check` from a shell to change it)")
    with pytest.raises(StoreError, match=r"^no store at "):
        ReadOnlyStore(store.parent / "new")
    assert not (store.parent / "new").exists()

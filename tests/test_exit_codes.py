"""Exit codes as a contract: 0 ok, 1 findings under a gate, 2 usage or input error, 3 internal error.

Every command, given bad input, answers in one line on stderr with code 2, never with a traceback; an
unexpected error is one line asking for a bug report with code 3 (``--debug`` adds the traceback).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forensics import overview
from forensics.cli import cli, main
from forensics.errors import ExitCode
from forensics.ingest import IngestOptions, ingest
from tests.conftest import ROOT

LOG = Path(__file__).resolve().parent.parent / "fixtures" / "logs" / "era5-default-b10587.log"


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("exit")
    ingest(d / "store", [LOG], IngestOptions(run="r1"))
    return d / "store"


def test_sql_that_yields_infinity_prints_it(store: Path) -> None:
    assert run("sql", "--store", str(store), "select 1/0 as x, -1/0 as y", "--format", "csv") == \
        (0, "x,y\ninf,-inf\n", "")
    code, out, _ = run("sql", "--store", str(store), "select 1/0 as x")
    assert code == 0 and out.splitlines()[-1].strip() == "inf"


def test_a_file_given_as_the_store_is_an_input_error(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    code, out, err = run("ingest", str(LOG), "--store", str(f))
    assert (code, out) == (2, "")
    assert err == f"forensics: error: {f} is a file, not a store folder (pass --store DIR with a folder path)\n"


def test_an_empty_folder_ingests_nothing_and_says_so(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run("ingest", str(empty), "--store", str(tmp_path / "s"))
    assert code == 2
    assert err == f"forensics: error: no files to read under {empty} (pass the log files or the folders that " \
                  "hold them)\n"


def test_hidden_files_are_reported_not_skipped_silently(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / ".cache").mkdir(parents=True)
    shutil.copy(LOG, logs / "server.log")
    (logs / ".cache" / "old.log").write_text("x\n")
    code, _, err = run("ingest", str(logs), "--store", str(tmp_path / "s"))
    assert code == 0
    assert f"warning: skipped 1 hidden file (e.g. {logs / '.cache' / 'old.log'}); name a file to read it" in err


def test_an_unexpected_error_is_one_line_and_exit_3(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object, **__: object) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(overview, "summary", broken)
    code, out, err = run("summary", "--store", str(store))
    assert (code, out) == (3, "")
    assert err == ("forensics: error: internal error: ZeroDivisionError: division by zero (this is a bug in "
                   "forensics: please report it with the command you ran; --debug shows the traceback)\n")
    code, _, err = run("--debug", "summary", "--store", str(store))
    assert code == 3
    assert err.startswith("Traceback (most recent call last):") and "ZeroDivisionError" in err


COMMANDS = [["summary"], ["sql"], ["runs"], ["missing"], ["deadslots"], ["runaways"], ["cap"], ["errors"], ["incidents"],
            ["throughput"], ["smoke"], ["chart"], ["report"], ["check"], ["ingest"], ["generate"], ["verdict"],
            ["compare"], ["compact"], ["watch"], ["demo"], ["whatif"], ["recommend"], ["export", "otel"],
            ["mapping", "init"], ["mcp"]]


def test_the_commands_tried_are_every_command() -> None:
    assert sorted(c[0] for c in COMMANDS) == sorted(cli.commands)


# What each command needs besides --store to reach the store (a file given as the store folder).
TO_THE_STORE: dict[str, list[str]] = {
    "sql": ["select 1"], "chart": ["throughput", "-o", "c.html"], "compare": ["a", "b"], "whatif": ["r1"],
    "ingest": [str(LOG)], "watch": [str(LOG), "--once"], "export": ["otel", "-o", "t.json"],
}
# The commands that have no store, and one bad input of each.
NO_STORE: dict[str, tuple[list[str], str]] = {
    "generate": (["--seed", "x", "out"], "Invalid value for '--seed': 'x' is not a valid integer. "
                                         "(see `forensics generate --help`)"),
    "demo": (["--out", str(LOG)], f"{LOG} is a file (pass --out with a folder path)"),
    "mapping": ([], "forensics mapping needs a command: init (see `forensics mapping --help`)"),
}


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_command_answers_bad_input_with_exit_2_and_exactly_one_line(command: str, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # what a command might write lands here
    if command in NO_STORE:
        args, line = NO_STORE[command]
        assert run(command, *args) == (2, "", f"forensics: error: {line}\n")
    else:
        assert run(command, *TO_THE_STORE.get(command, []), "--store", str(LOG)) == (
            2, "", f"forensics: error: {LOG} is a file, not a store folder (pass --store DIR with a folder path)\n")
    assert list(tmp_path.iterdir()) == []
WORDS = ["r1", "nope", "--format", "json", "csv", "table", "xml", "--by", "np", "-o", "--fail-on", "any",
         "--max-run", "20m", "--max-request", "-5", "abc", "--margin", "-1", "timeline", "select", "1/0",
         "--quantile", "2", "--run", "", "--keep-going", "--mapping", "vllm-bench", "--tz", "Mars/Base",
         "--started-at", "yesterday", "0", "--explain", "'", "\x00", "--seed", "x"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cmd=st.sampled_from(COMMANDS), words=st.lists(st.sampled_from(WORDS), max_size=5),
       where=st.sampled_from(["store", "missing", "file", "empty"]))
def test_no_command_answers_bad_input_with_a_traceback(store: Path, tmp_path: Path, cmd: list[str],
                                                       words: list[str], where: str) -> None:
    places = {"store": store, "missing": tmp_path / "no-such-store", "file": LOG, "empty": tmp_path}
    args = [*cmd, *words, "--store", str(places[where])]
    if cmd == ["ingest"]:
        args = ["ingest", *words, str(tmp_path / "nothing-here"), "--store", str(tmp_path / "s")]
    if cmd == ["generate"]:
        args = ["generate", *words, str(tmp_path / "gen")]
    if cmd == ["watch"]:  # never follow for long: one pass over what is there
        args = ["watch", *words, str(tmp_path / "nothing-here"), "--once", "--store", str(tmp_path / "w")]
    if cmd == ["demo"]:
        args = ["demo", *words, "--out", str(LOG)]  # a file, not a folder: refused before any work
    code, _, err = run(*args)
    assert code in (0, 1, 2), (args, code, err)
    assert "Traceback" not in err and "internal error" not in err, (args, err)
    if code == 2:
        assert_one_line(err, args)


def assert_one_line(err: str, args: object) -> None:
    """An input error, a usage error included (an unknown option, a missing argument, a bad choice), is
    exactly one line on stderr: ``forensics: error: ...``."""
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("forensics: error: ") and len(lines[0]) > 20, (args, err)


def test_a_usage_error_is_one_line() -> None:
    code, out, err = run("chart")
    assert (code, out) == (2, "")
    assert err == ("forensics: error: Missing argument '{throughput|latency|timeline|tokens|busy}'. Choose from: "
                   "throughput, latency, timeline, tokens, busy (see `forensics chart --help`)\n")
    code, _, err = run("--bogus")
    assert code == 2 and err == "forensics: error: No such option '--bogus'. (see `forensics --help`)\n"


def test_the_store_may_come_before_the_command(store: Path, tmp_path: Path) -> None:
    """``forensics --store S COMMAND``, as the README says every command takes it; the command's own wins."""
    s = tmp_path / "s"
    code, _, err = run("--store", str(s), "ingest", str(LOG), "--run", "r2")
    assert code == 0, err
    assert run("--store", str(s), "runs", "--format", "csv")[0] in (0, 2)
    code, out, _ = run("--store", str(s), "sql", "select distinct run from requests")
    assert code == 0 and "r2" in out
    code, out, _ = run("--store", str(tmp_path / "other"), "sql", "--store", str(s), "select distinct run from requests")
    assert code == 0 and "r2" in out  # the command's own --store wins


def test_runs_takes_run_names(tmp_path: Path) -> None:
    from fixtures.findings.scenarios import build

    st = build(tmp_path / "s")
    code, out, err = run("runs", "overflow", "--store", str(st.root), "--format", "csv")
    assert code == 0, err
    assert [line.split(",")[0] for line in out.splitlines()] == ["run", "overflow"]
    code, out, err = run("runs", "nope", "--store", str(st.root))
    assert (code, out) == (2, "")
    assert_one_line(err, "runs nope")
    assert err.startswith("forensics: error: no run 'nope' in the store")


def test_report_onto_a_folder_or_an_unwritable_path_is_an_input_error(store: Path, tmp_path: Path) -> None:
    """Exit 2 with one line, and nothing written outside the target's own folder (not even a temporary file)."""
    top = tmp_path / "top"
    top.mkdir()
    code, out, err = run("report", "r1", "--store", str(store), "-o", str(top))
    assert (code, out) == (2, "")
    assert err == f"forensics: error: {top} is a folder, not a file to write the report to (name a file, e.g. " \
                  f"{top / 'report.html'})\n"
    assert list(top.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["top"]
    code, out, err = run("report", "r1", "--store", str(store), "-o", "/")
    assert (code, out) == (2, "") and err.startswith("forensics: error: / is a folder")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        code, out, err = run("report", "r1", "--store", str(store), "-o", str(locked / "r.html"))
    finally:
        locked.chmod(0o700)
    if os.geteuid() != 0:  # root writes anywhere: the folder is not unwritable for it
        assert (code, out) == (2, "")
        assert_one_line(err, "report -o locked")
        assert err.startswith(f"forensics: error: cannot write the report to {locked / 'r.html'}: ")
    assert [p.name for p in locked.iterdir()] in ([], ["r.html"])
    code, out, err = run("report", "r1", "--store", str(store), "-o", "/proc/forensics-test/r.html")
    assert (code, out) == (2, "")
    assert_one_line(err, "report -o /proc/...")
    assert err.startswith("forensics: error: cannot write the report to /proc/forensics-test/r.html: ")


@click.command("boom")
@click.argument("what")
def _boom(what: str) -> None:
    """A command that fails as click lets a command fail: a ClickException (click's own exit code: 1) or an
    interrupt (Ctrl-C, which click turns into Abort)."""
    if what == "file":
        raise click.FileError("x.csv", hint="it is locked")
    raise KeyboardInterrupt


@pytest.mark.parametrize(("what", "code", "line"), [
    ("file", 2, "forensics: error: Could not open file 'x.csv': it is locked"),
    ("interrupt", 130, "forensics: interrupted (the store stays consistent: the next writer finishes or discards "
                       "a commit that was cut off)"),
])
def test_one_error_path_for_the_runner_and_the_console_entry(what: str, code: int, line: str,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """CliRunner and ``forensics.cli.main`` (the installed command) give a command's failure the same code and
    line: a ClickException is an input error (2, never click's 1, which would read as findings), Ctrl-C is 130."""
    monkeypatch.setitem(cli.commands, "boom", _boom)
    res = CliRunner().invoke(cli, ["boom", what])
    assert (res.exit_code, res.stdout, res.stderr.strip()) == (code, "", line)
    with pytest.raises(SystemExit) as exited:
        main(["boom", what])
    assert (exited.value.code, capsys.readouterr().err.strip()) == (code, line)


def test_every_exit_code_is_an_exit_code_and_documented() -> None:
    """The codes the command can exit with are the members of ExitCode, each in the README and in --help."""
    assert {int(c) for c in ExitCode} == {0, 1, 2, 3, 130}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    documented = readme[readme.index("**Exit codes:**"):readme.index("## Guarantees")]
    shown = " ".join(CliRunner().invoke(cli, ["--help"]).stdout.split())
    for c in ExitCode:
        assert f"`{int(c)}`" in documented, c
        assert f" {int(c)} " in shown.partition("Exit codes:")[2], c

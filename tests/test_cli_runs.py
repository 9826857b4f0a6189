"""The CLI behaves the same in every command: RUN arguments, --fail-on gates, and ingest's quiet output
with one summary line (per-file lines under -v) and one progress report for the whole job."""

from __future__ import annotations

import io
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.commands.core import _Progress
from forensics.ingest import Progress, ingest

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "server-runs"
SINGLE_LOGS = ("real-2026", "real-b4747")  # one log and its README each; the run folders beside them have own tests


def copy_single_logs(dst: Path) -> None:
    for name in SINGLE_LOGS:
        shutil.copytree(LOGS / name, dst / name)


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(scope="module")
def demo_store(demo: tuple[Path, Any]) -> str:
    return str(demo[0] / "store")


@pytest.mark.parametrize(("args", "code"), [
    (["runaways", "run-np1"], 0), (["runaways", "run-np1", "run-np4"], 1), (["runaways"], 1),
    (["deadslots", "run-np4"], 0), (["deadslots", "run-np4", "run-np6"], 1),
    (["cap", "run-np1"], 0), (["cap", "run-np6"], 1),
    (["errors", "run-np1"], 0), (["errors", "run-np4"], 1),  # warnings only, then a send error
    (["missing", "run-np1"], 0), (["missing", "run-np6"], 1),
    (["verdict", "run-np1"], 0), (["verdict", "run-np8"], 1),
])
def test_fail_on_any_gates_every_finding_command(demo_store: str, args: list[str], code: int) -> None:
    res = invoke(*args, "--fail-on", "any", "--store", demo_store)
    assert res.exit_code == code, res.output
    assert invoke(*args, "--store", demo_store).exit_code == 0  # no gate asked: findings are not a failure


def test_run_arguments_behave_the_same(demo_store: str) -> None:
    both = invoke("runaways", "run-np4", "run-np6", "--store", demo_store, "--format", "csv")
    assert {line.split(",")[0] for line in both.stdout.splitlines()[1:]} == {"run-np4", "run-np6"}
    for command in ("runaways", "deadslots", "cap", "errors", "verdict", "throughput", "smoke", "compare"):
        args = [command, "nope", "run-np1"] if command == "compare" else [command, "nope"]
        res = invoke(*args, "--store", demo_store)
        assert res.exit_code == 2, command
        assert res.stderr.startswith("forensics: error: no run 'nope' in the store (runs: run-np1, run-np2, "), command
    for command in ("missing", "report"):
        res = invoke(command, "--store", demo_store)
        assert (res.exit_code, res.stderr) == (2, "forensics: error: name a run: the store has 8 runs (runs: run-np1, "
                                                  "run-np2, run-np3, run-np4, run-np5, run-np6, run-np7, run-np8)\n")


def test_ingest_says_one_line_unless_asked(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    copy_single_logs(logs)
    res = invoke("ingest", str(logs), "--store", str(tmp_path / "s"))
    assert res.exit_code == 0, res.output
    lines = res.stderr.splitlines()  # each run's folder holds its README.md: passed over, not an error
    assert len(lines) == 1 and lines[0].startswith("total: files=4 (2 ingested, 2 skipped) lines=1017 ")
    again = invoke("ingest", str(logs), "--store", str(tmp_path / "s"), "-v")
    assert [ln.split()[0] for ln in again.stderr.splitlines()] == ["skipped", "unchanged", "skipped", "unchanged",
                                                                   "total:"]
    assert again.stderr.splitlines()[0] == (f"skipped   {logs / 'real-2026' / 'README.md'}  not a log  a .md file "
                                            "that is not a log: not read")
    assert again.stderr.splitlines()[-1].startswith("total: files=4 (2 skipped, 2 unchanged) lines=0")
    named = invoke("ingest", str(logs / "real-2026" / "README.md"), "--store", str(tmp_path / "s"))
    assert named.exit_code == 2  # named on the command line, it is an error: the user asked for it


def test_progress_reports_the_whole_job(tmp_path: Path) -> None:
    seen: list[Progress] = []
    res = ingest(tmp_path / "s", [LOGS / name for name in SINGLE_LOGS], progress=seen.append)
    files = len(res.files)
    assert seen[0].files_done == 0 and {p.files_total for p in seen} == {files}
    assert seen[-1].files_done == files and seen[-1].bytes_done == seen[-1].bytes_total > 0
    assert seen[-1].requests == res.totals["requests"] > 0
    done = [p.bytes_done for p in seen]
    assert done == sorted(done)  # never goes back


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_shows_on_a_terminal_only_and_after_a_second() -> None:
    """click's bar: bytes, percent, files and requests on one line of stderr, rewritten in place; nothing off a
    terminal or for an ingest that ends within the first second."""
    at = [Progress(files_done=n, files_total=2, bytes_done=n * 2**20, bytes_total=2 * 2**20, requests=n * 600)
          for n in (0, 1, 2)]
    term = _Terminal()
    bar = _Progress(time.monotonic() - 5, file=term)
    for p in at:
        bar.update(p)
    bar.close()
    lines = [line.strip() for line in term.getvalue().replace("\x1b[?25l", "").replace("\x1b[?25h", "").split("\r")]
    assert [line for line in lines if line] == [
        "ingest  [------------------------------------]    0%  0.0/2.0 MiB  files 0/2  requests 0",
        "ingest  [##################------------------]   50%  1.0/2.0 MiB  files 1/2  requests 600",
        "ingest  [####################################]  100%  2.0/2.0 MiB  files 2/2  requests 1,200"]
    for quiet in (_Progress(time.monotonic() - 5, file=io.StringIO()), _Progress(time.monotonic(), file=term)):
        before = term.getvalue()
        for p in at:
            quiet.update(p)
        quiet.close()
        assert quiet.bar is None and term.getvalue() == before

"""`forensics watch` end to end: a real process follows a real file while the test writes to it (growth, a
runaway seen while it runs, a dead slot, rotation by rename, a compressed rotated file, a crash and a restart in
the log, truncation), and a command records every alert it receives: each expected finding exactly once, in
order, with the JSON on stdin and the same facts in the environment.  Then Ctrl-C, and a restarted watch raises
nothing again."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests import watch_log as L
from tests.conftest import ROOT

RECORDER = """
import json, os, sys
alert = json.load(sys.stdin)
env = {k: v for k, v in os.environ.items() if k.startswith("FORENSICS_")}
with open(sys.argv[1], "a", encoding="utf-8") as fh:
    fh.write(json.dumps({"alert": alert, "env": env}) + "\\n")
"""


class Watch:
    """A `forensics watch` process whose --on-any command records what it receives."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.tmp = tmp
        self.record = tmp / "received.jsonl"
        recorder = tmp / "recorder.py"
        recorder.write_text(RECORDER, encoding="utf-8")
        self.cmd = [sys.executable, "-m", "forensics", "watch", *args, "--store", str(tmp / "store"),
                    "--on-any", f"{sys.executable} {recorder} {self.record}"]
        self.out = (tmp / "stdout.txt").open("w")
        self.err = (tmp / "stderr.txt").open("w")
        self.proc = subprocess.Popen(self.cmd, cwd=tmp, stdout=self.out, stderr=self.err,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})

    def received(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text(encoding="utf-8").splitlines()]

    def wait_for(self, n: int, timeout: float = 40.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.received()
            if len(got) >= n:
                return got
            assert self.proc.poll() is None, (self.tmp / "stderr.txt").read_text()
            time.sleep(0.1)
        raise AssertionError(f"{len(self.received())} alerts after {timeout} s, wanted {n}:\n"
                             + (self.tmp / "stderr.txt").read_text())

    def wait_note(self, text: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in (self.tmp / "stderr.txt").read_text():
                return
            time.sleep(0.1)
        raise AssertionError(f"no {text!r} on stderr:\n" + (self.tmp / "stderr.txt").read_text())

    def wait_cycles(self, n: int, timeout: float = 40.0) -> None:
        """Until watch has ended ``n`` more cycles: each one ends by renaming a new files.json over the last
        (another inode than the one before it; the file system may hand an inode out again later)."""
        state = self.tmp / "store" / "watch" / "files.json"
        last, ended = state.stat().st_ino, 0
        deadline = time.monotonic() + timeout
        while ended < n:
            assert time.monotonic() < deadline, f"watch ended {ended} of {n} cycles in {timeout} s"
            assert self.proc.poll() is None, (self.tmp / "stderr.txt").read_text()
            time.sleep(0.02)
            inode = state.stat().st_ino  # os.replace: the name never goes missing
            ended, last = ended + (inode != last), inode

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        rc = self.proc.wait(timeout=60)
        self.out.close()
        self.err.close()
        return rc


def append(path: Path, lines: list[str]) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write("".join(lines))


def brief(rec: dict[str, Any]) -> tuple[Any, ...]:
    a = rec["alert"]
    return a["kind"], a["status"], a["instance"], a["slot"], a["task"]


@pytest.mark.timeout(300)
def test_every_finding_once_in_order_through_growth_rotation_crash_restart_and_truncation(tmp_path: Path) -> None:
    logs = tmp_path / "logs" / "live"
    logs.mkdir(parents=True)
    log = logs / "server.log"
    log.write_text("".join(L.banner() + L.normal_requests()), encoding="utf-8")  # history: 48 normal requests
    w = Watch(tmp_path, "logs", "--poll", "0.3s", "--cpu-budget", "1")
    try:
        w.wait_note("watch: following 1 file(s) of run(s) live")  # it has read the history: nothing to raise there
        assert w.received() == []

        # growth: a runaway, suspected while it runs (its progress lines), confirmed when it ends
        append(log, L.start(0, 5000, 40.0) + L.progress(0, 5000, 44.0, 300))
        w.wait_for(1)
        append(log, L.progress(0, 5000, 49.0, 600) + L.end(0, 5000, 85.0, 200, 3000))
        w.wait_for(2)
        # a dead slot: slot 1 runs away, then its next request starts going the same way, then ends so
        append(log, L.request(1, 5002, 86.0, 200, 2500))
        w.wait_for(3)
        append(log, L.start(1, 5004, 125.0) + L.progress(1, 5004, 131.0, 400))
        w.wait_for(5)
        append(log, L.end(1, 5004, 165.0, 200, 2600))
        w.wait_for(7)

        # rotation by rename: the server keeps writing to the renamed file; then it is compressed
        rotated = logs / "server.log.1"
        log.rename(rotated)
        append(rotated, L.request(0, 5006, 166.0, 150, 60))
        w.wait_note("server.log.1: is ")
        with rotated.open("rb") as src, gzip.open(logs / "server.log.1.gz", "wb") as dst:
            dst.write(src.read())
        rotated.unlink()
        w.wait_note("server.log.1.gz: is a copy of")

        # the server restarts into a new server.log, crashes, restarts again (appending), and a runaway follows
        append(log, L.banner() + L.request(0, 0, 1.0, 200, 60) + L.crash(3.0))
        w.wait_for(8)
        append(log, L.banner() + L.normal_requests()[:40])
        append(log, L.request(0, 7, 40.0, 200, 3000))
        w.wait_for(9)

        # truncation: the same slot and task as the first runaway, but new content: raised again
        log.write_text("".join(L.banner() + L.normal_requests() + L.request(0, 5000, 40.0, 200, 3000)),
                       encoding="utf-8")
        w.wait_for(10)
        w.wait_cycles(2)  # a whole cycle after the one that raised the last alert: nothing more may come
    finally:
        rc = w.stop()
    got = w.received()
    assert [brief(r) for r in got] == [
        ("runaway", "suspected", "server", 0, 5000),
        ("runaway", "confirmed", "server", 0, 5000),
        ("runaway", "confirmed", "server", 1, 5002),
        ("runaway", "suspected", "server", 1, 5004),
        ("dead_slot", "suspected", "server", 1, 5004),
        ("runaway", "confirmed", "server", 1, 5004),
        ("dead_slot", "confirmed", "server", 1, 5002),  # where the finding says slot 1 went bad
        ("crash", "confirmed", "server", None, None),
        ("runaway", "confirmed", "server#2", 0, 7),
        ("runaway", "confirmed", "server", 0, 5000),
    ], (tmp_path / "stderr.txt").read_text()
    assert rc == 0
    dead = [r["alert"] for r in got if r["alert"]["kind"] == "dead_slot"]
    assert [(a["first_task"], a["second_task"]) for a in dead] == [(5002, 5004), (5002, 5004)]
    assert len({r["alert"]["id"] for r in got}) == len(got)
    # stdout: the same alerts, one JSON line each
    printed = [json.loads(line) for line in (tmp_path / "stdout.txt").read_text().splitlines()]
    assert printed == [r["alert"] for r in got]
    # the environment says what the JSON says
    for r in got:
        a, env = r["alert"], r["env"]
        assert env["FORENSICS_KIND"] == a["kind"] and env["FORENSICS_STATUS"] == a["status"]
        assert env["FORENSICS_RUN"] == "live" and env["FORENSICS_INSTANCE"] == a["instance"]
        assert env["FORENSICS_PORT"] == "18102" and env["FORENSICS_EVIDENCE"] == a["evidence"]
        assert env["FORENSICS_SLOT"] == ("" if a["slot"] is None else str(a["slot"]))
        assert env["FORENSICS_EVIDENCE_LINES"] == "\n".join(a["evidence_lines"])
    first = got[0]["alert"]
    assert first["so_far"]["tokens_so_far"] >= 300 and "still running" in first["detail"]
    # a confirmed incident names the precursors seen so far (forensics.incidents); the first is alone: too few
    assert got[1]["alert"]["precursors"] == ("1 runaway: too few to tell what sets their onsets apart (at least 3 "
                                             "are needed).")
    assert all(("precursors" in r["alert"]) == (r["alert"]["status"] == "confirmed") for r in got)
    assert first["evidence_lines"][0].endswith("| task 5000 | processing task, is_child = 0")
    crash = got[7]["alert"]
    assert crash["evidence_lines"] == [L.CRASH] and crash["in_flight"] == "slot 0 task 900"
    assert "fatal error" in crash["detail"]
    assert "stopped: 10 alert(s) raised, 10 delivered, 0 failed, 0 pending" in (tmp_path / "stderr.txt").read_text()

    # the store is consistent and holds each request once: the rotated file's rows moved with it
    check = subprocess.run([sys.executable, "-m", "forensics", "check", "--store", str(tmp_path / "store")],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert check.returncode == 0, check.stdout + check.stderr
    dup = subprocess.run([sys.executable, "-m", "forensics", "sql", "--store", str(tmp_path / "store"), "--format",
                          "csv", "select path, count(*) n from requests group by path order by path"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert dup.stdout.splitlines() == ["path,n", "logs/live/server.log,49", "logs/live/server.log.1.gz,52"]

    # a restarted watch raises nothing again
    again = subprocess.run([*w.cmd, "--once"], cwd=tmp_path, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout == ""
    assert len(w.received()) == 10

"""`forensics watch` as a user runs it: one watch per store, bad options in one line, the findings already in the
logs the first time (backlog), Ctrl-C and SIGTERM, and an alert interrupted mid-delivery delivered by the next
watch: never twice, never lost."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from forensics.watch.follow import Follower, stream_label
from tests import watch_log as L
from tests.conftest import ROOT

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def forensics(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forensics", *args], cwd=cwd, capture_output=True, text=True,
                          env=ENV, timeout=timeout)


def wait_until(cond: Callable[[], bool], timeout: float) -> None:
    """Wait for ``cond`` (polled), failing after ``timeout`` seconds: a condition, never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _has_requests(store: Path) -> bool:
    try:
        return bool(json.loads((store / "_manifest.json").read_text())["parts"].get("requests"))
    except (OSError, ValueError, KeyError):
        return False


class StderrLines:
    """A process's stderr read line by line as it comes, so a test can wait for a line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.lines.append(line)

    def text(self, timeout: float) -> str:
        self._thread.join(timeout)
        return "".join(self.lines)


def history_with_runaway(tmp: Path) -> Path:
    log = tmp / "logs" / "live" / "server.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(L.banner() + L.normal_requests() + L.request(0, 5000, 40.0, 200, 3000)), encoding="utf-8")
    return log


def test_findings_already_there_are_recorded_not_raised_unless_backlog(tmp_path: Path) -> None:
    history_with_runaway(tmp_path)
    first = forensics("watch", "logs", "--once", "--store", "st", "--on-any", "cat >> got.jsonl", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout == "" and not (tmp_path / "got.jsonl").exists()
    assert "watch: 1 finding(s) were already in the logs when watch first read them: recorded in the store, " \
           "not raised (--backlog raises them)" in first.stderr
    journal = [json.loads(x) for x in (tmp_path / "st" / "watch" / "alerts.jsonl").read_text().splitlines()]
    assert [(r["e"], r["alert"]["kind"], r["alert"]["task"]) for r in journal] == [("backlog", "runaway", 5000)]

    raised = forensics("watch", "logs", "--once", "--backlog", "--store", "st2", "--on-any", "cat >> got.jsonl",
                       cwd=tmp_path)
    assert raised.returncode == 0, raised.stderr
    alert = json.loads(raised.stdout)
    assert (alert["kind"], alert["status"], alert["task"]) == ("runaway", "confirmed", 5000)
    assert (tmp_path / "got.jsonl").exists(), raised.stderr
    assert json.loads((tmp_path / "got.jsonl").read_text()) == alert


def test_one_watch_per_store_and_bad_options_in_one_line(tmp_path: Path) -> None:
    history_with_runaway(tmp_path)
    first = subprocess.Popen([sys.executable, "-m", "forensics", "watch", "logs", "--store", "st"], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        wait_until((tmp_path / "st" / "watch" / "files.json").exists, 60)  # the first watch holds the store
        second = forensics("watch", "logs", "--once", "--store", "st", cwd=tmp_path)
        assert second.returncode == 2
        assert second.stderr.splitlines() == [
            "forensics: error: another `forensics watch` is following into st (stop it first, or give this one its "
            "own --store)"]
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert err.splitlines()[-1] == "watch: stopped: 0 alert(s) raised, 0 delivered, 0 failed, 0 pending for the next watch"

    bad = forensics("watch", "logs", "--poll", "soon", "--store", "st", cwd=tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and "Traceback" not in bad.stderr
    assert "cannot read duration 'soon'" in bad.stderr
    missing = forensics("watch", "nowhere/at/all.log", "--store", "st", cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.splitlines() == [
        "forensics: error: nowhere/at/all.log: neither it nor its folder exists (pass log files or the folders "
        "that hold them)"]


def test_a_nul_in_a_path_is_bad_input_not_a_bug(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from forensics.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["watch", "logs\x00", "--once", "--store", str(tmp_path / "st")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "forensics: error: 'logs\\x00': a path cannot hold a NUL byte (pass log files or their folders)"]


def test_an_alert_cut_off_mid_delivery_is_delivered_by_the_next_watch_once(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "live" / "server.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(L.banner() + L.normal_requests()), encoding="utf-8")
    hang = f"echo $$ > {tmp_path / 'hook.pid'}; exec sleep 120"
    proc = subprocess.Popen([sys.executable, "-m", "forensics", "watch", "logs", "--store", "st", "--poll", "0.3s",
                             "--cpu-budget", "1", "--timeout", "300s", "--on-runaway", hang], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    lines = StderrLines(proc)
    try:
        # the first pass has read the normal requests (their rows are in the store) before the runaway comes
        wait_until(lambda: _has_requests(tmp_path / "st"), 60)
        with log.open("a") as fh:
            fh.write("".join(L.request(0, 5000, 40.0, 200, 3000)))
        wait_until(lambda: (tmp_path / "hook.pid").exists(), 60)
        proc.send_signal(signal.SIGINT)  # stops after the delivery under way ...
        wait_until(lambda: any("stopping after" in ln for ln in lines.lines), 60)
        proc.send_signal(signal.SIGINT)  # ... unless asked twice: then at once
        proc.wait(timeout=60)
        os.kill(int((tmp_path / "hook.pid").read_text()), signal.SIGKILL)  # it holds our stderr open
        out = proc.stdout.read() if proc.stdout else ""
        err = lines.text(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        if (tmp_path / "hook.pid").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((tmp_path / "hook.pid").read_text()), signal.SIGKILL)
    assert proc.returncode == 130, err
    assert json.loads(out)["task"] == 5000
    assert forensics("check", "--store", "st", cwd=tmp_path).returncode == 0

    again = forensics("watch", "logs", "--once", "--store", "st", "--on-runaway", "cat >> got.jsonl", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "watch: delivering 1 alert(s) a previous watch had not delivered yet" in again.stderr
    assert again.stdout == ""  # raised before, not again
    assert json.loads((tmp_path / "got.jsonl").read_text()) == json.loads(out)
    third = forensics("watch", "logs", "--once", "--store", "st", "--on-runaway", "cat >> got.jsonl", cwd=tmp_path)
    assert third.returncode == 0 and "delivering" not in third.stderr
    assert len((tmp_path / "got.jsonl").read_text().splitlines()) == 1


def test_a_log_keeps_its_lineage_through_rename_and_compression_but_not_truncation(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "server.log"
    log.write_text("".join(L.banner() + L.normal_requests()), encoding="utf-8")
    state: dict[str, object] = {}
    f = Follower([logs], tmp_path / "store", state)
    f.scan(1.0)
    lineage = f.epoch_of(str(log))
    log.rename(logs / "server.log.1")
    ch = f.scan(2.0)
    assert f.epoch_of(str(logs / "server.log.1")) == lineage and ch.moved == [str(log)]
    with (logs / "server.log.1").open("rb") as src, gzip.open(logs / "server.log.1.gz", "wb") as dst:
        dst.write(src.read())
    (logs / "server.log.1").unlink()
    ch = f.scan(3.0)
    assert f.epoch_of(str(logs / "server.log.1.gz")) == lineage and ch.moved == [str(logs / "server.log.1")]
    log.write_text("".join(L.banner() + L.normal_requests()[:20]), encoding="utf-8")  # same banner, new start
    f.scan(4.0)
    new = f.epoch_of(str(log))
    assert new != lineage
    log.write_text("".join(L.banner()), encoding="utf-8")  # truncated
    ch = f.scan(5.0)
    assert f.epoch_of(str(log)) not in (lineage, new) and ch.notes == [f"{log}: truncated, read anew"]


def test_rotated_names_are_one_log() -> None:
    names = ["server.log", "server.log.1", "server.log.2.gz", "server.log-20261201", "server.log-20261201.zst",
             "server-2026-12-01.log"]
    assert {stream_label(n) for n in names} == {"server"}
    assert stream_label("server-2.log") == "server-2" and stream_label("backup.log.3") == "backup"

"""Delivering alerts: a command gets the JSON on stdin and FORENSICS_* variables; a failing or hanging command is
retried with a doubling backoff and stopped at its timeout (its children too); a webhook gets the same JSON; one
stuck hook never holds up another; every outcome is reported."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from forensics.watch.deliver import Dispatcher, Hook, Outcome, RetryPolicy, alert_env

ALERT: dict[str, Any] = {
    "id": "0123456789abcdef", "kind": "runaway", "status": "confirmed", "run": "live", "instance": "server#2",
    "path": "logs/live/server.log", "host": "127.0.0.1", "port": 18102, "slot": 1, "task": 5004, "seq": 9,
    "item": "TSLA", "stage": "extract", "why": "tokens,context", "detail": "runaway: slot 1 task 5004 ...",
    "evidence": "logs/live/server.log:120-127", "evidence_lines": ["line one", "line two"],
}


class Collect:
    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []
        self.notes: list[str] = []
        self.done = threading.Event()

    def outcome(self, o: Outcome) -> None:
        self.outcomes.append(o)
        self.done.set()


def run_one(hook: Hook, policy: RetryPolicy, timeout: float = 30.0) -> tuple[Collect, float]:
    c = Collect()
    d = Dispatcher([hook], policy, c.outcome, c.notes.append)
    t0 = time.monotonic()
    d.submit(ALERT)
    assert c.done.wait(timeout)
    took = time.monotonic() - t0
    d.close(5)
    return c, took


def test_command_gets_the_alert_on_stdin_and_in_its_environment(tmp_path: Path) -> None:
    out = tmp_path / "got.json"
    script = (f"{sys.executable} -c \"import json,os,sys; d=json.load(sys.stdin); "
              f"d['env']={{k: v for k, v in os.environ.items() if k.startswith('FORENSICS_')}}; "
              f"open(r'{out}', 'w').write(json.dumps(d))\"")
    c, _ = run_one(Hook("on-any", command=script), RetryPolicy(attempts=1, timeout_s=30))
    assert c.outcomes == [Outcome(ALERT["id"], "on-any", True, 1, "")]
    got = json.loads(out.read_text())
    env = got.pop("env")
    assert got == ALERT
    env = {k: v for k, v in env.items() if k not in os.environ}  # not what this process passes on itself
    assert env == {
        "FORENSICS_ALERT_ID": "0123456789abcdef", "FORENSICS_KIND": "runaway", "FORENSICS_STATUS": "confirmed",
        "FORENSICS_RUN": "live", "FORENSICS_INSTANCE": "server#2", "FORENSICS_LOG": "logs/live/server.log",
        "FORENSICS_HOST": "127.0.0.1", "FORENSICS_PORT": "18102", "FORENSICS_SLOT": "1", "FORENSICS_TASK": "5004",
        "FORENSICS_ITEM": "TSLA", "FORENSICS_STAGE": "extract", "FORENSICS_WHY": "tokens,context",
        "FORENSICS_DETAIL": "runaway: slot 1 task 5004 ...", "FORENSICS_EVIDENCE": "logs/live/server.log:120-127",
        "FORENSICS_EVIDENCE_LINES": "line one\nline two"}
    assert alert_env({"id": "x", "slot": None})["FORENSICS_SLOT"] == ""


def test_a_failing_command_is_retried_with_a_doubling_backoff_then_reported(tmp_path: Path) -> None:
    tries = tmp_path / "tries"
    c, took = run_one(Hook("on-runaway", frozenset({"runaway"}), command=f"echo x >> {tries}; exit 3"),
                      RetryPolicy(attempts=3, timeout_s=10, backoff_s=0.2))
    assert c.outcomes == [Outcome(ALERT["id"], "on-runaway", False, 3, "exit 3")]
    assert tries.read_text() == "x\nx\nx\n"
    assert took >= 0.6  # waited 0.2 s, then 0.4 s
    assert c.notes == [
        "on-runaway: alert 0123456789abcdef (runaway confirmed): attempt 1/3 failed: exit 3; retrying in 0.2 s",
        "on-runaway: alert 0123456789abcdef (runaway confirmed): attempt 2/3 failed: exit 3; retrying in 0.4 s",
        "on-runaway: alert 0123456789abcdef (runaway confirmed): attempt 3/3 failed: exit 3",
    ]


def test_a_hanging_command_is_stopped_at_its_timeout_with_its_children(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    c, took = run_one(Hook("on-any", command=f"sleep 60 & echo $! >> {pids}; echo $$ >> {pids}; wait"),
                      RetryPolicy(attempts=2, timeout_s=0.5, backoff_s=0.1))
    assert c.outcomes == [Outcome(ALERT["id"], "on-any", False, 2, "timed out after 0.5 s")]
    assert took < 10
    deadline = time.monotonic() + 30  # killed: gone once the kernel has reaped them
    while any(alive(pid) for pid in map(int, pids.read_text().split())) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in map(int, pids.read_text().split()):
        assert not alive(pid), pid


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


def test_a_kind_goes_only_to_its_hooks() -> None:
    d = Dispatcher([Hook("on-crash", frozenset({"crash"}), command="true"), Hook("on-any", None, command="true")],
                   RetryPolicy(), lambda o: None, lambda t: None)
    try:
        assert d.hooks_for("runaway") == ["on-any"]
        assert d.hooks_for("crash") == ["on-crash", "on-any"]
    finally:
        d.close(5)


def test_a_stuck_hook_does_not_hold_up_another(tmp_path: Path) -> None:
    """on-any waits until the test lets it go; on-runaway is delivered meanwhile (no clock involved: on-any
    cannot end before the test releases it, whatever the machine's load)."""
    c = Collect()
    release = tmp_path / "release"
    stuck = f"while [ ! -e {release} ]; do sleep 0.05; done"
    d = Dispatcher([Hook("on-any", command=stuck), Hook("on-runaway", frozenset({"runaway"}), command="true")],
                   RetryPolicy(attempts=1, timeout_s=120), c.outcome, c.notes.append)
    d.submit(ALERT)
    assert c.done.wait(60)
    assert [(o.hook, o.ok) for o in c.outcomes] == [("on-runaway", True)]  # while on-any is still stuck
    release.touch()
    d.close(60)
    assert [(o.hook, o.ok) for o in c.outcomes] == [("on-runaway", True), ("on-any", True)]


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[Any], list[int]]]:
    bodies: list[Any] = []
    statuses = [500, 200]  # the first POST fails, the next succeeds

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            n = int(self.headers["Content-Length"])
            bodies.append((self.headers["Content-Type"], json.loads(self.rfile.read(n))))
            self.send_response(statuses.pop(0) if statuses else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/alerts", bodies, statuses
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_webhook_gets_the_same_json_and_a_500_is_retried(receiver: tuple[str, list[Any], list[int]]) -> None:
    url, bodies, _ = receiver
    c, _ = run_one(Hook("webhook", url=url), RetryPolicy(attempts=3, timeout_s=5, backoff_s=0.1))
    assert c.outcomes == [Outcome(ALERT["id"], "webhook", True, 2, "")]
    assert bodies == [("application/json", ALERT), ("application/json", ALERT)]
    assert c.notes == ["webhook: alert 0123456789abcdef (runaway confirmed): attempt 1/3 failed: HTTP 500; "
                       "retrying in 0.1 s"]


def test_an_unreachable_webhook_is_reported_not_dropped() -> None:
    c, _ = run_one(Hook("webhook", url="http://127.0.0.1:9/alerts"), RetryPolicy(attempts=2, timeout_s=2, backoff_s=0.1))
    assert len(c.outcomes) == 1 and not c.outcomes[0].ok and c.outcomes[0].attempts == 2
    assert "Connection refused" in c.outcomes[0].error or "URLError" in c.outcomes[0].error

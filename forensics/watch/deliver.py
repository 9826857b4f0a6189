"""Hand each alert to the user's hooks: a shell command (the alert as JSON on stdin and as environment
variables) or a webhook (the same JSON POSTed).  Each hook has its own worker thread and queue, so one hook
that hangs never delays another, and a hook sees its alerts in the order they were raised.  A failed or
timed-out attempt is retried with a doubling backoff; every outcome is written to the journal and reported
on stderr, so nothing is dropped silently.

Library only: no click.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KINDS = ("runaway", "dead_slot", "crash")


@dataclass(frozen=True)
class Hook:
    """Where alerts go: ``command`` (run by /bin/sh) or ``url`` (POST), for ``kinds`` (None: every kind)."""

    name: str  # on-runaway, on-dead-slot, on-crash, on-any, webhook
    kinds: frozenset[str] | None = None
    command: str | None = None
    url: str | None = None

    def wants(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3  # tries per alert and hook
    timeout_s: float = 30.0  # a try that runs longer is stopped and counts as failed
    backoff_s: float = 1.0  # wait before the 2nd try; doubled before each further one


@dataclass
class Outcome:
    alert_id: str
    hook: str
    ok: bool
    attempts: int
    error: str = ""


def alert_env(alert: dict[str, Any]) -> dict[str, str]:
    """The alert as FORENSICS_* environment variables (empty when unknown)."""
    def s(key: str) -> str:
        v = alert.get(key)
        return "" if v is None else str(v)

    return {
        "FORENSICS_ALERT_ID": s("id"), "FORENSICS_KIND": s("kind"), "FORENSICS_STATUS": s("status"),
        "FORENSICS_RUN": s("run"), "FORENSICS_INSTANCE": s("instance"), "FORENSICS_LOG": s("path"),
        "FORENSICS_HOST": s("host"), "FORENSICS_PORT": s("port"), "FORENSICS_SLOT": s("slot"),
        "FORENSICS_TASK": s("task"), "FORENSICS_ITEM": s("item"), "FORENSICS_STAGE": s("stage"),
        "FORENSICS_WHY": s("why"), "FORENSICS_DETAIL": s("detail"), "FORENSICS_EVIDENCE": s("evidence"),
        "FORENSICS_EVIDENCE_LINES": "\n".join(alert.get("evidence_lines") or []),
    }


def run_command(command: str, alert: dict[str, Any], timeout_s: float) -> str | None:
    """Run ``command`` once; None when it exited 0, else why it failed.  Its stdout goes to our stderr
    (our stdout carries the alerts); a command that outlives ``timeout_s`` is stopped with its children."""
    payload = json.dumps(alert, ensure_ascii=False).encode("utf-8") + b"\n"
    env = {**os.environ, **alert_env(alert)}
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=2, env=env,
                                start_new_session=True)
    except OSError as exc:
        return f"cannot start: {exc}"
    try:
        proc.communicate(payload, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        return f"timed out after {timeout_s:g} s"
    except BrokenPipeError:  # it exited without reading stdin: its exit code tells
        proc.wait()
    if proc.returncode != 0:
        return f"exit {proc.returncode}" if proc.returncode > 0 else f"killed by signal {-proc.returncode}"
    return None


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def post_json(url: str, alert: dict[str, Any], timeout_s: float) -> str | None:
    """POST the alert; None on a 2xx answer, else why not."""
    req = urllib.request.Request(url, data=json.dumps(alert, ensure_ascii=False).encode("utf-8"), method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "llama-forensics-watch"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            resp.read()
            return None
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"


class Dispatcher:
    """One worker thread per hook; ``submit`` queues an alert for the hooks that want its kind."""

    def __init__(self, hooks: list[Hook], policy: RetryPolicy, on_outcome: Callable[[Outcome], None],
                 note: Callable[[str], None]) -> None:
        self.hooks = hooks
        self.policy = policy
        self.on_outcome = on_outcome
        self.note = note
        self.stopping = threading.Event()
        self.queues: dict[str, queue.Queue[dict[str, Any] | None]] = {h.name: queue.Queue() for h in hooks}
        self.started: dict[str, float] = {}  # alert id -> when its first hook started (for the benchmark)
        self.threads = [threading.Thread(target=self._work, args=(h,), name=f"watch-{h.name}", daemon=True)
                        for h in hooks]
        for t in self.threads:
            t.start()

    def hooks_for(self, kind: str) -> list[str]:
        return [h.name for h in self.hooks if h.wants(kind)]

    def submit(self, alert: dict[str, Any], only: list[str] | None = None) -> None:
        for h in self.hooks:
            if h.wants(str(alert.get("kind"))) and (only is None or h.name in only):
                self.queues[h.name].put(alert)

    def close(self, timeout_s: float) -> None:
        """Stop after the attempts under way (no further retries); alerts still queued stay pending in the
        journal and are delivered by the next watch."""
        self.stopping.set()
        for q in self.queues.values():
            q.put(None)
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _work(self, hook: Hook) -> None:
        q = self.queues[hook.name]
        while True:
            alert = q.get()
            if alert is None or self.stopping.is_set():
                return
            self._deliver(hook, alert)

    def _deliver(self, hook: Hook, alert: dict[str, Any]) -> None:
        wait = self.policy.backoff_s
        error: str | None = "not tried"
        tries = 0
        for tries in range(1, self.policy.attempts + 1):
            self.started.setdefault(str(alert["id"]), time.time())
            if hook.command is not None:
                error = run_command(hook.command, alert, self.policy.timeout_s)
            else:
                error = post_json(str(hook.url), alert, self.policy.timeout_s)
            if error is None:
                break
            last = tries == self.policy.attempts
            self.note(f"{hook.name}: alert {alert['id']} ({alert['kind']} {alert['status']}): attempt {tries}/"
                      f"{self.policy.attempts} failed: {error}" + ("" if last else f"; retrying in {wait:g} s"))
            if last or self.stopping.wait(wait):
                break
            wait *= 2
        if error is not None and self.stopping.is_set() and tries < self.policy.attempts:
            return  # interrupted: left pending, the next watch delivers it
        self.on_outcome(Outcome(str(alert["id"]), hook.name, error is None, tries, error or ""))

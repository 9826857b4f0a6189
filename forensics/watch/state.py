"""What ``forensics watch`` remembers, kept inside the store (folder ``watch/``) so that a restarted watch
neither raises an alert again nor forgets one it had not delivered yet.

* ``alerts.jsonl``: an append-only journal, one JSON object per line, each written and fsync'ed before
  the step it records is taken: ``raised`` (an alert, with the hooks it goes to), ``backlog`` (a finding
  that was already in the logs when watch first saw them: recorded, not raised), ``delivered`` and
  ``failed`` (a hook's outcome, with the attempts made).  A journal cut short by a crash loses at most
  its last, unterminated line.
* ``files.json``: the files followed (device, inode, size, which lineage of a log they are), replaced
  as a whole with an atomic rename.
* ``.lock``: held while a watch runs; a second watch on the same store is refused.

Library only: no click.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from forensics.errors import StoreError

WATCH_DIR = "watch"
JOURNAL = "alerts.jsonl"
FILES = "files.json"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class AlertRecord:
    """Everything the journal says about one alert."""

    alert: dict[str, Any]
    backlog: bool = False
    sinks: list[str] = field(default_factory=list)
    outcome: dict[str, str] = field(default_factory=dict)  # sink -> delivered | failed

    @property
    def pending(self) -> list[str]:
        return [s for s in self.sinks if s not in self.outcome]


class WatchState:
    """The journal and the followed files of one store (see the module docstring)."""

    def __init__(self, store_root: Path) -> None:
        self.dir = Path(store_root) / WATCH_DIR
        self.alerts: dict[str, AlertRecord] = {}
        self.order: list[str] = []  # alert ids in the order they were raised
        self.files: dict[str, Any] = {}
        self.torn = 0  # journal lines that could not be read (a crash mid-write)
        self._lock = threading.Lock()  # the hooks' workers write their outcomes from their own threads

    # ------------------------------------------------------------------ lock
    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the watch lock of this store for the life of one watch (``filelock``, on every platform)."""
        import filelock

        self.dir.mkdir(parents=True, exist_ok=True)
        held = filelock.FileLock(self.dir / ".lock")
        try:
            held.acquire(timeout=0)
        except filelock.Timeout:
            raise StoreError(f"another `forensics watch` is following into {self.dir.parent}",
                             hint="stop it first, or give this one its own --store") from None
        try:
            yield
        finally:
            held.release()

    # ------------------------------------------------------------------ loading
    def load(self) -> None:
        self.alerts.clear()
        self.order.clear()
        path = self.dir / JOURNAL
        if path.exists():
            with path.open("rb") as fh:
                for raw in fh:
                    try:
                        self._apply(json.loads(raw))
                    except (ValueError, KeyError, TypeError):
                        self.torn += 1
        fpath = self.dir / FILES
        if fpath.exists():
            try:
                self.files = json.loads(fpath.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self.files = {}

    def _apply(self, rec: dict[str, Any]) -> None:
        event, aid = rec["e"], rec["id"]
        if event in ("raised", "backlog"):
            if aid not in self.alerts:
                self.order.append(aid)
            self.alerts[aid] = AlertRecord(rec["alert"], backlog=event == "backlog", sinks=list(rec.get("sinks", [])))
        elif event in ("delivered", "failed") and aid in self.alerts:
            self.alerts[aid].outcome[rec["sink"]] = event

    def known(self, alert_id: str) -> bool:
        return alert_id in self.alerts

    def pending(self) -> list[tuple[dict[str, Any], list[str]]]:
        """Alerts raised but not yet delivered to every hook, in the order they were raised."""
        out = []
        for aid in self.order:
            rec = self.alerts[aid]
            if not rec.backlog and rec.pending:
                out.append((rec.alert, rec.pending))
        return out

    def failed(self) -> int:
        return sum(1 for r in self.alerts.values() for o in r.outcome.values() if o == "failed")

    # ------------------------------------------------------------------ writing
    def write(self, event: str, alert_id: str, **fields: Any) -> None:
        """Append one record to the journal and make it durable before returning."""
        rec = {"e": event, "id": alert_id, "at": now_iso(), **fields}
        line = json.dumps(rec, ensure_ascii=False, default=str, separators=(",", ":")) + "\n"
        with self._lock:
            self.dir.mkdir(parents=True, exist_ok=True)
            with (self.dir / JOURNAL).open("ab") as fh:
                fh.write(line.encode("utf-8"))
                fh.flush()
                os.fsync(fh.fileno())
            self._apply(rec)

    def save_files(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{FILES}.tmp-{uuid.uuid4().hex[:8]}"
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(self.files, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.dir / FILES)

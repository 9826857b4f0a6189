"""``forensics watch``: the findings on live logs, within seconds, with hooks to act on them.

One loop: notice what changed in the followed files (file-system events through ``watchfiles``, else polling),
ingest it (``forensics.ingest.ingest``: incremental, committed at once), poll the servers' ``/slots`` and
``/metrics`` when asked, evaluate the findings of the runs that changed (``detect.evaluate``: the findings
functions themselves, on the store as it stands with the running requests' progress so far), and raise each
finding not raised before: journaled in the store, printed (``on_alert``) and handed to the hooks
(``deliver.Dispatcher``).  The work of the loop is paced by a CPU budget, so a busy log never makes watch a
burden on the machine it guards: when the budget is spent, changes are gathered and ingested together.

Library only: no click.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from threading import Event
from typing import Any

import polars as pl

from forensics.errors import ForensicsError, InputError
from forensics.incidents import KINDS as INCIDENT_KINDS
from forensics.incidents import seen_so_far
from forensics.ingest import (
    FilesNotRead,
    IngestOptions,
    check_path_text,
    check_tz,
    file_id_of,
    ingest,
    run_of,
)
from forensics.store import MANIFEST, Store
from forensics.watch.compact import compact
from forensics.watch.deliver import Dispatcher, Hook, Outcome, RetryPolicy
from forensics.watch.detect import Clock, Identity, LiveInputs, Running, evaluate
from forensics.watch.follow import Follower, FsEvents, LineIndex, forget, proc_cpu
from forensics.watch.server import ServerView, poll
from forensics.watch.state import WatchState, now_iso

__all__ = ["Hook", "RetryPolicy", "WatchOptions", "WatchSummary", "watch"]


@dataclass
class WatchOptions:
    paths: list[Path]
    store: Path
    run: str | None = None
    hooks: list[Hook] = field(default_factory=list)
    servers: list[str] = field(default_factory=list)
    poll_s: float = 1.0  # how often files are checked without events, servers polled, running requests timed
    cpu_budget: float = 0.05  # share of one core the loop may use on average (bursts allowed)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    backlog: bool = False  # raise the findings already in the logs the first time watch sees them
    events: bool = True  # file-system events (else polling only)
    tz: str = "UTC"
    mapping: str | None = None
    thresholds: dict[str, Any] = field(default_factory=dict)
    once: bool = False  # one pass over what is there, then stop (delivering what it raised)


@dataclass
class WatchSummary:
    raised: int = 0
    backlog: int = 0
    delivered: int = 0
    failed: int = 0
    pending: int = 0
    cycles: int = 0
    cpu_s: float = 0.0


class CpuBudget:
    """A token bucket of CPU seconds: it fills at ``share`` per second up to ``burst``; work spends it."""

    def __init__(self, share: float, burst: float = 3.0) -> None:
        self.share = share
        self.burst = burst
        self.credit = burst
        self.at = time.monotonic()

    def wait_s(self) -> float:
        now = time.monotonic()
        self.credit = min(self.burst, self.credit + (now - self.at) * self.share)
        self.at = now
        return 0.0 if self.credit >= 0 else -self.credit / self.share

    def spend(self, cpu_s: float) -> None:
        self.wait_s()
        self.credit -= cpu_s


class Watcher:
    def __init__(self, opts: WatchOptions, on_alert: Callable[[dict[str, Any]], None], note: Callable[[str], None],
                 stop: Event) -> None:
        self.opts = opts
        self.on_alert = on_alert
        self.note = note
        self.stop = stop
        self.wake = Event()
        self.state = WatchState(opts.store)
        self.summary = WatchSummary()
        self.index = LineIndex()
        self.clocks: dict[str, Clock] = {}
        self.first_seen: dict[str, float] = {}
        self.live = Running()
        self.live_runs: set[str] = set()
        self.runs_of: dict[str, str] = {}  # followed path -> run
        self.backlog_epochs: set[str] = set()
        self.noted: set[str] = set()
        self.last_server_poll = 0.0
        self.views: list[ServerView] = []

    # ------------------------------------------------------------------ outline
    def run(self) -> WatchSummary:
        check_tz(self.opts.tz)
        with self.state.exclusive():
            self.state.load()
            if self.state.torn:
                self.note(f"the alert journal had {self.state.torn} unreadable line(s) (cut by a crash); skipped")
            fresh = not self.state.files
            self.follower = Follower(self.opts.paths, self.opts.store, self.state.files)
            self.dispatcher = Dispatcher(self.opts.hooks, self.opts.retry, self._outcome, self.note)
            self._redeliver()
            events = FsEvents(self.opts.paths, self.stop, self.note) if self.opts.events else None
            budget = CpuBudget(self.opts.cpu_budget)
            first = True
            spent = proc_cpu()
            while not self.stop.is_set():
                self._cycle(first and fresh)
                if first:
                    self.backlog_epochs.clear()
                    runs = sorted(set(self.runs_of.values()))
                    self.note(f"following {len(self.follower.seen)} file(s) of run(s) {', '.join(runs) or '-'} into "
                              f"{self.opts.store}" + (f"; polling {', '.join(self.opts.servers)}" if self.opts.servers
                                                      else ""))
                first = False
                self.state.save_files()
                # everything the process used since the last cycle counts, the threads' work between cycles too
                used, spent = proc_cpu() - spent, proc_cpu()
                budget.spend(used)
                self.summary.cycles += 1
                self.summary.cpu_s += used
                if self.opts.once:
                    break
                self._wait(events, budget)
            self.dispatcher.close(self.opts.retry.timeout_s + 5.0 if not self.opts.once else 3600.0)
            self.summary.pending = sum(len(p) for _, p in self.state.pending())
        return self.summary

    def _wait(self, events: FsEvents | None, budget: CpuBudget) -> None:
        """Until a file changes (or the poll interval passes), and the CPU budget allows the next cycle."""
        deadline = time.monotonic() + self.opts.poll_s
        while not self.stop.is_set() and time.monotonic() < deadline:
            if events is not None and events.error is None and events.changed.wait(0.05):
                events.changed.clear()
                break
            if events is None or events.error is not None:
                self.stop.wait(0.05)
        while not self.stop.is_set() and budget.wait_s() > 0:
            self.stop.wait(min(0.25, budget.wait_s()))

    # ------------------------------------------------------------------ one cycle
    def _cycle(self, fresh: bool) -> None:
        now = time.time()
        ch = self.follower.scan(now)
        if fresh:
            self.backlog_epochs = set(self.follower.new_epochs)
        for n in ch.notes:
            self.note(n)
        changed = self._ingest(ch.ingest) if ch.ingest else set()
        if ch.moved:
            gone = [p for p in ch.moved if (self.opts.store / MANIFEST).exists()]
            dropped = forget(self.opts.store, gone)
            for p in gone:
                self.index.forget(p)
                self.runs_of.pop(p, None)
            if dropped:
                self.note(f"dropped the rows of {len(gone)} rotated-away path(s); their content is read from where "
                          "it moved")
        for p in ch.gone:
            self.runs_of.pop(p, None)
        for p in self.follower.seen:
            if p not in self.runs_of:
                self.runs_of[p] = run_of(Path(p), self.opts.run, self._root_of(Path(p)))
        self._poll_servers(now)
        runs = changed | self.live_runs
        if self.views:
            runs |= set(self.runs_of.values())
        if runs and (self.opts.store / MANIFEST).exists():
            self._evaluate(sorted(runs), now)

    def _ingest(self, paths: list[Path]) -> set[str]:
        groups: dict[str, list[Path]] = {}
        for p in paths:
            run = run_of(p, self.opts.run, self._root_of(p))
            self.runs_of[str(p)] = run
            groups.setdefault(run, []).append(p)
        store_before = set(Store(self.opts.store).parts("events")) if (self.opts.store / MANIFEST).exists() else set()
        changed: set[str] = set()
        for run, group in groups.items():
            group = [p for p in group if p.exists()]
            if not group:
                continue
            try:
                res = ingest(self.opts.store, group,
                             IngestOptions(run=run, keep_going=True, mapping=self.opts.mapping, tz=self.opts.tz))
            except FilesNotRead as exc:
                res = exc.result
            except ForensicsError as exc:
                self._note_once(exc.one_line())
                continue
            for f in res.files:
                if f.status != "error":
                    continue
                if Path(f.path).exists():
                    self._note_once(f.message)
                else:  # rotated or removed between the scan and the read: the next scan finds it
                    self.note(f"{f.path}: gone while being read; its content is read where it moved")
            if any(f.status in ("ingested", "appended", "replaced") for f in res.files):
                changed.add(run)
        self._after_ingest(paths, store_before)
        if changed:
            compact(self.opts.store, [str(p) for p in paths if p.exists()])
        return changed

    def _root_of(self, path: Path) -> Path | None:
        for p in self.opts.paths:
            if p.is_dir() and path.resolve().is_relative_to(p.resolve()):
                return p
        return None

    def _after_ingest(self, paths: list[Path], before: set[str]) -> None:
        """Where each log's clock stands at its last line, and where its lines start (for the evidence)."""
        store = Store(self.opts.store)
        meta = store.meta("files", {}) or {}
        for p in paths:
            m = meta.get(file_id_of(p))
            if m and not m.get("compression"):
                self.index.mark(str(p), int(m.get("lines_total") or 0), int(m.get("bytes_read") or 0))
        for rel in [r for r in store.parts("events") if r not in before]:
            try:
                lf = pl.scan_parquet(store.root / rel, hive_partitioning=False)
                cols = [c for c in ("path", "line_no", "elapsed_s", "ts") if c in lf.collect_schema().names()]
                ev = lf.select(cols).sort("line_no").tail(1).collect()
            except (OSError, pl.exceptions.PolarsError):
                continue
            if ev.height == 0 or "path" not in ev.columns:
                continue
            last = ev.to_dicts()[0]
            path = str(last["path"])
            clock = self.clocks.get(path)
            if clock is None or int(last["line_no"]) >= clock.line:
                try:
                    mtime = Path(path).stat().st_mtime
                except OSError:
                    continue
                self.clocks[path] = Clock(int(last["line_no"]), last.get("elapsed_s"), last.get("ts"), mtime)

    def _poll_servers(self, now: float) -> None:
        if not self.opts.servers or now - self.last_server_poll < self.opts.poll_s:
            return
        self.last_server_poll = now
        self.views = [poll(url, timeout_s=min(2.0, self.opts.poll_s * 2)) for url in self.opts.servers]
        for v in self.views:
            for endpoint, err in v.errors.items():
                self._note_once(f"server {v.url}: /{endpoint}: {err}"
                                + (" (start llama-server with --metrics)" if endpoint == "metrics" and "404" in err
                                   else ""))

    # ------------------------------------------------------------------ findings
    def _evaluate(self, runs: list[str], now: float) -> None:
        followed = {p: (f.mtime, float(self.state.files["since"].get(p, now))) for p, f in self.follower.seen.items()}
        li = LiveInputs(now=now, followed=followed, clocks=self.clocks, first_seen=self.first_seen,
                        servers=self.views, few_tokens=int(self.opts.thresholds.get("few_tokens") or 3))
        ident = Identity({p: f.epoch for p, f in self.follower.seen.items()})
        try:
            cands, self.live = evaluate(self.opts.store, runs, li, ident,
                                        {k: v for k, v in self.opts.thresholds.items() if v is not None})
        except ForensicsError as exc:
            self._note_once(f"findings: {exc.one_line()}")
            return
        for url in li.unmatched:
            self._note_once(f"server {url}: no followed log listens on its port; /slots is used with its log only")
        self.live_runs = {k[0] for k in self.live.keys}
        self.first_seen = {k: v for k, v in self.first_seen.items()
                           if tuple(k.split("/")[:2]) in {(a, b) for a, b, _, _ in self.live.keys}}
        metrics = {v.url: v.metrics for v in self.views if v.metrics}
        seen: dict[str, str] | None = None  # the precursors so far, worked out for the first new incident
        for c in sorted(cands, key=lambda c: (c.path, c.at_line, c.key[0] != "crash")):
            if self.state.known(c.id):
                continue
            alert = {"id": c.id, **c.alert, "detected_at": now_iso()}
            if alert.get("kind") in INCIDENT_KINDS and alert.get("status") == "confirmed":
                seen = self._precursors() if seen is None else seen
                alert["precursors"] = seen.get(str(alert["kind"]))
            alert["evidence_lines"] = self.index.read(c.path, *c.lines) if c.lines else []
            if metrics and alert.get("status") == "suspected":
                alert["server_metrics"] = metrics
            epoch = ident.epochs.get(c.path)
            if epoch in self.backlog_epochs and not self.opts.backlog:
                self.state.write("backlog", c.id, alert=alert)
                self.summary.backlog += 1
                continue
            sinks = self.dispatcher.hooks_for(str(alert["kind"]))
            self.state.write("raised", c.id, alert=alert, sinks=sinks)
            self.summary.raised += 1
            self.on_alert(alert)
            self.dispatcher.submit(alert)
        if self.summary.backlog and "backlog" not in self.noted:
            self.noted.add("backlog")
            self.note(f"{self.summary.backlog} finding(s) were already in the logs when watch first read them: "
                      "recorded in the store, not raised (--backlog raises them)")

    def _precursors(self) -> dict[str, str]:
        """Each incident kind's precursor sentence over the store's runs so far (forensics.incidents)."""
        try:
            return seen_so_far(Store(self.opts.store))
        except ForensicsError as exc:
            self._note_once(f"precursors: {exc.one_line()}")
            return {}

    # ------------------------------------------------------------------ delivery
    def _redeliver(self) -> None:
        pending = self.state.pending()
        if any(s in {h.name for h in self.opts.hooks} for _, sinks in pending for s in sinks):
            self.note(f"delivering {len(pending)} alert(s) a previous watch had not delivered yet")
        configured = {h.name for h in self.opts.hooks}
        for alert, sinks in pending:
            for gone in [s for s in sinks if s not in configured]:  # said once, then settled
                self.state.write("failed", str(alert["id"]), sink=gone, attempts=0, error="hook no longer configured")
                self.note(f"{gone}: alert {alert['id']} was never delivered and the hook is no longer configured")
            self.dispatcher.submit(alert, only=[s for s in sinks if s in configured])
        if self.state.failed():
            self.note(f"{self.state.failed()} earlier hook delivery(ies) failed for good; see the journal "
                      f"{self.state.dir / 'alerts.jsonl'}")

    def _outcome(self, o: Outcome) -> None:
        self.state.write("delivered" if o.ok else "failed", o.alert_id, sink=o.hook, attempts=o.attempts,
                         **({"error": o.error} if o.error else {}))
        if o.ok:
            self.summary.delivered += 1
        else:
            self.summary.failed += 1
            self.note(f"{o.hook}: alert {o.alert_id} not delivered after {o.attempts} attempt(s): {o.error}; "
                      "recorded in the journal")

    def _note_once(self, text: str) -> None:
        if text not in self.noted:
            self.noted.add(text)
            self.note(text)


def watch(opts: WatchOptions, *, on_alert: Callable[[dict[str, Any]], None], note: Callable[[str], None],
          stop: Event | None = None) -> WatchSummary:
    """Follow ``opts.paths`` into the store until ``stop`` is set (or one pass with ``opts.once``); each new
    finding is journaled, passed to ``on_alert`` and delivered to the hooks.  Raises InputError for a path
    that cannot appear (not even its folder exists) and StoreError when another watch runs on the same store."""
    for p in opts.paths:
        check_path_text(p)
        if not p.exists() and not p.parent.exists():
            raise InputError(f"{p}: neither it nor its folder exists", hint="pass log files or the folders that hold them")
    return Watcher(opts, on_alert, note, stop or Event()).run()

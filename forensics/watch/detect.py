"""Which findings are there now, and which of them concern a request still running.

Nothing here defines a finding: watch raises every finding of the registry marked ``watch`` (dead slots,
runaways, crashes while serving, ...), computed by the same session as the CLI's.  Early warning applies those
same rules to the requests still running, as they stand *now*: the session is opened with ``live``, each
running request's tokens set to what it has generated so far (its progress lines, ``/slots``' n_decoded, or its
time on the slot at its run's normal speed, whichever is most) and its duration set to its time on the slot.  A
finding about such a request is *suspected*; once the request has ended (or its server is gone) it is
*confirmed*.

Library only: no click.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from forensics import findings, registry
from forensics.ingest import strip_exts
from forensics.session import LIVE_SCHEMA, Analysis, Thresholds, thresholds
from forensics.store import ArrowStream, Store, fetch_pl
from forensics.watch.follow import stream_label
from forensics.watch.server import ServerView, SlotView

KEYS = ["run", "instance", "slot", "task"]


# ---------------------------------------------------------------------------------------- what runs now
def store_facts(store_root: Path, runs: list[str]) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, float]]:
    """The runs' instances, their requests still open in the logs (the last on their slot), and each run's normal speed (the median
    ms per generated token of its ended requests: what turns a time on the slot into tokens)."""
    store = Store(store_root)
    con = store.connect(tables=["requests", "instances"])
    try:
        inst = fetch_pl(con, "SELECT run, instance, path, host, port, line_first, line_last, crashed, crash, "
                             "crash_line FROM instances WHERE run IN (SELECT unnest($runs))", {"runs": runs})
        # open: the log shows no end, and no later request on the same slot (which would have ended it)
        open_ = fetch_pl(con, "SELECT run, instance, path, slot, task, seq, gen_tokens, t_start, elapsed_start_s, "
                              "line_first, line_last FROM (SELECT *, max(seq) OVER (PARTITION BY run, instance, slot) "
                              "AS last_seq FROM requests WHERE run IN (SELECT unnest($runs))) "
                              "WHERE NOT coalesce(complete, true) AND seq = last_seq", {"runs": runs})
        speed = con.execute("SELECT run, median(gen_ms / gen_tokens) FROM requests WHERE run IN (SELECT unnest($runs)) "
                            "AND coalesce(complete, false) AND gen_tokens >= 2 AND gen_ms > 0 AND error IS NULL "
                            "GROUP BY run", {"runs": runs}).fetchall()
    finally:
        con.close()
    return inst, open_, {r: float(v) for r, v in speed if v is not None}


@dataclass
class Clock:
    """Where a log's clock stood at its last line, and when that line was written (the file's mtime)."""

    line: int
    elapsed_s: float | None
    ts: datetime | None
    mtime: float


@dataclass
class LiveInputs:
    now: float
    followed: dict[str, tuple[float, float]]  # path -> (mtime, when watch began following it)
    clocks: dict[str, Clock]
    first_seen: dict[str, float]  # request key -> when watch first saw it open (logs without time)
    servers: list[ServerView]
    few_tokens: int
    slots: dict[tuple[str, str], dict[int, SlotView]] = field(default_factory=dict)  # filled by map_servers
    unmatched: list[str] = field(default_factory=list)  # servers no followed log belongs to


@dataclass
class Running:
    keys: set[tuple[str, str, int, int]] = field(default_factory=set)
    patch: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=LIVE_SCHEMA))
    detail: dict[tuple[str, str, int, int], dict[str, Any]] = field(default_factory=dict)


def _last_instances(inst: pl.DataFrame) -> dict[str, tuple[str, str, bool]]:
    """path -> (run, instance, crashed) of the last server start in each file."""
    out: dict[str, tuple[str, str, bool]] = {}
    for row in inst.sort("line_first").iter_rows(named=True):
        out[str(row["path"])] = (row["run"], row["instance"], bool(row["crashed"]))
    return out


_ANY_HOST = {"", "0.0.0.0", "::", "127.0.0.1", "localhost", "::1"}


def map_servers(li: LiveInputs, inst: pl.DataFrame) -> None:
    """Tie each polled server to the last start in a followed log that listens on its port (the instance's
    host and port come from its log); with one followed log and no port logged, to that log's last start."""
    last = {p: v for p, v in _last_instances(inst).items() if p in li.followed}
    ports = {(r["run"], r["instance"]): (r["host"], r["port"]) for r in inst.iter_rows(named=True)}
    li.slots, li.unmatched = {}, []
    for view in li.servers:
        if view.slots is None:
            continue
        found = [(run, name) for run, name, _ in last.values()
                 if ports.get((run, name), (None, None))[1] == view.port
                 and (str(ports[(run, name)][0] or "") in _ANY_HOST or view.host in _ANY_HOST
                      or ports[(run, name)][0] == view.host)]
        if not found and len(last) == 1 and next(iter(ports.get(k[:2], (None, None))[1] for k in last.values())) is None:
            found = [next(iter(last.values()))[:2]]
        if len(found) != 1:
            li.unmatched.append(view.url)
            continue
        li.slots[found[0]] = {v.slot: v for v in view.slots}


def running(open_: pl.DataFrame, inst: pl.DataFrame, speed: dict[str, float], li: LiveInputs) -> Running:
    """The open requests that are still running, with their tokens and time on the slot so far.

    Running: the request is open in the last server start of a followed log that has not crashed, and either
    its server's /slots shows the slot on that task, or (no /slots) the log was written to since watch began
    following it: an old log's unfinished requests are history, not alerts."""
    last = _last_instances(inst)
    out = Running()
    rows = []
    for r in open_.iter_rows(named=True):
        path = str(r["path"])
        if r["task"] is None or path not in li.followed or last.get(path, (None, None, True))[1] != r["instance"] \
                or last[path][2]:
            continue
        key = (r["run"], r["instance"], int(r["slot"]), int(r["task"]))
        view = li.slots.get((r["run"], r["instance"]), {}).get(int(r["slot"])) if li.slots else None
        server_has_slots = bool(li.slots.get((r["run"], r["instance"])))
        if server_has_slots:
            if view is None or not view.processing or view.task != r["task"]:
                continue  # the server says this slot is idle or on another task: the log lags behind
        else:
            mtime, since = li.followed[path]
            if mtime <= since:
                continue
        secs = _time_on_slot(r, li.clocks.get(path), li, "/".join(map(str, key)))
        est = secs * 1000.0 / speed[r["run"]] if secs is not None and speed.get(r["run"]) else None
        tokens = max([v for v in (r["gen_tokens"], view.n_decoded if view is not None else None, est) if v is not None],
                     default=None)
        tokens_i = math.floor(tokens) if tokens is not None else None
        out.keys.add(key)
        out.detail[key] = {"tokens_so_far": tokens_i, "seconds_on_slot": None if secs is None else round(secs, 1),
                           "source": "server" if view is not None else "log",
                           "tokens_from": "server" if view is not None and view.n_decoded == tokens else
                           ("time" if est is not None and est == tokens else "log")}
        # a running request is never "a handful of tokens": it is still generating
        rows.append({**dict(zip(KEYS, key, strict=True)),
                     "gen_tokens": tokens_i if tokens_i is not None and tokens_i > li.few_tokens else None,
                     "total_ms": None if secs is None else secs * 1000.0})
    if rows:
        out.patch = pl.DataFrame(rows, schema=LIVE_SCHEMA, orient="row")
    return out


def _time_on_slot(r: dict[str, Any], clock: Clock | None, li: LiveInputs, key: str) -> float | None:
    """Seconds since the request started: its log's clock at the last line, minus the request's start, plus
    the time since that line was written; on a log without time, since watch first saw the request."""
    if clock is not None and r["elapsed_start_s"] is not None and clock.elapsed_s is not None \
            and clock.elapsed_s >= r["elapsed_start_s"]:
        return clock.elapsed_s - r["elapsed_start_s"] + max(0.0, li.now - clock.mtime)
    if clock is not None and r["t_start"] is not None and clock.ts is not None and clock.ts >= r["t_start"]:
        return (clock.ts - r["t_start"]).total_seconds() + max(0.0, li.now - clock.mtime)
    return li.now - li.first_seen.setdefault(key, li.now)


# ---------------------------------------------------------------------------------------- findings -> alerts
@dataclass
class Candidate:
    """A finding as an alert: ``key`` is its identity (stable across renames and restarts of watch)."""

    key: tuple[Any, ...]
    alert: dict[str, Any]
    path: str
    at_line: int
    lines: tuple[int, int] | None  # evidence line range to read back

    @property
    def id(self) -> str:
        return hashlib.sha1(json.dumps(self.key, default=str).encode()).hexdigest()[:16]


def _json_safe(row: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in row.items():
        if isinstance(v, datetime):
            v = v.isoformat().replace("+00:00", "Z")
        elif isinstance(v, float) and not math.isfinite(v):
            v = None
        out[k] = v
    return out


@dataclass
class Identity:
    """Names a finding's log by its lineage rather than its current path (see follow.py)."""

    epochs: dict[str, str]  # path -> lineage

    def key(self, kind: str, status: str, run: str, instance: str, path: str, *rest: Any) -> tuple[Any, ...]:
        suffix = instance[len(strip_exts(Path(path).name)):] if instance.startswith(strip_exts(Path(path).name)) \
            else instance
        return (kind, status, run, stream_label(path), self.epochs.get(path, path), suffix, *rest)


def _base(kind: str, status: str, irow: dict[str, Any] | None, run: str, instance: str) -> dict[str, Any]:
    irow = irow or {}
    return {"kind": kind, "status": status, "run": run, "instance": instance, "path": irow.get("path"),
            "host": irow.get("host"), "port": irow.get("port")}


def runaway_candidates(df: pl.DataFrame, inst: dict[tuple[str, str], dict[str, Any]], live: Running,
                       ident: Identity) -> list[Candidate]:
    out = []
    for row in df.iter_rows(named=True):
        run, instance, slot, task = row["run"], row["instance"], row["slot"], row["task"]
        irow = inst.get((run, instance)) or {}
        path = str(irow.get("path") or "")
        key = (run, instance, slot, task)
        status = "suspected" if key in live.keys else "confirmed"
        first, _, last = str(row["evidence"]).partition("-")
        lines = (int(first), int(last)) if first.isdigit() and last.isdigit() else None
        alert = _base("runaway", status, irow, run, instance)
        so_far = live.detail.get(key, {})
        if status == "suspected":
            detail = (f"suspected runaway: slot {slot} task {task} is still running: {so_far.get('tokens_so_far')} "
                      f"tokens so far, {so_far.get('seconds_on_slot')} s on the slot; its run's normal requests need "
                      f"{row['normal_tokens']} tokens ({row['why']})")
        else:
            detail = (f"runaway: slot {slot} task {task} generated {row['gen_tokens']} tokens in {row['seconds']} s; "
                      f"its run's normal requests need {row['normal_tokens']} ({row['why']})")
        alert.update(slot=slot, task=task, seq=row["seq"], item=row.get("item"), stage=row.get("stage"),
                     why=row["why"], detail=detail, evidence=f"{path}:{row['evidence']}",
                     finding=_json_safe(row), so_far=so_far or None)
        out.append(Candidate(ident.key("runaway", status, run, instance, path, slot,
                                       task if task is not None else f"seq{row['seq']}"),
                             alert, path, (lines[0] if status == "suspected" else lines[1]) if lines else 0, lines))
    return out


def dead_slot_candidates(rep: findings.DeadSlotReport, inst: dict[tuple[str, str], dict[str, Any]], live: Running,
                         ident: Identity, lines_of: dict[tuple[str, str, int, int], tuple[int, int]]) -> list[Candidate]:
    out = []
    for row in rep.slots.iter_rows(named=True):
        run, instance, slot = row["run"], row["instance"], row["slot"]
        seq = rep.sequence.filter((pl.col("run") == run) & (pl.col("instance") == instance) & (pl.col("slot") == slot)
                                  & (pl.col("seq") >= row["seq"])).sort("seq").head(2).to_dicts()
        second = seq[1] if len(seq) > 1 else None
        status = "suspected" if second is not None and (run, instance, slot, second["task"]) in live.keys \
            else "confirmed"
        irow = inst.get((run, instance)) or {}
        path = str(irow.get("path") or "")
        a = lines_of.get((run, instance, slot, row["seq"]))
        b = lines_of.get((run, instance, slot, second["seq"])) if second else None
        rng = (a[0], (b or a)[1]) if a else None
        alert = _base("dead_slot", status, irow, run, instance)
        pair = f"tasks {row['task']} and {second['task']}" if second else f"task {row['task']}"
        # task, seq, item and stage name one request: the one still running when suspected, else the first
        # abnormal one, where the finding says the slot went bad
        about = second if status == "suspected" and second else (seq[0] if seq else row)
        alert.update(slot=slot, task=about["task"], seq=about["seq"], first_task=row["task"],
                     second_task=second["task"] if second else None,
                     item=about.get("item"), stage=about.get("stage"),
                     why=row["why"],
                     detail=(f"{'suspected ' if status == 'suspected' else ''}dead slot: slot {slot} of {instance} "
                             f"went abnormal twice in a row ({pair}"
                             f"{', the second still running' if status == 'suspected' else ''}): {row['why']}"),
                     evidence=f"{path}:{rng[0]}-{rng[1]}" if rng else f"{path}:{row['line']}",
                     finding=_json_safe(row), so_far=live.detail.get((run, instance, slot, second["task"]))
                     if second else None)
        out.append(Candidate(ident.key("dead_slot", status, run, instance, path, slot, row["task"]), alert, path,
                             (b or a or (row["line"], row["line"]))[0 if status == "suspected" else 1]
                             if (b or a) else int(row["line"] or 0), rng))
    return out


def crash_candidates(crashes: pl.DataFrame, inst: dict[tuple[str, str], dict[str, Any]],
                     ident: Identity) -> list[Candidate]:
    """The crash finding's crashes at start-up or while serving (an abort while shutting down with nothing in
    flight is not a failure: no alert)."""
    out = []
    for row in crashes.filter(pl.col("phase") != "shutdown").iter_rows(named=True):
        run, instance, path = row["run"], row["instance"], str(row["path"])
        irow = inst.get((run, instance)) or {"path": path}
        line = int(row["line_no"] or 0)
        last = max(line, int(row["line_last"] or line))
        alert = _base("crash", "confirmed", irow, run, instance)
        in_flight = row["in_flight"]
        alert.update(slot=None, task=None, seq=None, item=None, stage=None, why="crash",
                     detail=f"crash: {instance} died at line {line}: {row['message']}"
                            + (f"; in flight: {in_flight}" if in_flight else ""),
                     evidence=f"{path}:{line}-{last}", in_flight=in_flight or None, phase=row["phase"],
                     finding=_json_safe({**irow, **row}), so_far=None)
        out.append(Candidate(ident.key("crash", "confirmed", run, instance, path, line), alert, path, line,
                             (line, last)))
    return out


def generic_candidates(f: registry.Finding, rows: pl.DataFrame, inst: dict[tuple[str, str], dict[str, Any]],
                       ident: Identity) -> list[Candidate]:
    """Alerts of a finding with no alert of its own: one per row, confirmed, keyed by its row."""
    out = []
    for row in rows.iter_rows(named=True):
        run, instance = row.get("run"), row.get("instance")
        irow = inst.get((run, instance)) or {}  # type: ignore[arg-type]
        path = str(row.get("path") or irow.get("path") or "")
        first = row.get("line_first", row.get("line_no"))
        last = row.get("line_last", first)
        lines = (int(first), int(last or first)) if first is not None else None
        alert = _base(f.name, "confirmed", irow, str(run), str(instance))
        said = "; ".join(f"{k} {v}" for k, v in row.items() if k not in ("run", "path") and v is not None)
        alert.update(slot=row.get("slot"), task=row.get("task"), seq=row.get("seq"), item=row.get("item"),
                     stage=row.get("stage"), why=f.name, detail=f"{f.title.lower()}: {said}"[:400],
                     evidence=f"{path}:{lines[0]}-{lines[1]}" if lines else path, finding=_json_safe(row),
                     so_far=None)
        rest = [row.get(k) for k in ("slot", "task", "seq", "item", "stage") if row.get(k) is not None]
        out.append(Candidate(ident.key(f.name, "confirmed", str(run), str(instance), path, *rest, first), alert,
                             path, lines[1] if lines else 0, lines))
    return out


def request_lines(store_root: Path, wanted: list[tuple[str, str, int, int]]) -> dict[tuple[str, str, int, int], tuple[int, int]]:
    """(run, instance, slot, seq) -> (line_first, line_last) of those requests."""
    if not wanted:
        return {}
    keys = pl.DataFrame(wanted, schema={"run": pl.String, "instance": pl.String, "slot": pl.Int64, "seq": pl.Int64},
                        orient="row")
    con = Store(store_root).connect(tables=["requests"])
    try:
        con.register("_watch_keys", ArrowStream(keys))
        rows = con.execute("SELECT r.run, r.instance, r.slot, r.seq, r.line_first, r.line_last FROM requests r "
                           "SEMI JOIN _watch_keys k ON k.run = r.run AND k.instance = r.instance AND k.slot = r.slot "
                           "AND k.seq = r.seq").fetchall()
    finally:
        con.close()
    return {(a, b, c, d): (e, f) for a, b, c, d, e, f in rows}


def evaluate(store_root: Path, runs: list[str], li: LiveInputs, ident: Identity,
             overrides: dict[str, Any]) -> tuple[list[Candidate], Running]:
    """Every finding of ``runs`` that watch raises, now, as candidate alerts (the caller keeps those it has not
    raised yet)."""
    inst_df, open_, speed = store_facts(store_root, runs)
    map_servers(li, inst_df)
    live = running(open_, inst_df, speed, li)
    inst = {(r["run"], r["instance"]): r for r in inst_df.iter_rows(named=True)}
    th = thresholds(**overrides)
    out: list[Candidate] = []
    with Analysis.open(Store(store_root), runs, live=live.patch) as session:
        for f in registry.in_dependency_order(registry.findings(watch=True)):
            out += _candidates_of(f, session, th, inst, live, ident)
    return out, live


def _candidates_of(f: registry.Finding, session: Analysis, th: Thresholds, inst: dict[tuple[str, str], dict[str, Any]],
                   live: Running, ident: Identity) -> list[Candidate]:
    if f.name == "runaway":
        return runaway_candidates(findings.find_runaways(session, None, **_th(th)), inst, live, ident)
    if f.name == "dead_slot":
        rep = findings.dead_slot_report(session, None, **_th(th))
        wanted = [(r["run"], r["instance"], r["slot"], r["seq"]) for r in rep.sequence.iter_rows(named=True)]
        return dead_slot_candidates(rep, inst, live, ident, request_lines(session.store.root, wanted))
    if f.name == "crash":
        return crash_candidates(session.rows("crash", th), inst, ident)
    return generic_candidates(f, f.listing(session.rows(f.name, th)), inst, ident)


def _th(th: Thresholds) -> dict[str, Any]:
    from dataclasses import asdict

    return {k: v for k, v in asdict(th).items() if k != "include_recovered"}

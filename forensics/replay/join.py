"""The join: match every attempt the harness made to the server request (a ``requests`` row) that
served it, and give every server request of a run an absolute time.

Keys, strongest first: the instance (the attempt's ``server`` -> the manifest's servers entry -> the
instance whose log file (or else port) it names; never a process name), the slot (``id_slot``), the
token counts (``tokens_evaluated`` = ``prompt_tokens``, ``tokens_predicted`` = ``gen_tokens``), and time
(request start within the attempt's send..end window) where the log has time, else the order of the
requests on the slot.  Elapsed-time logs are anchored to wall-clock time by the server's ``launched_at``
from the manifest, else the instance's known start, else the offset that best aligns the attempts' send
times with the requests' starts (least median distance).
"""

from __future__ import annotations

import bisect
import json
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from forensics import schema
from forensics.paths import file_stem

TOLERANCE_S = 1.0  # slack around the attempt's window for request starts (absolute time)
AMBIGUOUS_S = 0.5  # two candidates whose starts are this close to the send time cannot be told apart
ALIGN_CANDIDATE_ATTEMPTS = 8
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass
class JoinResult:
    """``matches``: one row per attempt (the ``matches`` table); ``requests``: the server requests of the
    instances the runs used, with ``t_start``/``t_end`` filled where the join could anchor them, and
    ``replay_run``, ``item``, ``stage``, ``attempt`` of the attempt each served (``replay_run`` also for
    unmatched requests, by time)."""

    matches: pl.DataFrame
    requests: pl.DataFrame
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        c = {"matched": 0, "ambiguous": 0, "unmatched": 0}
        for m in self.matches["match"].to_list():
            c[m] = c.get(m, 0) + 1
        return c


def _secs(dt: datetime | None) -> float | None:
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return (dt - EPOCH).total_seconds()


def _dt(s: float | None) -> datetime | None:
    if s is None:
        return None
    return datetime.fromtimestamp(round(s, 6), tz=timezone.utc)


def _resolved(p: str | None) -> str | None:
    if not p:
        return None
    try:
        return str(Path(p).resolve())
    except OSError:
        return p


InstKey = tuple[str, str]  # (store run partition, instance id)


def _instances_for(run: str, server: str | None, servers: dict[str, dict[str, Any]],
                   inst_rows: list[dict[str, Any]]) -> list[InstKey]:
    """Instances an attempt's ``server`` names: by the manifest's log file, else its port; without a
    manifest entry, an instance whose id or log-file stem is the server name, else the instances of the
    run's own partition."""
    s = servers.get(server or "") if server is not None else None
    if s is not None:
        log_path, log_file, port = s.get("log_path"), s.get("log_file"), s.get("port")
        hits = [r for r in inst_rows if log_path and r.get("_resolved", _resolved(r["path"])) == log_path]
        if not hits and log_file:
            base = Path(log_file).name
            hits = [r for r in inst_rows if r["path"] and Path(r["path"]).name == base]
        if not hits and port is not None:
            hits = [r for r in inst_rows if r["port"] == port]
        return [(r["run"], r["instance"]) for r in hits]
    if server:
        hits = [r for r in inst_rows if r["instance"] == server or (r["path"] and file_stem(Path(r["path"]).name) == server)]
        if hits:
            return [(r["run"], r["instance"]) for r in hits]
    if servers:  # the manifest lists servers and this one is not among them
        return []
    return [(r["run"], r["instance"]) for r in inst_rows if r["run"] == run]


@dataclass
class _Req:
    idx: int
    key: InstKey
    slot: int | None
    task: int | None
    seq: int | None
    prompt_tokens: int | None
    gen_tokens: int | None
    http_status: int | None
    total_ms: float | None
    t0: float | None
    t1: float | None
    e0: float | None
    e1: float | None
    path: str | None
    used: bool = False


def _align(att_starts: list[float], att_pairs: list[tuple[float, float]], req_starts: list[float]) -> tuple[float, float]:
    """The offset o minimising the median over attempts of min |send - (o + request start)|, and that
    median.  Candidates come from token-identified pairs when there are any, else from the first
    attempts against every request."""
    rs = sorted(req_starts)
    if att_pairs:
        cands = sorted({round(a - r, 6) for a, r in att_pairs})
    else:
        first = sorted(att_starts)[:ALIGN_CANDIDATE_ATTEMPTS]
        cands = sorted({round(a - r, 6) for a in first for r in rs})
    best, best_cost = cands[0], float("inf")
    for o in cands:
        dists = []
        for a in att_starts:
            x = a - o
            i = bisect.bisect_left(rs, x)
            d = min(abs(x - rs[j]) for j in (i - 1, i) if 0 <= j < len(rs))
            dists.append(d)
        cost = statistics.median(dists)
        if cost < best_cost - 1e-9:
            best, best_cost = o, cost
    return best, best_cost


class _Index:
    """The requests of one instance, for finding an attempt's candidates without scanning them all."""

    def __init__(self, rs: list[_Req]) -> None:
        self.timed = bool(rs) and all(r.t0 is not None for r in rs)
        if self.timed:
            self.by_time = sorted(rs, key=lambda r: (r.t0, r.idx))
            self.starts = [r.t0 for r in self.by_time]
        self.by_slot: dict[Any, list[_Req]] = {}
        for r in sorted(rs, key=lambda r: (r.seq if r.seq is not None else r.idx, r.idx)):
            self.by_slot.setdefault(r.slot, []).append(r)
        self.first_unused = dict.fromkeys(self.by_slot, 0)
        self.all = rs


def _candidates(index: dict[InstKey, _Index], k: InstKey, a: dict[str, Any], tol: float) -> list[_Req]:
    """Requests of instance ``k`` that could have served attempt ``a`` (a superset; the caller filters)."""
    ix = index.get(k)
    if ix is None:
        return []
    if ix.timed and a["_t0"] is not None:
        hi = (a["_t1"] if a["_t1"] is not None else a["_t0"] + 86400.0) + tol
        lo_i = bisect.bisect_left(ix.starts, a["_t0"] - tol)
        hi_i = bisect.bisect_right(ix.starts, hi)
        return ix.by_time[lo_i:hi_i]
    if ix.timed:
        return ix.all
    # order logs: on each slot, the unused requests in order (skipping the used prefix)
    slots = [a["id_slot"]] if a["id_slot"] is not None and a["id_slot"] in ix.by_slot else list(ix.by_slot)
    out: list[_Req] = []
    for sl in slots:
        lst = ix.by_slot[sl]
        j = ix.first_unused[sl]
        while j < len(lst) and lst[j].used:
            j += 1
        ix.first_unused[sl] = j
        out.extend(lst[j:])
    return out


def join(requests: pl.DataFrame, instances: pl.DataFrame, runs: pl.DataFrame,
         attempts: pl.DataFrame) -> JoinResult:
    """Match attempts to server requests (see the module docstring)."""
    notes: list[str] = []
    req = schema.conform(requests, "requests") if requests.height else schema.empty("requests")
    inst = schema.conform(instances, "instances") if instances.height else schema.empty("instances")
    inst_rows = list(inst.iter_rows(named=True))
    inst_by_key = {(r["run"], r["instance"]): r for r in inst_rows}
    servers_by_run: dict[str, dict[str, dict[str, Any]]] = {}
    windows: dict[str, tuple[float | None, float | None]] = {}
    for r in runs.iter_rows(named=True) if runs.height else []:
        try:
            lst = json.loads(r["servers"]) if r["servers"] else []
        except json.JSONDecodeError:
            lst = []
        servers_by_run[r["run"]] = {s["name"]: s for s in lst if isinstance(s, dict) and s.get("name")}
        windows[r["run"]] = (_secs(r["started_at"]), _secs(r["ended_at"]))
    att_rows = list(attempts.iter_rows(named=True)) if attempts.height else []
    fixed = {r for r, w in windows.items() if w[0] is not None and w[1] is not None}
    for a in att_rows:
        a["_t0"], a["_t1"] = _secs(a["started_at"]), _secs(a["ended_at"])
        if a["run"] in fixed:
            continue
        w = windows.get(a["run"], (None, None))
        lo = min((x for x in (w[0], a["_t0"]) if x is not None), default=None)
        hi = max((x for x in (w[1], a["_t1"], a["_t0"]) if x is not None), default=None)
        windows[a["run"]] = (lo, hi)
    # which instances each attempt may have reached, and the anchor of each instance
    att_keys: list[list[InstKey]] = []
    launched: dict[InstKey, float] = {}
    for r in inst_rows:  # resolve each log path once, not once per attempt
        r["_resolved"] = _resolved(r["path"])
    key_cache: dict[tuple[str, str | None], list[InstKey]] = {}
    for a in att_rows:
        servers = servers_by_run.get(a["run"], {})
        ck = (a["run"], a["server"])
        if ck not in key_cache:
            key_cache[ck] = _instances_for(a["run"], a["server"], servers, inst_rows)
        keys = key_cache[ck]
        att_keys.append(keys)
        s = servers.get(a["server"] or "")
        if s and s.get("launched_at"):
            for k in keys:
                launched.setdefault(k, _secs(datetime.fromisoformat(s["launched_at"].replace("Z", "+00:00"))) or 0.0)
    used_keys = sorted({k for ks in att_keys for k in ks})
    req_rows = list(req.with_row_index("_idx").iter_rows(named=True))
    reqs_by_key: dict[InstKey, list[_Req]] = {}
    for r in req_rows:
        k = (r["run"], r["instance"])
        if k not in used_keys:
            continue
        reqs_by_key.setdefault(k, []).append(_Req(
            r["_idx"], k, r["slot"], r["task"], r["seq"], r["prompt_tokens"], r["gen_tokens"], r["http_status"], r["total_ms"],
            _secs(r["t_start"]), _secs(r["t_end"]), r["elapsed_start_s"], r["elapsed_end_s"], r["path"]))
    offsets: dict[InstKey, float] = {}
    tolerance: dict[InstKey, float] = {}
    for k in used_keys:
        rs = reqs_by_key.get(k, [])
        basis = (inst_by_key.get(k) or {}).get("time_basis")
        if not rs or all(r.t0 is not None for r in rs):
            continue
        if all(r.e0 is None for r in rs):
            continue  # order: no time on the lines
        if k in launched:
            off, how = launched[k], "the manifest's launched_at"
        elif (inst_by_key.get(k) or {}).get("started_at") is not None and basis == "elapsed":
            off, how = _secs(inst_by_key[k]["started_at"]) or 0.0, "the instance's start time"
        else:
            mine = [a for a, ks in zip(att_rows, att_keys, strict=True) if k in ks and a["_t0"] is not None]
            starts = [a["_t0"] for a in mine]
            if not starts:
                notes.append(f"{k[1]}: elapsed times but no attempts with send times to anchor them")
                continue
            by_tokens: dict[tuple[int, int], list[_Req]] = {}
            for r in rs:
                if r.e0 is not None and r.prompt_tokens is not None and r.gen_tokens is not None:
                    by_tokens.setdefault((r.prompt_tokens, r.gen_tokens), []).append(r)
            pairs = [(a["_t0"], r.e0) for a in mine
                     if a["tokens_evaluated"] is not None and a["tokens_predicted"] is not None
                     for r in by_tokens.get((a["tokens_evaluated"], a["tokens_predicted"]), ())
                     if a["id_slot"] is None or a["id_slot"] == r.slot]
            off, cost = _align(starts, pairs, [r.e0 for r in rs if r.e0 is not None])
            tolerance[k] = max(TOLERANCE_S, 2 * cost)
            how = f"aligning attempts with requests (median distance {cost:.3f} s)"
        offsets[k] = off
        notes.append(f"{k[1]}: elapsed times anchored at {_dt(off).isoformat().replace('+00:00', 'Z')} by {how}")
        for r in rs:
            if r.t0 is None and r.e0 is not None:
                r.t0 = off + r.e0
            if r.t1 is None and r.e1 is not None:
                r.t1 = off + r.e1

    index = {k: _Index(reqs_by_key.get(k, [])) for k in used_keys}
    # match: attempts with server-side evidence (slot or tokens) first, then the rest, each in send order
    order = sorted(range(len(att_rows)), key=lambda i: (
        not (att_rows[i]["id_slot"] is not None or att_rows[i]["tokens_evaluated"] is not None),
        att_rows[i]["_t0"] if att_rows[i]["_t0"] is not None else float("inf"), i))
    results: dict[int, dict[str, Any]] = {}
    assigned: dict[int, dict[str, Any]] = {}  # request idx -> attempt row
    for i in order:
        a, keys = att_rows[i], att_keys[i]
        res = {"run": a["run"], "item": a["item"], "stage": a["stage"], "attempt": a["attempt"]}
        if not keys:
            results[i] = {**res, "match": "unmatched", "reason": "no_instance"}
            continue
        cands: list[tuple[float, _Req, str]] = []
        for k in keys:
            for r in _candidates(index, k, a, tolerance.get(k, TOLERANCE_S)):
                if r.used:
                    continue
                ev = []
                if a["id_slot"] is not None and r.slot is not None:
                    if a["id_slot"] != r.slot:
                        continue
                    ev.append("slot")
                if a["tokens_evaluated"] is not None and r.prompt_tokens is not None:
                    if a["tokens_evaluated"] != r.prompt_tokens:
                        continue
                    ev.append("tokens")
                if a["tokens_predicted"] is not None and r.gen_tokens is not None:
                    if a["tokens_predicted"] != r.gen_tokens:
                        continue
                    if "tokens" not in ev:
                        ev.append("tokens")
                if a["http_status"] is not None and r.http_status is not None:
                    if a["http_status"] != r.http_status:
                        continue
                    ev.append("status")
                if r.t0 is not None and a["_t0"] is not None:
                    tol = tolerance.get(k, TOLERANCE_S)
                    hi = (a["_t1"] if a["_t1"] is not None else a["_t0"] + 86400.0) + tol
                    if not (a["_t0"] - tol <= r.t0 <= hi):
                        continue
                    ev.append("time")
                    score = abs(r.t0 - a["_t0"])
                else:
                    ev.append("order")
                    score = float(r.seq if r.seq is not None else r.idx)
                cands.append((score, r, "+".join(ev)))
        if not cands:
            st = a["http_status"]
            if st is not None and st >= 400:
                reason = "rejected_before_slot"
            elif a["outcome"] == "timeout":
                reason = "client_timeout"
            elif a["outcome"] == "cancelled":
                reason = "client_cancelled"
            else:
                reason = "no_slot_request"
            results[i] = {**res, "match": "unmatched", "reason": reason}
            continue
        cands.sort(key=lambda c: (c[0], c[1].idx))
        best = cands[0]
        ambiguous = False
        if len(cands) > 1:
            second = cands[1]
            if set(best[2].split("+")) - set(second[2].split("+")):
                ambiguous = False  # the best has evidence the next one lacks (status, tokens, slot)
            elif "time" in best[2]:
                ambiguous = (second[0] - best[0]) < AMBIGUOUS_S
            else:
                # order on a slot decides when the slot is known; otherwise several requests fit
                ambiguous = "slot" not in best[2]
        r = best[1]
        out = {**res, "instance": r.key[1], "path": r.path, "slot": r.slot, "task": r.task, "seq": r.seq,
               "offset_s": offsets.get(r.key)}
        if ambiguous:
            results[i] = {**out, "match": "ambiguous", "reason": f"{len(cands)} candidates ({best[2]})"}
            continue
        r.used = True
        assigned[r.idx] = a
        results[i] = {**out, "match": "matched", "reason": best[2]}

    # order logs: times from the attempts that the requests served, then along each slot
    for k in used_keys:
        rs = reqs_by_key.get(k, [])
        if not rs or any(r.t0 is not None for r in rs):
            continue
        for r in rs:
            a = assigned.get(r.idx)
            if a is not None and a["_t0"] is not None:
                r.t0 = a["_t0"]
                r.t1 = r.t0 + r.total_ms / 1000.0 if r.total_ms is not None else a["_t1"]
        by_slot: dict[Any, list[_Req]] = {}
        for r in rs:
            by_slot.setdefault(r.slot, []).append(r)
        for lst in by_slot.values():
            lst.sort(key=lambda r: (r.seq if r.seq is not None else r.idx))
            for j, r in enumerate(lst):  # forwards: start when the previous request on the slot ended
                if r.t0 is None and j > 0 and lst[j - 1].t1 is not None:
                    r.t0 = lst[j - 1].t1
                    r.t1 = r.t0 + (r.total_ms or 0.0) / 1000.0
            for j in range(len(lst) - 1, -1, -1):  # backwards: end when the next one started
                r = lst[j]
                if r.t0 is None and j + 1 < len(lst) and lst[j + 1].t0 is not None:
                    r.t1 = lst[j + 1].t0
                    r.t0 = r.t1 - (r.total_ms or 0.0) / 1000.0
        if any(r.t0 is not None for r in rs):
            notes.append(f"{k[1]}: no time on the lines; request times estimated from the attempts they served "
                         "and the order on each slot")

    match_rows = [results[i] for i in range(len(att_rows))]
    matches = schema.conform(pl.DataFrame(match_rows, infer_schema_length=None), "matches") if match_rows \
        else schema.empty("matches")
    # requests of the used instances, with times and the run each belongs to
    out_rows = []
    runs_of_key: dict[InstKey, set[str]] = {}
    for a, ks in zip(att_rows, att_keys, strict=True):
        for k in ks:
            runs_of_key.setdefault(k, set()).add(a["run"])
    for k in used_keys:
        for r in reqs_by_key.get(k, []):
            a = assigned.get(r.idx)
            run = a["run"] if a is not None else None
            if run is None and r.t0 is not None:
                for cand in sorted(runs_of_key.get(k, ())):
                    lo, hi = windows.get(cand, (None, None))
                    if lo is not None and hi is not None and lo - TOLERANCE_S <= r.t0 <= hi + TOLERANCE_S:
                        run = cand
                        break
            if run is None and len(runs_of_key.get(k, ())) == 1 and r.t0 is None:
                run = next(iter(runs_of_key[k]))
            out_rows.append({"_idx": r.idx, "t_start": _dt(r.t0), "t_end": _dt(r.t1), "replay_run": run,
                             "item": a["item"] if a else None, "stage": a["stage"] if a else None,
                             "attempt": a["attempt"] if a else None, "_cap": a["max_tokens"] if a else None})
    if out_rows:
        extra = pl.DataFrame(out_rows, schema={"_idx": pl.UInt32, "t_start": schema.TS, "t_end": schema.TS,
                                               "replay_run": pl.String, "item": pl.String, "stage": pl.String,
                                               "attempt": pl.Int64, "_cap": pl.Int64})
        base = req.with_row_index("_idx").drop("t_start", "t_end", "replay_run", strict=False)
        joined = _own_cap(base.join(extra, on="_idx", how="inner").sort("_idx").drop("_idx"))
        cols = [c.name for c in schema.REQUESTS] + ["item", "stage", "attempt"]
        req_out = joined.select(cols)
    else:
        req_out = schema.empty("requests").with_columns(pl.lit(None, pl.String).alias("item"),
            pl.lit(None, pl.String).alias("stage"), pl.lit(None, pl.Int64).alias("attempt"))
    return JoinResult(matches, req_out, notes)


def _own_cap(req: pl.DataFrame) -> pl.DataFrame:
    """A request that generated as many tokens as its own cap (the attempt's ``max_tokens``, which the log
    may not show) was stopped by that cap: its stop reason is ``limit``, not ``eos``."""
    capped = (pl.col("_cap") > 0) & (pl.col("gen_tokens") >= pl.col("_cap")) & (pl.col("stop_reason") == "eos")
    return req.with_columns(pl.when(capped).then(pl.lit("limit")).otherwise(pl.col("stop_reason"))
                            .alias("stop_reason")).drop("_cap")


def join_store(store: Any) -> JoinResult:
    """``join`` over the store's ``requests``, ``instances``, ``runs`` and ``attempts`` tables."""
    return join(store.table("requests"), store.table("instances"), store.table("runs"), store.table("attempts"))

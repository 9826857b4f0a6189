"""The join: match every attempt the harness made to the server request (a ``requests`` row) that
served it, and give every server request of a run an absolute time.

Keys, strongest first: the instance (the attempt's ``server`` -> the manifest's servers entry -> the
instance whose log file (or else port) it names; never a process name), the slot (``id_slot``), the
token counts (``tokens_evaluated`` = ``prompt_tokens``, ``tokens_predicted`` = ``gen_tokens``), and time
(request start within the attempt's send..end window) where the log has time, else the order of the
requests on the slot.  Elapsed-time logs are anchored to wall-clock time by the server's ``launched_at``
from the manifest, else the instance's known start, else the offset that best aligns the attempts' send
times with the requests' starts (least median distance).

Every step works on whole tables (polars, numpy): the candidate pairs (attempt, request) come from one
join per instance, and the greedy choice "each attempt, in order, takes its best request not taken by
an earlier attempt" is found as the fixed point of a table-wide step (see ``_assign``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, overload

import numpy as np
import polars as pl

from forensics import schema
from forensics.paths import file_stem

TOLERANCE_S = 1.0  # slack around the attempt's window for request starts (absolute time)
AMBIGUOUS_S = 0.5  # two candidates whose starts are this close to the send time cannot be told apart
ALIGN_CANDIDATE_ATTEMPTS = 8
ALIGN_CHUNK_CELLS = 4_000_000  # offsets x attempts scored at once when aligning (bounds memory)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
NO_END_S = 86400.0  # an attempt without an end time may be served up to a day after its send

InstKey = tuple[str, str]  # (store run partition, instance id)
KEY = ["krun", "kinst"]  # the instance key's columns in the frames below


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
        for m, n in self.matches.group_by("match", maintain_order=True).len().iter_rows():
            c[m] = c.get(m, 0) + n
        return c


def _secs(dt: datetime | None) -> float | None:
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return (dt - EPOCH).total_seconds()


@overload
def _dt(s: float) -> datetime: ...
@overload
def _dt(s: float | None) -> datetime | None: ...
def _dt(s: float | None) -> datetime | None:
    if s is None:
        return None
    return datetime.fromtimestamp(round(s, 6), tz=timezone.utc)


def _divided(expr: pl.Expr, by: float) -> pl.Expr:
    """``expr / by`` rounded as Python rounds it: polars may multiply by the reciprocal instead, which
    can miss by one unit in the last place (and move a time by a microsecond)."""
    def divide(s: pl.Series) -> pl.Series:
        return pl.Series(s.name, s.cast(pl.Float64).to_numpy() / by, dtype=pl.Float64).fill_nan(None)

    return expr.map_batches(divide, return_dtype=pl.Float64)


def _secs_expr(col: str) -> pl.Expr:
    """``_secs`` on a datetime column: seconds since the epoch (naive times are UTC)."""
    return _divided(pl.col(col).dt.epoch("us"), 1e6).alias(col)


def _round6(x: np.ndarray) -> np.ndarray:
    """Python's ``round(x, 6)`` (correctly rounded) for an array: split off the whole seconds first, so
    scaling the fraction to microseconds loses nothing that decides the rounding."""
    whole = np.floor(x)
    micros = whole * 1e6 + np.rint((x - whole) * 1e6)
    return micros / 1e6


def _to_datetime(s: pl.Series) -> pl.Series:
    """``_dt`` on a column of seconds: the nearest microsecond, as a UTC timestamp."""
    x = s.to_numpy(allow_copy=True).astype(np.float64)
    valid = ~np.isnan(x)
    whole = np.floor(np.where(valid, x, 0.0))
    micros = whole.astype(np.int64) * 1_000_000 + np.rint((np.where(valid, x, 0.0) - whole) * 1e6).astype(np.int64)
    out = pl.Series(s.name, micros).cast(pl.Datetime("us")).dt.replace_time_zone("UTC")
    return out.set(pl.Series(~valid), None).cast(schema.TS)


def _resolved(p: str | None) -> str | None:
    if not p:
        return None
    try:
        return str(Path(p).resolve())
    except OSError:
        return p


def _instances_for(run: str, server: str | None, servers: dict[str, dict[str, Any]],
                   inst_rows: list[dict[str, Any]]) -> list[InstKey]:
    """Instances an attempt's ``server`` names: by the manifest's log file, else its port; without a
    manifest entry, an instance whose id or log-file stem is the server name, else the instances of the
    run's own partition."""
    s = servers.get(server or "") if server is not None else None
    if s is not None:
        log_path, log_file, port = s.get("log_path"), s.get("log_file"), s.get("port")
        hits = [r for r in inst_rows if log_path and r["resolved"] == log_path]
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


def _manifest_servers(runs: pl.DataFrame) -> dict[str, dict[str, dict[str, Any]]]:
    """Each run's manifest servers by name (a run listed twice: its last row)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run, servers in runs.select("run", "servers").iter_rows() if runs.height else []:
        try:
            lst = json.loads(servers) if servers else []
        except json.JSONDecodeError:
            lst = []
        out[run] = {s["name"]: s for s in lst if isinstance(s, dict) and s.get("name")}
    return out


def _attempt_frame(attempts: pl.DataFrame) -> pl.DataFrame:
    """The attempts with their row number ``_a``, send/end in seconds (``t0``/``t1``) and ``rank``, the
    order they are matched in: attempts with server-side evidence (slot or tokens) first, then the rest,
    each in send order."""
    if not attempts.height:
        attempts = schema.empty("attempts")
    att = attempts.with_row_index("_a").with_columns(
        _secs_expr("started_at").alias("t0"), _secs_expr("ended_at").alias("t1"))
    weak = ~(pl.col("id_slot").is_not_null() | pl.col("tokens_evaluated").is_not_null())
    order = att.select("_a", weak.alias("_weak"), pl.col("t0").fill_null(float("inf")).alias("_t")) \
        .sort("_weak", "_t", "_a").with_row_index("rank").select("_a", "rank")
    return att.join(order, on="_a").sort("_a")


def _run_windows(runs: pl.DataFrame, att: pl.DataFrame) -> pl.DataFrame:
    """Each run's time window (``lo``, ``hi`` in seconds): the manifest's start and end when it has both,
    else widened to the attempts' send and end times."""
    declared = runs.select("run", _secs_expr("started_at").alias("w0"), _secs_expr("ended_at").alias("w1")) \
        .unique("run", keep="last", maintain_order=True) if runs.height else \
        pl.DataFrame(schema={"run": pl.String, "w0": pl.Float64, "w1": pl.Float64})
    seen = att.group_by("run").agg(pl.col("t0").min().alias("a0"),
                                   pl.max_horizontal(pl.col("t1").max(), pl.col("t0").max()).alias("a1"))
    w = declared.join(seen, on="run", how="full", coalesce=True)
    fixed = pl.col("w0").is_not_null() & pl.col("w1").is_not_null()
    return w.select("run", pl.when(fixed).then("w0").otherwise(pl.min_horizontal("w0", "a0")).alias("lo"),
                    pl.when(fixed).then("w1").otherwise(pl.max_horizontal("w1", "a1")).alias("hi"))


def _attempt_instances(att: pl.DataFrame, inst_rows: list[dict[str, Any]],
                       servers_by_run: dict[str, dict[str, dict[str, Any]]]) -> tuple[pl.DataFrame, dict[InstKey, float]]:
    """Which instances each attempt may have reached (``_a``, ``krun``, ``kinst``; an instance listed
    twice counts twice), resolved once per (run, server); and the manifest's launch time per instance
    (the first attempt's server that names one wins)."""
    pairs = att.select("run", "server").unique(maintain_order=True)
    rows: list[tuple[str, str | None, str, str]] = []
    launched: dict[InstKey, float] = {}
    for run, server in pairs.iter_rows():
        servers = servers_by_run.get(run, {})
        keys = _instances_for(run, server, servers, inst_rows)
        rows.extend((run, server, k[0], k[1]) for k in keys)
        s = servers.get(server or "")
        if s and s.get("launched_at"):
            for k in keys:
                launched.setdefault(k, _secs(datetime.fromisoformat(s["launched_at"].replace("Z", "+00:00"))) or 0.0)
    by_server = pl.DataFrame(rows, schema={"run": pl.String, "server": pl.String, "krun": pl.String,
                                           "kinst": pl.String}, orient="row")
    ak = att.select("_a", "run", "server").join(by_server, on=["run", "server"], nulls_equal=True) \
        .sort("_a", maintain_order=True).select("_a", "krun", "kinst")
    return ak, launched


def _server_requests(req: pl.DataFrame, used: pl.DataFrame) -> pl.DataFrame:
    """The requests of the instances some attempt may have reached, times in seconds (``t0``/``t1``,
    elapsed ``e0``/``e1``)."""
    r = req.with_row_index("_idx").rename({"run": "krun", "instance": "kinst"})
    r = r.join(used, on=KEY, how="semi").sort("_idx")
    return r.select("_idx", *KEY, "slot", "task", "seq", "prompt_tokens", "gen_tokens", "http_status", "total_ms",
                    _secs_expr("t_start").alias("t0"), _secs_expr("t_end").alias("t1"),
                    pl.col("elapsed_start_s").alias("e0"), pl.col("elapsed_end_s").alias("e1"), "path")


def _align(att_starts: list[float], att_pairs: list[tuple[float, float]], req_starts: list[float]) -> tuple[float, float]:
    """The offset o minimising the median over attempts of min |send - (o + request start)|, and that
    median.  Candidates come from token-identified pairs when there are any, else from the first
    attempts against every request; the first candidate wins ties closer than a nanosecond."""
    rs = np.sort(np.asarray(req_starts, dtype=np.float64))
    if att_pairs:
        a, r = np.asarray(att_pairs, dtype=np.float64).T
        cands = np.unique(_round6(a - r))
    else:
        first = np.sort(np.asarray(att_starts, dtype=np.float64))[:ALIGN_CANDIDATE_ATTEMPTS]
        cands = np.unique(_round6((first[:, None] - rs[None, :]).ravel()))
    starts = np.asarray(att_starts, dtype=np.float64)
    costs = np.empty(len(cands))
    step = max(1, ALIGN_CHUNK_CELLS // max(1, len(starts)))
    for lo in range(0, len(cands), step):  # chunks of candidate offsets, each scored at once
        x = starts[None, :] - cands[lo:lo + step, None]
        i = np.searchsorted(rs, x, side="left")
        left = np.abs(x - rs[np.clip(i - 1, 0, len(rs) - 1)])
        right = np.abs(x - rs[np.clip(i, 0, len(rs) - 1)])
        d = np.minimum(np.where(i > 0, left, np.inf), np.where(i < len(rs), right, np.inf))
        costs[lo:lo + step] = np.median(d, axis=1)
    best = int(np.argmin(costs))
    if np.any((costs > costs[best]) & (costs <= costs[best] + 1e-9)):  # near-ties: the first that beats by 1 ns
        best, best_cost = 0, float("inf")
        for j, c in enumerate(costs.tolist()):
            if c < best_cost - 1e-9:
                best, best_cost = j, c
    return float(cands[best]), float(costs[best])


@dataclass
class _Anchors:
    """How the elapsed-time instances were put on the wall clock: the offset and match tolerance per
    instance, and a note for each."""

    offsets: dict[InstKey, float] = field(default_factory=dict)
    tolerance: dict[InstKey, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _anchor_offset(key: InstKey, rs: pl.DataFrame, inst_row: dict[str, Any], launched: dict[InstKey, float],
                   mine: pl.DataFrame, anchors: _Anchors) -> tuple[float, str] | None:
    """The wall-clock offset of one elapsed-time instance and how it was found (None: nothing to anchor by)."""
    if key in launched:
        return launched[key], "the manifest's launched_at"
    if inst_row.get("started_at") is not None and inst_row.get("time_basis") == "elapsed":
        return _secs(inst_row["started_at"]) or 0.0, "the instance's start time"
    mine = mine.filter(pl.col("t0").is_not_null())
    if not mine.height:
        anchors.notes.append(f"{key[1]}: elapsed times but no attempts with send times to anchor them")
        return None
    by_tokens = rs.filter(pl.col("e0").is_not_null() & pl.col("prompt_tokens").is_not_null()
                          & pl.col("gen_tokens").is_not_null())
    pairs = mine.filter(pl.col("tokens_evaluated").is_not_null() & pl.col("tokens_predicted").is_not_null()) \
        .join(by_tokens, left_on=["tokens_evaluated", "tokens_predicted"], right_on=["prompt_tokens", "gen_tokens"]) \
        .filter(pl.col("id_slot").is_null() | (pl.col("id_slot") == pl.col("slot")))
    off, cost = _align(mine["t0"].to_list(), list(zip(pairs["t0"].to_list(), pairs["e0"].to_list(), strict=True)),
                       rs["e0"].drop_nulls().to_list())
    anchors.tolerance[key] = max(TOLERANCE_S, 2 * cost)
    return off, f"aligning attempts with requests (median distance {cost:.3f} s)"


def _anchor(reqs: pl.DataFrame, inst_by_key: dict[InstKey, dict[str, Any]], launched: dict[InstKey, float],
            att: pl.DataFrame, ak: pl.DataFrame) -> tuple[pl.DataFrame, _Anchors]:
    """Give the requests of elapsed-time instances wall-clock times (``t0``/``t1``); one pass per
    instance, each a column operation."""
    anchors = _Anchors()
    used = sorted(set(ak.select(KEY).iter_rows()))
    per_key = {k: g for k, g in reqs.partition_by(KEY, as_dict=True, maintain_order=True).items()}
    for k in used:
        rs = per_key.get(k)
        if rs is None or rs["t0"].null_count() == 0 or rs["e0"].null_count() == rs.height:
            continue  # nothing to anchor: absolute times, or none at all (order)
        mine = att.join(ak.filter((pl.col("krun") == k[0]) & (pl.col("kinst") == k[1])).select("_a").unique(),
                        on="_a", how="semi")
        found = _anchor_offset(k, rs, inst_by_key.get(k) or {}, launched, mine, anchors)
        if found is None:
            continue
        off, how = found
        anchors.offsets[k] = off
        anchors.notes.append(f"{k[1]}: elapsed times anchored at {_dt(off).isoformat().replace('+00:00', 'Z')} by {how}")
    if not anchors.offsets:
        return reqs, anchors
    offsets = pl.DataFrame([(k[0], k[1], o) for k, o in anchors.offsets.items()],
                           schema={"krun": pl.String, "kinst": pl.String, "_off": pl.Float64}, orient="row")
    reqs = reqs.join(offsets, on=KEY, how="left").sort("_idx").with_columns(
        pl.coalesce("t0", pl.col("_off") + pl.col("e0")).alias("t0"),
        pl.coalesce("t1", pl.col("_off") + pl.col("e1")).alias("t1")).drop("_off")
    return reqs, anchors


def _ranged_pairs(left: pl.DataFrame, reqs: pl.DataFrame) -> pl.DataFrame:
    """(``_k``, ``_idx``) for attempts with a send time on instances whose requests all have a start:
    the requests starting in the attempt's window, found by binary search on the sorted starts."""
    out = [pl.DataFrame(schema={"_k": pl.UInt32, "_idx": pl.UInt32})]
    sent = left.filter(pl.col("timed") & pl.col("a_t0").is_not_null())
    by_key = reqs.partition_by(KEY, as_dict=True)
    for k, mine in sent.partition_by(KEY, as_dict=True, maintain_order=True).items():
        rs = by_key[k].sort("t0", "_idx")
        starts = rs["t0"].to_numpy()
        lo_i = np.searchsorted(starts, (mine["a_t0"] - mine["_tol"]).to_numpy(), side="left")
        hi_i = np.searchsorted(starts, mine["a_hi"].to_numpy(), side="right")
        n = np.maximum(hi_i - lo_i, 0)
        pos = np.repeat(lo_i, n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
        out.append(pl.DataFrame({"_k": np.repeat(mine["_k"].to_numpy(), n), "_idx": rs["_idx"].to_numpy()[pos]},
                                schema={"_k": pl.UInt32, "_idx": pl.UInt32}))
    return pl.concat(out)


def _pairs(att: pl.DataFrame, ak: pl.DataFrame, reqs: pl.DataFrame,
           tolerance: dict[InstKey, float]) -> pl.DataFrame:
    """Every (attempt, request) that could have served it, with its evidence and score (a smaller
    score is a better candidate)."""
    per_key = reqs.group_by(KEY).agg(pl.col("t0").is_not_null().all().alias("timed"),
                                     pl.col("slot").unique().alias("_slots"))
    tol = pl.DataFrame([(k[0], k[1], t) for k, t in tolerance.items()],
                       schema={"krun": pl.String, "kinst": pl.String, "_tol": pl.Float64}, orient="row")
    a_cols = ["_a", "rank", "id_slot", "tokens_evaluated", "tokens_predicted", pl.col("http_status").alias("a_http"),
              pl.col("t0").alias("a_t0"), pl.col("t1").alias("a_t1")]
    # one row per (attempt, instance it names): an instance listed twice gives its candidates twice
    left = ak.with_row_index("_k").join(att.select(a_cols), on="_a").join(per_key, on=KEY) \
        .join(tol, on=KEY, how="left").with_columns(pl.col("_tol").fill_null(TOLERANCE_S))
    left = left.with_columns(
        (pl.coalesce("a_t1", pl.col("a_t0") + NO_END_S) + pl.col("_tol")).alias("a_hi"),
        # on an instance without times, a known slot picks that slot's requests only (not those without one)
        (~pl.col("timed") & pl.col("id_slot").is_not_null() & pl.col("_slots").list.contains(pl.col("id_slot")))
        .fill_null(False).alias("own_slot")).drop("_slots")
    ranged = _ranged_pairs(left, reqs).join(left, on="_k").join(reqs.drop(KEY), on="_idx")
    rest = left.filter(~(pl.col("timed") & pl.col("a_t0").is_not_null()))
    on_slot = rest.filter("own_slot").join(reqs, left_on=[*KEY, "id_slot"], right_on=[*KEY, "slot"]) \
        .with_columns(pl.col("id_slot").alias("slot"))
    any_slot = rest.filter(~pl.col("own_slot")).join(reqs, on=KEY)
    return _evidence(pl.concat([ranged, on_slot, any_slot], how="diagonal"))


def _evidence(p: pl.DataFrame) -> pl.DataFrame:
    """Drop the pairs whose slot, tokens, status or time contradict; name the evidence of the rest."""
    def both(a: str, b: str) -> pl.Expr:
        return pl.col(a).is_not_null() & pl.col(b).is_not_null()

    ok = (~both("id_slot", "slot") | (pl.col("id_slot") == pl.col("slot"))) \
        & (~both("tokens_evaluated", "prompt_tokens") | (pl.col("tokens_evaluated") == pl.col("prompt_tokens"))) \
        & (~both("tokens_predicted", "gen_tokens") | (pl.col("tokens_predicted") == pl.col("gen_tokens"))) \
        & (~both("a_http", "http_status") | (pl.col("a_http") == pl.col("http_status"))) \
        & (~both("t0", "a_t0") | ((pl.col("a_t0") - pl.col("_tol") <= pl.col("t0")) & (pl.col("t0") <= pl.col("a_hi"))))
    p = p.filter(ok.fill_null(True))
    ev_slot, ev_time = both("id_slot", "slot"), both("t0", "a_t0")
    ev_tokens = both("tokens_evaluated", "prompt_tokens") | both("tokens_predicted", "gen_tokens")
    ev_status = both("a_http", "http_status")
    ev = pl.concat_str([pl.when(ev_slot).then(pl.lit("slot+")).otherwise(pl.lit("")),
                        pl.when(ev_tokens).then(pl.lit("tokens+")).otherwise(pl.lit("")),
                        pl.when(ev_status).then(pl.lit("status+")).otherwise(pl.lit("")),
                        pl.when(ev_time).then(pl.lit("time")).otherwise(pl.lit("order"))])
    score = pl.when(ev_time).then((pl.col("t0") - pl.col("a_t0")).abs()) \
        .otherwise(pl.coalesce(pl.col("seq"), pl.col("_idx").cast(pl.Int64)).cast(pl.Float64))
    return p.with_columns(ev.alias("ev"), score.alias("score"), ev_slot.alias("ev_slot"),
                          ev_tokens.alias("ev_tokens"), ev_status.alias("ev_status"), ev_time.alias("ev_time")) \
        .select("_a", "rank", "_idx", *KEY, "path", "slot", "task", "seq", "ev", "score",
                "ev_slot", "ev_tokens", "ev_status", "ev_time").sort("rank", "score", "_idx", maintain_order=True)


def _choose(avail: pl.DataFrame) -> pl.DataFrame:
    """Each attempt's pick among its available candidates (sorted best first): the best one, matched
    unless the next one is as good (same evidence, and a start as close in time, or no slot to order by)."""
    g = avail.with_columns(pl.int_range(pl.len()).over("_a").alias("_pos"), pl.len().over("_a").alias("_n"))
    flags = ["ev_slot", "ev_tokens", "ev_status", "ev_time"]
    second = g.filter(pl.col("_pos") == 1).select("_a", pl.col("score").alias("s_score"),
                                                  *[pl.col(f).alias(f"s_{f}") for f in flags])
    b = g.filter(pl.col("_pos") == 0).join(second, on="_a", how="left")
    lacks = pl.any_horizontal(*[pl.col(f) & ~pl.col(f"s_{f}") for f in flags], ~pl.col("ev_time") & pl.col("s_ev_time"))
    close = pl.when(pl.col("ev_time")).then((pl.col("s_score") - pl.col("score")) < AMBIGUOUS_S) \
        .otherwise(~pl.col("ev_slot"))
    ambiguous = (pl.col("_n") > 1) & ~lacks.fill_null(False) & close
    return b.with_columns(
        pl.when(ambiguous).then(pl.lit("ambiguous")).otherwise(pl.lit("matched")).alias("match"),
        pl.when(ambiguous).then(pl.format("{} candidates ({})", "_n", "ev")).otherwise("ev").alias("reason"))


def _guess(live: pl.DataFrame, picks: pl.DataFrame) -> pl.DataFrame:
    """A guess of who takes what (``_idx``, ``rank``): of the attempts that matched in the last step,
    those whose best candidate is the same take, in rank order, their first, second, ... candidate (the
    n-th attempt on a slot of a log without times takes the n-th request on it)."""
    matched = picks.filter(pl.col("match") == "matched").select("_a")
    pos = live.join(matched, on="_a", how="semi").with_columns(pl.int_range(pl.len()).over("_a").alias("_pos"))
    best = pos.filter(pl.col("_pos") == 0).select("_a", "rank", "_idx")
    nth = best.sort("rank").with_columns(pl.int_range(pl.len()).over("_idx").alias("_pos")).select("_a", "_pos")
    return pos.join(nth, on=["_a", "_pos"]).select("_idx", "rank")


def _step(live: pl.DataFrame, guess: pl.DataFrame) -> pl.DataFrame:
    """Every attempt's pick when the requests the guess gives to an earlier attempt are taken."""
    taken = guess.group_by("_idx").agg(pl.col("rank").min().alias("_by"))
    avail = live.join(taken, on="_idx", how="left") \
        .filter(pl.col("_by").is_null() | (pl.col("_by") >= pl.col("rank"))) \
        .drop("_by").sort("rank", "score", "_idx", maintain_order=True)
    return _choose(avail)


def _assign(pairs: pl.DataFrame) -> pl.DataFrame:
    """The attempts' picks when each, in rank order, takes its best request that no earlier attempt took.

    An attempt's pick depends only on what earlier attempts took.  So from any guess of who took what,
    one step (every attempt picks under the guess) is exact up to and including the first attempt whose
    pick differs from the guess: those picks are final, the rest start again from a new guess.  A guess
    that reproduces itself is the answer; a good guess settles a run in a step or two."""
    final: list[pl.DataFrame] = []
    live = pairs
    guess = _guess(live, _step(live, pairs.select("_idx", "rank").clear()))
    while True:
        picks = _step(live, guess)
        mine = picks.filter(pl.col("match") == "matched").select("_a", pl.col("_idx").alias("_mine"))
        said = guess.join(live.select("_a", "rank", "_idx"), on=["rank", "_idx"]).select("_a", pl.col("_idx").alias("_said"))
        differ = live.select("_a", "rank").unique().join(mine, on="_a", how="left").join(said, on="_a", how="left") \
            .filter(pl.col("_mine").ne_missing(pl.col("_said")))
        if not differ.height:
            return pl.concat([*final, picks])
        upto = differ["rank"].min()
        final.append(picks.filter(pl.col("rank") <= upto))
        gone = final[-1].filter(pl.col("match") == "matched").select("_idx")
        live = live.filter(pl.col("rank") > upto).join(gone, on="_idx", how="anti").sort("rank", "score", "_idx")
        guess = _guess(live, picks)


def _unmatched_reason() -> pl.Expr:
    st = pl.col("http_status")
    return pl.when(st.is_not_null() & (st >= 400)).then(pl.lit("rejected_before_slot")) \
        .when(pl.col("outcome") == "timeout").then(pl.lit("client_timeout")) \
        .when(pl.col("outcome") == "cancelled").then(pl.lit("client_cancelled")) \
        .otherwise(pl.lit("no_slot_request"))


def _matches(att: pl.DataFrame, ak: pl.DataFrame, picks: pl.DataFrame, offsets: dict[InstKey, float]) -> pl.DataFrame:
    """The ``matches`` table: one row per attempt, in the attempts' order."""
    if not att.height:
        return schema.empty("matches")
    off = pl.DataFrame([(k[0], k[1], o) for k, o in offsets.items()],
                       schema={"krun": pl.String, "kinst": pl.String, "offset_s": pl.Float64}, orient="row")
    got = picks.join(off, on=KEY, how="left").select("_a", pl.col("kinst").alias("instance"), "path", "slot", "task",
                                                       "seq", "offset_s", "match", "reason")
    m = att.select("_a", "run", "item", "stage", "attempt", "http_status", "outcome") \
        .join(got, on="_a", how="left").join(ak.select("_a").unique().with_columns(pl.lit(True).alias("_keyed")),
                                             on="_a", how="left").sort("_a")
    m = m.with_columns(
        pl.coalesce("match", pl.lit("unmatched")).alias("match"),
        pl.when(pl.col("match").is_not_null()).then("reason")
        .when(pl.col("_keyed").is_null()).then(pl.lit("no_instance")).otherwise(_unmatched_reason()).alias("reason"))
    return schema.conform(m, "matches")


def _order_times(reqs: pl.DataFrame, served: pl.DataFrame) -> tuple[pl.DataFrame, list[InstKey]]:
    """Times for the requests of instances with no time on the lines: a request an attempt was matched
    to starts at the attempt's send; along each slot, the others start when the previous one ended
    (forwards), else end when the next one started (backwards).  Returns the instances that got times."""
    untimed = reqs.group_by(KEY).agg(pl.col("t0").is_null().all().alias("_untimed"))
    r = reqs.join(untimed, on=KEY).join(served.select("_idx", "a_t0", "a_t1"), on="_idx", how="left")
    from_attempt = pl.col("_untimed") & pl.col("a_t0").is_not_null()
    r = r.with_columns(
        pl.when(from_attempt).then("a_t0").otherwise("t0").alias("t0"),
        pl.when(from_attempt).then(pl.when(pl.col("total_ms").is_not_null())
                                   .then(pl.col("a_t0") + _divided(pl.col("total_ms"), 1000.0)).otherwise("a_t1"))
        .otherwise("t1").alias("t1"),
        _divided(pl.col("total_ms").fill_null(0.0), 1000.0).alias("_d"),
        pl.coalesce(pl.col("seq"), pl.col("_idx").cast(pl.Int64)).alias("_ord"))
    slot = [*KEY, "slot"]
    # forwards: a run of unknown starts after a request with an end continues from that end
    r = r.sort(*slot, "_ord", "_idx", nulls_last=False).with_columns(
        pl.col("t0").is_not_null().cum_sum().over(slot).alias("_seg"))
    seg = [*slot, "_seg"]
    cum = pl.when(pl.col("t0").is_not_null()).then("t1").otherwise("_d").cum_sum().over(seg)
    fill = pl.col("_untimed") & pl.col("t0").is_null() & (pl.col("_seg") > 0) & pl.col("t1").first().over(seg).is_not_null()
    r = r.with_columns(_cum=cum).with_columns(
        pl.when(fill).then(pl.col("_cum").shift(1).over(seg)).otherwise("t0").alias("t0"),
        pl.when(fill).then("_cum").otherwise("t1").alias("t1"))
    # backwards: a run of unknown starts before a known start ends where the next one starts
    r = r.sort(*slot, "_ord", "_idx", descending=[False, False, False, True, True], nulls_last=False).with_columns(
        pl.col("t0").is_not_null().cum_sum().over(slot).alias("_seg"))
    cum = pl.when(pl.col("t0").is_not_null()).then("t0").otherwise(-pl.col("_d")).cum_sum().over(seg)
    fill = pl.col("_untimed") & pl.col("t0").is_null() & (pl.col("_seg") > 0)
    r = r.with_columns(_cum=cum).with_columns(
        pl.when(fill).then("_cum").otherwise("t0").alias("t0"),
        pl.when(fill).then(pl.col("_cum").shift(1).over(seg)).otherwise("t1").alias("t1"))
    got = r.filter(pl.col("_untimed") & pl.col("t0").is_not_null()).select(KEY).unique()
    return r.sort("_idx").select(reqs.columns), sorted(got.iter_rows())


def _run_of_requests(reqs: pl.DataFrame, served: pl.DataFrame, att: pl.DataFrame, ak: pl.DataFrame,
                     windows: pl.DataFrame) -> pl.DataFrame:
    """``replay_run`` of each request: its attempt's run; else the first (by name) of the runs that used
    its instance whose window holds its start; else, without a start, the only run that used it."""
    runs_of_key = ak.join(att.select("_a", "run"), on="_a").select(*KEY, "run").unique()
    free = reqs.join(served, on="_idx", how="anti")
    by_window = free.filter(pl.col("t0").is_not_null()).join(runs_of_key, on=KEY).join(windows, on="run") \
        .filter((pl.col("lo") - TOLERANCE_S <= pl.col("t0")) & (pl.col("t0") <= pl.col("hi") + TOLERANCE_S)) \
        .group_by("_idx").agg(pl.col("run").min())
    only = runs_of_key.group_by(KEY).agg(pl.col("run").first(), pl.len().alias("_n")).filter(pl.col("_n") == 1)
    by_only = free.filter(pl.col("t0").is_null()).join(only.drop("_n"), on=KEY).select("_idx", "run")
    return pl.concat([served.select("_idx", "run"), by_window, by_only]).rename({"run": "replay_run"})


def _requests_out(req: pl.DataFrame, reqs: pl.DataFrame, served: pl.DataFrame, runs: pl.DataFrame) -> pl.DataFrame:
    """The requests of the used instances with their times, run and attempt."""
    cols = [c.name for c in schema.REQUESTS] + ["item", "stage", "attempt"]
    if not reqs.height:
        return schema.empty("requests").with_columns(pl.lit(None, pl.String).alias("item"),
            pl.lit(None, pl.String).alias("stage"), pl.lit(None, pl.Int64).alias("attempt"))
    extra = reqs.select("_idx", "t0", "t1").join(runs, on="_idx", how="left") \
        .join(served.select("_idx", "item", "stage", "attempt", pl.col("max_tokens").alias("_cap")), on="_idx", how="left")
    extra = extra.with_columns(_to_datetime(extra["t0"]).alias("t_start"), _to_datetime(extra["t1"]).alias("t_end")) \
        .drop("t0", "t1")
    base = req.with_row_index("_idx").drop("t_start", "t_end", "replay_run", strict=False)
    return _own_cap(base.join(extra, on="_idx", how="inner").sort("_idx").drop("_idx")).select(cols)


def join(requests: pl.DataFrame, instances: pl.DataFrame, runs: pl.DataFrame,
         attempts: pl.DataFrame) -> JoinResult:
    """Match attempts to server requests (see the module docstring)."""
    req = schema.conform(requests, "requests") if requests.height else schema.empty("requests")
    inst = schema.conform(instances, "instances") if instances.height else schema.empty("instances")
    inst_rows = [{**r, "resolved": _resolved(r["path"])} for r in inst.iter_rows(named=True)]
    att = _attempt_frame(attempts)
    windows = _run_windows(runs, att)
    ak, launched = _attempt_instances(att, inst_rows, _manifest_servers(runs))
    reqs = _server_requests(req, ak.select(KEY).unique())
    reqs, anchors = _anchor(reqs, {(r["run"], r["instance"]): r for r in inst_rows}, launched, att, ak)
    picks = _assign(_pairs(att, ak, reqs, anchors.tolerance))
    served = picks.filter(pl.col("match") == "matched").select("_idx", "_a") \
        .join(att.select("_a", "run", "item", "stage", "attempt", "max_tokens", pl.col("t0").alias("a_t0"),
                         pl.col("t1").alias("a_t1")), on="_a")
    reqs, estimated = _order_times(reqs, served)
    notes = anchors.notes + [f"{k[1]}: no time on the lines; request times estimated from the attempts they served "
                             "and the order on each slot" for k in estimated]
    run_of = _run_of_requests(reqs, served, att, ak, windows)
    return JoinResult(_matches(att, ak, picks, anchors.offsets), _requests_out(req, reqs, served, run_of), notes)


def _own_cap(req: pl.DataFrame) -> pl.DataFrame:
    """A request that generated as many tokens as its own cap (the attempt's ``max_tokens``, which the log
    may not show) was stopped by that cap: its stop reason is ``limit``, not ``eos``."""
    capped = (pl.col("_cap") > 0) & (pl.col("gen_tokens") >= pl.col("_cap")) & (pl.col("stop_reason") == "eos")
    return req.with_columns(pl.when(capped).then(pl.lit("limit")).otherwise(pl.col("stop_reason"))
                            .alias("stop_reason")).drop("_cap")


def join_store(store: Any) -> JoinResult:
    """``join`` over the store's ``requests``, ``instances``, ``runs`` and ``attempts`` tables."""
    return join(store.table("requests"), store.table("instances"), store.table("runs"), store.table("attempts"))

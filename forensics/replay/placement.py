"""Where the join puts each server request on the wall clock, and how (the ``requests.clock`` column).

``clock`` values (``CLOCKS``), strongest first:

* ``log``: the line's own absolute time;
* ``anchored``: the log's elapsed time plus a known start: the manifest's ``launched_at`` for the server, or the
  instance's own start (``--started-at``, or an absolute time the log gives once);
* ``aligned``: elapsed time plus the offset that best lines the attempts' send times up with the requests' starts;
* ``attempt``: no time on the lines; the request starts when the attempt it served was sent, and lasts its
  ``total_ms`` (else until the attempt ended, but not past the next request's start on its slot);
* ``order``: no time on the lines; placed by the order on its slot: it starts where the request before it
  ended, or ends where the one after it starts and lasts its ``total_ms``; a request whose length is not
  logged (cancelled, failed) gets a start that way but no end;
* null: nothing places it (t_start, t_end null).

A request that ran never gets a zero or negative length: an end that cannot be placed after the start stays
unknown (``t_end`` null).  The join reads only the times the log gives (``log``) and places every other time
again from them, so joining a join's output gives the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, overload

import polars as pl

from forensics import schema
from forensics.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
else:  # loaded when a join runs: the commands that import the replay package do not pay for it
    np = lazy_import("numpy")

CLOCKS = ("log", "anchored", "aligned", "attempt", "order")
TOLERANCE_S = 1.0  # slack around the attempt's window for request starts (absolute time)
ALIGN_CANDIDATE_ATTEMPTS = 8
ALIGN_CHUNK_CELLS = 4_000_000  # offsets x attempts scored at once when aligning (bounds memory)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

InstKey = tuple[str, str]  # (store run partition, instance id)
KEY = ["krun", "kinst"]  # the instance key's columns in the frames below


def secs(dt: datetime | None) -> float | None:
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return (dt - EPOCH).total_seconds()


@overload
def as_dt(s: float) -> datetime: ...
@overload
def as_dt(s: float | None) -> datetime | None: ...
def as_dt(s: float | None) -> datetime | None:
    if s is None:
        return None
    return datetime.fromtimestamp(round(s, 6), tz=timezone.utc)


def divided(expr: pl.Expr, by: float) -> pl.Expr:
    """``expr / by`` rounded as Python rounds it: polars may multiply by the reciprocal instead, which
    can miss by one unit in the last place (and move a time by a microsecond)."""
    def divide(s: pl.Series) -> pl.Series:
        return pl.Series(s.name, s.cast(pl.Float64).to_numpy() / by, dtype=pl.Float64).fill_nan(None)

    return expr.map_batches(divide, return_dtype=pl.Float64)


def secs_expr(col: str) -> pl.Expr:
    """``secs`` on a datetime column: seconds since the epoch (naive times are UTC)."""
    return divided(pl.col(col).dt.epoch("us"), 1e6).alias(col)


def _round6(x: np.ndarray) -> np.ndarray:
    """Python's ``round(x, 6)`` (correctly rounded) for an array: split off the whole seconds first, so
    scaling the fraction to microseconds loses nothing that decides the rounding."""
    whole = np.floor(x)
    micros = whole * 1e6 + np.rint((x - whole) * 1e6)
    return micros / 1e6


def to_datetime(s: pl.Series) -> pl.Series:
    """``as_dt`` on a column of seconds: the nearest microsecond, as a UTC timestamp."""
    x = s.to_numpy(allow_copy=True).astype(np.float64)
    valid = ~np.isnan(x)
    whole = np.floor(np.where(valid, x, 0.0))
    micros = whole.astype(np.int64) * 1_000_000 + np.rint((np.where(valid, x, 0.0) - whole) * 1e6).astype(np.int64)
    out = pl.Series(s.name, micros).cast(pl.Datetime("us")).dt.replace_time_zone("UTC")
    return out.set(pl.Series(~valid), None).cast(schema.polars_type(schema.TS))


def log_times(req: pl.DataFrame, inst: pl.DataFrame) -> pl.DataFrame:
    """The requests with only the times their log gives (``clock`` = log): a time the join or an anchor placed
    is dropped, to be placed again.  Rows stored before ``clock`` existed keep their times when their instance's
    times are absolute (or it is not known)."""
    basis = inst.select("run", "instance", pl.col("time_basis").alias("_basis")).unique(["run", "instance"])
    r = req.join(basis, on=["run", "instance"], how="left", nulls_equal=True)
    placed_elsewhere = pl.col("_basis").is_in(["elapsed", "anchored", "order"]).fill_null(False)
    own = (pl.col("clock") == "log") | (pl.col("clock").is_null() & ~placed_elsewhere)
    own = own & pl.col("t_start").is_not_null()
    return r.with_columns(pl.when(own).then("t_start").alias("t_start"), pl.when(own).then("t_end").alias("t_end"),
                          pl.when(own).then(pl.lit("log")).alias("clock")).drop("_basis")


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
class Anchors:
    """How the elapsed-time instances were put on the wall clock: the offset, the clock it gives
    (anchored, aligned) and the match tolerance per instance, and a note for each."""

    offsets: dict[InstKey, float] = field(default_factory=dict)
    clocks: dict[InstKey, str] = field(default_factory=dict)
    tolerance: dict[InstKey, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _anchor_offset(key: InstKey, rs: pl.DataFrame, inst_row: dict[str, Any], launched: dict[InstKey, float],
                   mine: pl.DataFrame | None, anchors: Anchors) -> tuple[float, str, str] | None:
    """The wall-clock offset of one elapsed-time instance, the clock it gives and how it was found (None:
    nothing to anchor by).  A start given at ingest (``--started-at``) comes first, then the manifest's launch,
    then a start the log gives, then aligning the attempts that may have reached it."""
    basis, started = inst_row.get("time_basis"), inst_row.get("started_at")
    if started is not None and basis == "anchored":
        return secs(started) or 0.0, "anchored", "the instance's start time"
    if key in launched:
        return launched[key], "anchored", "the manifest's launched_at"
    if started is not None and basis == "elapsed":
        return secs(started) or 0.0, "anchored", "the instance's start time"
    if mine is None:
        return None
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
    return off, "aligned", f"aligning attempts with requests (median distance {cost:.3f} s)"


def anchor(reqs: pl.DataFrame, inst_by_key: dict[InstKey, dict[str, Any]], launched: dict[InstKey, float],
           att: pl.DataFrame, ak: pl.DataFrame) -> tuple[pl.DataFrame, Anchors]:
    """Give the requests of elapsed-time instances wall-clock times (``t0``/``t1``) and their ``clock``; one
    pass per instance, each a column operation.  An instance no attempt may have reached is anchored only by
    a known start."""
    anchors = Anchors()
    used = set(ak.select(KEY).iter_rows())
    for k, rs in sorted(reqs.partition_by(KEY, as_dict=True, maintain_order=True).items()):
        key = (str(k[0]), str(k[1]))
        if rs["t0"].null_count() == 0 or rs["e0"].null_count() == rs.height:
            continue  # nothing to anchor: absolute times, or none at all (order)
        mine = att.join(ak.filter((pl.col("krun") == key[0]) & (pl.col("kinst") == key[1])).select("_a").unique(),
                        on="_a", how="semi") if key in used else None
        found = _anchor_offset(key, rs, inst_by_key.get(key) or {}, launched, mine, anchors)
        if found is None:
            continue
        off, clock, how = found
        anchors.offsets[key], anchors.clocks[key] = off, clock
        anchors.notes.append(f"{key[1]}: elapsed times anchored at {as_dt(off).isoformat().replace('+00:00', 'Z')} "
                             f"by {how}")
    if not anchors.offsets:
        return reqs, anchors
    offsets = pl.DataFrame([(k[0], k[1], o, anchors.clocks[k]) for k, o in anchors.offsets.items()],
                           schema={"krun": pl.String, "kinst": pl.String, "_off": pl.Float64, "_clock": pl.String},
                           orient="row")
    placed = pl.col("t0").is_null() & pl.col("_off").is_not_null() & pl.col("e0").is_not_null()
    reqs = reqs.join(offsets, on=KEY, how="left").sort("_idx").with_columns(
        pl.when(placed).then(pl.col("_off") + pl.col("e0")).otherwise("t0").alias("t0"),
        pl.when(placed).then(pl.col("_off") + pl.col("e1")).otherwise("t1").alias("t1"),
        pl.when(placed).then("_clock").otherwise("clock").alias("clock")).drop("_off", "_clock")
    return reqs, anchors


def _chains(r: pl.DataFrame, slot: list[str], head: str) -> pl.DataFrame:
    """Each slot cut into chains, each starting at a request whose times are known (``_seg``), in the frame's
    order: the lengths summed along the chain (``_sum``), the unknown lengths met so far (``_gaps``) and the
    chain's first request's ``head`` time (``_head``)."""
    r = r.with_columns(pl.col("_known").cum_sum().over(slot).alias("_seg"))
    seg = [*slot, "_seg"]
    d = pl.when(pl.col("_known")).then(0.0).otherwise("_d")
    return r.with_columns(d.fill_null(0.0).cum_sum().over(seg).alias("_sum"),
                          d.is_null().cast(pl.Int64).cum_sum().over(seg).alias("_gaps"),
                          pl.col(head).first().over(seg).alias("_head"))


def _chained() -> pl.Expr:
    """A request of unknown times inside a chain that has a known head."""
    return ~pl.col("_known") & (pl.col("_seg") > 0) & pl.col("_head").is_not_null()


def _forwards(r: pl.DataFrame, slot: list[str]) -> pl.DataFrame:
    """Along each slot in order, a request of unknown start after one whose end is known starts at that end
    and lasts its ``_d``; the chain stops at the first request whose length is unknown (``_f0``, ``_f1``)."""
    r = _chains(r, slot, "t1")
    ok = _chained()
    start = pl.col("_head") + pl.col("_sum") - pl.col("_d").fill_null(0.0)
    gaps_before = pl.col("_gaps") - pl.col("_d").is_null().cast(pl.Int64)
    return r.with_columns(pl.when(ok & (gaps_before == 0)).then(start).alias("_f0"),
                          pl.when(ok & (pl.col("_gaps") == 0)).then(pl.col("_head") + pl.col("_sum")).alias("_f1"))


def _backwards(r: pl.DataFrame, slot: list[str]) -> pl.DataFrame:
    """Along each slot in reverse, a request of known length ``_d`` and unknown start before one whose start is
    known ends where that one starts, and starts ``_d`` earlier; the chain stops at the first unknown length
    (``_b0``, ``_b1``)."""
    r = _chains(r.reverse(), slot, "t0")
    ok = _chained()
    end = pl.col("_head") - pl.col("_sum") + pl.col("_d").fill_null(0.0)
    gaps_after = pl.col("_gaps") - pl.col("_d").is_null().cast(pl.Int64)
    own = pl.col("_d").is_not_null()  # a request of unknown length is not assumed to end as the next one starts
    return r.with_columns(pl.when(ok & own & (gaps_after == 0)).then(end).alias("_b1"),
                          pl.when(ok & (pl.col("_gaps") == 0)).then(pl.col("_head") - pl.col("_sum")).alias("_b0")) \
        .reverse()


def order_times(reqs: pl.DataFrame, served: pl.DataFrame) -> tuple[pl.DataFrame, list[InstKey]]:
    """Times for the requests of instances with no time on the lines (see the module docstring): a request an
    attempt was matched to starts at the attempt's send (``attempt``); along each slot the others follow the
    request before them or precede the one after them (``order``).  A request of unknown length that served no
    attempt gets no end; an end is never at or before its start, and an end taken from the attempt never after
    the next start on the slot.  Returns the instances that got times."""
    untimed = reqs.group_by(KEY).agg(pl.col("t0").is_null().all().alias("_untimed"))
    r = reqs.join(untimed, on=KEY).join(served.select("_idx", "a_t0", "a_t1"), on="_idx", how="left")
    from_attempt = pl.col("_untimed") & pl.col("a_t0").is_not_null()
    d = divided(pl.col("total_ms"), 1000.0)
    r = r.with_columns(
        pl.when(from_attempt).then("a_t0").otherwise("t0").alias("t0"),
        pl.when(from_attempt).then(pl.when(pl.col("total_ms").is_not_null()).then(pl.col("a_t0") + d)
                                   .when(pl.col("a_t1") > pl.col("a_t0")).then("a_t1")).otherwise("t1").alias("t1"),
        pl.when(from_attempt).then(pl.lit("attempt")).otherwise("clock").alias("clock"),
        d.alias("_d"), pl.coalesce(pl.col("seq"), pl.col("_idx").cast(pl.Int64)).alias("_ord"))
    slot = [*KEY, "slot"]
    r = r.sort(*slot, "_ord", "_idx", nulls_last=False).with_columns(pl.col("t0").is_not_null().alias("_known"))
    r = _backwards(_forwards(r, slot), slot)
    fill = pl.col("_untimed") & ~pl.col("_known")
    r = r.with_columns(pl.when(fill).then(pl.coalesce("_f0", "_b0")).otherwise("t0").alias("t0"),
                       pl.when(fill).then(pl.coalesce("_f1", "_b1")).otherwise("t1").alias("t1"))
    # an end taken from the attempt (the request's own length unknown) is bounded by the next start on the slot;
    # an end at or before its start is unknown
    nxt = pl.col("t0").shift(-1).over(slot)
    bound = pl.col("_untimed") & pl.col("_d").is_null() & (pl.col("t1") > nxt) & (nxt > pl.col("t0"))
    r = r.with_columns(pl.when(bound).then(nxt).otherwise("t1").alias("t1"))
    r = r.with_columns(
        pl.when(pl.col("_untimed") & (pl.col("t1") <= pl.col("t0"))).then(None).otherwise("t1").alias("t1"),
        pl.when(fill & (pl.col("t0").is_not_null() | pl.col("t1").is_not_null())).then(pl.lit("order"))
        .otherwise("clock").alias("clock"))
    got = r.filter(pl.col("_untimed") & pl.col("t0").is_not_null()).select(KEY).unique()
    return r.sort("_idx").select(reqs.columns), sorted(got.iter_rows())

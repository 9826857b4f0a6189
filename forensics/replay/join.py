"""The join: match every attempt the harness made to the server request (a ``requests`` row) that
served it, and give every server request of a run an absolute time.

Keys, strongest first: the instance (the attempt's ``server`` -> the manifest's servers entry -> the
instance whose log file (or else port) it names; never a process name, and never another run's instance but
a log the run's manifest names: ``forensics.replay.scope``), the slot (``id_slot``), the
token counts (``tokens_evaluated`` = ``prompt_tokens``, ``tokens_predicted`` = ``gen_tokens``), and time
(request start within the attempt's send..end window) where the log has time, else the order of the
requests on the slot.  Elapsed-time logs are anchored to wall-clock time by the server's ``launched_at``
from the manifest, else the instance's known start, else the offset that best aligns the attempts' send
times with the requests' starts (least median distance); how each request's time was placed is its
``clock`` (``forensics.replay.placement``).

Every step works on whole tables (polars, numpy): the candidate pairs (attempt, request) come from one
join per instance, and the greedy choice "each attempt, in order, takes its best request not taken by
an earlier attempt" is found as the fixed point of a table-wide step (see ``_assign``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

from forensics import schema
from forensics.lazy import lazy_import
from forensics.replay import scope
from forensics.replay.placement import (
    KEY,
    TOLERANCE_S,
    InstKey,
    anchor,
    log_times,
    order_times,
    secs_expr,
    to_datetime,
)

if TYPE_CHECKING:
    import numpy as np
else:  # loaded when a join runs: the commands that import the replay package do not pay for it
    np = lazy_import("numpy")

AMBIGUOUS_S = 0.5  # two candidates whose starts are this close to the send time cannot be told apart
NO_END_S = 86400.0  # an attempt without an end time may be served up to a day after its send
ORDER = ["rank", "_w", "score", "_idx"]  # candidates best first: by attempt, most evidence, nearest, first read


@dataclass
class JoinResult:
    """``matches``: one row per attempt (the ``matches`` table); ``requests``: every server request given,
    with ``t_start``/``t_end`` where the join could place them and ``clock`` saying how, and ``replay_run``,
    ``item``, ``stage``, ``attempt`` of the attempt each served (``replay_run`` also for unmatched requests,
    by time)."""

    matches: pl.DataFrame
    requests: pl.DataFrame
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        c = {"matched": 0, "ambiguous": 0, "unmatched": 0}
        for m, n in self.matches.group_by("match", maintain_order=True).len().iter_rows():
            c[m] = c.get(m, 0) + n
        return c


def _attempt_frame(attempts: pl.DataFrame) -> pl.DataFrame:
    """The attempts with their row number ``_a``, send/end in seconds (``t0``/``t1``) and ``rank``, the
    order they are matched in: attempts with server-side evidence (slot or tokens) first, then the rest,
    each in send order."""
    if not attempts.height:
        attempts = schema.empty("attempts")
    att = attempts.with_row_index("_a").with_columns(
        secs_expr("started_at").alias("t0"), secs_expr("ended_at").alias("t1"))
    weak = ~(pl.col("id_slot").is_not_null() | pl.col("tokens_evaluated").is_not_null())
    order = att.select("_a", weak.alias("_weak"), pl.col("t0").fill_null(float("inf")).alias("_t")) \
        .sort("_weak", "_t", "_a").with_row_index("rank").select("_a", "rank")
    return att.join(order, on="_a").sort("_a")


def _run_windows(runs: pl.DataFrame, att: pl.DataFrame) -> pl.DataFrame:
    """Each run's time window (``lo``, ``hi`` in seconds): the manifest's start and end when it has both,
    else widened to the attempts' send and end times."""
    declared = runs.select("run", secs_expr("started_at").alias("w0"), secs_expr("ended_at").alias("w1")) \
        .unique("run", keep="last", maintain_order=True) if runs.height else \
        pl.DataFrame(schema={"run": pl.String, "w0": pl.Float64, "w1": pl.Float64})
    seen = att.group_by("run").agg(pl.col("t0").min().alias("a0"),
                                   pl.max_horizontal(pl.col("t1").max(), pl.col("t0").max()).alias("a1"))
    w = declared.join(seen, on="run", how="full", coalesce=True)
    fixed = pl.col("w0").is_not_null() & pl.col("w1").is_not_null()
    return w.select("run", pl.when(fixed).then("w0").otherwise(pl.min_horizontal("w0", "a0")).alias("lo"),
                    pl.when(fixed).then("w1").otherwise(pl.max_horizontal("w1", "a1")).alias("hi"))


def _attempt_instances(att: pl.DataFrame, inst: scope.Instances,
                       servers_by_run: dict[str, dict[str, dict[str, Any]]]) -> tuple[pl.DataFrame, dict[InstKey, float]]:
    """Which instances each attempt may have reached (``_a``, ``krun``, ``kinst``, ``sname``: the manifest's name
    for it; an instance listed twice counts twice), resolved once per (run, server) within the run's scope
    (``forensics.replay.scope``); and the manifest's launch time per instance."""
    pairs = att.select("run", "server").unique(maintain_order=True)
    got = scope.reach(pairs.iter_rows(), inst, servers_by_run)
    ak = att.select("_a", "run", "server").join(got.pairs, on=["run", "server"], nulls_equal=True) \
        .sort("_a", maintain_order=True).select("_a", "krun", "kinst", "sname")
    return ak, got.launched


def _server_requests(req: pl.DataFrame) -> pl.DataFrame:
    """The requests with their row number, instance key, times in seconds (``t0``/``t1``, elapsed ``e0``/``e1``)."""
    r = req.with_row_index("_idx").rename({"run": "krun", "instance": "kinst"})
    return r.select("_idx", *KEY, "slot", "task", "seq", "prompt_tokens", "gen_tokens", "http_status", "total_ms",
                    secs_expr("t_start").alias("t0"), secs_expr("t_end").alias("t1"),
                    pl.col("elapsed_start_s").alias("e0"), pl.col("elapsed_end_s").alias("e1"), "path", "clock")


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
           tolerance: dict[InstKey, float]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every (attempt, request) that could have served it, with its evidence and score (a smaller
    score is a better candidate); and per attempt (``_a``) how many requests were looked at (``_raw``: in
    its window, or on its instance when the log has no time), whether one had its HTTP status
    (``_same_status``), and how many fit (``_ok``)."""
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
    raw = pl.concat([ranged, on_slot, any_slot], how="diagonal")
    pairs = _evidence(raw)
    looked = raw.group_by("_a").agg(pl.len().alias("_raw"),
                                    (pl.col("a_http") == pl.col("http_status")).fill_null(False).any().alias("_same_status"))
    fit = pairs.group_by("_a").agg(pl.len().alias("_ok"))
    return pairs, looked.join(fit, on="_a", how="left").with_columns(pl.col("_ok").fill_null(0))


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
    ev_prompt, ev_gen = both("tokens_evaluated", "prompt_tokens"), both("tokens_predicted", "gen_tokens")
    ev_tokens = ev_prompt | ev_gen
    ev_status = both("a_http", "http_status")
    # more agreeing fields first: a request whose prompt and generated tokens both agree beats one that only
    # does not contradict (a cancelled request has no generated count), however near in time or order
    weak = -(ev_slot.cast(pl.Int8) + ev_prompt.cast(pl.Int8) + ev_gen.cast(pl.Int8) + ev_status.cast(pl.Int8))
    ev = pl.concat_str([pl.when(ev_slot).then(pl.lit("slot+")).otherwise(pl.lit("")),
                        pl.when(ev_tokens).then(pl.lit("tokens+")).otherwise(pl.lit("")),
                        pl.when(ev_status).then(pl.lit("status+")).otherwise(pl.lit("")),
                        pl.when(ev_time).then(pl.lit("time")).otherwise(pl.lit("order"))])
    score = pl.when(ev_time).then((pl.col("t0") - pl.col("a_t0")).abs()) \
        .otherwise(pl.coalesce(pl.col("seq"), pl.col("_idx").cast(pl.Int64)).cast(pl.Float64))
    return p.with_columns(ev.alias("ev"), score.alias("score"), weak.alias("_w"), ev_slot.alias("ev_slot"),
                          ev_prompt.alias("ev_prompt"), ev_gen.alias("ev_gen"), ev_status.alias("ev_status"),
                          ev_time.alias("ev_time")) \
        .select("_a", "rank", "_idx", *KEY, "path", "slot", "task", "seq", "ev", "_w", "score",
                "ev_slot", "ev_prompt", "ev_gen", "ev_status", "ev_time").sort(*ORDER, maintain_order=True)


def _choose(avail: pl.DataFrame) -> pl.DataFrame:
    """Each attempt's pick among its available candidates (sorted best first): the best one, matched
    unless the next one is as good (same evidence, and a start as close in time, or no slot to order by)."""
    g = avail.with_columns(pl.int_range(pl.len()).over("_a").alias("_pos"), pl.len().over("_a").alias("_n"))
    flags = ["ev_slot", "ev_prompt", "ev_gen", "ev_status", "ev_time"]
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
        .drop("_by").sort(*ORDER, maintain_order=True)
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
        live = live.filter(pl.col("rank") > upto).join(gone, on="_idx", how="anti").sort(*ORDER)
        guess = _guess(live, picks)


def _unmatched_reason() -> pl.Expr:
    """Why an attempt that may have reached an instance was tied to no request: ``taken`` (requests fit it,
    each served an attempt with stronger evidence); ``evidence_disagrees`` (requests in its window, or on its
    instance, contradict its slot, tokens or time, and for an HTTP error one had its status); else nothing on
    the instances could be it: ``rejected_before_slot`` (an HTTP error), ``client_timeout``,
    ``client_cancelled``, ``no_slot_request``."""
    st = pl.col("http_status")
    error = st.is_not_null() & (st >= 400)
    looked = pl.col("_raw").fill_null(0) > 0
    return pl.when(pl.col("_ok").fill_null(0) > 0).then(pl.lit("taken")) \
        .when(looked & (~error | pl.col("_same_status").fill_null(False))).then(pl.lit("evidence_disagrees")) \
        .when(error).then(pl.lit("rejected_before_slot")) \
        .when(pl.col("outcome") == "timeout").then(pl.lit("client_timeout")) \
        .when(pl.col("outcome") == "cancelled").then(pl.lit("client_cancelled")) \
        .otherwise(pl.lit("no_slot_request"))


def _one_name(ak: pl.DataFrame, keys: pl.DataFrame, alias: str) -> pl.DataFrame:
    """``_a`` and the manifest's name (``alias``) of the instances ``keys`` (``_a``, krun, kinst), where those of
    an attempt are all one server's."""
    named = keys.select("_a", *KEY).unique().join(ak.unique(["_a", *KEY]), on=["_a", *KEY])
    return named.group_by("_a").agg(pl.col("sname").unique().alias("_n")) \
        .filter(pl.col("_n").list.len() == 1).select("_a", pl.col("_n").list.first().alias(alias))


def _server_reached(att: pl.DataFrame, ak: pl.DataFrame, picks: pl.DataFrame, pairs: pl.DataFrame) -> pl.DataFrame:
    """``server`` of each attempt (``_a``): its own; else the manifest's name for the instance of the request it
    matched; ambiguous, the one server all its candidates are on; else the one server every instance it may have
    reached belongs to (null: the attempt names none, and several could have served it)."""
    return att.select("_a", "server") \
        .join(_one_name(ak, picks.filter(pl.col("match") == "matched"), "_picked"), on="_a", how="left") \
        .join(_one_name(ak, pairs.join(picks.filter(pl.col("match") == "ambiguous").select("_a"), on="_a"), "_fits"),
              on="_a", how="left") \
        .join(_one_name(ak, ak, "_reach"), on="_a", how="left") \
        .select("_a", pl.coalesce("server", "_picked", "_fits", "_reach").alias("server"))


def _matches(att: pl.DataFrame, ak: pl.DataFrame, picks: pl.DataFrame, pairs: pl.DataFrame,
             offsets: dict[InstKey, float], looked: pl.DataFrame) -> pl.DataFrame:
    """The ``matches`` table: one row per attempt, in the attempts' order."""
    if not att.height:
        return schema.empty("matches")
    off = pl.DataFrame([(k[0], k[1], o) for k, o in offsets.items()],
                       schema={"krun": pl.String, "kinst": pl.String, "offset_s": pl.Float64}, orient="row")
    got = picks.join(off, on=KEY, how="left").select("_a", pl.col("kinst").alias("instance"), "path", "slot", "task",
                                                       "seq", "offset_s", "match", "reason")
    m = att.select("_a", "run", "item", "stage", "attempt", "http_status", "outcome") \
        .join(got, on="_a", how="left").join(ak.select("_a").unique().with_columns(pl.lit(True).alias("_keyed")),
                                             on="_a", how="left") \
        .join(_server_reached(att, ak, picks, pairs), on="_a", how="left").join(looked, on="_a", how="left").sort("_a")
    m = m.with_columns(
        pl.coalesce("match", pl.lit("unmatched")).alias("match"),
        pl.when(pl.col("match").is_not_null()).then("reason")
        .when(pl.col("_keyed").is_null()).then(pl.lit("no_instance")).otherwise(_unmatched_reason()).alias("reason"))
    return schema.conform(m, "matches")


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
    """Every request given, with its times and their ``clock``, its run and the attempt it served."""
    cols = [c.name for c in schema.REQUESTS] + ["item", "stage", "attempt"]
    if not reqs.height:
        return schema.empty("requests").with_columns(pl.lit(None, pl.String).alias("item"),
            pl.lit(None, pl.String).alias("stage"), pl.lit(None, pl.Int64).alias("attempt"))
    extra = reqs.select("_idx", "t0", "t1", "clock").join(runs, on="_idx", how="left") \
        .join(served.select("_idx", "item", "stage", "attempt", pl.col("max_tokens").alias("_cap")), on="_idx", how="left")
    extra = extra.with_columns(to_datetime(extra["t0"]).alias("t_start"), to_datetime(extra["t1"]).alias("t_end")) \
        .drop("t0", "t1")
    base = req.with_row_index("_idx").drop("t_start", "t_end", "replay_run", "clock", strict=False)
    return _own_cap(base.join(extra, on="_idx", how="inner").sort("_idx").drop("_idx")).select(cols)


def join(requests: pl.DataFrame, instances: pl.DataFrame, runs: pl.DataFrame,
         attempts: pl.DataFrame) -> JoinResult:
    """Match attempts to server requests (see the module docstring)."""
    req = schema.conform(requests, "requests") if requests.height else schema.empty("requests")
    inst = schema.conform(instances, "instances") if instances.height else schema.empty("instances")
    req = log_times(req, inst)  # the join places every other time again: joining its own output changes nothing
    ix = scope.Instances.of(inst)
    att = _attempt_frame(attempts)
    windows = _run_windows(runs, att)
    ak, launched = _attempt_instances(att, ix, scope.manifest_servers(runs))
    reqs, anchors = anchor(_server_requests(req), ix.rows, launched, att, ak)
    pairs, looked = _pairs(att, ak, reqs, anchors.tolerance)
    picks = _assign(pairs)
    served = picks.filter(pl.col("match") == "matched").select("_idx", "_a") \
        .join(att.select("_a", "run", "item", "stage", "attempt", "max_tokens", pl.col("t0").alias("a_t0"),
                         pl.col("t1").alias("a_t1")), on="_a")
    reqs, estimated = order_times(reqs, served)
    notes = anchors.notes + [f"{k[1]}: no time on the lines; request times estimated from the attempts they served "
                             "and the order on each slot" for k in estimated]
    run_of = _run_of_requests(reqs, served, att, ak, windows)
    return JoinResult(_matches(att, ak, picks, pairs, anchors.offsets, looked),
                      _requests_out(req, reqs, served, run_of), notes)


def _own_cap(req: pl.DataFrame) -> pl.DataFrame:
    """A request that generated as many tokens as its own cap (the attempt's ``max_tokens``, which the log
    may not show) was stopped by that cap: its stop reason is ``limit``, not ``eos``."""
    capped = (pl.col("_cap") > 0) & (pl.col("gen_tokens") >= pl.col("_cap")) & (pl.col("stop_reason") == "eos")
    return req.with_columns(pl.when(capped).then(pl.lit("limit")).otherwise(pl.col("stop_reason"))
                            .alias("stop_reason")).drop("_cap")


def join_runs(store: Any, runs: set[str]) -> tuple[JoinResult, dict[str, str]]:
    """``join`` over the store's parts of ``runs`` (a component: ``scope.component``), with each manifest's log
    paths as the store knows those logs; and the file id of each log path among them."""
    tables, fids = scope.read_component(store, runs)
    tables["runs"] = scope.stored_log_paths(tables["runs"], fids)
    return join(*(tables[t] for t in scope.JOIN_TABLES)), fids


def join_store(store: Any) -> JoinResult:
    """``join`` over the whole store: what the ingest stores, worked out there one component of runs at a time."""
    return join_runs(store, scope.store_runs(store))[0]

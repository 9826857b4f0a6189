"""Narrowing the ambiguous attempts of logs with no time on the lines.

On an instance whose lines carry no time, the join ties an attempt to a request by slot, tokens and status; the
attempts that carry none of those (a client timeout, an HTTP 500 without a slot: most runaways) are left with
several candidates of the same evidence.  What the log does give narrows them, and an attempt is tied to a
request only when that leaves the two to each other alone (``between`` in the match's reason):

* **the order of the tasks**: a server numbers its tasks as the requests arrive, so a request whose task lies
  between those of two tied requests was sent between their attempts (within the largest disorder of the tied
  requests themselves, and at least ``ORDER_SLACK_S``: two sends a few milliseconds apart may arrive swapped);
* **the order on the slot**: a slot serves one request at a time, so a request after a tied one on its slot
  ended after that one's attempt was sent, and one before a tied request was sent before that attempt ended;
* **the cancel lines**: a request the server cancelled (the client went away) served an attempt that got no
  HTTP answer;
* retries: attempt 2 of an item is sent after attempt 1 ended, which the send times already say.

Each round ties the pairs that are alone, then works the bounds out again from the tied requests (a new tie
narrows its neighbours), until a round ties nothing.  Every round is a few table operations (polars): no loop
per request.
"""

from __future__ import annotations

import polars as pl

from forensics.replay.placement import KEY, TOLERANCE_S

ORDER_SLACK_S = 0.01  # sends closer than this may reach the server in either order (localhost: milliseconds)
MAX_ROUNDS = 50
INF = float("inf")


def _untimed(reqs: pl.DataFrame) -> pl.DataFrame:
    """The instances (krun, kinst) whose lines have no time."""
    return reqs.group_by(KEY).agg(pl.col("t0").is_null().all().alias("_u")).filter("_u").select(KEY)


def _slack(by_task: pl.DataFrame) -> pl.DataFrame:
    """Per instance, how far the tied requests' sends run out of their task order (twice the largest step back),
    at least ORDER_SLACK_S."""
    got = by_task.filter(pl.col("m0").is_not_null() & pl.col("task").is_not_null()).with_columns(
        (pl.col("m0").cum_max().over(KEY) - pl.col("m0")).alias("_inv")) \
        .group_by(KEY).agg((2 * pl.col("_inv").max()).alias("_slack"))
    return by_task.select(KEY).unique().join(got, on=KEY, how="left").with_columns(
        pl.max_horizontal(pl.col("_slack").fill_null(0.0), pl.lit(ORDER_SLACK_S)).alias("_slack"))


def _bounds(reqs: pl.DataFrame, tied: pl.DataFrame) -> pl.DataFrame:
    """Per untied request of an untimed instance (``_idx``): the send-time window its attempt must fall in
    (``lo``, ``hi``: from the tied requests before and after it in task order, with the slack), the time its
    attempt must end after (``end_lo``: a tied request before it on its slot was sent then) and be sent before
    (``send_hi``: a tied request after it on its slot ended then); ``_seg``, the stretch of tasks between two
    tied ones it lies in, and the instance's ``_slack``."""
    r = reqs.join(tied.select("_idx", "m0", "m1"), on="_idx", how="left")
    by_task = r.sort(*KEY, "task", "_idx", nulls_last=True)
    numbered = pl.col("task").is_not_null()
    by_task = by_task.with_columns(
        pl.when(numbered).then(pl.col("m0").fill_null(-INF).cum_max().over(KEY)).otherwise(-INF).alias("lo"),
        pl.when(numbered).then(pl.col("m0").fill_null(INF).reverse().cum_min().reverse().over(KEY))
        .otherwise(INF).alias("hi"),
        pl.col("m0").is_not_null().cum_sum().over(KEY).alias("_seg")).join(_slack(by_task), on=KEY)
    slot = [*KEY, "slot"]
    by_slot = by_task.sort(*slot, "seq", "_idx", nulls_last=True).with_columns(
        pl.col("m0").fill_null(-INF).cum_max().over(slot).alias("end_lo"),
        pl.col("m1").fill_null(INF).reverse().cum_min().reverse().over(slot).alias("send_hi"))
    return by_slot.filter(pl.col("m0").is_null()).select(
        "_idx", (pl.col("lo") - pl.col("_slack")).alias("lo"), (pl.col("hi") + pl.col("_slack")).alias("hi"),
        (pl.col("end_lo") - TOLERANCE_S).alias("end_lo"), (pl.col("send_hi") + TOLERANCE_S).alias("send_hi"),
        pl.when(numbered).then("_seg").alias("_seg"), "_slack", "task")


def _in_order(fit: pl.DataFrame) -> pl.DataFrame:
    """Where no pair is alone: in a stretch of tasks between two tied requests whose untied requests are the
    candidates of as many attempts, and of no attempt that could also be elsewhere, the k-th request in task
    order served the k-th attempt in send order, when the sends are further apart than the slack and each of
    those pairs fits."""
    grp = [*KEY, "_seg"]
    fs = fit.filter(pl.col("_seg").is_not_null())
    fs = fs.with_columns(pl.struct(grp).n_unique().over("_a").alias("_ns"))
    ok = fs.group_by(grp).agg((pl.col("_ns") == 1).all().alias("_clean"), pl.col("_a").n_unique().alias("_na"),
                              pl.col("_idx").n_unique().alias("_nr"))
    fs = fs.join(ok.filter(pl.col("_clean") & (pl.col("_na") == pl.col("_nr"))), on=grp, how="semi")
    att = fs.select(*grp, "_a", "a_t0", "_slack").unique().sort(*grp, "a_t0", "_a").with_columns(
        pl.int_range(pl.len()).over(grp).alias("_k"), pl.col("a_t0").diff().over(grp).alias("_gap"))
    apart = att.group_by(grp).agg((pl.col("_gap").drop_nulls() > pl.col("_slack").first()).all().alias("_apart"))
    req = fs.select(*grp, "_idx", "task").unique().sort(*grp, "task", "_idx") \
        .with_columns(pl.int_range(pl.len()).over(grp).alias("_k"))
    ranked = att.join(apart.filter("_apart"), on=grp, how="semi").join(req, on=[*grp, "_k"]).select("_a", "_idx")
    got = fs.join(ranked, on=["_a", "_idx"], how="semi")
    whole = got.group_by(grp).agg(pl.len().alias("_n")).join(ok, on=grp).filter(pl.col("_n") == pl.col("_na"))
    return got.join(whole, on=grp, how="semi")


def _alone(cand: pl.DataFrame) -> pl.DataFrame:
    """The candidate pairs whose attempt has no other candidate and whose request no other attempt."""
    return cand.filter((pl.len().over("_a") == 1) & (pl.len().over("_idx") == 1))


def narrow(picks: pl.DataFrame, pairs: pl.DataFrame, att: pl.DataFrame,
           reqs: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``picks`` (the join's choice per attempt) with the ambiguous attempts of untimed instances tied where the
    order of the log leaves one request to them and them alone to it (see the module docstring); and the
    ambiguous attempts (``_a``) it found no request left for, which it drops from the picks."""
    untimed = _untimed(reqs)
    nothing = pl.DataFrame(schema={"_a": pl.UInt32})
    if not untimed.height or not picks.filter(pl.col("match") == "ambiguous").height:
        return picks, nothing
    times = att.select("_a", pl.col("t0").alias("a_t0"), pl.col("t1").alias("a_t1"),
                       pl.col("http_status").alias("a_http"))
    mine = reqs.join(untimed, on=KEY, how="semi")
    # attempts whose every candidate is on an untimed instance (time narrows the others)
    open_a = picks.filter(pl.col("match") == "ambiguous").select("_a") \
        .join(pairs.join(untimed, on=KEY, how="anti").select("_a").unique(), on="_a", how="anti")
    cand = pairs.join(open_a, on="_a", how="semi").join(times, on="_a") \
        .join(mine.select("_idx", pl.col("stop_reason").alias("r_stop")), on="_idx")
    # a request the server cancelled served an attempt that got no HTTP answer
    cand = cand.filter(~((pl.col("r_stop") == "cancelled") & pl.col("a_http").is_not_null()))
    tied = picks.filter(pl.col("match") == "matched").select("_a", "_idx")
    new: list[pl.DataFrame] = []
    for _ in range(MAX_ROUNDS):
        placed = tied.join(times, on="_a").select("_idx", pl.col("a_t0").alias("m0"),
                                                  pl.coalesce("a_t1", "a_t0").alias("m1"))
        b = _bounds(mine, placed)
        cand = cand.join(tied.select("_a"), on="_a", how="anti").join(tied.select("_idx"), on="_idx", how="anti")
        fit = cand.join(b, on="_idx").filter(
            (pl.col("a_t0") >= pl.col("lo")) & (pl.col("a_t0") <= pl.col("hi"))
            & (pl.col("a_t0") <= pl.col("send_hi"))
            & (pl.col("a_t1").is_null() | (pl.col("a_t1") >= pl.col("end_lo"))))
        got = _alone(fit)
        if not got.height:
            got = _in_order(fit)
        if not got.height:
            break
        new.append(got.select(pairs.columns))
        tied = pl.concat([tied, got.select("_a", "_idx")])
    # an attempt none of whose candidates is left (each served another, or lies outside its bounds) reached no
    # request of the log: unmatched, for the reason of an attempt nothing on its instance could be
    left = cand.join(b, on="_idx").filter(
        (pl.col("a_t0") >= pl.col("lo")) & (pl.col("a_t0") <= pl.col("hi")) & (pl.col("a_t0") <= pl.col("send_hi"))
        & (pl.col("a_t1").is_null() | (pl.col("a_t1") >= pl.col("end_lo")))).select("_a").unique()
    none = open_a.join(tied.select("_a"), on="_a", how="anti").join(left, on="_a", how="anti")
    won = pl.concat(new).with_columns(pl.lit("matched").alias("match"), (pl.col("ev") + "+between").alias("reason")) \
        if new else None
    out = picks.join(none, on="_a", how="anti")
    if won is not None:
        out = pl.concat([out.join(won.select("_a"), on="_a", how="anti"), won], how="diagonal_relaxed")
    return out.sort("_a"), none

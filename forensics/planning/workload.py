"""A run's workload as the planning model replays it: its requests in the order the harness sent them, what
each asked of the server, which request waited for which, and how the harness drove the server.

One home for "what did this run ask for": every request of the run (``planning_requests.sql``: a replay attempt
joined to the server request it was served as, or a server request when the run has no records) becomes a *job*
with its prompt (cache excluded), its output length, its item, stage and attempt, its predecessor (the previous
request of the same item, which it waited for) and the think time after it.  The harness's shape is read from
the same rows: its concurrency, its dependency policy and its think time (see ``Harness``).

Library only: polars and DuckDB, no click, no altair.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import polars as pl

from forensics import runs as runs_mod
from forensics.sql import load_query
from forensics.store import Store, fetch_pl

POLICIES = ("chain", "fifo", "barrier")  # see Harness
SMALL_LAG_S = 1.0  # a request sent within this of its predecessor's end (+5 % of a latency) followed it at once
CHAIN_SHARE = 0.9  # that many successors sent at once: the worker kept its item (chain)
MAX_LAG_S = 600.0  # a think time longer than this is a pause of the operator, not of the harness


@dataclass(frozen=True)
class Harness:
    """How the run's harness drove the server.

    ``policy``: ``chain`` (a worker keeps its item and sends the item's next stage or retry as soon as the previous
    one ended: the stock-replay harness), ``fifo`` (ready requests wait in one queue for a free worker: an
    asyncio semaphore over all requests), ``barrier`` (a stage starts when the previous stage has ended for every
    item).  ``gap_s``: the think time between a worker's requests; ``overhead_s``: the client's latency beyond the
    server's own time (HTTP, tokenising, parsing); ``stagger_s``: between the first sends of the workers.
    """

    concurrency: int
    policy: str
    gap_s: float
    overhead_s: float
    stagger_s: float
    timeout_s: float | None = None  # the harness gave up on a request after this long (seen in its records)


@dataclass
class Workload:
    """One run's jobs (one row per request, in send order) and its harness; ``np`` the slots that served it."""

    run: str
    instance: str | None
    source: str  # records (client times) or server (a server log's own times)
    np: int
    harness: Harness
    jobs: pl.DataFrame  # see JOB_COLUMNS
    run_extra_s: float = 0.0  # the run's duration beyond its requests (the manifest's start to end, when known)
    notes: list[str] = field(default_factory=list)


# A job: ``gen_tokens`` as recorded, ``target`` what the server would have generated had nobody stopped it (a
# request the client cancelled ran on: up to the slot's context), ``deadline_s`` when the client gives up on it.
JOB_COLUMNS = ("order", "item", "stage", "stage_idx", "attempt", "instance", "slot", "task", "prev", "lag_s",
               "prompt_eval", "prompt_tokens", "gen_tokens", "target", "simulated", "fixed_s", "deadline_s", "failed",
               "outcome", "n_predict", "send_s", "end_s", "latency_s")
GAVE_UP = ("timeout", "cancelled")


def requests_frame(store: Store, runs: list[str]) -> pl.DataFrame:
    """``planning_requests.sql`` over ``runs``: every request with its tokens, timings and times."""
    con = store.connect(tables=["requests", "attempts", "matches"])
    try:
        return fetch_pl(con, load_query("planning_requests").text, {"runs": runs})
    finally:
        con.close()


def run_slots(store: Store, runs: list[str]) -> pl.DataFrame:
    """(run, instance, n_slots, model, port) of the runs' instances, and each run's harness concurrency, duration,
    model and stages (its manifest's)."""
    con = store.connect(tables=["instances", "runs"])
    try:
        return fetch_pl(con, "SELECT i.run, i.instance, i.n_slots, i.model, i.build, i.port, r.concurrency, "
                             "epoch(r.ended_at) - epoch(r.started_at) AS run_s, r.model AS run_model, r.stages "
                             "FROM instances i FULL JOIN (SELECT run, any_value(concurrency) AS concurrency, "
                             "any_value(started_at) AS started_at, any_value(ended_at) AS ended_at, "
                             "any_value(model) AS model, any_value(stages) AS stages FROM runs GROUP BY run) r "
                             "USING (run) WHERE list_contains($runs, run) ORDER BY run, instance", {"runs": runs})
    finally:
        con.close()


def _clock(rows: pl.DataFrame) -> pl.DataFrame:
    """``send_s``/``end_s`` on the run's clock (seconds since its first send): the client's times for records, the
    server's for a log; null for a log without time."""
    if rows.height == 0:
        return rows.with_columns(pl.lit(None, dtype=pl.Float64).alias("send_s"),
                                 pl.lit(None, dtype=pl.Float64).alias("end_s"))
    send = pl.when(pl.col("source") == "records").then(pl.col("send_abs")).otherwise(pl.col("srv_start"))
    end = pl.when(pl.col("source") == "records").then(pl.col("end_abs")).otherwise(pl.col("srv_end"))
    return rows.with_columns(send.alias("_send"), end.alias("_end")).with_columns(
        (pl.col("_send") - pl.col("_send").min().over("run")).alias("send_s"),
        (pl.col("_end") - pl.col("_send").min().over("run")).alias("end_s")).drop("_send", "_end")


def _chains(jobs: pl.DataFrame) -> pl.DataFrame:
    """Each job's predecessor (``prev``: the previous request of the same item that had ended when it was sent)
    and the think time after it (``lag_s``)."""
    n = jobs.height
    prev = np.full(n, -1, dtype=np.int64)
    lag = np.full(n, np.nan)
    if n and jobs["item"].null_count() < n:
        j = jobs.with_row_index("_i").filter(pl.col("item").is_not_null())
        j = j.with_columns(pl.col("_i").shift(1).over("item").alias("_p"),
                           pl.col("end_s").shift(1).over("item").alias("_pe"))
        dep = j.filter(pl.col("_p").is_not_null() & (pl.col("send_s") >= pl.col("_pe") - 1e-6))
        idx = dep["_i"].to_numpy()
        prev[idx] = dep["_p"].to_numpy()
        lag[idx] = np.clip((dep["send_s"] - dep["_pe"]).to_numpy(), 0.0, MAX_LAG_S)
    return jobs.with_columns(pl.Series("prev", prev), pl.Series("lag_s", lag))


def _since_free(send: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each send, the seconds since the latest end before it (NaN when nothing had ended yet)."""
    ends = np.sort(end[~np.isnan(end)])
    k = np.searchsorted(ends, send, side="right")
    out = np.full(send.shape, np.nan)
    has = k > 0
    out[has] = send[has] - ends[k[has] - 1]
    return out


def _in_flight_at_send(send: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Requests in flight at each send (itself included)."""
    s, e = np.sort(send), np.sort(end[~np.isnan(end)])
    return np.searchsorted(s, send, side="right") - np.searchsorted(e, send, side="right")


def infer_policy(jobs: pl.DataFrame, concurrency: int) -> str:
    """The harness's dependency policy from its records (see ``Harness``): barrier when every stage began after
    the previous one had ended for every item (and there were more items than workers, else it cannot be told
    from chain); chain when nearly every successor was sent as soon as its predecessor ended; else fifo."""
    if jobs["item"].null_count() == jobs.height:
        return "fifo"
    per_stage = jobs.group_by("stage_idx").agg(pl.col("send_s").min().alias("first"),
                                               pl.col("end_s").max().alias("last"),
                                               pl.col("item").n_unique().alias("items")).sort("stage_idx")
    if per_stage.height > 1 and int(per_stage["items"].min()) > concurrency:  # type: ignore[arg-type]
        first, last = per_stage["first"].to_numpy(), per_stage["last"].to_numpy()
        if bool(np.all(first[1:] >= last[:-1] - 1e-6)):
            return "barrier"
    succ = jobs.filter(pl.col("prev") >= 0)
    if succ.height == 0:
        return "chain"
    typical = float(cast(float, jobs["latency_s"].median()) or 0.0)  # seconds, a Float64 column
    small = (succ["lag_s"] <= SMALL_LAG_S + 0.05 * typical).mean()
    return "chain" if small is not None and float(cast(float, small)) >= CHAIN_SHARE else "fifo"  # a share of rows


def _harness(jobs: pl.DataFrame, concurrency: int, np_: int, source: str) -> Harness:
    send, end = jobs["send_s"].to_numpy().astype(float), jobs["end_s"].to_numpy().astype(float)
    policy = infer_policy(jobs, concurrency)
    lags = jobs.filter(pl.col("prev") >= 0)["lag_s"]
    since = _since_free(send, end)
    gap = float(cast(float, lags.median())) if policy == "chain" and lags.len() else \
        float(np.nanmedian(since)) if np.any(~np.isnan(since)) else 0.0
    overhead = 0.0
    if source == "records":
        server_s = (jobs["prompt_ms"].fill_null(0.0) + jobs["gen_ms"].fill_null(0.0)) / 1000.0
        extra = (jobs["latency_s"] - server_s).to_numpy()
        ok = ((jobs["gen_ms"].is_not_null()).to_numpy() & (_in_flight_at_send(send, end) <= np_)
              & ~np.isnan(extra))
        overhead = float(np.median(np.clip(extra[ok], 0.0, None))) if ok.any() else 0.0
    first = np.sort(send)[: max(concurrency, 1)]
    stagger = float(np.median(np.diff(first))) if first.size > 1 else 0.0
    return Harness(concurrency, policy, max(gap, 0.0), overhead, max(stagger, 0.0), harness_timeout(jobs))


def _stage_index(rows: pl.DataFrame, stages: list[str] | None) -> pl.Expr:
    if stages:
        return pl.col("stage").replace_strict(stages, list(range(len(stages))), default=None,
                                              return_dtype=pl.Int64).fill_null(0)
    first = rows.group_by("stage").agg(pl.col("send_s").min()).sort("send_s")["stage"].to_list()
    return pl.col("stage").replace_strict(first, list(range(len(first))), default=0, return_dtype=pl.Int64)


def harness_timeout(rows: pl.DataFrame) -> float | None:
    """The client's timeout: the latency of its requests that timed out (their longest), when any did."""
    t = rows.filter(pl.col("outcome") == "timeout")["latency_s"].drop_nulls()
    return float(t.max()) if t.len() else None  # type: ignore[arg-type]


def _targets(rows: pl.DataFrame, runaways: pl.DataFrame | None) -> pl.Expr:
    """What each request would have generated had nobody stopped it.  Ended by itself: what it generated.  Given up
    on by the client (a timeout): a runaway (the runaways finding says so) would have run on to the slot's context;
    any other (a slow slot, say) at least its stage's usual output (the median of the stage's answered requests)."""
    done = rows.filter(~pl.col("outcome").is_in(GAVE_UP) & pl.col("gen_tokens").is_not_null())
    usual = dict(done.group_by("stage").agg(pl.col("gen_tokens").median()).iter_rows())
    fallback = float(cast(float, done["gen_tokens"].median()) or 0.0) if done.height else 0.0  # an Int64 median
    usual_expr = pl.col("stage").replace_strict(usual, default=fallback, return_dtype=pl.Float64) if usual else \
        pl.lit(fallback)
    room = pl.col("n_ctx_slot") - pl.col("prompt_tokens")
    run_away = pl.col("_runaway") if runaways is not None else pl.lit(False)
    gave_up = pl.col("outcome").is_in(GAVE_UP)
    return (pl.when(gave_up & run_away).then(pl.max_horizontal("gen_tokens", room))
            .when(gave_up).then(pl.max_horizontal(pl.col("gen_tokens"), usual_expr.round().cast(pl.Int64)))
            .otherwise(pl.col("gen_tokens")))


def jobs_of(rows: pl.DataFrame, instance: str | None, stages: list[str] | None = None,
            runaways: pl.DataFrame | None = None) -> pl.DataFrame:
    """The run's requests as jobs, in send order: ``simulated`` for those the chosen ``instance`` served with
    known tokens (the model replays them), the others keep their recorded latency (``fixed_s``).  ``runaways``:
    the (instance, slot, task) the runaways finding names."""
    rows = rows.sort(pl.col("send_s").fill_null(float("inf")), "ord")
    if runaways is not None:
        keys = runaways.select("instance", "slot", "task").unique().with_columns(pl.lit(True).alias("_runaway"))
        rows = rows.join(keys, on=["instance", "slot", "task"], how="left", maintain_order="left").with_columns(
            pl.col("_runaway").fill_null(False))
    served = pl.col("gen_tokens").is_not_null() & pl.col("prompt_tokens").is_not_null()
    if instance is not None:
        served = served & (pl.col("instance") == instance)
    gave_up = pl.col("outcome").is_in(GAVE_UP)
    timeout = harness_timeout(rows)
    rows = rows.with_row_index("order").with_columns(
        _stage_index(rows, stages).alias("stage_idx"), served.alias("simulated"),
        pl.col("prompt_eval").fill_null(pl.col("prompt_tokens")).clip(lower_bound=0),
        _targets(rows, runaways).alias("target"),
        pl.when(gave_up).then(pl.col("latency_s")).otherwise(pl.lit(timeout, dtype=pl.Float64)).alias("deadline_s"),
        pl.col("latency_s").fill_null(pl.col("end_s") - pl.col("send_s")).fill_null(0.0).alias("fixed_s"))
    return _chains(rows).select(*JOB_COLUMNS, "prompt_ms", "gen_ms", "ord")


def _runaways_if_needed(store: Store, run: str, rows: pl.DataFrame) -> pl.DataFrame | None:
    """The runaways finding's requests of ``run``, read only when the client gave up on a request it served."""
    if rows.filter(pl.col("outcome").is_in(GAVE_UP) & pl.col("gen_tokens").is_not_null()).height == 0:
        return None
    from forensics import findings

    return findings.find_runaways(store, run)


def main_instance(rows: pl.DataFrame, instance: str | None) -> str | None:
    """The instance the model replays: the one asked for, else the one that served the most requests."""
    have = rows.filter(pl.col("gen_tokens").is_not_null() & pl.col("instance").is_not_null())
    names = have.group_by("instance").len().sort(["len", "instance"], descending=[True, False])["instance"]
    if instance is not None:
        return instance
    return names[0] if names.len() else None


def _np_of(slots: pl.DataFrame, run: str, instance: str | None) -> int | None:
    mine = slots.filter(pl.col("run") == run)
    if instance is not None and mine.filter(pl.col("instance") == instance).height:
        mine = mine.filter(pl.col("instance") == instance)
    n = mine["n_slots"].drop_nulls()
    if n.len():
        return int(n.max())  # type: ignore[arg-type]
    c = mine["concurrency"].drop_nulls()
    return int(c.max()) if c.len() else None  # type: ignore[arg-type]


def read_workload(store: Store, run: str, *, instance: str | None = None,
             rows: pl.DataFrame | None = None, slots: pl.DataFrame | None = None) -> Workload:
    """The workload of ``run`` (``rows``/``slots``: its ``requests_frame`` and ``run_slots`` rows, when already read)."""
    name = runs_mod.resolve(store, [run]).runs[0]
    rows = _clock(requests_frame(store, [name]) if rows is None else rows.filter(pl.col("run") == name))
    slots = run_slots(store, [name]) if slots is None else slots
    inst = main_instance(rows, instance)
    stages = slots.filter(pl.col("run") == name)["stages"].drop_nulls()
    jobs = jobs_of(rows, inst, _stages(stages[0] if stages.len() else None), _runaways_if_needed(store, name, rows))
    np_ = _np_of(slots, name, inst) or 1
    conc = slots.filter(pl.col("run") == name)["concurrency"].drop_nulls()
    in_flight = _in_flight_at_send(jobs["send_s"].to_numpy().astype(float), jobs["end_s"].to_numpy().astype(float))
    concurrency = int(conc.max()) if conc.len() else int(in_flight.max()) if in_flight.size else np_  # type: ignore[arg-type]
    source = str(rows["source"][0]) if rows.height else "server"
    wall = _wall(jobs)
    run_s = slots.filter(pl.col("run") == name)["run_s"].drop_nulls()
    extra = max(float(run_s.max()) - wall, 0.0) if run_s.len() and wall is not None else 0.0  # type: ignore[arg-type]
    return Workload(name, inst, source, np_, _harness(jobs, max(concurrency, 1), np_, source), jobs, extra)


def _wall(jobs: pl.DataFrame) -> float | None:
    if jobs.height == 0 or jobs["send_s"].null_count() == jobs.height:
        return None
    return float(jobs["end_s"].max()) - float(jobs["send_s"].min())  # type: ignore[arg-type]


def _stages(text: str | None) -> list[str] | None:
    """The stage names of a manifest's JSON array, in order."""
    try:
        value: Any = json.loads(text) if text else None
    except ValueError:
        return None
    return [str(s) for s in value] if isinstance(value, list) else None

"""Throughput, latency and concurrency per run, their scaling across runs, and smoke budgets.

Definitions (see docs/metrics.md) follow vLLM's ``bench serve``, SGLang's ``bench_serving`` and
llama.cpp's timings where those define the same thing:

* request latency: server side ``total_ms / 1000`` (llama.cpp's prompt + generation time), or client
  side ``ended_at - started_at`` when the run has replay records (column ``source`` says which);
* TPOT (time per output token, vLLM): ``gen_ms / (gen_tokens - 1)`` per request;
* ``gen_tok_per_s``: Σ generated tokens / wall time (vLLM's output throughput, token-weighted);
* ``effective_concurrency``: Σ request durations / wall time (SGLang's "Concurrency");
* ``peak_busy_slots``: the most requests in flight at the same moment.

Everything here is plain polars and DuckDB: no click, no altair.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import duckdb
import polars as pl
import regex

from forensics import runs as runs_mod
from forensics.errors import InputError, QueryError
from forensics.sql import load_query
from forensics.store import Store, fetch_pl
from forensics.vocab import SOURCES

KNEE_GAIN = 0.10  # the knee: first step where throughput grows less than 10 % per extra slot


# The views the throughput path reads, and the tables whose rows make a run known to it.
THROUGHPUT_TABLES = ["requests", "attempts", "runs", "instances"]


@contextmanager
def _prepared(store: Store | duckdb.DuckDBPyConnection,
              runs: list[str] | None) -> Iterator[tuple[duckdb.DuckDBPyConnection, list[str]]]:
    """A connection whose ``fx_requests`` holds the request facts of ``runs`` (a session's, already prepared, when
    ``store`` is its connection), and the runs' names."""
    if not isinstance(store, Store):
        yield store, runs_mod.resolve(store, runs).runs
        return
    from forensics.session import Analysis

    names = runs_mod.resolve(store, runs).runs
    with Analysis.open(store, names) as s:
        s.prepare(names)
        s.bind(THROUGHPUT_TABLES)
        yield s.con, names


def _con(store: Store | duckdb.DuckDBPyConnection,
         tables: list[str] | None = None) -> tuple[duckdb.DuckDBPyConnection, bool]:
    if isinstance(store, Store):
        return store.connect(tables=tables), True
    return store, False


def lanes_source(store: Store, runs: list[str] | None, source: str = "auto") -> str:
    """The requests a per-request chart draws: with ``auto``, the server's when its log has requests for
    ``runs`` (the slots are the lanes), else the replay records."""
    if source != "auto":
        return source
    names = runs_mod.resolve(store, runs).runs
    con = store.connect(tables=["requests"])
    try:
        n = con.execute("SELECT count(*) FROM requests WHERE list_contains($runs, run)", {"runs": names}).fetchone()
    finally:
        con.close()
    return "server" if n and n[0] else "auto"


def request_intervals(store: Store | duckdb.DuckDBPyConnection, runs: list[str] | None = None, *,
                      source: str = "auto") -> pl.DataFrame:
    """One row per request with ``start_s``/``end_s`` on its run's clock (see request_intervals.sql)."""
    if source not in SOURCES:
        raise QueryError(f"unknown source {source!r}", hint=f"use one of {', '.join(SOURCES)}")
    with _prepared(store, runs) as (con, names):
        return fetch_pl(con, load_query("request_intervals").text, {"runs": names, "source": source})


@cache
def _throughput_sql() -> str:
    """throughput.sql with request_intervals.sql as its first CTE (parameters $runs, $source)."""
    text = load_query("throughput").text
    head = "WITH per_run AS ("
    if text.count(head) != 1:
        raise QueryError("throughput.sql does not start its CTEs with per_run", hint="reinstall the package")
    intervals = load_query("request_intervals").text.rstrip()
    order = "ORDER BY run, instance, slot, start_s, seq"  # the rows' order: the aggregates do not need it
    if intervals.endswith(order):
        intervals = intervals[: -len(order)]
    return text.replace(head, "WITH request_intervals AS (\n" + intervals + "\n),\nper_run AS (", 1)


# throughput.sql's columns, in its order: the analysis stores them in ``run_facts`` (``stored_throughput``)
THROUGHPUT_COLUMNS = ("run", "np", "np_source", "source", "time_basis", "estimated", "requests", "failed", "wall_s",
                      "run_s", "gen_tokens", "prompt_tokens", "gen_tok_per_s", "req_per_s", "latency_mean_s",
                      "latency_p50_s", "latency_p90_s", "latency_p95_s", "latency_p99_s", "latency_max_s",
                      "tpot_mean_ms", "tpot_p50_ms", "effective_concurrency", "peak_busy_slots")


def stored_throughput(store: Store, runs: list[str]) -> pl.DataFrame | None:
    """The throughput rows the store's analysis holds for ``runs`` (None when some run is not derived yet)."""
    from forensics import derived
    from forensics.session import VERSION, read_derived

    if derived.state(store).needs(runs, VERSION):
        return None
    facts = read_derived(store, "run_facts", runs)
    return facts.filter(pl.col("source").is_not_null()).select(THROUGHPUT_COLUMNS).sort("np", "run", nulls_last=True)


def throughput(store: Store | duckdb.DuckDBPyConnection, runs: list[str] | None = None, *,
               source: str = "auto", intervals: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per-run metrics (one row per run, see throughput.sql for the columns): as the store's analysis holds them
    for the default source, else worked out."""
    if source not in SOURCES:
        raise QueryError(f"unknown source {source!r}", hint=f"use one of {', '.join(SOURCES)}")
    if isinstance(store, Store) and source == "auto" and intervals is None:
        got = stored_throughput(store, runs_mod.resolve(store, runs).runs)
        if got is not None:
            return got
    if intervals is not None:
        con, own = _con(store, THROUGHPUT_TABLES)
        try:
            con.register("request_intervals", intervals.to_arrow())
            try:
                return fetch_pl(con, load_query("throughput").text)
            finally:
                con.unregister("request_intervals")
        finally:
            if own:
                con.close()
    # One query: request_intervals.sql becomes the first CTE of throughput.sql, so a million rows stay inside
    # DuckDB instead of going to polars and back.
    with _prepared(store, runs) as (con, names):
        return fetch_pl(con, _throughput_sql(), {"runs": names, "source": source})


# ---------------------------------------------------------------------------------------- scaling
@dataclass(frozen=True)
class Fit:
    """Least-squares line ``y = a + b x`` (b: marginal cost of one more concurrent request)."""

    a: float
    b: float
    r2: float | None
    n: int

    def predict(self, x: float) -> float:
        return self.a + self.b * x


def fit_line(x: list[float], y: list[float]) -> Fit | None:
    """Ordinary least squares over the pairs with both values; None with fewer than two distinct x."""
    pts = [(float(a), float(b)) for a, b in zip(x, y, strict=True)
           if a is not None and b is not None and not (math.isnan(a) or math.isnan(b))]
    n = len(pts)
    if n < 2:
        return None
    mx = sum(p[0] for p in pts) / n
    my = sum(p[1] for p in pts) / n
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    if sxx == 0:
        return None
    sxy = sum((p[0] - mx) * (p[1] - my) for p in pts)
    b = sxy / sxx
    a = my - b * mx
    syy = sum((p[1] - my) ** 2 for p in pts)
    ss_res = sum((p[1] - (a + b * p[0])) ** 2 for p in pts)
    r2 = 1 - ss_res / syy if syy > 0 else None
    return Fit(a, b, r2, n)


@dataclass
class Scaling:
    """Throughput and latency against concurrency (or another field) across runs.

    One knee (``one_knee``): ``knee`` is always a measured value of ``by``, ``knee_between`` the two measured
    values it lies between when the fitted model puts it between them, and ``sentence`` says it.
    ``model_knee`` is the fitted model's own knee, which may fall on a value no run measured; it is not said
    anywhere (``model_sentence`` is None)."""

    by: str
    table: pl.DataFrame
    fit: Fit | None
    knee: float | None
    sentence: str
    notes: list[str] = field(default_factory=list)
    model_knee: float | None = None  # the knee of the fitted model (see model_knee)
    model_sentence: str | None = None
    knee_between: tuple[float, float] | None = None  # the measured values the knee lies between


def _config_values(store: Store | duckdb.DuckDBPyConnection, key: str) -> dict[str, Any]:
    con, own = _con(store, ["runs"])
    try:
        rows = con.execute("SELECT run, config FROM runs").fetchall()
    finally:
        if own:
            con.close()
    out: dict[str, Any] = {}
    for run, config in rows:
        try:
            data = json.loads(config) if config else {}
        except json.JSONDecodeError:
            continue
        value: Any = data
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            out[run] = value
    return out


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(str(v))
    except ValueError:
        return None


def _fmt_x(x: float) -> str:
    return f"{x:g}"


def scaling(metrics: pl.DataFrame, *, by: str = "np",
            store: Store | duckdb.DuckDBPyConnection | None = None) -> Scaling:
    """Group per-run ``metrics`` by ``by`` (a metrics column, or a key of runs.config), fit latency
    = a + b × x on the runs' median latency, and find the knee (see ``knee``)."""
    notes: list[str] = []
    if by in metrics.columns:
        values = dict(zip(metrics["run"].to_list(), metrics[by].to_list(), strict=True))
    elif store is not None:
        values = _config_values(store, by)
        if not values:
            raise InputError(f"no run has a field {by!r}",
                             hint="use np, a column of `forensics throughput`, or a key of the runs' config")
    else:
        raise InputError(f"unknown field {by!r}", hint="use np or a column of `forensics throughput`")
    xs = [_num(values.get(r)) for r in metrics["run"].to_list()]
    skipped = [r for r, x in zip(metrics["run"].to_list(), xs, strict=True) if x is None]
    if skipped:
        notes.append(f"runs without a numeric {by}: {', '.join(skipped)} (left out)")
    df = metrics.with_columns(pl.Series("x", xs, dtype=pl.Float64)).filter(pl.col("x").is_not_null())
    table = (
        df.group_by("x")
        .agg(pl.len().alias("runs"),
             pl.col("gen_tok_per_s").mean(),
             pl.col("req_per_s").mean(),
             pl.col("latency_p50_s").mean(),
             pl.col("latency_p90_s").mean(),
             pl.col("effective_concurrency").mean(),
             pl.col("peak_busy_slots").max())
        .sort("x")
    )
    thr = table["gen_tok_per_s"].to_list()
    lat = table["latency_p50_s"].to_list()
    xv = table["x"].to_list()
    gain: list[float | None] = [None] * min(1, len(xv))
    lat_step: list[float | None] = [None] * min(1, len(xv))
    for i in range(1, len(xv)):
        dx = xv[i] - xv[i - 1]
        gain.append(_per_step(thr[i - 1], thr[i], dx))
        lat_step.append(_per_step(lat[i - 1], lat[i], dx))
    table = table.with_columns(pl.Series("throughput_gain_per_step", gain, dtype=pl.Float64),
                               pl.Series("latency_growth_per_step", lat_step, dtype=pl.Float64))
    if all(x == int(x) for x in xv):
        table = table.with_columns(pl.col("x").cast(pl.Int64))
    if by not in table.columns:
        table = table.rename({"x": by})
    fit = fit_line(df["x"].to_list(), df["latency_p50_s"].to_list())
    m_knee, _ = model_knee(fit, xv, by=by)
    knee_x, between, sentence = one_knee(fit, m_knee, xv, gain, lat_step, by=by)
    return Scaling(by, table, fit, knee_x, sentence, notes, m_knee, None, between)


def one_knee(fit: Fit | None, m_knee: float | None, xs: list[float], gain: list[float | None],
             lat_step: list[float | None], *, by: str = "np") -> tuple[float | None, tuple[float, float] | None, str]:
    """The one knee to say: the fitted model's (``model_knee``, which one run's noise cannot move) placed on the
    measured values: at the measured value it falls on, at the smallest measured value when it falls below
    them, or between the two measured values around it; with no model, the measured knee (``knee``).  Returns
    (knee, the two measured values it lies between or None, the sentence)."""
    label = "np" if by == "np" else by
    unit = "slot" if by == "np" else f"unit of {by}"
    if fit is None or m_knee is None:
        if fit is not None and fit.n >= 3 and len(set(xs)) >= 3 and fit.a > 0 and fit.b > 0:
            return None, None, (f"{_fitted(fit, label)}: throughput still grows by {KNEE_GAIN * 100:.0f} % or more "
                                f"per step up to {label} {_fmt_x(xs[-1])}: no knee yet")
        x, sentence = knee(xs, gain, lat_step, by=by)
        return x, None, sentence
    at = next((i for i, x in enumerate(xs) if x >= m_knee), None)
    if at is None:  # beyond every run: model_knee said so only for a c <= 4 x the largest
        return None, None, (f"{_fitted(fit, label)}: throughput still grows by {KNEE_GAIN * 100:.0f} % or more per "
                            f"{unit} up to {label} {_fmt_x(xs[-1])}, the largest measured: no knee yet")
    if xs[at] == m_knee or at == 0:
        x = xs[at]
        nxt = at + 1 if at + 1 < len(xs) else None
        g, lt = (gain[nxt], lat_step[nxt]) if nxt is not None else (None, None)
        return x, None, f"{_fitted(fit, label)}: above {label} {_fmt_x(x)} {_step_words(g, lt, unit, 'adds')}"
    lo, hi = xs[at - 1], xs[at]
    g = gain[at]
    if g is not None and g >= KNEE_GAIN:  # the runs' own step disagrees with the model: say both
        later = "; ".join(f"{_fmt_x(xs[i - 1])} to {_fmt_x(xs[i])} {gi * 100:.0f} %"
                          for i in range(at + 1, len(xs)) if (gi := gain[i]) is not None)
        return lo, (lo, hi), (f"{_fitted(fit, label)}: the fitted model puts the knee between {label} {_fmt_x(lo)} "
                              f"and {_fmt_x(hi)}, but measured, the step from {_fmt_x(lo)} to {_fmt_x(hi)} still "
                              f"added {g * 100:.0f} % throughput per {unit}" + (f" (then {later})" if later else "")
                              + ": the runs are noisier than the fit")
    return lo, (lo, hi), (f"{_fitted(fit, label)}: the knee is between {label} {_fmt_x(lo)} and {_fmt_x(hi)}: "
                          f"from {_fmt_x(lo)} to {_fmt_x(hi)} {_step_words(g, lat_step[at], unit, 'added')}")


def _fitted(fit: Fit, label: str) -> str:
    return f"fitted latency = {fit.a:.2f} s + {fit.b:.2f} s × {label}"


def _step_words(g: float | None, lt: float | None, unit: str, verb: str) -> str:
    if g is None:
        return f"each extra {unit} {verb} less than {KNEE_GAIN * 100:.0f} % throughput (fitted)"
    lat = f"{lt * 100:.0f} % latency" if lt is not None else "unknown latency"
    return f"each extra {unit} {verb} {g * 100:.0f} % throughput and {lat}"


def model_knee(fit: Fit | None, xs: list[float], *, by: str = "np",
               threshold: float = KNEE_GAIN) -> tuple[float | None, str | None]:
    """The knee of the fitted model, which single runs' noise (a retry, a slow request) cannot move.

    With latency L(c) = a + b·c and each of c concurrent requests producing about the same tokens,
    throughput is T(c) ∝ c / (a + b·c) (each extra request adds the constant marginal cost b).  The knee
    is the first c (from the runs' smallest value up) after which one more unit adds less than
    ``threshold`` throughput.  Needs a fit over three or more distinct values with a > 0, b > 0.
    """
    if fit is None or fit.n < 3 or len(set(xs)) < 3 or fit.a <= 0 or fit.b <= 0:
        return None, None
    label = "np" if by == "np" else by
    unit = "slot" if by == "np" else f"unit of {by}"
    c = max(1.0, float(min(xs)))
    top = max(float(max(xs)), c) * 4
    while c <= top:
        t0, t1 = c / fit.predict(c), (c + 1) / fit.predict(c + 1)
        gain = t1 / t0 - 1
        if gain < threshold:
            lat = fit.predict(c + 1) / fit.predict(c) - 1
            where = "" if c <= max(xs) else f" (beyond the runs' largest {label} {_fmt_x(max(xs))})"
            return c, (f"fitted latency = {fit.a:.2f} s + {fit.b:.2f} s × {label}: above {label} {_fmt_x(c)} "
                       f"each extra {unit} adds {gain * 100:.0f} % throughput and {lat * 100:.0f} % latency{where}")
        c += 1.0
    return None, None


def _per_step(prev: float | None, cur: float | None, dx: float) -> float | None:
    if prev is None or cur is None or prev == 0 or dx <= 0:
        return None
    return (cur / prev - 1) / dx


def knee(xs: list[float], gain: list[float | None], lat_step: list[float | None], *,
         by: str = "np", threshold: float = KNEE_GAIN) -> tuple[float | None, str]:
    """The knee: the first x after which throughput grows by less than ``threshold`` (relative) per
    extra unit of x.  ``gain[i]``/``lat_step[i]`` are the relative changes per unit from xs[i-1] to
    xs[i].  Returns (knee x or None, a sentence)."""
    label = "np" if by == "np" else by
    if len(xs) < 2:
        return None, f"need runs at two or more values of {label} to find a knee"
    for i in range(1, len(xs)):
        g = gain[i]
        if g is not None and g < threshold:
            lt = lat_step[i]
            lat_txt = f"{lt * 100:.0f} % latency" if lt is not None else "unknown latency"
            unit = "slot" if by == "np" else f"unit of {by}"
            return xs[i - 1], (f"above {label} {_fmt_x(xs[i - 1])} each extra {unit} adds "
                               f"{g * 100:.0f} % throughput and {lat_txt}")
    return None, (f"throughput still grows by {threshold * 100:.0f} % or more per step up to {label} "
                  f"{_fmt_x(xs[-1])}: no knee yet")


# ---------------------------------------------------------------------------------------- smoke
_DURATION = regex.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$", regex.IGNORECASE)
_UNIT = {None: 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str | float | int) -> float:
    """Seconds from "90s", "20m", "1h", "1500ms" or plain seconds ("45", 45)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    m = _DURATION.match(str(text))
    if not m:
        raise InputError(f"cannot read duration {text!r}", hint='use e.g. "90s", "20m", "1h", "1500ms" or seconds')
    unit = m.group(2).lower() if m.group(2) else None
    return float(m.group(1)) * _UNIT[unit]


@dataclass
class SmokeResult:
    table: pl.DataFrame
    passed: bool
    budgets: dict[str, float]


def smoke(metrics: pl.DataFrame, *, max_run_s: float | None = None, max_request_s: float | None = None,
          max_p95_s: float | None = None) -> SmokeResult:
    """Check each run against the budgets: total run time (manifest duration when known, else the
    wall time of its requests), the longest request, and the p95 request latency.  One row per run,
    side by side: the number and ``pass``/``fail`` per budget, and the run's verdict."""
    budgets = {k: v for k, v in (("run", max_run_s), ("request", max_request_s), ("p95", max_p95_s))
               if v is not None}
    if not budgets:
        raise InputError("no budget given", hint="pass --max-run, --max-request and/or --max-p95")
    rows = []
    all_ok = True
    for m in metrics.iter_rows(named=True):
        row: dict[str, Any] = {"run": m["run"], "np": m["np"]}
        ok = True
        values = {"run": m["run_s"] if m["run_s"] is not None else m["wall_s"],
                  "request": m["latency_max_s"], "p95": m["latency_p95_s"]}
        for name, limit in budgets.items():
            v = values[name]
            verdict = "fail" if v is None or v > limit else "pass"
            ok = ok and verdict == "pass"
            row[f"{name}_s"] = v
            row[f"max_{name}_s"] = limit
            row[f"{name}_verdict"] = verdict
        row["verdict"] = "PASS" if ok else "FAIL"
        all_ok = all_ok and ok
        rows.append(row)
    schema: dict[str, Any] = {"run": pl.String, "np": pl.Int64}
    for name in budgets:
        schema |= {f"{name}_s": pl.Float64, f"max_{name}_s": pl.Float64, f"{name}_verdict": pl.String}
    schema["verdict"] = pl.String
    return SmokeResult(pl.DataFrame(rows, schema=schema, orient="row"), all_ok and bool(rows), budgets)


BUSY_GAP_S = 1.0  # a slot handed to its next request within this is still busy: no drop at every boundary


def busy_over_time(intervals: pl.DataFrame, *, gap_s: float = BUSY_GAP_S) -> pl.DataFrame:
    """Busy slots per run and instance as a step function: (run, instance, t_s, busy) after each change.

    A slot's requests that follow each other within ``gap_s`` count as one busy stretch: the moment between a
    request's end and the next one's start on the same slot is the server handing the slot over, not a slot
    going idle, and drawing it would drop the line at every request boundary.
    """
    ri = intervals.filter(pl.col("start_s").is_not_null() & pl.col("end_s").is_not_null())
    if "slot" in ri.columns:
        keys = ["run", "instance", "slot"]
        ri = ri.sort(*keys, "start_s").with_columns(
            pl.col("start_s").shift(-1).over(keys).alias("_next"))
        ri = ri.with_columns(pl.when((pl.col("_next") - pl.col("end_s")).is_between(0, gap_s))
                             .then(pl.col("_next")).otherwise(pl.col("end_s")).alias("end_s")).drop("_next")
    edges = pl.concat([
        ri.select("run", "instance", pl.col("start_s").alias("t_s"), pl.lit(1).alias("d")),
        ri.select("run", "instance", pl.col("end_s").alias("t_s"), pl.lit(-1).alias("d")),
    ])
    return (
        edges.group_by("run", "instance", "t_s").agg(pl.col("d").sum())
        .filter(pl.col("d") != 0)  # a stretch's joined end and start: no change at all
        .sort("run", "instance", "t_s")
        .with_columns(pl.col("d").cum_sum().over("run", "instance").cast(pl.Int64).alias("busy"))
        .drop("d")
    )


def with_classes(intervals: pl.DataFrame, classes: pl.DataFrame) -> pl.DataFrame:
    """``intervals`` with each request's ``class`` from ``findings.request_classes`` (requests it does not list,
    replay attempts without a server request, are "unclassified")."""
    keys = ["run", "instance", "slot", "task"]
    if not set(keys) <= set(intervals.columns):
        return intervals.with_columns(pl.lit("unclassified").alias("class"))
    out = intervals.drop("class", strict=False).join(classes.select(*keys, "class"), on=keys, how="left",
                                                     nulls_equal=True, maintain_order="left")
    return out.with_columns(pl.col("class").fill_null("unclassified"))

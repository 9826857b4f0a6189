"""Findings: runaway outputs, dead slots, the output cap that would have stopped them, server errors, ...

The public functions of each finding of the registry (``forensics.registry``).  Each takes a ``Store`` (a
session is opened for the call) or an open ``Analysis`` session (``forensics.session``: the verdict, the
report and watch compute every finding in one), the runs (none: all), and the thresholds as keywords.  The
rules are the named SQL files in ``forensics/queries/``; their defaults are in docs/findings.md.  ``rows``
gives any registered finding's listing by name.

Library only: no click, no altair.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TypeAlias, cast

import polars as pl

from forensics import registry
from forensics.registry import CAPS_SCHEMA, cap_step, round_cap, serious_errors  # noqa: F401  (public names)
from forensics.session import DEFAULTS, Analysis, Thresholds, analysis, thresholds
from forensics.shapes import MASKS, mask_series, mask_shape  # noqa: F401
from forensics.store import Store, fetch_pl
from forensics.timefmt import wall_expr

Source: TypeAlias = "Store | Analysis"
Runs: TypeAlias = "str | list[str] | tuple[str, ...] | None"

mask_message = mask_shape  # the errors finding's name for it
RUNAWAY_COLUMNS = registry.RUNAWAY_COLUMNS
PROMPT_OVER_COLUMNS = registry.PROMPT_COLUMNS


def rows(source: Source, name: str, runs: Runs = None, th: Thresholds = DEFAULTS) -> pl.DataFrame:
    """The listing of the registered finding ``name`` for ``runs``: what its command prints."""
    f = registry.finding(name)
    with analysis(source, runs) as s:
        return f.listing(s.rows(name, th, s.narrowed(runs)))


def find_runaways(source: Source, run: Runs = None, **overrides: float | int | None) -> pl.DataFrame:
    """Requests whose output ran away (see runaways.sql): one row each, with why and what followed."""
    return rows(source, "runaway", run, thresholds(**overrides))


def find_prompt_over_context(source: Source, run: Runs = None, **overrides: float | int | None) -> pl.DataFrame:
    """Requests whose prompt did not fit the slot's context: refused, cut, or filling it before the output grew
    (see prompt_over_context.sql).  They are not runaways: the cure is a shorter prompt or a larger -c."""
    return rows(source, "prompt_over_context", run, thresholds(**overrides))


@dataclass
class DeadSlotReport:
    slots: pl.DataFrame  # one row per dead slot
    sequence: pl.DataFrame  # the requests of those slots, in order, with abnormal and why


def dead_slot_report(source: Source, run: Runs = None, *, include_recovered: bool = False,
                     **overrides: float | int | None) -> DeadSlotReport:
    """Dead slots: a slot is dead from the first of two consecutive abnormal requests on it (deadslots.sql).

    ``recovered`` is true when the slot's last two requests are normal again; such slots are left out
    unless ``include_recovered`` (two bad requests in a row that the slot gets over are usually
    retries of one bad item landing on the same slot).
    """
    th = thresholds(include_recovered=include_recovered, **overrides)
    with analysis(source, run) as s:
        slots = s.rows("dead_slot", th, s.narrowed(run))
        return DeadSlotReport(slots, registry.dead_slot_sequence(s, th, slots))


def find_dead_slots(source: Source, run: Runs = None, *, include_recovered: bool = False,
                    **overrides: float | int | None) -> pl.DataFrame:
    """Dead slots as a frame (see ``dead_slot_report``)."""
    return dead_slot_report(source, run, include_recovered=include_recovered, **overrides).slots


# ---------------------------------------------------------------------------------------- classes
CLASS_SCHEMA = {"run": pl.String, "instance": pl.String, "slot": pl.Int64, "task": pl.Int64, "class": pl.String}
_KEYS = ["run", "instance", "slot", "task"]


def classes() -> tuple[str, ...]:
    """The request classes, most telling first: the registry's, then normal."""
    return (*[f.request_class for f in registry.FINDINGS.values() if f.request_class], "normal")


def request_classes(source: Source, runs: Runs = None, th: Thresholds = DEFAULTS) -> pl.DataFrame:
    """Each server request of ``runs`` with the findings' verdict on it, for the charts and the report.

    ``class`` is the first finding of the registry that claims the request (dead slot, runaway, prompt over
    context, failed, ...), else normal.  Defined by the findings and nothing else: no finding, no class.
    """
    with analysis(source, runs) as s:
        names = s.narrowed(runs)
        s.prepare(names)
        base = s.query("request_keys", th, names)
        cls = pl.lit("normal")
        for f in reversed([f for f in registry.FINDINGS.values() if f.request_class]):
            got = f.class_rows(s, th, names) if f.class_rows is not None else s.rows(f.name, th, names)
            flag = f"_{f.name}"
            marked = got.select(_KEYS).unique().with_columns(pl.lit(True).alias(flag))
            base = base.join(marked, on=_KEYS, how="left", nulls_equal=True)
            cls = pl.when(pl.col(flag).fill_null(False)).then(pl.lit(f.request_class)).otherwise(cls)
    return base.select(*_KEYS, cls.alias("class")).cast(CLASS_SCHEMA)  # type: ignore[arg-type]


CLASSES = ("dead slot", "runaway", "prompt over context", "failed", "normal")


def classified_requests(store: Source, runs: str | list[str] | None = None, *, source: str = "auto") -> pl.DataFrame:
    """Each request's interval on its run's clock (``metrics.request_intervals``, the server's requests when
    the log has them) with its ``class`` from ``request_classes``: what every per-request chart draws."""
    from forensics import metrics

    with analysis(store, runs) as s:
        names = s.narrowed(runs)
        ri = metrics.request_intervals(s.store, names, source=metrics.lanes_source(s.store, names, source))
        return metrics.with_classes(ri, request_classes(s, names))


# ---------------------------------------------------------------------------------------- cap
@dataclass
class CapResult:
    cap: int | None  # recommended output cap (max_tokens / n_predict); None without normal responses
    margin: float
    per_stage: pl.DataFrame  # stage, normal, normal_max, runaways, cap
    whatif: pl.DataFrame  # stage, cap, recommended, normal_cut, runaways_stopped, runaways, tokens_saved, seconds_saved
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _candidates(rec: int) -> list[int]:
    powers = [2 ** k for k in range(6, 20) if rec / 4 <= 2 ** k <= rec * 4]
    return sorted({rec, *powers})


def cut_by_cap(cap: int) -> pl.Expr:
    """The rows of cap.sql an output cap of ``cap`` tokens cuts: a normal response that reached it (≥ cap: it would
    have ended at the cap) and a runaway that went past it; never one that already had a cap of its own at or below
    ``cap`` (a response the harness capped at 64 that stopped at 64 is not cut by a cap of 64)."""
    own = pl.col("own_cap").is_null() | (pl.col("own_cap") > cap)
    return own & ((pl.col("normal") & (pl.col("gen_tokens") >= cap)) | (pl.col("runaway") & (pl.col("gen_tokens") > cap)))


CAP_KEYS = ("run", "stage", "gen_tokens", "own_cap", "normal", "runaway", "prompt_tokens", "ctx_slot")


def cap_facts(df: pl.DataFrame) -> pl.DataFrame:
    """cap.sql's rows grouped alike (the derived ``cap_facts``): ``n`` requests each, the sum of their ms per token;
    a normal response's prompt size kept (the p95 reads them), the others' dropped.  Everything ``recommend_cap``
    works out is a sum, a count, a min or max, or a quantile of these, so it reads the groups as it read the rows."""
    normal = pl.col("normal").fill_null(False)
    return (df.with_columns(normal.alias("normal"),
                            pl.when(normal).then(pl.col("prompt_tokens")).alias("prompt_tokens"))
            .group_by(CAP_KEYS).agg(pl.len().cast(pl.Int64).alias("n"),
                                    pl.col("ms_per_token").fill_null(0.0).sum().alias("ms_per_token"))
            .sort(CAP_KEYS, nulls_last=True))


def _n(df: pl.DataFrame) -> int:
    return int(df["n"].sum())


def _whatif(df: pl.DataFrame, caps: list[int], rec: int, stage: str | None) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    gen = df["gen_tokens"].cast(pl.Float64)
    runaways = _n(df.filter(pl.col("runaway")))
    for c in caps:
        over = (gen - c).clip(lower_bound=0)
        cut = df.filter(cut_by_cap(c))
        out.append({
            "stage": stage, "cap": c, "recommended": c == rec,
            "normal_cut": _n(cut.filter(pl.col("normal"))),
            "runaways_stopped": _n(cut.filter(pl.col("runaway"))),
            "runaways": runaways,
            "tokens_saved": int((over * df["n"]).sum()),
            "seconds_saved": round(float((over * df["ms_per_token"]).sum()) / 1000.0, 1),
        })
    return out


WHATIF_SCHEMA = {"stage": pl.String, "cap": pl.Int64, "recommended": pl.Boolean, "normal_cut": pl.Int64,
                 "runaways_stopped": pl.Int64, "runaways": pl.Int64, "tokens_saved": pl.Int64,
                 "seconds_saved": pl.Float64}
STAGE_SCHEMA = {"stage": pl.String, "normal": pl.Int64, "normal_max": pl.Int64, "runaways": pl.Int64,
                "cap": pl.Int64}


def _per_stage(df: pl.DataFrame, margin: float) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    stages = sorted({st for st in df["stage"].to_list() if st is not None})
    stage_rows: list[dict[str, object]] = []
    whatif: list[dict[str, object]] = []
    if len(stages) <= 1:
        return stage_rows, whatif
    for st in stages:
        part = df.filter(pl.col("stage") == st)
        pn = part.filter(pl.col("normal"))
        scap = round_cap(int(pn["gen_tokens"].max()), margin) if pn.height else None  # type: ignore[arg-type]
        stage_rows.append({"stage": st, "normal": _n(pn), "normal_max": pn["gen_tokens"].max() if pn.height else None,
                           "runaways": _n(part.filter(pl.col("runaway"))), "cap": scap})
        if scap is not None:
            whatif += _whatif(part, _candidates(scap), scap, st)
    return stage_rows, whatif


def _cap_groups(s: Analysis, th: Thresholds, names: list[str]) -> pl.DataFrame:
    """``cap_facts`` of the runs: stored at the default thresholds (the margin only rounds), else worked out."""
    if (replace(th, margin=DEFAULTS.margin) == DEFAULTS and s.stored is not None
            and s.stored.has("cap_facts", names)):
        s.bind(["cap_facts"])
        return fetch_pl(s.con, "SELECT * FROM cap_facts WHERE run IN (SELECT unnest($runs))", {"runs": names})
    s.register("fx_runaway", s.rows("runaway", th, names))
    s.prepare(names)
    return cap_facts(s.query("cap", th, names))


def recommend_cap(source: Source, runs: Runs = None, *, margin: float = 0.2,
                  **overrides: float | int | None) -> CapResult:
    """Recommend an output-token cap above every normal response (with ``margin``), and what it would do."""
    th = thresholds(margin=margin, **overrides)
    with analysis(source, runs) as s:
        names = s.narrowed(runs)
        s.bind(["attempts"])
        # in one order whatever the engine and the batches: the sums of seconds come out the same each time
        df = _cap_groups(s, th, names).sort(CAP_KEYS, nulls_last=True)
        no_cap_attempts = s.query("attempts_capped", th, names)["n"][0] == 0
    warnings: list[str] = []
    normal = df.filter(pl.col("normal"))
    if normal.height == 0:
        warnings.append("no normal response to choose a cap from")
        return CapResult(None, margin, pl.DataFrame(schema=STAGE_SCHEMA), pl.DataFrame(schema=WHATIF_SCHEMA),
                         warnings)
    rec = round_cap(int(normal["gen_tokens"].max()), margin)  # type: ignore[arg-type]
    stage_rows, per_stage_whatif = _per_stage(df, margin)
    whatif = _whatif(df, _candidates(rec), rec, None) + per_stage_whatif
    warnings += _cap_warnings(df, normal, rec, no_cap_attempts)
    return CapResult(rec, margin, pl.DataFrame(stage_rows, schema=STAGE_SCHEMA, orient="row"),
                     pl.DataFrame(whatif, schema=WHATIF_SCHEMA, orient="row"), warnings)


def _cap_warnings(df: pl.DataFrame, normal: pl.DataFrame, rec: int, no_cap_attempts: bool) -> list[str]:
    import math

    warnings = []
    run_df = df.filter(pl.col("runaway"))
    runaways = _n(run_df)
    if runaways and _n(run_df.filter(pl.col("own_cap").is_null())) == runaways and no_cap_attempts:
        warnings.append(f"the logs show no output cap (n_predict unset or -1 everywhere) and {runaways} "
                        f"runaway(s): set max_tokens / n_predict to {rec}")
    smallest = cast("int | None", run_df["gen_tokens"].min())  # an Int64 column: None when no runaway
    if runaways and smallest is not None and rec >= smallest:
        warnings.append(f"cap {rec} does not stop every runaway (the smallest generated {smallest} tokens)")
    # each normal prompt size as many times as requests had it: the quantile of the requests themselves
    p95 = normal.select(pl.col("prompt_tokens").repeat_by("n").explode()).to_series().drop_nulls()
    ctx = df["ctx_slot"].drop_nulls()
    if p95.len() and ctx.len():
        need = math.ceil(float(p95.quantile(0.95, interpolation="linear"))) + rec  # type: ignore[arg-type]
        smallest_ctx = cast(int, ctx.min())  # an Int64 column, not empty here
        if smallest_ctx < need:
            warnings.append(f"a slot's context ({smallest_ctx} tokens) cannot hold a normal prompt (p95 "
                            f"{need - rec} tokens) plus the cap {rec}: raise -c or lower -np")
    return warnings


def caps_by_run(source: Source, runs: Runs = None, *, margin: float = 0.2,
                **overrides: float | int | None) -> pl.DataFrame:
    """``recommend_cap``'s cap for each run on its own (the same rule: ``round_cap`` of the run's longest normal
    response), with what it would have done there: runaways stopped, normal responses cut, and whether the
    logs show a cap in force (``capped``)."""
    return rows(source, "cap", runs, thresholds(margin=margin, **overrides))


CUT_COLUMNS = ("run", "instance", "slot", "task", "item", "stage", "gen_tokens", "runaway", "normal")


def cap_cuts(source: Source, runs: Runs, cap: int, **overrides: float | int | None) -> pl.DataFrame:
    """The outputs an output cap of ``cap`` tokens would have cut (``cut_by_cap``), one row each: its request, item
    and stage, its generated tokens, and whether it was a runaway or a normal response."""
    th = thresholds(**overrides)
    with analysis(source, runs) as s:
        names = s.narrowed(runs)
        s.register("fx_runaway", s.rows("runaway", th, names))
        s.prepare(names)
        df = s.query("cap", th, names)
    return df.filter(cut_by_cap(cap)).select(CUT_COLUMNS)


def uncapped_runaway_runs(source: Source, runs: Runs = None, *, margin: float = 0.2,
                          **overrides: float | int | None) -> pl.DataFrame:
    """The ``caps_by_run`` rows of runs that had runaways with no output cap in force: a cap was needed."""
    caps = caps_by_run(source, runs, margin=margin, **overrides)
    return caps.filter(~pl.col("capped").fill_null(False) & (pl.col("runaways").fill_null(0) > 0))


# ---------------------------------------------------------------------------------------- errors
ERROR_SCHEMA = {"run": pl.String, "kind": pl.String, "level": pl.String, "count": pl.Int64,
                "http_status": pl.String, "first": pl.String, "last": pl.String, "slots": pl.String,
                "items": pl.String, "in_flight": pl.String, "shape": pl.String, "example": pl.String,
                "evidence": pl.String}


def _joined(col: str, limit: int = 10) -> pl.Expr:
    """The distinct values of ``col`` in a group, shortest first, the first ``limit`` and ``+N`` more."""
    vals = pl.col(col).cast(pl.String).drop_nulls().unique()
    vals = vals.sort_by(vals.str.len_chars(), vals)
    head = vals.head(limit).str.join(",")
    n = vals.len()
    return pl.when(n > limit).then(pl.format("{},+{}", head, n - limit)).otherwise(head).alias(col)


def group_errors(ev: pl.DataFrame) -> pl.DataFrame:
    """The rows of errors.sql grouped by run, kind and message shape (``shapes.MASKS``), errors first."""
    if ev.height == 0:
        return pl.DataFrame(schema=ERROR_SCHEMA)
    at = wall_expr(pl.col("ts"))  # wall clock or nothing: the lines are in `evidence`
    spot = pl.format("{}:{}", pl.col("path"), pl.col("line_no")) + \
        pl.when(pl.col("line_last") != pl.col("line_no")).then(pl.format("-{}", pl.col("line_last"))).otherwise(pl.lit(""))
    ev = ev.with_row_index("_i").with_columns(mask_series(ev["message"]).alias("shape"), at.alias("_at"),
                                              spot.alias("_spot"))
    spots = pl.col("_spot")
    out = ev.group_by("run", "kind", "shape").agg(
        pl.col("_i").min().alias("_order"), _joined("level"), pl.len().cast(pl.Int64).alias("count"),
        _joined("http_status"), pl.col("_at").first().alias("first"), pl.col("_at").last().alias("last"),
        _joined("slot").alias("slots"), _joined("item").alias("items"),
        pl.col("tasks").drop_nulls().str.join("; ").alias("in_flight"), pl.col("message").first().alias("example"),
        (spots.head(5).str.join(", ") + pl.when(pl.len() > 5).then(pl.format(", +{}", pl.len() - 5))
         .otherwise(pl.lit(""))).alias("evidence"))
    out = out.with_columns(pl.when(pl.col("in_flight") != "").then(pl.col("in_flight")).alias("in_flight"))
    order = (pl.when(pl.col("kind") == "crash").then(0)
             .when(pl.col("level").str.contains("(?i)^e|err|fatal")).then(1).otherwise(2))
    out = out.sort([pl.col("run"), order, pl.col("count"), pl.col("_order")], descending=[False, False, True, False])
    return out.select(list(ERROR_SCHEMA)).cast(ERROR_SCHEMA)  # type: ignore[arg-type]


def error_groups(source: Source, run: Runs = None) -> pl.DataFrame:
    """Server-side errors and warnings grouped by message shape, and one row per crash with the tasks it
    had in flight (see errors.sql and ``MASKS``); ``evidence`` gives the lines to read."""
    return rows(source, "errors", run)


def missing_items(source: Source, runs: Runs = None) -> pl.DataFrame:
    """(run, item, stage) of every expected item that did not finish ok, from the replay ``items`` table (its
    rules decide what is expected of each stage); a run without records has none."""
    return rows(source, "missing", runs)

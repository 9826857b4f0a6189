"""Findings: runaway outputs, dead slots, the output cap that would have stopped them, server errors.

Each finding runs a named SQL file from ``forensics/queries/`` (runaways, deadslots, cap, errors) over
the store's DuckDB views with bound parameters, on top of ``findings_base.sql`` (the ``fx_requests``
table: the requests of the chosen runs, built once per session).  A request's item and stage come from
the ``matches`` table when the store has one with rows; otherwise baselines are per run and instance
instead of per run and stage.

Library only: no click, no altair.  The rules and their defaults are in docs/findings.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import duckdb
import polars as pl
import regex

from forensics import runs as runs_mod
from forensics import schema
from forensics.errors import QueryError
from forensics.repetition import score_texts
from forensics.sql import load_query
from forensics.store import ArrowStream, Store, fetch_pl


@dataclass(frozen=True)
class Thresholds:
    """The rules' knobs (defaults documented in docs/findings.md)."""

    factor: float = 3.0  # runaway: gen_tokens > factor x the group's `quantile` quantile ...
    quantile: float = 0.9
    min_tokens: int = 256  # ... and at least this many tokens
    min_group: int = 5  # fewer clean requests in a stage/instance group: use the whole run's baseline
    ctx_slack: int = 8  # reached the slot's context: n_past_end >= n_ctx_slot - ctx_slack
    long_factor: float = 5.0  # abnormally long: seconds > long_factor x the group's median seconds ...
    min_seconds: float = 1.0  # ... and at least this long
    slow_factor: float = 4.0  # abnormally slow: ms per token > slow_factor x the group's median
    few_tokens: int = 3  # a handful of tokens: gen_tokens <= few_tokens ...
    few_normal: float = 100.0  # ... where the group's median is at least this many

    def __post_init__(self) -> None:
        if not 0 < self.quantile <= 1:
            raise QueryError(f"quantile {self.quantile} is not in (0, 1]", hint="pass e.g. --quantile 0.9")
        for name in ("factor", "long_factor", "slow_factor"):
            if getattr(self, name) <= 0:
                raise QueryError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("min_tokens", "min_group", "ctx_slack", "few_tokens"):
            if getattr(self, name) < 0:
                raise QueryError(f"{name} must not be negative, got {getattr(self, name)}")


def thresholds(**overrides: float | int | None) -> Thresholds:
    """Thresholds with the given overrides (None values keep the default)."""
    known = {f.name for f in fields(Thresholds)}
    bad = [k for k in overrides if k not in known]
    if bad:
        raise QueryError(f"unknown threshold {bad[0]!r}", hint=f"thresholds: {', '.join(sorted(known))}")
    return Thresholds(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- session
EVENT_FIELDS = {"slot": "BIGINT", "task": "BIGINT", "error": "VARCHAR", "msg": "VARCHAR", "status": "BIGINT",
                "method": "VARCHAR", "n_ctx_train": "BIGINT"}
MATCH_COLUMNS = {"run": "VARCHAR", "item": "VARCHAR", "stage": "VARCHAR", "attempt": "BIGINT",
                 "instance": "VARCHAR", "slot": "BIGINT", "task": "BIGINT"}
RUNAWAY_KEYS = {"run": pl.String, "instance": pl.String, "slot": pl.Int64, "task": pl.Int64}


@dataclass
class _Session:
    con: duckdb.DuckDBPyConnection
    runs: list[str]
    has_matches: bool
    runaways: dict[Thresholds, pl.DataFrame] = field(default_factory=dict)  # by thresholds, computed once


# The session every finding of one verdict shares (``shared_session``): (store root, session).
_SHARED: contextvars.ContextVar[tuple[Path, _Session] | None] = contextvars.ContextVar("_SHARED", default=None)


# The views each kind of session reads (the run list comes from the manifest, see runs.all_runs).
# Each view binds every part of its table (slow with many runs), so a session creates only these, the
# ``tables`` a finding asks for, and attempts when the matched outputs are scored (fx_degenerate).
REQUEST_TABLES = ["requests", "instances", "matches", "events"]
EVENT_TABLES = ["events", "matches"]


@contextlib.contextmanager
def _session(store: Store, runs: str | list[str] | tuple[str, ...] | None, *,
             requests: bool = True, tables: tuple[str, ...] = ()) -> Iterator[_Session]:
    """A connection with the findings' helper relations: fx_matches, fx_events, and unless ``requests``
    is false (the errors finding reads only the events) fx_requests and fx_degenerate.

    fx_requests is a temporary table built once: each finding reads it several times (the runaways
    under deadslots and cap, the baselines and the rows), and a view would scan and join the requests
    again at every reference.
    """
    shared = _SHARED.get()
    if shared is not None and shared[0] == store.root and runs_mod.resolve(store, runs).runs == shared[1].runs:
        yield shared[1]
        return
    con = store.connect(tables=[*(REQUEST_TABLES if requests else EVENT_TABLES), *tables])
    try:
        # fx_matches: the matches table when it exists and has rows, else an empty relation.  A part is
        # only ever written with rows, so the table has rows when the manifest lists a part; the view
        # has exactly the contract's columns.
        has_matches = "matches" in schema.TABLES and bool(store.parts("matches"))
        if has_matches:
            cols = ", ".join(f'CAST("{c}" AS {t}) AS "{c}"' for c, t in MATCH_COLUMNS.items())
            have_m = {c.name for c in schema.TABLES["matches"]}
            where = " AND coalesce(\"match\", 'matched') <> 'unmatched'" if "match" in have_m else ""
            con.execute(f"CREATE OR REPLACE TEMP VIEW fx_matches AS SELECT {cols} FROM matches "
                        f"WHERE task IS NOT NULL{where}")
        else:
            cols = ", ".join(f'CAST(NULL AS {t}) AS "{c}"' for c, t in MATCH_COLUMNS.items())
            con.execute(f"CREATE OR REPLACE TEMP VIEW fx_matches AS SELECT {cols} WHERE false")
        # fx_events: events with every field the findings read (an empty store has only the base columns).
        have = {r[0] for r in con.execute("DESCRIBE events").fetchall()}
        extra = ", ".join(f'CAST(NULL AS {t}) AS "{c}"' for c, t in EVENT_FIELDS.items() if c not in have)
        con.execute("CREATE OR REPLACE TEMP VIEW fx_events AS SELECT *" + (f", {extra}" if extra else "")
                    + " FROM events")
        names = runs_mod.resolve(store, runs).runs
        if requests:
            if has_matches and "attempts" not in tables:
                store._create_view(con, "attempts")
            con.execute(load_query("findings_base").text, {"runs": names})
            con.register("fx_degenerate", ArrowStream(_degenerate(con, has_matches)))
        yield _Session(con, names, has_matches)
    finally:
        con.close()


@contextlib.contextmanager
def shared_session(store: Store, runs: list[str]) -> Iterator[None]:
    """Within it, every finding over exactly ``runs`` shares one session: the request relation, the scored
    outputs and the runaways are built once, not once per finding (the verdict asks for all of them)."""
    with _session(store, runs, tables=("items", "attempts", "requests", "instances")) as s:
        token = _SHARED.set((store.root, s))
        try:
            yield
        finally:
            _SHARED.reset(token)


def _degenerate(con: duckdb.DuckDBPyConnection, has_matches: bool) -> pl.DataFrame:
    """Matched requests whose attempt's output text is degenerate (repetition.py)."""
    empty = pl.DataFrame(schema={**RUNAWAY_KEYS, "degenerate": pl.Boolean})
    if not has_matches:
        return empty
    texts = fetch_pl(con, "SELECT m.run, m.instance, m.slot, m.task, a.output_text FROM fx_matches m "
                          "JOIN attempts a USING (run, item, stage, attempt) WHERE a.output_text IS NOT NULL")
    if texts.height == 0:
        return empty
    scored = score_texts(texts)
    return scored.filter(pl.col("degenerate")).select(*RUNAWAY_KEYS, "degenerate")


def _run_query(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, object]) -> pl.DataFrame:
    try:
        return fetch_pl(con, load_query(name).text, params)
    except duckdb.Error as exc:
        raise QueryError(f"query {name} failed: {str(exc).splitlines()[0]}",
                         hint="the store may come from another version; re-ingest it") from exc


def _drop_empty(df: pl.DataFrame, cols: tuple[str, ...]) -> pl.DataFrame:
    return df.drop([c for c in cols if c in df.columns and df[c].null_count() == df.height])


# ---------------------------------------------------------------------------------------- runaways
def _runaways(s: _Session, th: Thresholds) -> pl.DataFrame:
    if th not in s.runaways:
        s.runaways[th] = _run_query(s.con, "runaways", {
            "factor": th.factor, "quantile": th.quantile, "min_tokens": th.min_tokens,
            "min_group": th.min_group, "ctx_slack": th.ctx_slack})
    return s.runaways[th]


RUNAWAY_COLUMNS = ("run", "instance", "slot", "task", "seq", "item", "stage", "gen_tokens", "seconds",
                   "normal_tokens", "why", "evidence", "followed_by")


def find_runaways(store: Store, run: str | None = None, **overrides: float | int | None) -> pl.DataFrame:
    """Requests whose output ran away (see runaways.sql): one row each, with why and what followed."""
    th = thresholds(**overrides)
    with _session(store, run) as s:
        df = _runaways(s, th)
    return _drop_empty(df.select(RUNAWAY_COLUMNS), ("item", "stage"))


# ---------------------------------------------------------------------------------------- prompt over context
PROMPT_OVER_COLUMNS = ("run", "instance", "slot", "task", "seq", "item", "stage", "prompt_tokens", "ctx_slot",
                       "gen_tokens", "how", "error", "evidence")


def find_prompt_over_context(store: Store, run: str | None = None, **overrides: float | int | None) -> pl.DataFrame:
    """Requests whose prompt did not fit the slot's context: cut, refused, or filling it before the output grew
    (see prompt_over_context.sql).  They are not runaways: the cure is a shorter prompt or a larger -c."""
    th = thresholds(**overrides)
    with _session(store, run) as s:
        df = _run_query(s.con, "prompt_over_context", {"min_tokens": th.min_tokens, "ctx_slack": th.ctx_slack})
    return _drop_empty(df.select(PROMPT_OVER_COLUMNS), ("item", "stage"))


# ---------------------------------------------------------------------------------------- dead slots
@dataclass
class DeadSlotReport:
    slots: pl.DataFrame  # one row per dead slot
    sequence: pl.DataFrame  # the requests of those slots, in order, with abnormal and why


DEAD_COLUMNS = {
    "run": pl.String, "instance": pl.String, "slot": pl.Int64, "dead_from": pl.String, "seq": pl.Int64,
    "task": pl.Int64, "line": pl.Int64, "requests_affected": pl.Int64, "items_lost": pl.Int64,
    "recovered": pl.Boolean, "why": pl.String,
}
SEQUENCE_COLUMNS = ("run", "instance", "slot", "seq", "task", "item", "stage", "gen_tokens", "seconds",
                    "stop_reason", "abnormal", "why", "line_first")


def _when(row: dict[str, object]) -> str:
    ts = row.get("t_start")
    if ts is not None:
        return ts.isoformat(timespec="milliseconds").replace("+00:00", "Z")  # type: ignore[attr-defined]
    el = row.get("elapsed_start_s")
    if el is not None:
        return f"{el:.3f}s"
    return f"seq {row['seq']}"


def dead_slot_report(store: Store, run: str | None = None, *, include_recovered: bool = False,
                     **overrides: float | int | None) -> DeadSlotReport:
    """Dead slots: a slot is dead from the first of two consecutive abnormal requests on it.

    ``recovered`` is true when the slot's last two requests are normal again; such slots are left out
    unless ``include_recovered`` (two bad requests in a row that the slot gets over are usually
    retries of one bad item landing on the same slot).
    """
    th = thresholds(**overrides)
    with _session(store, run, tables=("items",)) as s:
        run_df = _runaways(s, th).select(*RUNAWAY_KEYS)
        s.con.register("fx_runaways", ArrowStream(run_df))
        seq = _run_query(s.con, "deadslots", {
            "long_factor": th.long_factor, "min_seconds": th.min_seconds,
            "slow_factor": th.slow_factor, "few_tokens": th.few_tokens, "few_normal": th.few_normal,
            "min_group": th.min_group})
        lost = _lost_items(s.con) if s.has_matches else None
    rows: list[dict[str, object]] = []
    keep: list[tuple[str, str, int]] = []
    # Only slots with two abnormal requests in a row can be dead: find them vectorised, then look closer
    # (a million healthy requests never reach the per-slot loop).
    slot_keys = ["run", "instance", "slot"]
    pairs = seq.select(*slot_keys, (pl.col("abnormal") & pl.col("abnormal").shift(-1).over(slot_keys))
                       .fill_null(False).alias("_pair"))
    suspects = pairs.filter(pl.col("_pair")).select(slot_keys).unique()
    candidates = seq.join(suspects, on=slot_keys, how="semi")
    for (run_name, inst, slot), part in candidates.group_by(slot_keys, maintain_order=True):
        recs = part.to_dicts()
        ab = [bool(r["abnormal"]) for r in recs]
        start = next((i for i in range(len(recs) - 1) if ab[i] and ab[i + 1]
                      and not _same_item(recs[i], recs[i + 1])), None)
        if start is None:
            continue
        # recovered: the slot ends with two normal requests in a row (one normal request after a dead streak
        # can be chance, the same "twice in a row" rule that declares it dead)
        trailing_normal = len(ab) - 1 - max(i for i, a in enumerate(ab) if a)
        recovered = trailing_normal >= 2
        if recovered and not include_recovered:
            continue
        first = recs[start]
        items = None
        if lost is not None and any(r["item"] is not None for r in recs):
            after = {(r["item"], r["stage"]) for r in recs[start:] if r["item"] is not None}
            items = len({it for it, st in after if (run_name, it, st) in lost})
        rows.append({
            "run": run_name, "instance": inst, "slot": slot, "dead_from": _when(first), "seq": first["seq"],
            "task": first["task"], "line": first["line_first"], "requests_affected": sum(ab[start:]),
            "items_lost": items, "recovered": recovered,
            "why": ",".join(dict.fromkeys(w for r in recs[start:start + 2] for w in str(r["why"]).split(","))),
        })
        keep.append((str(run_name), str(inst), int(slot)))  # type: ignore[call-overload]
    slots = pl.DataFrame(rows, schema=DEAD_COLUMNS, orient="row")
    if lost is None:
        slots = slots.drop("items_lost")
    keys = pl.DataFrame(keep, schema={"run": pl.String, "instance": pl.String, "slot": pl.Int64}, orient="row")
    sequence = seq.join(keys, on=["run", "instance", "slot"], how="semi").select(SEQUENCE_COLUMNS)
    return DeadSlotReport(slots, _drop_empty(sequence, ("item", "stage")))


def _same_item(a: dict[str, object], b: dict[str, object]) -> bool:
    """Two requests for the same item and stage (a retry): their pair says nothing about the slot."""
    return a.get("item") is not None and a.get("item") == b.get("item") and a.get("stage") == b.get("stage")


def _lost_items(con: duckdb.DuckDBPyConnection) -> set[tuple[str, str, str]]:
    """(run, item, stage) that never finished ok, from the items table."""
    rows = con.execute("SELECT run, item, stage FROM items WHERE NOT coalesce(done, false)").fetchall()
    return {(r[0], r[1], r[2]) for r in rows}


def find_dead_slots(store: Store, run: str | None = None, *, include_recovered: bool = False,
                    **overrides: float | int | None) -> pl.DataFrame:
    """Dead slots as a frame (see ``dead_slot_report``)."""
    return dead_slot_report(store, run, include_recovered=include_recovered, **overrides).slots


# ---------------------------------------------------------------------------------------- classes
CLASSES = ("dead slot", "runaway", "prompt over context", "failed", "normal")
CLASS_SCHEMA = {"run": pl.String, "instance": pl.String, "slot": pl.Int64, "task": pl.Int64, "class": pl.String}
_KEYS = ["run", "instance", "slot", "task"]


def request_classes(store: Store, runs: str | list[str] | None = None) -> pl.DataFrame:
    """Each server request of ``runs`` with the findings' verdict on it, for the charts and the report.

    ``class`` is, in this order: dead slot (an abnormal request on a dead slot, from the one it died on), runaway,
    prompt over context, failed (an error or HTTP >= 400), else normal.  Defined by the findings above and
    nothing else: no finding, no class.
    """
    dead = dead_slot_report(store, runs)  # type: ignore[arg-type]
    gone = dead.sequence.join(dead.slots.select("run", "instance", "slot", pl.col("seq").alias("_from")),
                              on=["run", "instance", "slot"]).filter(pl.col("abnormal") & (pl.col("seq") >= pl.col("_from")))
    flagged = [
        ("dead slot", gone.select(_KEYS)),
        ("runaway", find_runaways(store, runs).select(_KEYS)),  # type: ignore[arg-type]
        ("prompt over context", find_prompt_over_context(store, runs).select(_KEYS)),  # type: ignore[arg-type]
    ]
    with _session(store, runs) as s:
        base = fetch_pl(s.con, "SELECT run, instance, slot, task, (error IS NOT NULL OR coalesce(http_status, 200) >= 400 "
                               "OR stop_reason = 'error') AS failed FROM fx_requests")
    cls = pl.when(pl.col("failed")).then(pl.lit("failed")).otherwise(pl.lit("normal"))
    for name, keys in reversed(flagged):
        marked = keys.unique().with_columns(pl.lit(True).alias(f"_{name}"))
        base = base.join(marked, on=_KEYS, how="left", nulls_equal=True)
        cls = pl.when(pl.col(f"_{name}").fill_null(False)).then(pl.lit(name)).otherwise(cls)
    return base.select(*_KEYS, cls.alias("class"))


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


def classified_requests(store: Store, runs: str | list[str] | None = None, *, source: str = "auto") -> pl.DataFrame:
    """Each request's interval on its run's clock (``metrics.request_intervals``, the server's requests when
    the log has them) with its ``class`` from ``request_classes``: what every per-request chart draws."""
    from forensics import metrics

    names = [runs] if isinstance(runs, str) else list(runs or [])
    ri = metrics.request_intervals(store, names, source=metrics.lanes_source(store, names, source))
    return metrics.with_classes(ri, request_classes(store, names))


def cap_step(x: float) -> int:
    """Rounding step for a cap near ``x``: a quarter of the power of two below it, at least 64
    (≤ 511 → 64, 512-1023 → 128, 1024-2047 → 256, 2048-4095 → 512, ...)."""
    if x < 256:
        return 64
    return max(64, 2 ** (math.floor(math.log2(x)) - 2))


def round_cap(normal_max: float, margin: float) -> int:
    """The smallest multiple of ``cap_step`` at or above normal_max x (1 + margin), strictly above normal_max."""
    target = max(float(normal_max) * (1 + margin), 1.0)
    step = cap_step(target)
    cap = int(math.ceil(target / step) * step)
    while cap <= normal_max:
        cap += step
    return cap


def _candidates(rec: int) -> list[int]:
    powers = [2 ** k for k in range(6, 20) if rec / 4 <= 2 ** k <= rec * 4]
    return sorted({rec, *powers})


def cut_by_cap(cap: int) -> pl.Expr:
    """The rows of cap.sql an output cap of ``cap`` tokens cuts: a normal response that reached it (≥ cap: it would
    have ended at the cap) and a runaway that went past it."""
    return (pl.col("normal") & (pl.col("gen_tokens") >= cap)) | (pl.col("runaway") & (pl.col("gen_tokens") > cap))


def _whatif(df: pl.DataFrame, caps: list[int], rec: int, stage: str | None) -> list[dict[str, object]]:
    out = []
    gen = df["gen_tokens"].cast(pl.Float64)
    for c in caps:
        over = (gen - c).clip(lower_bound=0)
        cut = df.filter(cut_by_cap(c))
        out.append({
            "stage": stage, "cap": c, "recommended": c == rec,
            "normal_cut": int(cut["normal"].sum()),
            "runaways_stopped": int(cut["runaway"].sum()),
            "runaways": int(df["runaway"].sum()),
            "tokens_saved": int(over.sum()),
            "seconds_saved": round(float((over * df["ms_per_token"].fill_null(0.0)).sum()) / 1000.0, 1),
        })
    return out


WHATIF_SCHEMA = {"stage": pl.String, "cap": pl.Int64, "recommended": pl.Boolean, "normal_cut": pl.Int64,
                 "runaways_stopped": pl.Int64, "runaways": pl.Int64, "tokens_saved": pl.Int64,
                 "seconds_saved": pl.Float64}
STAGE_SCHEMA = {"stage": pl.String, "normal": pl.Int64, "normal_max": pl.Int64, "runaways": pl.Int64,
                "cap": pl.Int64}


def recommend_cap(store: Store, runs: str | list[str] | None = None, *, margin: float = 0.2,
                  **overrides: float | int | None) -> CapResult:
    """Recommend an output-token cap above every normal response (with ``margin``), and what it would do."""
    if margin < 0:
        raise QueryError(f"margin must not be negative, got {margin}", hint="pass e.g. --margin 0.2")
    th = thresholds(**overrides)
    with _session(store, runs, tables=("attempts",)) as s:
        run_df = _runaways(s, th).select(*RUNAWAY_KEYS)
        s.con.register("fx_runaways", ArrowStream(run_df))
        df = _run_query(s.con, "cap", {})
        no_cap_attempts = _attempts_uncapped(s.con, s.runs)
    warnings: list[str] = []
    normal = df.filter(pl.col("normal"))
    if normal.height == 0:
        warnings.append("no normal response to choose a cap from")
        return CapResult(None, margin, pl.DataFrame(schema=STAGE_SCHEMA), pl.DataFrame(schema=WHATIF_SCHEMA),
                         warnings)
    rec = round_cap(int(normal["gen_tokens"].max()), margin)  # type: ignore[arg-type]
    stages = sorted({st for st in df["stage"].to_list() if st is not None})
    stage_rows = []
    whatif = _whatif(df, _candidates(rec), rec, None)
    if len(stages) > 1:
        for st in stages:
            part = df.filter(pl.col("stage") == st)
            pn = part.filter(pl.col("normal"))
            scap = round_cap(int(pn["gen_tokens"].max()), margin) if pn.height else None  # type: ignore[arg-type]
            stage_rows.append({"stage": st, "normal": pn.height,
                               "normal_max": pn["gen_tokens"].max() if pn.height else None,
                               "runaways": int(part["runaway"].sum()), "cap": scap})
            if scap is not None:
                whatif += _whatif(part, _candidates(scap), scap, st)
    runaways = int(df["runaway"].sum())
    nps = [v for v in df["n_predict"].to_list() if v is not None and v > 0]
    if not nps and no_cap_attempts and runaways:
        warnings.append(f"the logs show no output cap (n_predict unset or -1 everywhere) and {runaways} "
                        f"runaway(s): set max_tokens / n_predict to {rec}")
    biggest = df.filter(pl.col("runaway"))["gen_tokens"]
    if runaways and rec >= int(biggest.min()):  # type: ignore[arg-type]
        warnings.append(f"cap {rec} does not stop every runaway (the smallest generated {biggest.min()} tokens)")
    p95 = normal["prompt_tokens"].drop_nulls()
    ctx = df["ctx_slot"].drop_nulls()
    if p95.len() and ctx.len():
        need = math.ceil(float(p95.quantile(0.95, interpolation="linear"))) + rec  # type: ignore[arg-type]
        if int(ctx.min()) < need:  # type: ignore[arg-type]
            warnings.append(f"a slot's context ({ctx.min()} tokens) cannot hold a normal prompt (p95 "
                            f"{need - rec} tokens) plus the cap {rec}: raise -c or lower -np")
    return CapResult(rec, margin, pl.DataFrame(stage_rows, schema=STAGE_SCHEMA, orient="row"),
                     pl.DataFrame(whatif, schema=WHATIF_SCHEMA, orient="row"), warnings)


CAPS_SCHEMA = {"run": pl.String, "cap": pl.Int64, "capped": pl.Boolean, "normal": pl.Int64, "normal_min": pl.Int64,
               "normal_max": pl.Int64, "runaways": pl.Int64, "runaway_min": pl.Int64, "runaway_max": pl.Int64,
               "runaways_stopped": pl.Int64, "normal_cut": pl.Int64}


def caps_by_run(store: Store, runs: str | list[str] | None = None, *, margin: float = 0.2,
                **overrides: float | int | None) -> pl.DataFrame:
    """``recommend_cap``'s cap for each run on its own (the same rule: ``round_cap`` of the run's longest normal
    response), with what it would have done there: runaways stopped, normal responses cut, and whether the
    logs show a cap in force (``capped``)."""
    th = thresholds(**overrides)
    with _session(store, runs) as s:
        run_df = _runaways(s, th).select(*RUNAWAY_KEYS)
        s.con.register("fx_runaways", ArrowStream(run_df))
        df = _run_query(s.con, "cap", {})
    rows = []
    for (run,), part in df.group_by("run", maintain_order=True):
        normal = part.filter(pl.col("normal"))["gen_tokens"]
        ran = part.filter(pl.col("runaway"))["gen_tokens"]
        cap = round_cap(int(normal.max()), margin) if normal.len() else None  # type: ignore[arg-type]
        rows.append({
            "run": run, "cap": cap, "capped": bool((part["n_predict"].fill_null(-1) > 0).any()),
            "normal": normal.len(), "normal_min": normal.min(), "normal_max": normal.max(), "runaways": ran.len(),
            "runaway_min": ran.min(), "runaway_max": ran.max(),
            "runaways_stopped": int((ran > cap).sum()) if cap is not None else None,
            "normal_cut": int((normal >= cap).sum()) if cap is not None else None,
        })
    return pl.DataFrame(rows, schema=CAPS_SCHEMA, orient="row")


CUT_COLUMNS = ("run", "instance", "slot", "task", "item", "stage", "gen_tokens", "runaway", "normal")


def cap_cuts(store: Store, runs: str | list[str] | None, cap: int, **overrides: float | int | None) -> pl.DataFrame:
    """The outputs an output cap of ``cap`` tokens would have cut (``cut_by_cap``), one row each: its request, item
    and stage, its generated tokens, and whether it was a runaway or a normal response."""
    th = thresholds(**overrides)
    with _session(store, runs) as s:
        run_df = _runaways(s, th).select(*RUNAWAY_KEYS)
        s.con.register("fx_runaways", ArrowStream(run_df))
        df = _run_query(s.con, "cap", {})
    return df.filter(cut_by_cap(cap)).select(CUT_COLUMNS)


def _attempts_uncapped(con: duckdb.DuckDBPyConnection, runs: list[str]) -> bool:
    rows = con.execute("SELECT count(*) FROM attempts WHERE run IN (SELECT unnest(?)) AND max_tokens > 0",
                       [runs]).fetchall()  # all: a result left open blocks the session's next statement
    return not rows or rows[0][0] == 0


# ---------------------------------------------------------------------------------------- errors
def _mask_quoted(m: regex.Match[str]) -> str:
    text = m.group(0)
    if m.group(1) is not None or any(ch.isspace() for ch in text):
        return text
    return '"<s>"'


# Masking rules, applied in order: (regex, replacement text or function of the match).
MASKS: list[tuple[str, str | Callable[[regex.Match[str]], str]]] = [
    (r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b", "<uuid>"),
    (r"\b0x[0-9a-fA-F]+\b", "<hex>"),
    (r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b", "<hex>"),
    (r"'[^'\n]*'", "'<s>'"),  # single-quoted strings
    # double-quoted strings: one word (an id, a name, a path) is masked; JSON keys and sentences are kept
    (r'"(?:[^"\\]|\\.)*"(\s*:)?', _mask_quoted),
    (r"(?<![A-Za-z_<])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", "N"),  # numbers
]
_MASKS = [(regex.compile(p), r) for p, r in MASKS]


def mask_message(text: str | None) -> str:
    """The message's shape: ``MASKS`` applied in order, whitespace squeezed."""
    out = text or ""
    for rx, rep in _MASKS:
        out = rx.sub(rep, out)
    return " ".join(out.split())


ERROR_SCHEMA = {"run": pl.String, "kind": pl.String, "level": pl.String, "count": pl.Int64,
                "http_status": pl.String, "first": pl.String, "last": pl.String, "slots": pl.String,
                "items": pl.String, "in_flight": pl.String, "shape": pl.String, "example": pl.String,
                "evidence": pl.String}


def _at(ts: object, el: object, line: object) -> str:
    if ts is not None:
        return ts.isoformat(timespec="milliseconds").replace("+00:00", "Z")  # type: ignore[attr-defined]
    if el is not None:
        return f"{el:.3f}s"
    return f"line {line}"


def _join(values: list[object], limit: int = 10) -> str:
    vals = sorted({str(v) for v in values if v is not None}, key=lambda v: (len(v), v))
    text = ",".join(vals[:limit])
    return text + (f",+{len(vals) - limit}" if len(vals) > limit else "")


def _evidence(recs: list[dict[str, object]], limit: int = 5) -> str:
    """Where to look: file:line (a range for a crash's lines), the first few of a group."""
    spots = [f"{r['path']}:{r['line_no']}" + (f"-{r['line_last']}" if r["line_last"] != r["line_no"] else "")
             for r in recs[:limit]]
    return ", ".join(spots) + (f", +{len(recs) - limit}" if len(recs) > limit else "")


def error_groups(store: Store, run: str | None = None) -> pl.DataFrame:
    """Server-side errors and warnings grouped by message shape, and one row per crash with the tasks it
    had in flight (see errors.sql and ``MASKS``); ``evidence`` gives the lines to read."""
    with _session(store, run, requests=False, tables=("requests", "instances")) as s:
        ev = _run_query(s.con, "errors", {"runs": s.runs})
    if ev.height == 0:
        return pl.DataFrame(schema=ERROR_SCHEMA)
    # each distinct message masked once: a log repeats the same error text thousands of times
    distinct = ev["message"].drop_nulls().unique()
    shapes = pl.Series([mask_message(m) for m in distinct.to_list()], dtype=pl.String)
    ev = ev.with_columns(pl.col("message").replace_strict(distinct, shapes, default=mask_message(None),
                                                          return_dtype=pl.String).alias("shape"))
    rows = []
    for (run_name, kind, shape), g in ev.group_by(["run", "kind", "shape"], maintain_order=True):
        recs = g.to_dicts()
        a, b = recs[0], recs[-1]
        rows.append({
            "run": run_name, "kind": kind, "level": _join([r["level"] for r in recs]), "count": len(recs),
            "http_status": _join([r["http_status"] for r in recs]),
            "first": _at(a["ts"], a["elapsed_s"], a["line_no"]), "last": _at(b["ts"], b["elapsed_s"], b["line_no"]),
            "slots": _join([r["slot"] for r in recs]), "items": _join([r["item"] for r in recs]),
            "in_flight": "; ".join(r["tasks"] for r in recs if r["tasks"]) or None,
            "shape": shape, "example": a["message"], "evidence": _evidence(recs),
        })
    out = pl.DataFrame(rows, schema=ERROR_SCHEMA, orient="row")
    order = (pl.when(pl.col("kind") == "crash").then(0)
             .when(pl.col("level").str.contains("(?i)^e|err|fatal")).then(1).otherwise(2))
    return out.sort([pl.col("run"), order, pl.col("count")], descending=[False, False, True], maintain_order=True)


def missing_items(store: Store, runs: list[str]) -> pl.DataFrame:
    """(run, item, stage) of every expected item that did not finish ok, from the replay ``items`` table (its
    rules decide what is expected of each stage); a run without records has none."""
    con = store.connect(tables=["items"])
    try:
        return fetch_pl(con, "SELECT run, item, stage FROM items WHERE list_contains($runs, run) "
                             "AND NOT coalesce(done, false) ORDER BY run, item, stage", {"runs": runs})
    finally:
        con.close()


def serious_errors(groups: pl.DataFrame) -> pl.DataFrame:
    """The ``error_groups`` rows that are failures, not warnings: crashes, and every level but W/WARN."""
    level = pl.col("level").str.to_uppercase()
    return groups.filter((pl.col("kind") == "crash") | level.is_null() | ~level.str.starts_with("W"))


def uncapped_runaway_runs(store: Store, runs: str | list[str] | None = None, *, margin: float = 0.2,
                          **overrides: float | int | None) -> pl.DataFrame:
    """The ``caps_by_run`` rows of runs that had runaways with no output cap in force: a cap was needed."""
    caps = caps_by_run(store, runs, margin=margin, **overrides)
    return caps.filter(~pl.col("capped").fill_null(False) & (pl.col("runaways").fill_null(0) > 0))

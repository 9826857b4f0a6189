"""The registry of findings: each finding declared once, and everything that shows findings iterates it.

A ``Finding`` says what the finding is (its named SQL in ``forensics/queries/``, the findings it reads, its
columns), how the verdict tells it (its sentence function in ``forensics.sentences``), and where else it
shows: the class it gives requests in the charts, its report section, its row in ``compare``, whether
``watch`` raises it, its CLI command and what ``--fail-on any`` counts.  The verdict, the report, compare, the
charts, watch, the CLI and the notebook read this list and nothing else, so a new finding is its SQL, one
entry here (``register``) and its docs.

Every finding is worked out per run (see ``forensics.session``): its query sees the session's runs and
partitions every baseline and window by run.

Library only: no click, no altair.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from forensics import sentences as S
from forensics.cache_words import prompt_cache as prompt_cache_sentence
from forensics.errors import NotFoundError
from forensics.lazy import lazy_import
from forensics.timefmt import wall_expr

if TYPE_CHECKING:
    import polars as pl

    from forensics.session import Analysis, Thresholds
else:  # loaded on first use: the CLI imports this module to build its commands (forensics.lazy)
    pl = lazy_import("polars")

Shape = Callable[["pl.DataFrame", "Analysis", "Thresholds"], "pl.DataFrame"]
Sentence = Callable[["pl.DataFrame", S.RunContext], list[S.Fact]]
ClassRows = Callable[["Analysis", "Thresholds", list[str]], "pl.DataFrame"]
Detail = Callable[["Analysis", list[str]], "pl.DataFrame"]

RUNAWAY_OPTIONS = ("factor", "quantile", "min_tokens", "min_group", "ctx_slack")
DEAD_SLOT_OPTIONS = (*RUNAWAY_OPTIONS, "long_factor", "min_seconds", "slow_factor", "few_tokens", "few_normal")


@dataclass(frozen=True)
class Finding:
    """One finding, declared once (see the module's docstring)."""

    name: str  # its id: the verdict's fact kind, the key everything else uses
    title: str  # its heading in the report and the docs
    summary: str  # what it finds, in one sentence (the command's help)
    query: str | None = None  # named SQL (forensics/queries/<query>.sql); None: ``shape`` builds the rows
    uses: tuple[str, ...] = ()  # findings whose rows the query reads as fx_<name>
    tables: tuple[str, ...] = ()  # store tables it reads besides the session's request relations
    reads_requests: bool = True  # its query reads fx_requests (the session builds it first)
    shape: Shape | None = None  # vectorised shaping of the query's rows (columns, derived text)
    columns: tuple[str, ...] | None = None  # the listing's columns, in order (None: the query's)
    sentence: Sentence | None = None  # the verdict's sentence about one run
    request_class: str | None = None  # the class it gives requests (charts, report timeline)
    class_rows: ClassRows | None = None  # the requests it gives its class (default: all its rows)
    compare: str | None = None  # its row in `forensics compare` (the count of ``counted`` rows of the run)
    counted: Callable[[pl.DataFrame], pl.DataFrame] | None = None  # rows compare and the gate count (default all)
    report: bool = True  # a section in the report's findings
    shown_in: str | None = None  # the finding whose report section shows it, when it has none of its own
    detail: Detail | None = None  # the report section's table (default: the listing)
    watch: bool = False  # watch raises it as an alert
    command: str | None = None  # its CLI command, when it has one of its own
    options: tuple[str, ...] = ()  # the thresholds its command takes as options
    needs: str = "requests"  # the half of a run its command reads: requests (server log), log, records
    examples: tuple[tuple[str, str], ...] = ()  # its command's help examples: (command line, what it shows)
    breaks_throughput: bool = False  # a run with it measures a broken server: left out of throughput fits
    drop_empty: tuple[str, ...] = ("item", "stage")  # columns dropped when every row leaves them empty
    sql_dir: Path | None = None  # where its SQL is, when not forensics/queries/
    version: str = "1"  # part of the cache key: bump it when the rule changes
    doc: str = ""  # its anchor in docs/findings.md

    def listing(self, rows: pl.DataFrame) -> pl.DataFrame:
        """The rows as the finding lists them: its columns, less the ones no row fills."""
        out = rows.select([c for c in self.columns if c in rows.columns]) if self.columns else rows
        return out.drop([c for c in self.drop_empty if c in out.columns and out[c].null_count() == out.height])

    @property
    def anchor(self) -> str:
        """The id of its report section (the title, lower case, dashes for spaces)."""
        return self.title.lower().replace(" ", "-")

    def count_rows(self, rows: pl.DataFrame) -> pl.DataFrame:
        return self.counted(rows) if self.counted is not None else rows


# ---------------------------------------------------------------------------------------- shapes
def _dead_slots(rows: pl.DataFrame, session: Analysis, th: Thresholds) -> pl.DataFrame:
    """One row per dead slot, from its rows of the sequence (deadslots.sql decides everything)."""
    seq = session.rows("dead_slot_sequence", th)
    first = seq.filter(pl.col("seq") == pl.col("dead_seq"))
    if not th.include_recovered:
        first = first.filter(~pl.col("recovered"))
    out = first.select(
        "run", "instance", "slot", wall_expr(pl.col("t_start")).alias("dead_from"),
        pl.col("elapsed_start_s").round(3).alias("since_start_s"),
        "seq", "task", pl.col("line_first").alias("line"), "requests_affected", "items_lost", "recovered",
        pl.col("dead_why").alias("why"))
    return out if session.has_matches else out.drop("items_lost")


def dead_slot_sequence(session: Analysis, th: Thresholds, slots: pl.DataFrame) -> pl.DataFrame:
    """The requests of the dead slots ``slots`` lists, in order, with abnormal and why."""
    seq = session.rows("dead_slot_sequence", th)
    keep = slots.select("run", "instance", "slot")
    cols = ("run", "instance", "slot", "seq", "task", "item", "stage", "gen_tokens", "seconds", "stop_reason",
            "abnormal", "why", "line_first")
    out = seq.join(keep, on=["run", "instance", "slot"], how="semi").select(cols)
    return out.drop([c for c in ("item", "stage") if out[c].null_count() == out.height])


def dead_requests(session: Analysis, th: Thresholds, runs: list[str]) -> pl.DataFrame:
    """The abnormal requests of dead slots, from the one each died on (their request class)."""
    rows = session.rows("dead_slot_sequence", th, runs)
    return rows.filter(pl.col("abnormal") & pl.col("dead_seq").is_not_null() & (pl.col("seq") >= pl.col("dead_seq"))
                       & (~pl.col("recovered") | th.include_recovered))


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


def caps_schema() -> dict[str, type[pl.DataType]]:
    """The columns of the caps table and their types (``CAPS_SCHEMA``; a function, so importing this module does
    not load polars)."""
    counts = ("capped_requests", "requests", "normal", "normal_min", "normal_max", "runaways", "runaway_min",
              "runaway_max", "runaways_stopped", "normal_cut")
    return {"run": pl.String, "cap": pl.Int64, "capped": pl.Boolean, **dict.fromkeys(counts, pl.Int64)}


def __getattr__(name: str) -> object:
    if name == "CAPS_SCHEMA":
        return caps_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _caps(rows: pl.DataFrame, session: Analysis, th: Thresholds) -> pl.DataFrame:
    """Each run's cap (``round_cap`` of its longest normal response) and what it would have done there."""
    tok = pl.col("gen_tokens")
    per = rows.group_by("run", maintain_order=True).agg(
        # a cap was in force on the runaways (a run without runaways: on any request)
        pl.when(pl.col("runaway").any()).then(pl.col("own_cap").filter(pl.col("runaway")).is_not_null().all())
        .otherwise(pl.col("own_cap").is_not_null().any()).alias("capped"),
        pl.col("own_cap").is_not_null().sum().alias("capped_requests"), pl.len().alias("requests"),
        tok.filter(pl.col("normal")).len().alias("normal"), tok.filter(pl.col("normal")).min().alias("normal_min"),
        tok.filter(pl.col("normal")).max().alias("normal_max"), tok.filter(pl.col("runaway")).len().alias("runaways"),
        tok.filter(pl.col("runaway")).min().alias("runaway_min"),
        tok.filter(pl.col("runaway")).max().alias("runaway_max"))
    caps = [round_cap(v, th.margin) if v is not None else None for v in per["normal_max"].to_list()]
    per = per.with_columns(pl.Series("cap", caps, dtype=pl.Int64))
    own = pl.col("own_cap").is_null() | (pl.col("own_cap") > pl.col("cap"))
    effect = rows.join(per.select("run", "cap"), on="run").group_by("run").agg(
        (own & pl.col("runaway") & (tok > pl.col("cap"))).sum().alias("runaways_stopped"),
        (own & pl.col("normal") & (tok >= pl.col("cap"))).sum().alias("normal_cut"))
    out = per.join(effect, on="run", how="left").with_columns(
        pl.when(pl.col("cap").is_not_null()).then(pl.col(c)).alias(c) for c in ("runaways_stopped", "normal_cut"))
    schema = caps_schema()
    return out.select(list(schema)).cast(schema)  # type: ignore[arg-type]


def _missing_detail(session: Analysis, runs: list[str]) -> pl.DataFrame:
    """Every missing item x stage of the runs that have replay records, and why (forensics.replay.tables)."""
    from forensics.replay import tables as replay_tables

    with_records = set(session.rows("missing", runs=runs)["run"].to_list())
    frames = [replay_tables.missing(session.store, r).with_columns(pl.lit(r).alias("run")) for r in runs
              if r in with_records]
    return pl.concat(frames, how="diagonal_relaxed").select("run", pl.all().exclude("run")) if frames else \
        pl.DataFrame()


def _errors(rows: pl.DataFrame, session: Analysis, th: Thresholds) -> pl.DataFrame:
    from forensics.findings import group_errors

    return group_errors(rows)


# ---------------------------------------------------------------------------------------- the registry
FINDINGS: dict[str, Finding] = {}


def register(f: Finding) -> Finding:
    """Add ``f`` to the registry (its place: after the findings registered before it)."""
    if f.name in FINDINGS:
        raise ValueError(f"finding {f.name!r} is registered twice")
    FINDINGS[f.name] = f
    return f


@contextlib.contextmanager
def added(f: Finding) -> Iterator[Finding]:
    """``f`` in the registry for the duration (a test's sample finding)."""
    register(f)
    try:
        yield f
    finally:
        FINDINGS.pop(f.name, None)


def finding(name: str) -> Finding:
    try:
        return FINDINGS[name]
    except KeyError:
        raise NotFoundError(f"no finding {name!r}", hint=f"findings: {', '.join(listed())}") from None


def listed() -> list[str]:
    """The findings a user sees (helper relations such as the dead-slot sequence left out)."""
    return [f.name for f in FINDINGS.values() if f.title]


def section_of(kind: str) -> str | None:
    """The anchor of the report section that shows the fact ``kind`` (None: no section)."""
    f = FINDINGS.get(kind)
    if f is None:
        return None
    if f.report:
        return f.anchor
    return section_of(f.shown_in) if f.shown_in else None


def depends_on(f: Finding, other: str) -> bool:
    """``f`` reads ``other``'s rows, directly or through the findings it uses."""
    return any(u == other or depends_on(FINDINGS[u], other) for u in f.uses if u in FINDINGS)


def in_dependency_order(found: list[Finding]) -> list[Finding]:
    """``found`` with every finding after the ones it reads (a runaway is raised before the dead slot it makes)."""
    out: list[Finding] = []
    for f in found:
        at = next((i for i, g in enumerate(out) if depends_on(g, f.name)), len(out))
        out.insert(at, f)
    return out


def findings(**having: object) -> list[Finding]:
    """The registered findings in order, those whose attributes have the given values (``report=True``)."""
    return [f for f in FINDINGS.values() if f.title and all(getattr(f, k) == v for k, v in having.items())]


RUNAWAY_COLUMNS = ("run", "instance", "slot", "task", "seq", "item", "stage", "gen_tokens", "seconds",
                   "normal_tokens", "why", "evidence", "followed_by")
PROMPT_COLUMNS = ("run", "instance", "slot", "task", "seq", "item", "stage", "prompt_tokens", "ctx_slot",
                  "gen_tokens", "how", "error", "evidence")

register(Finding(
    "dead_slot_sequence", "", "the requests of the slots that may be dead, with the dead-slot verdict",
    query="deadslots", uses=("runaway", "prompt_over_context"), version="3"))
register(Finding(
    "dead_slot", "Dead slots", "Slots that went bad and stayed bad: dead from the first of two consecutive abnormal "
    "requests (a runaway, an abnormally long or slow request, a handful of tokens where normal is hundreds, the "
    "same error again).", uses=("dead_slot_sequence",), reads_requests=False, shape=_dead_slots,
    sentence=S.dead_slot, request_class="dead slot", class_rows=dead_requests, compare="dead slots", watch=True,
    command="deadslots", options=(*DEAD_SLOT_OPTIONS, "include_recovered"), examples=(
        ("forensics deadslots run-42 --explain", "each dead slot with the request sequence behind the verdict"),
        ("forensics deadslots --fail-on any", "exit 1 when a slot died in any run (wire it to a restart)")),
    breaks_throughput=True, drop_empty=(), doc="forensics-deadslots-run"))
register(Finding(
    "crash", "Crashes", "Server instances that died (an assert, an abort, a signal, out of memory), with the phase "
    "they were in: start-up, serving, or shutting down.", query="crashes", tables=("events", "requests",
                                                                                   "instances"),
    reads_requests=False, shape=None, sentence=S.crash, compare="crashes",
    counted=lambda df: df.filter(pl.col("phase") != "shutdown"), watch=True, breaks_throughput=True,
    report=False, shown_in="errors", doc="crashes-by-phase"))
register(Finding(
    "runaway", "Runaways", "Requests whose output ran away: far more tokens than normal, reached the slot's context, "
    "or cut at the training-context cap; with why and what followed.", query="runaways", columns=RUNAWAY_COLUMNS,
    sentence=S.runaway, request_class="runaway", compare="runaways", watch=True, command="runaways",
    options=RUNAWAY_OPTIONS, breaks_throughput=True, examples=(
        ("forensics runaways run-42", "the outputs that ran away in run-42, why, and what followed"),
        ("forensics runaways --fail-on any", "exit 1 when any run has one (a CI gate)")),
    doc="forensics-runaways-run"))
register(Finding(
    "prompt_over_context", "Prompts over the context", "Requests whose prompt did not fit the slot's context: "
    "refused, cut to fit, or filling it before the output grew.", query="prompt_over_context", uses=("runaway",),
    columns=PROMPT_COLUMNS, sentence=S.prompt_over_context, request_class="prompt over context",
    compare="prompts over the context", doc="prompts-over-the-context"))
register(Finding(
    "kv_stall", "KV-cache stalls", "Server instances whose KV cache ran out of room and kept them retrying "
    "smaller batches (hundreds of 'failed to find free space in the KV cache' lines).", query="kv_stall",
    tables=("events",), sentence=S.kv_stall, compare="KV-cache stalls", watch=True, breaks_throughput=True,
    options=("stall_lines",), doc="kv-cache-stalls"))
register(Finding(
    "failover", "Client timeouts and failovers", "Attempts the client gave up on (a timeout) or that failed on one "
    "server and were sent again to another, from the harness's records.", query="client_timeouts", tables=("attempts", "matches"),
    reads_requests=False, sentence=S.failover, compare="failovers", counted=lambda df: df.filter(pl.col("failed_over")),
    breaks_throughput=True, drop_empty=(), doc="client-timeouts-and-failovers"))
register(Finding(
    "missing", "Missing items", "Expected items x stages of replay runs that never finished ok.",
    query="missing_items", tables=("items",), reads_requests=False, sentence=S.missing,
    compare="items missing", counted=lambda df: df.unique(["run", "item"]), drop_empty=(), detail=_missing_detail,
    doc="missing-items"))
register(Finding(
    "failed", "Failed requests", "Requests that failed: every attempt of the harness that did not finish ok, and "
    "every server request that failed (an error, HTTP >= 400, cancelled) no attempt is tied to.",
    query="failed_requests", tables=("attempts",), sentence=S.failed, request_class="failed", report=False,
    shown_in="errors", drop_empty=(), class_rows=lambda s, th, runs: s.rows("failed", th, runs).filter(
        pl.col("task").is_not_null()), doc="failed-requests"))
register(Finding(
    "cap", "Recommended output cap", "The output cap that would have stopped each run's runaways, and what it "
    "would have cut.", query="cap", uses=("runaway",), shape=_caps, sentence=S.cap, drop_empty=(),
    command="cap", options=(*RUNAWAY_OPTIONS, "margin"), examples=(
        ("forensics cap run-42", "the cap to set, and what candidate caps would have done"),
        ("forensics cap --margin 0.5 --fail-on any", "more headroom; exit 1 when a run had runaways and no cap")),
    counted=lambda df: df.filter(~pl.col("capped").fill_null(False) & (pl.col("runaways").fill_null(0) > 0)),
    doc="forensics-cap-run"))
register(Finding(
    "ended", "Runs that did not complete", "Runs whose harness says they did not complete (killed by a watchdog, "
    "crashed).", query="run_ends", tables=("runs",), reads_requests=False, sentence=S.ended,
    breaks_throughput=True, report=False, shown_in="missing", doc="the-verdict"))
register(Finding(
    "cost", "Cost", "what the findings cost each run: its span against what its requests needed",
    query="run_cost", uses=("dead_slot_sequence", "runaway"), tables=("attempts",), sentence=S.cost, report=False,
    doc="the-cost"))
register(Finding(
    "errors", "Errors", "Server-side errors, crashes and warnings grouped by message shape (numbers, ids and quoted "
    "words masked), with where they first and last appeared and the lines to read.", query="errors",
    uses=("crash",), reads_requests=False, tables=("events", "matches"), shape=_errors, command="errors",
    needs="log", counted=lambda df: serious_errors(df), drop_empty=(), examples=(
        ("forensics errors run-42", "errors and warnings of run-42 grouped by message shape"),
        ("forensics errors --fail-on any", "exit 1 on any error or crash (warnings do not count)")),
    doc="forensics-errors-run"))
register(Finding(
    "prompt_cache", "Prompt cache", "How much of each prompt the slots' cache served, per run and server instance: "
    "cold starts, requests that reused less than their stage usually does (after a context shift, a slot switch, or "
    "not reused at all), the prompt tokens and time spent computing again what the cache held, and the flag or "
    "request field to change.", query="prompt_cache", tables=("requests",), sentence=prompt_cache_sentence,
    options=("cache_waste",), counted=lambda df: df.filter(pl.col("costly")), drop_empty=(), doc="prompt-cache"))


def serious_errors(groups: pl.DataFrame) -> pl.DataFrame:
    """The ``errors`` rows that are failures, not warnings: crashes, and every level but W/WARN."""
    level = pl.col("level").str.to_uppercase()
    return groups.filter((pl.col("kind") == "crash") | level.is_null() | ~level.str.starts_with("W"))

"""What changed between two runs: np, throughput, latency percentiles, findings and missing items.

Every number comes from the one place that defines it: the run metrics from ``metrics.throughput``, each
finding's count from its rows (the registry's ``compare`` rows, counted as ``--fail-on any`` counts them: the
same numbers as the finding's command and the report), the missing items from ``findings.missing_items``.  This
module only lines the two runs up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from forensics import findings, metrics, registry
from forensics import runs as runs_mod
from forensics.session import Analysis
from forensics.store import Store

# (column of metrics.throughput, what it is in words, higher is better?)
METRICS: tuple[tuple[str, str, bool | None], ...] = (
    ("np", "parallel slots (np)", None),
    ("requests", "requests", None),
    ("failed", "failed requests", False),
    ("wall_s", "wall time (s)", False),
    ("gen_tok_per_s", "throughput (generated tokens/s)", True),
    ("req_per_s", "requests/s", True),
    ("latency_p50_s", "latency p50 (s)", False),
    ("latency_p90_s", "latency p90 (s)", False),
    ("latency_p95_s", "latency p95 (s)", False),
    ("latency_p99_s", "latency p99 (s)", False),
    ("latency_max_s", "latency max (s)", False),
    ("effective_concurrency", "effective concurrency", None),
    ("peak_busy_slots", "peak busy slots", None),
)
USEFUL = "throughput of normal requests (tokens/s)"  # the tokens no finding claims, over the wall time
LATENCIES = ("latency_p50_s", "latency_p90_s", "latency_p95_s", "latency_p99_s")


@dataclass
class Comparison:
    a: str
    b: str
    table: pl.DataFrame  # metric, <a>, <b>, change, change_pct, better (a word: a, b or "")
    items: pl.DataFrame  # item, stage, missing_in: the items missing in one run or both
    sentences: list[str] = field(default_factory=list)
    metrics: pl.DataFrame = field(default_factory=pl.DataFrame)  # metrics.throughput rows of a and b


def compared() -> list[registry.Finding]:
    """The findings compare counts, in the registry's order."""
    return [f for f in registry.findings() if f.compare]


def finding_counts(session: Analysis, runs: list[str]) -> dict[str, dict[str, int]]:
    """run -> compare row -> count: each finding's rows of the run, counted as its gate counts them."""
    out: dict[str, dict[str, int]] = {r: {} for r in runs}
    for f in compared():
        counted = f.count_rows(session.rows(f.name, runs=runs))
        per = dict(counted.group_by("run").len().iter_rows()) if counted.height else {}
        for r in runs:
            out[r][f.compare] = int(per.get(r, 0))  # type: ignore[index]
    return out


def useful_tokens(session: Analysis, runs: list[str]) -> dict[str, tuple[int, int]]:
    """run -> (generated tokens of its normal requests, of all its server requests), by the findings' classes."""
    session.prepare(runs)
    session.register("fx_classes", findings.request_classes(session, runs))
    df = session.query("class_tokens", runs=runs)
    out: dict[str, tuple[int, int]] = {}
    for run in runs:
        mine = df.filter(pl.col("run") == run)
        out[run] = (int(mine.filter(pl.col("class") == "normal")["gen_tokens"].sum()), int(mine["gen_tokens"].sum()))
    return out


def _rows(m: pl.DataFrame, counts: dict[str, dict[str, int]], useful: dict[str, tuple[int, int]], a: str,
          b: str) -> list[tuple[str, float | None, float | None, bool | None]]:
    """One row per metric and finding.  Raw throughput is "better" only when neither run's tokens include
    what the findings claim (a runaway's or a dead slot's tokens are not throughput): the normal requests'
    throughput says which is better then."""
    ma, mb = (m.filter(pl.col("run") == r).row(0, named=True) for r in (a, b))
    tainted = any(useful[r][0] < useful[r][1] for r in (a, b))
    rows = []
    for col, label, better in METRICS:
        rows.append((label, _num(ma.get(col)), _num(mb.get(col)), None if tainted and col == "gen_tok_per_s" else better))
        if col == "gen_tok_per_s":
            rows.append((USEFUL, _per_s(useful[a][0], ma), _per_s(useful[b][0], mb), True))
    rows += [(str(f.compare), float(counts[a][str(f.compare)]), float(counts[b][str(f.compare)]), False)
             for f in compared()]
    return rows


def _per_s(tokens: int, m: dict[str, object]) -> float | None:
    wall = _num(m.get("wall_s"))
    return tokens / wall if wall else None


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _better(va: float | None, vb: float | None, higher: bool | None, a: str, b: str) -> str:
    if higher is None or va is None or vb is None or va == vb:
        return ""
    return b if (vb > va) == higher else a


def _table(rows: list[tuple[str, float | None, float | None, bool | None]], a: str, b: str) -> pl.DataFrame:
    df = pl.DataFrame(rows, schema={"metric": pl.String, a: pl.Float64, b: pl.Float64, "_higher": pl.Boolean},
                      orient="row")
    return df.with_columns(
        (pl.col(b) - pl.col(a)).alias("change"),
        pl.when(pl.col(a) != 0).then((pl.col(b) - pl.col(a)) / pl.col(a) * 100).alias("change_pct"),
        pl.Series("better", [_better(r[1], r[2], r[3], a, b) for r in rows], dtype=pl.String),
    ).drop("_higher")


def _missing_in(items: pl.DataFrame, a: str, b: str) -> pl.DataFrame:
    """Items missing in a, in b, or in both (one row per item and stage)."""
    keys = ["item", "stage"]
    ia = items.filter(pl.col("run") == a).select(keys).unique().with_columns(pl.lit(True).alias("_a"))
    ib = items.filter(pl.col("run") == b).select(keys).unique().with_columns(pl.lit(True).alias("_b"))
    both = ia.join(ib, on=keys, how="full", coalesce=True, nulls_equal=True)
    where = pl.when(pl.col("_a") & pl.col("_b")).then(pl.lit("both")).when(pl.col("_a")).then(pl.lit(a)) \
        .otherwise(pl.lit(b))
    order = pl.when(pl.col("_a") & pl.col("_b")).then(2).when(pl.col("_a")).then(0).otherwise(1)
    return both.sort(order, "item", "stage", nulls_last=True).select(*keys, where.alias("missing_in"))


def compare(store: Store, a: str, b: str) -> Comparison:
    """Line up runs ``a`` and ``b``: their metrics and findings side by side, with the change from a to b."""
    runs = runs_mod.resolve(store, [a, b]).runs
    if len(runs) != 2:
        raise _same_run(a)
    m = metrics.throughput(store, runs)
    with Analysis.open(store, runs) as session:
        counts = finding_counts(session, runs)
        useful = useful_tokens(session, runs)
        items = findings.missing_items(session, runs)
    table = _table(_rows(m, counts, useful, a, b), a, b)
    cmp = Comparison(a, b, table, _missing_in(items, a, b), metrics=m)
    cmp.sentences = _sentences(cmp)
    return cmp


def _same_run(a: str) -> Exception:
    from forensics.errors import NotFoundError

    return NotFoundError(f"compare needs two different runs, got {a!r} twice", hint="name two runs")


def _pct(v: float | None) -> str:
    return "" if v is None else f" ({v:+.0f}%)"


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.0f}" if v == int(v) else f"{v:.2f}" if abs(v) < 100 else f"{v:.1f}"


def _sentences(cmp: Comparison) -> list[str]:
    """What changed, in words: one sentence per group (setup, speed, latency, findings, items)."""
    t = {r["metric"]: r for r in cmp.table.iter_rows(named=True)}
    a, b = cmp.a, cmp.b

    def pair(metric: str, unit: str = "") -> str:
        r = t[metric]
        return f"{_fmt(r[a])}{unit} → {_fmt(r[b])}{unit}{_pct(r['change_pct'])}"

    raw = t["throughput (generated tokens/s)"]
    normal = t[USEFUL]
    of_normal = f", {pair(USEFUL, ' tok/s')} from normal requests" if raw["better"] == "" and \
        (normal[a], normal[b]) != (raw[a], raw[b]) and normal[a] is not None else ""
    out = [f"{a} → {b}: np {pair('parallel slots (np)')}, {pair('requests')} requests.",
           f"Throughput {pair('throughput (generated tokens/s)', ' tok/s')}{of_normal}; wall time "
           f"{pair('wall time (s)', ' s')}.",
           f"Latency p50 {pair('latency p50 (s)', ' s')}, p95 {pair('latency p95 (s)', ' s')}."]
    found = [f"{name} {_fmt(t[name][a])} → {_fmt(t[name][b])}" for name in (str(f.compare) for f in compared())
             if name != "items missing" and (t[name][a] or 0) + (t[name][b] or 0) > 0]
    if found:
        out.append("Findings: " + ", ".join(found) + ".")
    if cmp.items.height:
        parts = []
        for who, label in ((a, f"only in {a}"), (b, f"only in {b}"), ("both", "in both")):
            names = list(dict.fromkeys(cmp.items.filter(pl.col("missing_in") == who)["item"].to_list()))
            if names:
                parts.append(f"{label}: {', '.join(names[:8])}" + (f" and {len(names) - 8} more" if len(names) > 8
                                                                    else ""))
        out.append("Items missing " + "; ".join(parts) + ".")
    return out

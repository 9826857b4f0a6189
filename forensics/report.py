"""One self-contained HTML report for a run: summary, findings, throughput and charts.

The file works offline: the Vega, Vega-Lite and vega-embed JavaScript is inlined once and every
chart's data is inline, so the page references no external URL.  Every string that came from a log
or a record is HTML-escaped (in tables) or JSON-escaped for <script> (in chart specs), so a log line
holding ``<script>`` stays text.

Findings come from ``forensics.findings`` (dead slots, runaways, prompts over the context, the cap, error
groups, and the class of each request in the charts) and ``forensics.replay`` (missing items): one
definition each.  A section that cannot be computed says why; the rest of the report is still written.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from forensics import metrics
from forensics.errors import ForensicsError, NotFoundError, bug_boundary
from forensics.store import Store

MAX_ROWS = 200
SECTIONS = ("Summary", "Findings", "Throughput", "Charts")

# (title, module, candidate function names): the first function found is used
def _findings() -> list[tuple[str, Callable[[Store, str], Any]]]:
    """The report's findings sections: a title and how to compute it for one run."""
    from forensics import findings, replay

    return [
        ("Dead slots", lambda store, run: findings.find_dead_slots(store, run)),
        ("Runaways", lambda store, run: findings.find_runaways(store, run)),
        ("Prompts over the context", lambda store, run: findings.find_prompt_over_context(store, run)),
        ("Missing items", lambda store, run: replay.missing(store, run)),
        ("Recommended output cap", lambda store, run: findings.recommend_cap(store, [run])),
        ("Error groups", lambda store, run: findings.error_groups(store, run)),
    ]

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
.wrap { overflow-x: auto; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 2px 8px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f4f4f4; } .na { color: #888; font-style: italic; } .note { color: #555; }
.chart { margin: 1em 0 2em; }
"""


@dataclass
class ReportResult:
    path: Path
    notes: list[str] = field(default_factory=list)


def _cell(v: Any) -> tuple[str, bool]:
    if v is None:
        return "", False
    if isinstance(v, bool):
        return ("true" if v else "false"), False
    if isinstance(v, float):
        if math.isnan(v):
            return "", True
        return (f"{v:.3f}" if abs(v) < 1000 else f"{v:.1f}"), True
    if isinstance(v, int):
        return str(v), True
    if isinstance(v, datetime):
        return v.isoformat(timespec="seconds").replace("+00:00", "Z"), False
    return html.escape(str(v)), False


def html_table(df: pl.DataFrame, *, max_rows: int = MAX_ROWS) -> str:
    """``df`` as an HTML table, every header and cell escaped."""
    if df.height == 0:
        return '<p class="na">none</p>'
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for row in df.head(max_rows).iter_rows():
        cells = []
        for v in row:
            text, num = _cell(v)
            cells.append(f'<td class="num">{text}</td>' if num else f"<td>{text}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    more = f'<p class="note">… {df.height - max_rows} more rows</p>' if df.height > max_rows else ""
    return (f'<div class="wrap"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'
            f"{more}")


def _kv_table(row: dict[str, Any]) -> str:
    return html_table(pl.DataFrame({"metric": list(row), "value": [_cell(v)[0] for v in row.values()]}))


def _as_frame(res: Any) -> pl.DataFrame:
    if isinstance(res, pl.DataFrame):
        return res
    if isinstance(res, dict):
        return pl.DataFrame([{k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
                              for k, v in res.items()}])
    if isinstance(res, list) and all(isinstance(r, dict) for r in res):
        return pl.DataFrame(res, infer_schema_length=None)
    for attr in ("table", "df", "frame"):
        inner = getattr(res, attr, None)
        if isinstance(inner, pl.DataFrame):
            return inner
    return pl.DataFrame({"value": [str(res)]})


def _only_run(df: pl.DataFrame, run: str) -> pl.DataFrame:
    return df.filter(pl.col("run") == run) if "run" in df.columns else df


def render_finding(res: Any, run: str) -> str:
    """HTML for a finding's result: a frame as a table; a result object (e.g. a cap recommendation)
    as its scalar fields, its messages and its frames."""
    if isinstance(res, (pl.DataFrame, dict, list)) or not hasattr(res, "__dict__"):
        return html_table(_only_run(_as_frame(res), run))
    fields = dict(vars(res))
    out = []
    scalars = {k: v for k, v in fields.items() if v is None or isinstance(v, (int, float, str, bool))}
    if scalars:
        out.append(_kv_table(scalars))
    for k, v in fields.items():
        if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            out.append(f"<p>{html.escape(k)}:</p><ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in v) + "</ul>")
        elif isinstance(v, pl.DataFrame):
            out.append(f"<p>{html.escape(k)}:</p>" + html_table(_only_run(v, run)))
    return "\n".join(out) or html_table(_as_frame(res))


def _computed(compute: Callable[[], Any]) -> tuple[Any, str]:
    """(result, "") or (None, why it could not be computed): a section that cannot be computed says so, and the
    rest of the report is still written.  A bug is reported the same way, as an internal error."""
    try:
        with bug_boundary():
            return compute(), ""
    except ForensicsError as exc:
        return None, exc.one_line()


def build_report(store: Store, run: str) -> tuple[str, list[str]]:
    """The report's HTML for ``run`` and notes (what was not available)."""
    from forensics import charts, findings  # altair only here, when a report is asked for

    runs = metrics.all_runs(store)
    if run not in runs:
        raise NotFoundError(f"no run {run!r} in the store", hint=f"runs: {', '.join(runs) or 'none'}")
    notes: list[str] = []
    esc = html.escape
    m_all = metrics.throughput(store, runs)
    m_run = m_all.filter(pl.col("run") == run)
    has_server = charts.has_server_requests(store, [run])
    ri = metrics.request_intervals(store, [run], source="server" if has_server else "auto")
    classes, why_not = _computed(lambda: findings.request_classes(store, [run]))
    ri = metrics.with_classes(ri, classes if classes is not None else pl.DataFrame(
        schema={"run": pl.String, "instance": pl.String, "slot": pl.Int64, "task": pl.Int64, "class": pl.String}))
    cap_res, _ = _computed(lambda: findings.recommend_cap(store, [run]))
    cap = cap_res.cap if cap_res is not None else None

    parts: list[str] = []
    # ---- summary
    parts.append('<h2 id="summary">Summary</h2>')
    if m_run.height:
        row = m_run.row(0, named=True)
        if row["estimated"]:
            parts.append('<p class="note">This run has no timestamps: wall time, rates, effective concurrency and '
                         "peak busy slots are estimates from request order.</p>")
        parts.append(_kv_table(row))
    else:
        parts.append('<p class="na">no requests for this run</p>')
    counts = ri.group_by("class").agg(pl.len().alias("requests")).sort("class")
    parts.append("<p>Requests by what the findings say of them:</p>" if not why_not else
                 f'<p class="na">the requests could not be classified: {esc(why_not)}</p>')
    parts.append(html_table(counts))
    # ---- findings
    parts.append('<h2 id="findings">Findings</h2>')
    for title, compute in _findings():
        parts.append(f"<h3>{esc(title)}</h3>")
        res, reason = _computed(lambda compute=compute: compute(store, run))
        if reason:
            parts.append(f'<p class="na">{esc(reason)}</p>')
            notes.append(f"{title.lower()}: {reason}")
        else:
            parts.append(render_finding(res, run))
    failed = ri.filter(pl.col("failed")).select(
        [c for c in ("instance", "slot", "task", "item", "stage", "start_s", "stop_reason", "error") if c in ri.columns])
    parts.append("<h3>Failed requests</h3>")
    parts.append(html_table(failed))
    # ---- throughput
    parts.append('<h2 id="throughput">Throughput</h2>')
    parts.append("<p>All runs in the store, one row per run:</p>")
    parts.append(html_table(m_all))
    sc = metrics.scaling(m_all, by="np")
    parts.append("<p>Against np:</p>")
    parts.append(html_table(sc.table))
    if sc.fit is not None:
        parts.append(f"<p>Fit: latency_p50_s = {sc.fit.a:.3f} + {sc.fit.b:.3f} × np "
                     f"(b is the seconds one more concurrent request adds; {sc.fit.n} runs).</p>")
    parts.append(f"<p><b>{esc(sc.sentence)}</b> (measured, step by step)</p>")
    if sc.model_sentence:
        parts.append(f"<p><b>{esc(sc.model_sentence)}</b></p>")
    # ---- charts
    parts.append('<h2 id="charts">Charts</h2>')
    chart_list: list[tuple[str, Any]] = [
        ("timeline", charts.timeline_chart(ri)),
        ("busy", charts.busy_chart(ri)),
        ("tokens", charts.tokens_chart(ri, cap)),
    ]
    if sc.table.height >= 1:
        chart_list += [("throughput", charts.throughput_chart(sc)), ("latency", charts.latency_chart(sc))]
    for name, c in chart_list:
        parts.append(charts.embed_div(c, f"chart-{name}"))

    now = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    nav = " · ".join(f'<a href="#{s.lower()}">{s}</a>' for s in SECTIONS)
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>forensics report: {esc(run)}</title>\n<style>{CSS}</style>\n"
        f"<script>{charts.javascript_bundle()}</script>\n</head><body>\n"
        f"<h1>Run {esc(run)}</h1>\n<p class=\"note\">llama-forensics report, written {now}. {nav}</p>\n"
        + "\n".join(parts) + "\n</body></html>\n"
    )
    return page, notes


def write_report(store: Store, run: str, path: Path | str) -> ReportResult:
    """Write the report for ``run`` to ``path`` (one HTML file that works offline)."""
    page, notes = build_report(store, run)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return ReportResult(path, notes)

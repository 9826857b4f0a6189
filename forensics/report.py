"""One self-contained HTML report for one run or a sweep of runs: the verdict, the timeline, the findings, the
throughput.

Read top down it answers, in order: what went wrong and what to change (the verdict, each sentence with the
lines it rests on and a link to its table), when it happened (the slot timeline and the tokens per request,
coloured by finding the same way in every chart, the recommended cap drawn), the findings' own tables
(cells wrap, long ones fold), and how throughput scales with the number of slots across comparable runs only
(which runs, and which were left out and why).

The file works offline: the Vega, Vega-Lite and vega-embed JavaScript is inlined once and every chart's data
is inline, so the page references no external URL.  Every string that came from a log or a record is
HTML-escaped (in tables) or JSON-escaped for <script> (in chart specs), so a log line holding ``<script>``
stays text.  Every finding comes from ``forensics.findings``, ``forensics.verdict`` and ``forensics.replay``:
one definition each; a section that cannot be computed says why, and the rest of the report is still written.
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
from forensics import runs as runs_mod
from forensics.errors import ForensicsError, bug_boundary
from forensics.store import Store

MAX_ROWS = 200
FOLD_CHARS = 120  # a cell longer than this is folded: its start shown, the rest behind a click
SECTIONS = (("verdict", "Verdict"), ("timeline", "Timeline"), ("findings", "Findings"), ("incidents", "Incidents"),
            ("throughput", "Throughput"), ("whatif", "What if"), ("metrics", "Run metrics"))

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1180px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: .2em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
h3 { margin-bottom: .3em; }
.verdict p { font-size: 15px; margin: .4em 0 .8em; } .verdict .run { font-weight: 600; }
.healthy { color: #2e7d32; } .sick { color: #b71c1c; }
.ev { font: 12px ui-monospace, monospace; color: #555; white-space: normal; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: 13px; max-width: 100%; }
th, td { border: 1px solid #ddd; padding: 2px 8px; text-align: left; vertical-align: top;
         white-space: normal; overflow-wrap: break-word; }
th { white-space: nowrap; } td { max-width: 36em; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
th { background: #f4f4f4; } .na { color: #888; font-style: italic; } .note { color: #555; }
details summary { cursor: pointer; color: #1a5fb4; } .chart { margin: 1em 0 2em; }
.scroll { overflow-x: auto; max-width: 100%; }
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
    text = str(v)
    if len(text) > FOLD_CHARS:  # long evidence folds: never cut, never wider than the page
        return (f"<details><summary>{html.escape(text[:FOLD_CHARS // 2])}…</summary>{html.escape(text)}</details>",
                False)
    return html.escape(text), False


def html_table(df: pl.DataFrame, *, max_rows: int = MAX_ROWS) -> str:
    """``df`` as an HTML table, every header and cell escaped; cells wrap, long ones fold."""
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
    more = f'<p class="note">… {df.height - max_rows} more rows (all of them: the CLI command)</p>' \
        if df.height > max_rows else ""
    # a table wider than the page scrolls inside its own box instead of widening the page
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    return f'<div class="scroll">{table}</div>{more}'


def _kv_table(row: dict[str, Any]) -> str:
    """One row as a two-column table (metric, value), each value rendered as its own type."""
    cells = []
    for name, v in row.items():
        text, num = _cell(v)
        td = '<td class="num">' if num else "<td>"
        cells.append(f"<tr><th>{html.escape(str(name))}</th>{td}{text}</td></tr>")
    return f'<div class="scroll"><table><tbody>{"".join(cells)}</tbody></table></div>'


def _computed(compute: Callable[[], Any]) -> tuple[Any, str]:
    """(result, "") or (None, why it could not be computed): a section that cannot be computed says so, and the
    rest of the report is still written.  A bug is reported the same way, as an internal error."""
    try:
        with bug_boundary():
            return compute(), ""
    except ForensicsError as exc:
        return None, exc.one_line()


# ---------------------------------------------------------------------------------------- sections
def finding_anchor(kind: str) -> str | None:
    """The report section a verdict fact of ``kind`` links to (the registry says which shows it)."""
    from forensics import registry

    return registry.section_of(kind)


def _verdict_section(verdicts: list[Any]) -> str:
    from forensics.verdict import short_evidence

    parts = ['<h2 id="verdict">Verdict</h2>', '<div class="verdict">']
    for v in verdicts:
        cls = "healthy" if v.healthy else "sick"
        sentences = []
        for f in v.facts:
            text = html.escape(f.sentence)
            anchor = finding_anchor(f.kind)
            ev = f"{short_evidence(f.evidence)}" if f.evidence else ""
            if anchor:  # the evidence links to the finding's table
                ev = f'<a href="#{anchor}">{html.escape(ev.strip() or "[details]")}</a>'
            sentences.append(f'{text} <span class="ev">{ev}</span>' if ev else text)
        parts.append(f'<p><span class="run {cls}">{html.escape(v.run)}:</span> {" ".join(sentences)}</p>')
    parts.append("</div>")
    return "\n".join(parts)


def _findings_sections(session: Any, runs: list[str], notes: list[str]) -> str:
    """One section per finding of the registry that has one, in its order, each its listing (or detail)."""
    from forensics import findings, registry

    parts = ['<h2 id="findings">Findings</h2>']
    for f in registry.findings(report=True):
        def compute(f: registry.Finding = f) -> Any:
            return f.detail(session, runs) if f.detail is not None else findings.rows(session, f.name, runs)

        parts.append(f'<h3 id="{f.anchor}">{html.escape(f.title)}</h3>')
        res, reason = _computed(compute)
        if reason:
            parts.append(f'<p class="na">{html.escape(reason)}</p>')
            notes.append(f"{f.title.lower()}: {reason}")
        else:
            parts.append(html_table(res))
    return "\n".join(parts)


def _incidents_section(session: Any, runs: list[str], charts: Any, notes: list[str]) -> str:
    """The incidents of the runs (``forensics.incidents``): what they add up to, what their onsets had in common,
    their onsets over time per build, and the listing."""
    from forensics import incidents

    parts = ['<h2 id="incidents">Incidents</h2>']
    got, why = _computed(lambda: (incidents.incidents(session, runs), incidents.precursors(session, runs)))
    if why:
        notes.append(f"incidents: {why}")
        return "\n".join([*parts, f'<p class="na">{html.escape(why)}</p>'])
    rows, pre = got
    parts.append(f"<p>{html.escape(incidents.summary(rows, len(runs)))}</p>")
    parts += [f'<p class="note">{html.escape(s)}</p>' for s in pre.sentences if rows.height]
    if rows.filter(pl.col("onset").is_not_null()).height:
        parts.append(charts.embed_div(charts.incidents_chart(rows), "chart-incidents"))
    return "\n".join([*parts, html_table(incidents.listing(rows))])


def _timeline_section(session: Any, runs: list[str], charts: Any, notes: list[str]) -> str:
    from forensics import findings

    store = session.store
    classed, why = _computed(lambda: findings.classified_requests(session, runs))
    if why:  # the timeline is still drawn, every bar "unclassified", and the page says why
        notes.append(f"classes: {why}")
    ri = classed if classed is not None else metrics.request_intervals(
        store, runs, source=metrics.lanes_source(store, runs)).with_columns(pl.lit("unclassified").alias("class"))
    cap_res, _ = _computed(lambda: findings.recommend_cap(session, runs))
    parts = ['<h2 id="timeline">Timeline</h2>',
             '<p class="note">One lane per slot, one bar per request, coloured by what the findings say of it.</p>'
             if not why else f'<p class="na">the requests could not be classified: {html.escape(why)}</p>']
    if ri.height:
        parts.append(charts.embed_div(charts.timeline_chart(ri), "chart-timeline"))
        parts.append(charts.embed_div(charts.tokens_chart(ri, cap_res.cap if cap_res else None), "chart-tokens"))
        parts.append(charts.embed_div(charts.busy_chart(ri), "chart-busy"))
    else:
        parts.append('<p class="na">no request with a start and an end</p>')
    failed, _ = _computed(lambda: findings.rows(session, "failed", runs))  # the one count of failures
    return "\n".join([*parts, "<h3>Failed requests</h3>", html_table(failed if failed is not None else pl.DataFrame())])


def _throughput_section(store: Store, runs: list[str], charts: Any) -> tuple[str, str]:
    """The throughput of the comparable runs, one fit per setup (with which runs and which were left out), and
    the named runs' own metrics."""
    from forensics.sweep import throughput_fits

    fits, why = _computed(lambda: throughput_fits(store, runs))
    parts = ['<h2 id="throughput">Throughput</h2>']
    if fits is None:
        parts.append(f'<p class="na">{html.escape(why)}</p>')
    for i, res in enumerate(fits or []):
        g, suffix = res.group, "" if i == 0 else f"-{i + 1}"
        parts.append(f"<h3>Setup {html.escape(g.label)}</h3>" if len(fits or []) > 1 else
                     f"<p>Setup: {html.escape(g.label)}.</p>")
        parts.append(f"<p>Compared: {html.escape(g.basis)}: {html.escape(', '.join(g.runs) or 'none')}.</p>")
        if g.left_out:
            parts.append("<p>Left out (they measure a broken server, not the concurrency):</p><ul>" + "".join(
                f"<li>{html.escape(r)}: {html.escape(w)}</li>" for r, w in g.left_out.items()) + "</ul>")
        sc = res.scaling
        if sc is not None:
            parts.append(html_table(sc.table))
            parts.append(f"<p><b>{html.escape(sc.sentence)}</b></p>")
            if sc.table.height >= 2:
                parts.append(charts.embed_div(charts.throughput_chart(sc), f"chart-throughput{suffix}"))
                parts.append(charts.embed_div(charts.latency_chart(sc), f"chart-latency{suffix}"))
    own = metrics.throughput(store, runs)
    detail = ['<h2 id="metrics">Run metrics</h2>']
    for row in own.iter_rows(named=True):
        detail.append(f"<h3>{html.escape(str(row['run']))}</h3>")
        if row.get("estimated"):
            detail.append('<p class="note">No timestamps: wall time, rates and concurrency are estimates from '
                          "request order.</p>")
        detail.append(_kv_table(row))
    return "\n".join(parts), "\n".join(detail)


def build_report(store: Store, runs: str | list[str] | None) -> tuple[str, list[str]]:
    """The report's HTML for one run or several (a sweep; none: the store's only run), and notes (what
    could not be computed)."""
    from forensics import charts  # altair only here, when a report is asked for
    from forensics.session import Analysis

    names = runs_mod.resolve(store, runs, one=True).runs
    with Analysis.open(store, names) as session:  # the findings as the store's analysis holds them
        return _page(session, names, charts)


def _page(session: Any, names: list[str], charts: Any) -> tuple[str, list[str]]:
    from forensics.planning.section import whatif_section
    from forensics.verdict import verdict

    notes: list[str] = []
    every, why = _computed(lambda: verdict(session))
    verdicts = [v for v in every or [] if v.run in names]
    body = [_verdict_section(verdicts) if every else f'<p class="na">{html.escape(why)}</p>',
            _timeline_section(session, names, charts, notes), _findings_sections(session, names, notes),
            _incidents_section(session, names, charts, notes)]
    throughput, detail = _throughput_section(session.store, names, charts)
    whatif, whatif_notes = whatif_section(session.store, names, charts, html_table)
    notes += whatif_notes
    body += [throughput, whatif, detail]
    now = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    nav = " · ".join(f'<a href="#{a}">{t}</a>' for a, t in SECTIONS)
    title = f"Run {names[0]}" if len(names) == 1 else f"Runs {', '.join(names)}"
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>forensics report: {html.escape(', '.join(names))}</title>\n<style>{CSS}</style>\n"
        f"<script>{charts.javascript_bundle()}</script>\n</head><body>\n"
        f"<h1>{html.escape(title)}</h1>\n<p class=\"note\">llama-forensics report, written {now}. {nav}</p>\n"
        + "\n".join(body) + "\n</body></html>\n"
    )
    return page, notes


def write_report(store: Store, runs: str | list[str] | None, path: Path | str) -> ReportResult:
    """Write the report for ``runs`` to ``path`` (one HTML file that works offline)."""
    from forensics.outfile import checked_target, write_whole

    checked_target(path, "report", "report.html")  # before the work: a folder is an input error at once
    page, notes = build_report(store, runs)
    return ReportResult(write_whole(path, page, "report", "report.html"), notes)

"""The report's "What if" section: for the report's run, the prediction at the recommended np and cap next to what
happened (the outputs layer: HTML from ``forensics.planning``'s results, charts from ``planning.charts``).

The budgets are the run's own (``recommendation.run_budgets``: its manifest's max_run_s, max_request_s,
max_p95_s); without them the section predicts the run at its own np with the recommended output cap.  When the store cannot support a prediction
the section says, in one line, what to record.
"""

from __future__ import annotations

import html
from typing import Any

import polars as pl

from forensics.errors import ForensicsError, bug_boundary
from forensics.planning.costmodel import NotEnoughData
from forensics.store import Store


def _side_by_side(res: Any, measured: dict[str, float], own_np: int) -> pl.DataFrame:
    """The what-if figures next to what the run measured at its own np."""
    from forensics.planning.predict import FIGURES

    t = res.table
    meas = [measured.get(f) for f in FIGURES] + [None] * (t.height - len(FIGURES))
    return pl.DataFrame({
        "figure": t["figure"], f"this run (np {own_np}, measured)": pl.Series(meas, dtype=pl.Float64),
        f"predicted at np {res.np}" + (f", cap {res.cap}" if res.cap else ""): t["predicted"],
        "low": t["low"], "high": t["high"], "band": t["band"]})


def whatif_section(store: Store, runs: list[str], charts: Any, table: Any) -> tuple[str, list[str]]:
    """The section's HTML and the notes (what could not be computed); ``table`` renders a frame as HTML.  The
    report's runs of several setups get one what-if each (for the first run of each setup), never a refusal."""
    from forensics.planning import predict

    parts = ['<h2 id="whatif">What if</h2>']
    notes: list[str] = []
    try:
        with bug_boundary():
            found = predict.each_setup(store, runs)
    except ForensicsError as exc:
        parts.append(f'<p class="na">{html.escape(exc.one_line())}</p>')
        return "\n".join(parts), [f"what if: {exc.one_line()}"]
    for k, p in enumerate(found):
        if len(found) > 1:
            parts.append(f"<h3>{html.escape(p.setup)}</h3>")
        if isinstance(p, predict.Unplanned):  # not a failure: the store cannot support a prediction yet; it says so
            parts.append(f'<p class="na">{html.escape(p.error.one_line())}</p>')
            continue
        try:
            with bug_boundary():
                parts += _body(p, (p.targets or runs)[0], charts, table, suffix="" if k == 0 else f"-{k + 1}")
        except NotEnoughData as exc:
            parts.append(f'<p class="na">{html.escape(exc.one_line())}</p>')
        except ForensicsError as exc:
            parts.append(f'<p class="na">{html.escape(exc.one_line())}</p>')
            notes.append(f"what if: {exc.one_line()}")
    return "\n".join(parts), notes


def _body(p: Any, run: str, charts: Any, table: Any, suffix: str = "") -> list[str]:
    from forensics import findings, metrics
    from forensics.planning import charts as pcharts
    from forensics.planning.recommendation import Budgets, recommend_with, run_budgets
    from forensics.planning.what_if import whatif_with

    store = p.store
    w = p.workload(run)
    cap_res = findings.recommend_cap(store, [run])
    cap = cap_res.cap if cap_res.cap is not None and findings.cap_cuts(store, run, cap_res.cap).height else None
    budgets = run_budgets(store, run)
    out = [f"<p>The run's own requests replayed through the cost model fitted on {html.escape(', '.join(p.pool))} "
           f"({html.escape(p.model.describe())}); each prediction's band is the largest error {p.fold_kind} "
           "measured for its kind.</p>"]
    n = w.np
    if budgets:
        rec = recommend_with(p, [run], Budgets(**budgets), cap=cap)
        out += [f"<p><b>{html.escape(rec.sentence)}</b></p>",
                "<ul>" + "".join(f"<li>{html.escape(d)}</li>" for d in rec.details) + "</ul>" if rec.details else "",
                table(rec.table), charts.embed_div(pcharts.recommend_chart(rec), "chart-recommend" + suffix)]
        n = rec.np or n
    else:
        out.append('<p class="note">The run\'s manifest sets no budgets (max_run_s, max_request_s, max_p95_s): the '
                   "prediction is at the run's own np" + (" with the recommended output cap" if cap else "") + ".</p>")
    res = whatif_with(p, run, np_=n, cap=cap)
    out += [f"<p>{html.escape(' '.join(res.sentences[:-1]))}</p>",
            table(_side_by_side(res, p.measured.get(run, {}), w.np))]
    if cap is not None:
        out += ["<h3>Outputs the cap cuts</h3>", table(res.cuts)]
    ri = metrics.request_intervals(store, [run], source=metrics.lanes_source(store, [run]))
    busy = metrics.busy_over_time(ri)
    mine = busy.filter(pl.col("instance") == w.instance) if w.instance is not None else busy
    out.append(charts.embed_div(pcharts.busy_chart(res, mine if n == w.np else None), "chart-whatif" + suffix))
    return out

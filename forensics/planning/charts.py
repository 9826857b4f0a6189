"""Charts of the planning predictions (the outputs layer: the one planning module that imports altair).

``recommend_chart``: run time and request latency against np, the prediction as a line with its band, the
measured runs as points, the budgets as dashed rules and the recommended np marked.  ``busy_chart``: slots in use
over the run, predicted and (when the run was measured at that np) measured.
"""

from __future__ import annotations

import textwrap
from typing import Any

import altair as alt
import polars as pl

from forensics import charts as base
from forensics.planning.predict import FIGURE_NAMES
from forensics.planning.recommendation import BUDGETS, Recommendation
from forensics.planning.what_if import WhatIf

PREDICTED, MEASURED, BUDGET = "#4c78a8", "#e45756", "#7f7f7f"
LATENCY_FIGURES = ("latency_max_s", "latency_p95_s")


def _values(df: pl.DataFrame) -> alt.Data:
    return alt.Data(values=df.to_dicts())


def _panel(rec: Recommendation, figures: tuple[str, ...], title: str, budgets: tuple[str, ...]) -> alt.LayerChart | alt.FacetChart:
    curve = rec.curve.filter(pl.col("figure").is_in(figures)).with_columns(
        pl.col("figure").replace_strict(FIGURE_NAMES, default=pl.col("figure")).alias("what"))
    x = alt.X("np:Q", title="np (parallel slots)", axis=alt.Axis(tickMinStep=1, format="d"), scale=alt.Scale(zero=False))
    color = alt.Color("what:N", title=None)
    band = alt.Chart(_values(curve.filter(pl.col("low").is_not_null()))).mark_area(opacity=0.18).encode(
        x=x, y=alt.Y("low:Q", title=title), y2="high:Q", color=color)
    line = alt.Chart(_values(curve)).mark_line(point=alt.OverlayMarkDef(filled=False)).encode(
        x=x, y=alt.Y("predicted:Q", title=title), color=color, strokeDash=alt.value([5, 3]),
        tooltip=[alt.Tooltip("np:Q"), alt.Tooltip("what:N"), alt.Tooltip("predicted:Q", format=".1f"),
                 alt.Tooltip("low:Q", format=".1f"), alt.Tooltip("high:Q", format=".1f")])
    meas = alt.Chart(_values(curve.filter(pl.col("measured").is_not_null()))).mark_point(
        filled=True, size=80, shape="diamond").encode(
        x=x, y="measured:Q", color=color,
        tooltip=[alt.Tooltip("np:Q"), alt.Tooltip("what:N"), alt.Tooltip("measured:Q", format=".1f")])
    layers: list[Any] = [band, line, meas]
    limits = [{"limit": rec.budgets[b], "budget": f"budget: {BUDGETS[b][1]}"} for b in budgets if b in rec.budgets]
    if limits:
        lim = alt.Chart(_values(pl.DataFrame(limits))).mark_rule(color=BUDGET, strokeDash=[2, 2])
        layers += [lim.encode(y="limit:Q", tooltip=["budget:N", alt.Tooltip("limit:Q", format=".0f")]),
                   lim.mark_text(align="left", dx=4, dy=-6, color=BUDGET).encode(y="limit:Q", text="budget:N",
                                                                                  x=alt.value(0))]
    if rec.np is not None:
        mark = pl.DataFrame({"np": [rec.np], "label": [f"recommended np {rec.np}"]})
        layers.append(alt.Chart(_values(mark)).mark_rule(color="#333333").encode(x="np:Q", tooltip=["label:N"]))
    return alt.layer(*layers).properties(width=420, height=260, title=title)


def recommend_chart(rec: Recommendation) -> alt.HConcatChart:
    """Predicted (line and band) and measured (diamonds) run time and latency against np, with the budgets."""
    left = _panel(rec, ("run_s",), "run time (s)", ("run",))
    right = _panel(rec, LATENCY_FIGURES, "request latency (s)", ("request", "p95"))
    key = "dashed: predicted (shaded: its leave-one-np-out band); diamonds: measured; dotted: the budgets"
    return alt.hconcat(left, right).resolve_scale(color="independent").properties(
        title={"text": "Predicted vs measured against np" + (f": {rec.setup}" if rec.setup else ""),
               "subtitle": [*textwrap.wrap(rec.sentence, 150), key]})


def recommend_charts(recs: list[Recommendation]) -> alt.VConcatChart | alt.HConcatChart:
    """``recommend_chart`` of each setup's answer, one under the other (the setups that could be predicted)."""
    drawn = [recommend_chart(r) for r in recs if r.error is None and r.curve.height]
    return drawn[0] if len(drawn) == 1 else alt.vconcat(*drawn)


def busy_chart(res: WhatIf, measured: pl.DataFrame | None = None) -> alt.Chart:
    """Slots in use over the run: the prediction, and ``measured`` (t_s, busy) when given."""
    pred = res.busy.with_columns(pl.lit(f"predicted at np {res.np}").alias("what"))
    frames = [pred]
    if measured is not None and measured.height:
        frames.append(measured.select("t_s", "busy").with_columns(pl.lit("measured").alias("what")))
    df = pl.concat(frames, how="vertical_relaxed")
    return alt.Chart(_values(df)).mark_line(interpolate="step-after").encode(
        x=alt.X("t_s:Q", title="seconds since the run's first request"),
        y=alt.Y("busy:Q", title="slots busy", axis=alt.Axis(tickMinStep=1, format="d")),
        color=alt.Color("what:N", title=None, scale=alt.Scale(range=[PREDICTED, MEASURED])),
        tooltip=[alt.Tooltip("what:N"), alt.Tooltip("t_s:Q", format=".1f"), alt.Tooltip("busy:Q")],
    ).properties(width=560, height=200, title=f"Busy slots: {res.run}")


def busy_charts(found: list[WhatIf]) -> alt.Chart | alt.VConcatChart:
    """``busy_chart`` of each prediction, one under the other."""
    return busy_chart(found[0]) if len(found) == 1 else alt.vconcat(*(busy_chart(r) for r in found))


def save(chart: alt.TopLevelMixin, path: Any, title: str) -> Any:
    """Write ``chart`` like every other chart of the tool (.html offline, .png, .svg, .json)."""
    return base.save(chart, path, title=title)

"""Altair charts of throughput, latency, slot timelines, token counts and busy slots.

The only library module that imports altair.  Every chart function takes plain polars frames from
``forensics.metrics`` and returns an ``alt.Chart``; ``save`` writes it as self-contained HTML (the
Vega, Vega-Lite and vega-embed JavaScript inline, no CDN), PNG, SVG or the Vega-Lite JSON spec,
chosen by the file extension.  ``build`` draws a chart KIND for runs of a store.
"""

from __future__ import annotations

import html
import json
from functools import cache
from pathlib import Path
from typing import Any, cast

import altair as alt
import polars as pl

from forensics import metrics
from forensics.errors import InputError
from forensics.store import Store
from forensics.vocab import CHART_KINDS

KINDS = CHART_KINDS
EXTENSIONS = (".html", ".png", ".svg", ".json")
VL_VERSION = "v" + ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
KNEE_COLOR = "#333333"
CAP_COLOR = "#54a24b"  # not a finding's colour: the cap is advice, not a fault
# One colour per finding, the same in every chart; a class of a finding added to the registry gets the next
# colour of EXTRA_COLORS (class_colors).
CLASS_COLORS = {"normal": "#4c78a8", "runaway": "#f58518", "dead slot": "#e45756", "prompt over context": "#b279a2",
                "failed": "#7f7f7f", "unclassified": "#c7c7c7"}
EXTRA_COLORS = ("#72b7b2", "#eeca3b", "#9d755d", "#54a24b", "#ff9da6", "#bab0ac")


def class_colors() -> dict[str, str]:
    """Every request class of the registry (``findings.classes``) with its colour, then unclassified."""
    from forensics.findings import classes

    extra = iter(EXTRA_COLORS)
    out = {c: v for c, v in CLASS_COLORS.items() if c != "unclassified"}
    out.update({c: next(extra, "#000000") for c in classes() if c not in out})
    return {**out, "unclassified": CLASS_COLORS["unclassified"]}


def _data(df: pl.DataFrame) -> alt.Data:
    """Inline values (JSON-safe: datetimes as ISO strings) so specs never point at a file or URL."""
    flat = df.with_columns([pl.col(c).dt.to_string("%Y-%m-%dT%H:%M:%S%.3fZ")
                            for c, t in df.schema.items() if isinstance(t, pl.Datetime)])
    return alt.Data(values=flat.to_dicts())


def _tips(df: pl.DataFrame, cols: list[str]) -> list[alt.Tooltip]:
    """Tooltips with explicit types (inline data gives altair nothing to infer them from)."""
    return [alt.Tooltip(f"{c}:{'Q' if df.schema[c].is_numeric() else 'N'}") for c in cols if c in df.columns]


def _x_axis(by: str, values: list[Any]) -> alt.X:
    """The concurrency axis: whole numbers only (no np 1.5) when every value is whole."""
    whole = all(float(v).is_integer() for v in values if v is not None)
    axis = alt.Axis(tickMinStep=1, format="d", values=sorted({int(v) for v in values})) if whole and values else None
    return alt.X("x:Q", title=by, axis=axis, scale=alt.Scale(zero=False))


def _knee(scaling: metrics.Scaling) -> tuple[float | None, str]:
    """The knee the sentence talks about (always at a measured value of ``by``), and its label."""
    x = scaling.knee
    if scaling.knee_between is not None:
        lo, hi = scaling.knee_between
        return x, f"knee: between {scaling.by} {lo:g} and {hi:g}"
    return x, (f"knee: above {scaling.by} {x:g}" if x is not None else "")


def throughput_chart(scaling: metrics.Scaling, setup: str | None = None) -> alt.TopLevelMixin:
    """Output tokens/s against concurrency across runs, the knee drawn where the sentence puts it (``setup``: the
    setup's label, in the title, when a chart shows one setup among several)."""
    by = scaling.by
    t = scaling.table.rename({by: "x"}) if by in scaling.table.columns else scaling.table
    line = alt.Chart(_data(t)).mark_line(point=True).encode(
        x=_x_axis(by, t["x"].to_list()), y=alt.Y("gen_tok_per_s:Q", title="output tokens / s"),
        tooltip=[alt.Tooltip("x:Q", title=by), alt.Tooltip("runs:Q", title="runs"),
                 alt.Tooltip("gen_tok_per_s:Q", title="output tokens / s", format=".1f"),
                 alt.Tooltip("req_per_s:Q", title="requests / s", format=".3f"),
                 alt.Tooltip("effective_concurrency:Q", title="effective concurrency", format=".2f")])
    layers: list[Any] = [line]
    knee_x, label = _knee(scaling)
    if scaling.knee_between is not None:  # the knee lies between two measured values: shade them, no line
        lo, hi = scaling.knee_between
        band = alt.Chart(_data(pl.DataFrame({"x": [lo], "x2": [hi], "label": [label]})))
        layers += [band.mark_rect(color=KNEE_COLOR, opacity=0.12).encode(x="x:Q", x2="x2:Q", tooltip=["label:N"]),
                   band.mark_text(align="left", dx=4, dy=-120, color=KNEE_COLOR).encode(x="x:Q", text="label:N")]
    elif knee_x is not None:
        mark = alt.Chart(_data(pl.DataFrame({"x": [knee_x], "label": [label]})))
        layers += [mark.mark_rule(color=KNEE_COLOR, strokeDash=[4, 4]).encode(x="x:Q", tooltip=["label:N"]),
                   mark.mark_text(align="left", dx=4, dy=-120, color=KNEE_COLOR).encode(x="x:Q", text="label:N")]
    sentence = scaling.sentence
    head = f"Throughput vs {by}" + (f": {setup}" if setup else "")
    return alt.layer(*layers).properties(title={"text": head, "subtitle": sentence},
                                         width=560, height=300)


LATENCY_LABELS = {"latency_p50_s": "median latency", "latency_p90_s": "p90 latency"}


def latency_chart(scaling: metrics.Scaling, setup: str | None = None) -> alt.TopLevelMixin:
    """Median and p90 latency against concurrency, with the fitted line latency = a + b × x (``setup``: as in
    ``throughput_chart``)."""
    by = scaling.by
    t = scaling.table.rename({by: "x"}) if by in scaling.table.columns else scaling.table
    long = t.select("x", *LATENCY_LABELS).unpivot(index="x", variable_name="stat", value_name="latency_s") \
        .with_columns(pl.col("stat").replace_strict(LATENCY_LABELS))
    pts = alt.Chart(_data(long)).mark_line(point=True).encode(
        x=_x_axis(by, t["x"].to_list()), y=alt.Y("latency_s:Q", title="request latency (s)"),
        color=alt.Color("stat:N", title=None, sort=list(LATENCY_LABELS.values())),
        tooltip=[alt.Tooltip("x:Q", title=by), alt.Tooltip("stat:N", title="latency"),
                 alt.Tooltip("latency_s:Q", title="seconds", format=".2f")])
    layers: list[Any] = [pts]
    subtitle = ""
    fit = scaling.fit
    if fit is not None and t.height:
        xs = [min(t["x"].to_list()), max(t["x"].to_list())]
        fitted = pl.DataFrame({"x": xs, "latency_s": [fit.predict(x) for x in xs], "stat": ["fit on the median"] * 2})
        layers.append(alt.Chart(_data(fitted)).mark_line(strokeDash=[6, 3], color="black")
                      .encode(x="x:Q", y="latency_s:Q", tooltip=[alt.Tooltip("stat:N", title="line")]))
        subtitle = f"dashed: fit on the median, {fit.a:.2f} s + {fit.b:.2f} s × {by} ({fit.n} runs)"
    head = f"Latency vs {by}" + (f": {setup}" if setup else "")
    return alt.layer(*layers).properties(title={"text": head, "subtitle": subtitle},
                                         width=560, height=300)


def timeline_chart(intervals: pl.DataFrame) -> alt.TopLevelMixin:
    """One lane per instance and slot, one bar per request, coloured by class."""
    df = intervals if "class" in intervals.columns else intervals.with_columns(pl.lit("unclassified").alias("class"))
    df = df.filter(pl.col("start_s").is_not_null() & pl.col("end_s").is_not_null()).with_columns(
        pl.concat_str([pl.col("run"), pl.lit(" "), pl.col("instance").fill_null("?"), pl.lit(" slot "),
                       pl.col("slot").cast(pl.String).fill_null("?")]).alias("lane"))
    cols = [c for c in ("lane", "run", "instance", "slot", "task", "item", "stage", "gen_tokens", "prompt_tokens",
                        "latency_s", "start_s", "end_s", "class", "stop_reason", "error") if c in df.columns]
    df = df.select(cols)
    tooltip = _tips(df, ["item", "stage", "task", "slot", "instance", "class", "stop_reason"])
    tooltip += [alt.Tooltip("gen_tokens:Q", title="generated tokens"),
                alt.Tooltip("prompt_tokens:Q", title="prompt tokens"),
                alt.Tooltip("latency_s:Q", title="seconds", format=".2f"),
                alt.Tooltip("start_s:Q", title="start (s)", format=".1f")]
    lanes = df["lane"].n_unique() if df.height else 1
    return alt.Chart(_data(df)).mark_bar(stroke="white", strokeWidth=0.5).encode(
        x=alt.X("start_s:Q", title="seconds since the run's first request"),
        x2="end_s:Q",
        y=alt.Y("lane:N", title=None, sort=None),
        color=alt.Color("class:N", title="request",
                        scale=alt.Scale(domain=list(class_colors()), range=list(class_colors().values()))),
        tooltip=tooltip,
    ).properties(title="Slot timeline", width=720, height=max(60, 18 * lanes))


def tokens_chart(intervals: pl.DataFrame, cap: int | None = None) -> alt.TopLevelMixin:
    """Generated tokens per request, by stage when known (else by run), the recommended cap as a rule."""
    df = intervals.filter(pl.col("gen_tokens").is_not_null())
    group = "stage" if "stage" in df.columns and df["stage"].drop_nulls().len() else "run"
    if "class" not in df.columns:
        df = df.with_columns(pl.lit("unclassified").alias("class"))
    df = df.select(group, "gen_tokens", "class", *[c for c in ("item", "task", "slot") if c in df.columns])
    pts = alt.Chart(_data(df)).mark_tick(thickness=2, size=14).encode(
        x=alt.X("gen_tokens:Q", title="generated tokens"),
        y=alt.Y(f"{group}:N", title=group),
        color=alt.Color("class:N", scale=alt.Scale(domain=list(class_colors()), range=list(class_colors().values()))),
        tooltip=_tips(df, df.columns),
    )
    layers: list[Any] = [pts]
    title = f"Generated tokens per {group}"
    if cap is not None:
        label = f"recommended cap {cap}"
        layers.append(alt.Chart(_data(pl.DataFrame({"cap": [cap], "label": [label]})))
                      .mark_rule(color=CAP_COLOR, strokeWidth=2).encode(x="cap:Q", tooltip=["label:N"]))
        title += f", {label}"
    n = df[group].n_unique() if df.height else 1
    return alt.layer(*layers).properties(title=title, width=620, height=max(60, 30 * n))


def busy_chart(intervals: pl.DataFrame) -> alt.TopLevelMixin:
    """Busy slots (requests in flight) over time, one step line per run and instance."""
    b = metrics.busy_over_time(intervals).with_columns(
        pl.concat_str([pl.col("run"), pl.lit(" "), pl.col("instance").fill_null("?")]).alias("series"))
    return alt.Chart(_data(b)).mark_line(interpolate="step-after").encode(
        x=alt.X("t_s:Q", title="seconds since the run's first request"),
        y=alt.Y("busy:Q", title="busy slots"),
        color=alt.Color("series:N", title=None),
        tooltip=["series:N", alt.Tooltip("t_s:Q", format=".1f"), "busy:Q"],
    ).properties(title="Busy slots over time", width=620, height=220)


INCIDENT_SHAPES = {"dead_slot": "cross", "runaway": "triangle-up", "crash": "square", "kv_stall": "diamond",
                   "failover": "circle"}
INCIDENT_COLORS = {"dead_slot": CLASS_COLORS["dead slot"], "runaway": CLASS_COLORS["runaway"], "crash": "#9d755d",
                   "kv_stall": "#eeca3b", "failover": "#72b7b2"}


def incidents_chart(rows: pl.DataFrame) -> alt.TopLevelMixin:
    """Each incident's onset over time (``forensics.incidents``), one row per build, its kind by shape and colour:
    whether a kind of incident began with a build, and when.  Incidents without a wall-clock onset are left out."""
    df = rows.filter(pl.col("onset").is_not_null()).select(
        "onset", pl.col("build").cast(pl.String).fill_null("unknown").alias("build"), "run", "kind", "instance", "slot",
        "item", "stage", "why")
    kinds = [k for k in INCIDENT_SHAPES if k in set(df["kind"].to_list())]
    tips = _tips(df, ["run", "kind", "instance", "slot", "item", "stage", "why"])
    return alt.Chart(_data(df)).mark_point(size=90, filled=True).encode(
        x=alt.X("onset:T", title="onset (UTC)", scale=alt.Scale(type="utc")),
        y=alt.Y("build:N", title="build"),
        shape=alt.Shape("kind:N", title="incident", scale=alt.Scale(domain=kinds,
                                                                    range=[INCIDENT_SHAPES[k] for k in kinds])),
        color=alt.Color("kind:N", title="incident", scale=alt.Scale(domain=kinds,
                                                                    range=[INCIDENT_COLORS[k] for k in kinds])),
        tooltip=[alt.Tooltip("onset:T", format="%Y-%m-%d %H:%M:%S", formatType="utc"), *tips],
    ).properties(title="Incident onsets over time, per build", width=620, height=max(80, 40 * df["build"].n_unique()))


RUN_PAIR_COLORS = ["#2f4b6e", "#9ab8d8"]
COMPARE_LATENCY_LABELS = {"latency_p50_s": "p50", "latency_p90_s": "p90", "latency_p95_s": "p95",
                          "latency_p99_s": "p99"}


def compare_chart(cmp: Any) -> alt.HConcatChart:
    """Two runs side by side (a ``compare.Comparison``): latency percentiles, and throughput."""
    m = cmp.metrics.filter(pl.col("run").is_in([cmp.a, cmp.b]))
    order = [cmp.a, cmp.b]
    lat = m.select("run", *COMPARE_LATENCY_LABELS).unpivot(index="run", variable_name="stat", value_name="s") \
        .with_columns(pl.col("stat").replace_strict(COMPARE_LATENCY_LABELS))
    # two shades of one hue: no finding's colour, so a run never reads as "runaway" or "dead slot"
    colour = alt.Color("run:N", title="run", sort=order, scale=alt.Scale(domain=order, range=RUN_PAIR_COLORS))
    latency = alt.Chart(_data(lat)).mark_bar().encode(
        x=alt.X("stat:N", title="latency percentile", sort=list(COMPARE_LATENCY_LABELS.values()),
                axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset("run:N", sort=order), y=alt.Y("s:Q", title="request latency (s)"), color=colour,
        tooltip=[alt.Tooltip("run:N"), alt.Tooltip("stat:N", title="percentile"),
                 alt.Tooltip("s:Q", title="seconds", format=".2f")],
    ).properties(title="Latency", width=320, height=260)
    speed = alt.Chart(_data(m.select("run", "np", "gen_tok_per_s"))).mark_bar().encode(
        x=alt.X("run:N", title=None, sort=order, axis=alt.Axis(labelAngle=0)),
        y=alt.Y("gen_tok_per_s:Q", title="output tokens / s"),
        color=colour, tooltip=[alt.Tooltip("run:N"), alt.Tooltip("np:Q", title="np"),
                               alt.Tooltip("gen_tok_per_s:Q", title="output tokens / s", format=".1f")],
    ).properties(title="Throughput", width=160, height=260)
    return alt.hconcat(latency, speed).properties(title={"text": f"{cmp.a} vs {cmp.b}",
                                                         "subtitle": cmp.sentences[1:3]})


def build(store: Store, kind: str, runs: list[str] | None = None, *, by: str = "np",
          source: str = "auto") -> alt.TopLevelMixin:
    """The chart ``kind`` for ``runs`` of ``store`` (all runs when empty)."""
    if kind not in KINDS:
        raise InputError(f"unknown chart kind {kind!r}", hint=f"use one of {', '.join(KINDS)}")
    if kind in {"throughput", "latency"}:
        from forensics.sweep import throughput_fits

        fits = throughput_fits(store, runs, by=by, source=source)  # the same healthy runs as the CLI and report
        drawn = [(f.group.label, f.scaling) for f in fits if f.scaling is not None]
        if not drawn:
            raise InputError("no healthy run to draw", hint="; ".join(
                f"{r}: {w}" for f in fits for r, w in f.group.left_out.items())[:300] or None)
        make = throughput_chart if kind == "throughput" else latency_chart
        one = [make(sc, setup=label if len(drawn) > 1 else None) for label, sc in drawn]
        return one[0] if len(one) == 1 else alt.vconcat(*cast(list[Any], one))  # one chart per setup, never pooled
    from forensics import findings

    if kind == "busy":
        return busy_chart(metrics.request_intervals(store, runs, source=metrics.lanes_source(store, runs, source)))
    ri = findings.classified_requests(store, runs, source=source)
    if kind == "timeline":
        return timeline_chart(ri)
    return tokens_chart(ri, findings.recommend_cap(store, runs).cap)


def spec(chart: alt.TopLevelMixin) -> dict[str, Any]:
    """The Vega-Lite spec with its data inline and no ``$schema`` URL."""
    d = chart.to_dict()
    d.pop("$schema", None)
    return d


@cache
def javascript_bundle() -> str:
    """Vega, Vega-Lite and vega-embed as one inline script (from vl-convert; no network)."""
    import vl_convert as vlc

    return vlc.javascript_bundle(vl_version=VL_VERSION)  # type: ignore[call-arg]  # the stub makes the optional snippet required


def script_json(data: Any) -> str:
    """JSON safe inside a <script> element: <, > and & escaped so no string can end the script."""
    return (json.dumps(data, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def embed_div(chart: alt.TopLevelMixin, div_id: str) -> str:
    """A <div> and the script that draws ``chart`` in it (needs ``javascript_bundle`` on the page)."""
    return (f'<div id="{html.escape(div_id)}" class="chart"></div>\n'
            f'<script>vegaEmbed("#{html.escape(div_id)}", {script_json(spec(chart))}, '
            '{"actions": false, "renderer": "svg"}).catch(function (e) {'
            f' document.getElementById("{html.escape(div_id)}").textContent = "chart failed: " + e; }});'
            "</script>")


def to_html(chart: alt.TopLevelMixin, title: str = "chart") -> str:
    """A standalone HTML page drawing ``chart`` that works offline."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>\n'
            f"<script>{javascript_bundle()}</script>\n</head><body>\n{embed_div(chart, 'vis')}\n</body></html>\n")


def save(chart: alt.TopLevelMixin, path: Path | str, *, title: str = "chart") -> Path:
    """Write ``chart`` to ``path``: .html (interactive, offline), .png, .svg or .json (the spec)."""
    import vl_convert as vlc

    path = Path(path)
    ext = path.suffix.lower()
    if ext not in EXTENSIONS:
        raise InputError(f"cannot write a chart as {ext or 'a file without extension'}", path=str(path),
                         hint=f"use one of {', '.join(EXTENSIONS)}")
    from forensics.outfile import checked_target, write_whole

    checked_target(path, "chart", f"chart{ext}")
    s = spec(chart)
    data: str | bytes
    if ext == ".html":
        data = to_html(chart, title)
    elif ext == ".png":
        data = vlc.vegalite_to_png(s, vl_version=VL_VERSION, scale=2)
    elif ext == ".svg":
        data = vlc.vegalite_to_svg(s, vl_version=VL_VERSION)
    else:
        data = json.dumps(s, indent=1, ensure_ascii=False)
    return write_whole(path, data, "chart", f"chart{ext}")

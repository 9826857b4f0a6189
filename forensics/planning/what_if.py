"""``whatif``: a run's own workload replayed at another np and/or with an output cap, with error bands.

The run's requests (``workload``) go through the cost model fitted on the store's runs of the run's setup
(``predict.planner``: its healthy runs, and those whose outputs ran away, which still time the server); each figure
carries the band leave-one-np-out measured for predictions of its kind, and what was measured at that np comes from
the run itself or the setup's healthy runs.  Between two measured np a prediction never beats both unless the
model's own curve peaks there (``predict.sanity``).  With
a cap, the outputs it cuts are named by the cap finding's own rule (``findings.cut_by_cap``: normal responses at
or above it, runaways past it), and the time saved is the run's duration times the relative saving the model
predicts between the run with and without the cap (the model's own bias on this run cancels out); its band is the
run time's band in seconds.  At the run's own np its run time with the cap is its measured one less that saving.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import polars as pl

from forensics import metrics
from forensics.errors import InputError
from forensics.planning import predict, simulate
from forensics.planning.costmodel import CostModel
from forensics.planning.predict import FIGURE_NAMES, FIGURES, Planner
from forensics.store import Store

TABLE_SCHEMA = {"figure": pl.String, "predicted": pl.Float64, "low": pl.Float64, "high": pl.Float64,
                "band_pct": pl.Float64, "band": pl.String, "measured": pl.Float64, "measured_run": pl.String}
CUT_SCHEMA = {"item": pl.String, "stage": pl.String, "attempt": pl.Int64, "class": pl.String, "gen_tokens": pl.Int64,
              "tokens_cut": pl.Int64, "instance": pl.String, "slot": pl.Int64, "task": pl.Int64}


@dataclass
class WhatIf:
    """The prediction for one run at ``np`` slots (and ``cap``), next to what was measured where something was."""

    run: str
    np: int
    cap: int | None
    concurrency: int
    table: pl.DataFrame  # TABLE_SCHEMA: one row per figure (and "time saved" with a cap)
    cuts: pl.DataFrame  # CUT_SCHEMA: the outputs the cap cuts
    busy: pl.DataFrame  # t_s, busy: predicted slots in use
    model: CostModel
    pool: list[str]
    left_out: dict[str, str]
    folds: pl.DataFrame
    sentences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fold_kind: str = "leave-one-np-out"  # how the bands' folds were made (``Planner.fold_kind``)

    def figure(self, name: str) -> dict[str, Any]:
        """The table's row of ``name`` (a FIGURES key or ``time_saved_s``)."""
        rows = self.table.filter(pl.col("figure") == _label(name)).to_dicts()
        if not rows:
            raise KeyError(name)
        return rows[0]


def _label(name: str) -> str:
    return {"time_saved_s": "time saved (s)"}.get(name, f"{FIGURE_NAMES.get(name, name)}"
                                                         f"{'' if name == 'gen_tok_per_s' else ' (s)'}")


def fmt_s(seconds: float | None) -> str:
    """A duration for a sentence: 4.2 s, 71 s, 4m10s, 1h02m."""
    if seconds is None or not np.isfinite(seconds):
        return "?"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        m, s = divmod(round(seconds), 60)
        return f"{m}m{s:02d}s"
    h, m = divmod(round(seconds / 60), 60)
    return f"{h}h{m:02d}m"


def band_row(p: Planner, figure: str, value: float, np_: int, measured: tuple[float | None, str | None],
             sane: predict.Sanity | None = None) -> dict[str, Any]:
    """One row of a prediction table: the value, its band from the folds, and the measured figure if any (``sane``:
    the value moved between its measured neighbours, the band reaching the model's own figure)."""
    rel, kind = p.band(figure, np_)
    if sane is not None:
        value = sane.value
    lo, hi = (max(value * (1 - rel), 0.0), value * (1 + rel)) if rel is not None else (None, None)
    if sane is not None:
        lo, hi = sane.band(lo, hi)
    return {"figure": _label(figure), "predicted": value, "low": lo, "high": hi,
            "band_pct": rel * 100 if rel is not None else None, "band": kind if rel is not None else "none",
            "measured": measured[0], "measured_run": measured[1]}


def _tokens(p: Planner, run: str) -> float:
    """The tokens ``run`` generated (its measured row's)."""
    facts = p.facts.filter(pl.col("run") == run)["gen_tokens"] if p.facts is not None else pl.Series([])
    return float(facts[0] or 0) if facts.len() else float(p.workload(run).jobs["gen_tokens"].fill_null(0).sum())


def measured_at(p: Planner, run: str, np_: int, figure: str) -> tuple[float | None, str | None]:
    """The figure measured on ``run`` itself when it ran at ``np_``, else on the healthy run of its setup that did
    whose workload is closest to its own (in tokens generated): never a broken run's."""
    cands = [run] if p.np_of(run) == np_ else []
    others = [r for r in p.measured_runs(np_) if r != run]
    cands += sorted(others, key=lambda r: (abs(_tokens(p, r) - _tokens(p, run)), r))
    for r in cands:
        v = p.measured.get(r, {}).get(figure)
        if v is not None:
            return float(v), r
    return None, None


def _cuts(store: Store, p: Planner, run: str, cap: int) -> pl.DataFrame:
    """The outputs ``cap`` cuts: the cap finding's rows (server requests with their class), else, for a run with
    records only, the attempts at or above the cap with no class."""
    from forensics import findings

    jobs = p.workload(run).jobs
    keys = ["instance", "slot", "task"]
    rows = findings.cap_cuts(store, run, cap)
    if rows.height:
        att = jobs.filter(pl.col("task").is_not_null()).select(*keys, "attempt").unique(keys)
        rows = rows.join(att, on=keys, how="left").with_columns(
            pl.when(pl.col("runaway")).then(pl.lit("runaway")).otherwise(pl.lit("normal")).alias("class"))
    elif jobs["task"].null_count() == jobs.height:
        rows = jobs.filter(pl.col("gen_tokens") >= cap).with_columns(pl.lit("unclassified").alias("class"))
    else:
        return pl.DataFrame(schema=CUT_SCHEMA)
    out = rows.with_columns((pl.col("gen_tokens") - cap).clip(lower_bound=0).alias("tokens_cut"))
    return out.select(list(CUT_SCHEMA)).cast(CUT_SCHEMA).sort("item", "stage", "attempt", nulls_last=True)  # type: ignore[arg-type]


RERUN_SETUP = ("build", "commit", "model", "n_ctx", "context_shift", "host", "stages")  # all but the caps


def _reruns(p: Planner, run: str) -> list[str]:
    """The runs of ``run``'s setup less its caps (a rerun with a cap measures another setup: its caps differ),
    at the same np, but ``run``."""
    from forensics import setups

    facts = setups.setups(p.store, None, columns=("run", "setup_key", "setup", "np", *RERUN_SETUP))
    if p.slots is not None:
        facts = facts.join(p.slots.group_by("run").agg(pl.col("n_slots").max()), on="run", how="left")
    mine = facts.filter(pl.col("run") == run)
    if mine.height == 0:
        return []
    same = facts.join(mine.select(*RERUN_SETUP), on=list(RERUN_SETUP), how="semi", nulls_equal=True)
    return sorted(r for r, n in same.select("run", "n_slots" if "n_slots" in same.columns else "np").iter_rows()
                  if r != run and (n or 0) == p.np_of(run))


def capped_rerun(p: Planner, run: str, cap: int) -> str | None:
    """A run of ``run``'s setup less its caps at the same np that sent the same items and stages and capped, at
    ``cap`` or less, every request ``run`` sent without a cap: the rerun with the cap, whose saving was measured."""
    def uncapped(jobs: pl.DataFrame) -> pl.DataFrame:
        return jobs.filter(pl.col("n_predict").fill_null(-1) <= 0).select("item", "stage").unique()

    mine = p.workload(run).jobs
    todo = uncapped(mine)
    if todo.height == 0 or todo["item"].null_count():
        return None
    pairs = set(mine.select("item", "stage").unique().iter_rows())
    for other in _reruns(p, run)[:RERUNS_READ]:
        w = p.workload(other)
        if w.np != p.np_of(run):
            continue
        if set(w.jobs.select("item", "stage").unique().iter_rows()) != pairs:
            continue
        there = w.jobs.join(todo, on=["item", "stage"], how="semi")["n_predict"]
        if there.len() and bool(((there.fill_null(-1) > 0) & (there.fill_null(-1) <= cap)).all()):
            if other not in p.measured:
                p.measured.update(predict.measured_figures(metrics.throughput(p.store, [other])))
            return other
    return None


RERUNS_READ = 20  # candidate reruns read at most (the setup less its caps, at the run's np)


def _saved(p: Planner, run: str, np_: int, with_cap: dict[str, float], without: dict[str, float],
           measured: float | None) -> dict[str, Any]:
    """Time saved by the cap: the run's duration (measured at this np when known, else predicted without the cap)
    times the relative saving the model predicts."""
    rel_saving = 1 - with_cap["run_s"] / without["run_s"] if without["run_s"] > 0 else 0.0
    base = measured if measured is not None else without["run_s"]
    saved = base * rel_saving
    row = band_row(p, "run_s", saved, np_, (None, None))
    if row["band_pct"] is not None:  # the run time's error, in seconds, is the saving's: a difference of two runs
        half = row["band_pct"] / 100 * base
        row.update(low=saved - half, high=saved + half, band_pct=half / saved * 100 if saved > 0 else None)
    row["figure"] = _label("time_saved_s")
    return row


def whatif(store: Store, run: str, *, np_: int | None = None, cap: int | None = None,
           concurrency: int | None = None, instance: str | None = None) -> WhatIf:
    """``run``'s workload at ``np_`` slots (default its own) and with output ``cap`` (default none), its harness
    at ``concurrency`` (default: its own, or following ``np_`` when it matched the run's np)."""
    _check_positive(np_=np_, cap=cap, concurrency=concurrency)
    return whatif_with(predict.planner(store, [run], instance=instance), run, np_=np_, cap=cap, concurrency=concurrency)


def whatif_all(store: Store, runs: list[str], *, np_: int | None = None, cap: int | None = None,
               concurrency: int | None = None, instance: str | None = None) -> list[WhatIf]:
    """``whatif`` of each of ``runs``, each through the planner of its own setup (runs of several setups are never
    refused: one planner per setup, shared by its runs); a setup the store cannot support raises its
    ``NotEnoughData``."""
    _check_positive(np_=np_, cap=cap, concurrency=concurrency)
    from forensics import runs as runs_mod

    out: dict[str, WhatIf] = {}
    for p in predict.each_setup(store, runs, instance=instance):
        if isinstance(p, predict.Unplanned):
            raise p.error
        for run in p.targets:
            out[run] = whatif_with(p, run, np_=np_, cap=cap, concurrency=concurrency)
    return [out[r] for r in runs_mod.resolve(store, runs).runs if r in out]


def _check_positive(**values: int | None) -> None:
    bad = [k.rstrip("_") for k, v in values.items() if v is not None and v < 1]
    if bad:
        raise InputError(f"{', '.join(bad)} must be 1 or more", hint="e.g. --np 4 --cap 1024")


def whatif_with(p: Planner, run: str, *, np_: int | None = None, cap: int | None = None,
                concurrency: int | None = None) -> WhatIf:
    """``whatif`` with a planner already built for ``run``."""
    _check_positive(np_=np_, cap=cap, concurrency=concurrency)
    name = store_run(p, run)
    w = p.workload(name)
    n = np_ or w.np
    pred, sim = p.predict(name, n, cap=cap, concurrency=concurrency)
    notes = list(p.notes) + list(w.notes)
    sane = _sanity(p, name, n, pred, notes) if cap is None and concurrency is None else {}
    rows = [band_row(p, f, pred[f], n, measured_at(p, name, n, f), sane.get(f)) for f in FIGURES]
    cuts = pl.DataFrame(schema=CUT_SCHEMA)
    if cap is not None:
        base, _ = p.predict(name, n, concurrency=concurrency)
        rows.append(_saved(p, name, n, pred, base, measured_at(p, name, n, "run_s")[0]))
        cuts = _cuts(p.store, p, name, cap)
        own = measured_at(p, name, n, "run_s")
        if own[1] == name:  # the run as it was measured, less what the cap saves: one account of its run time
            saved = rows[-1]
            run_s = own[0] - saved["predicted"]
            half = (saved["high"] - saved["predicted"]) if saved["high"] is not None else None
            rows[0].update(predicted=run_s, low=run_s - half if half is not None else None,
                           high=run_s + half if half is not None else None,
                           band_pct=half / run_s * 100 if half is not None and run_s > 0 else None)
        rerun = capped_rerun(p, name, cap) if n == w.np and concurrency is None else None
        if rerun is not None:
            rows[-1].update(_rerun_measured(p, name, rerun, notes))
    if n != w.np:
        notes += _speed_spread(p, name) + predict.solo_note(p.model, n)
    conc = concurrency or (n if w.harness.concurrency == w.np else w.harness.concurrency)
    res = WhatIf(name, n, cap, conc, pl.DataFrame(rows, schema=TABLE_SCHEMA, orient="row"), cuts, sim.busy,
                 p.model, p.pool, p.left_out, p.folds, notes=notes, fold_kind=p.fold_kind)
    res.sentences = sentences(res, w.np, sim)
    return res


def _sanity(p: Planner, run: str, np_: int, pred: dict[str, float], notes: list[str]) -> dict[str, predict.Sanity]:
    """The interpolation check (``predict.sanity``) of ``run`` at an np no healthy run measured, between two that
    did: only for a healthy run of the setup (another workload is not its neighbours')."""
    measured = p.measured_nps()
    if run not in p.healthy or np_ in measured:
        return {}
    below, above = [m for m in measured if m < np_], [m for m in measured if m > np_]
    if not below or not above:
        return {}
    a, b = below[-1], above[0]
    got, said = predict.sanity(np_, (a, b), pred, (p.predict(run, a)[0], p.predict(run, b)[0]),
                               (p.measured_at(a, p.measured_runs(a)), p.measured_at(b, p.measured_runs(b))))
    notes += said
    return {f: s for f, s in got.items() if s.adjusted}


SPREAD_NOTE = 1.25  # runs' speeds differing by more than this make a rerun elsewhere another question


def _speed_spread(p: Planner, run: str) -> list[str]:
    """A note when the pool's runs went at very different speeds: the prediction is for this run's conditions, and
    a rerun at another np on another day may differ by that much."""
    speeds = [p.speed(r)[0] for r in p.pool]
    lo, hi = min(speeds), max(speeds)
    if lo <= 0 or hi / lo <= SPREAD_NOTE:
        return []
    return [f"the pool's runs went at {lo:.2f}x to {hi:.2f}x the model's step times (the machine's load that day; "
            f"{run}: {p.speed(run)[0]:.2f}x): this is {run} at another np on its own day, and a rerun on another may "
            "differ by that much (`forensics recommend` carries that spread in its bands)"]


def _rerun_measured(p: Planner, run: str, rerun: str, notes: list[str]) -> dict[str, Any]:
    """The saving the rerun with the cap measured, and, in ``notes``, how fast it went against ``run`` (a rerun on a
    busier or quieter machine saves more or less than the cap alone)."""
    a, b = p.measured[run]["run_s"], p.measured[rerun]["run_s"]
    k = p.speed(rerun)[0] / p.speed(run)[0]
    if abs(k - 1) > 0.05:
        notes.append(f"{rerun} (the rerun with the cap) went at {k:.2f}x {run}'s step times (the machine's load): at "
                     f"{run}'s speed it would have taken about {b / k:.0f} s, a saving of {a - b / k:.0f} s "
                     f"against the {a - b:.0f} s measured")
    return {"measured": a - b, "measured_run": rerun}


def store_run(p: Planner, run: str) -> str:
    """The stored name of ``run`` (an alias resolves to it)."""
    from forensics import runs as runs_mod

    return runs_mod.resolve(p.store, [run]).runs[0]


def sentences(res: WhatIf, own_np: int, sim: simulate.Simulated) -> list[str]:
    """What the prediction says, in words: the figures with their bands, the cap's cuts and saving, what it rests on."""
    t = {r["figure"]: r for r in res.table.to_dicts()}

    def fig(name: str) -> str:
        r = t[_label(name)]
        band = f" ±{r['band_pct']:.0f} %" if r["band_pct"] is not None else " (no band)"
        return fmt_s(r["predicted"]) + band
    at = f"at np {res.np}" + (f" (it ran at np {own_np})" if res.np != own_np else "") + \
        (f" with output cap {res.cap}" if res.cap is not None else "")
    out = [f"{res.run} {at}: run time {fig('run_s')}, request latency p50 {fig('latency_p50_s')}, "
           f"p95 {fig('latency_p95_s')}, max {fig('latency_max_s')}; peak {int(cast(int, res.busy['busy'].max()) or 0)} "
           f"slots busy."]
    if res.cap is not None:
        out.append(cap_sentence(res))
    bands = sorted({r["band"] for r in res.table.to_dicts() if r["band"] != "none"})
    out.append(f"Model: {res.model.describe()}; bands: the largest error of {res.fold_kind} over "
               f"{len(res.folds['run'].unique())} runs ({', '.join(bands) or 'none'}).")
    return out


def cap_sentence(res: WhatIf) -> str:
    """Which outputs the cap cuts, by class and item, and the time it saves."""
    def named(df: pl.DataFrame) -> str:
        items = [f"{r['item'] or 'task ' + str(r['task'])}/{r['stage'] or '?'}" for r in df.to_dicts()]
        return ", ".join(dict.fromkeys(items))
    run_away = res.cuts.filter(pl.col("class") == "runaway")
    normal = res.cuts.filter(pl.col("class") == "normal")
    other = res.cuts.filter(~pl.col("class").is_in(["runaway", "normal"]))
    saved = res.figure("time_saved_s")
    band = f" ±{saved['band_pct']:.0f} %" if saved["band_pct"] is not None else ""
    parts = [f"{run_away.height} runaway(s)" + (f" ({named(run_away)})" if run_away.height else ""),
             f"{normal.height} normal response(s)" + (f" ({named(normal)})" if normal.height else "")]
    if other.height:
        parts.append(f"{other.height} output(s) of unknown class ({named(other)})")
    return (f"Cap {res.cap} cuts " + ", ".join(parts) + f"; it saves {fmt_s(saved['predicted'])}{band} of run time.")

"""``recommend``: which np (and which output cap) meets the smoke budgets, from runs already recorded.

One answer per setup (``recommend_all``; ``recommend`` for runs of one).  For every candidate np (by default the
powers of two up to ``EXTRAPOLATE`` times the widest np measured, and every np measured): the measured figures when
a healthy run of the setup ran there (the median of its healthy runs there; never a run whose outputs ran away; and
the cap, if one is asked for, would not have changed it), else the prediction: the median of a sample of the
setup's healthy workloads each replayed at that np (``predict.Planner``), with a band from the lower to the upper
quartile of those replays (how much the runs' own workloads differ), widened by the model's leave-one-np-out error;
between two measured np a prediction never beats both unless the model's own curve peaks there
(``predict.sanity``).  Each budget is checked as ``smoke`` checks it (run time: the manifest's
duration else the wall time; request: the longest request; p95) and, for a prediction, against the band too:
``pass`` (even the band's upper edge holds), ``likely pass`` (the prediction holds, its band's edge does not),
``likely fail``, ``fail``.  The recommendation is the np with the highest throughput whose every budget passes or
likely passes, throughput ranked as the model has it at the sweep's typical speed (``ranked_tok_per_s``: on a
shared machine a run on a quiet moment would otherwise win by luck), an extrapolated np only when no measured or
interpolated one meets the budgets, one beyond ``EXTRAPOLATE`` times the widest never; how sure it is says which
budgets hold only inside the band.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from forensics import runs as runs_mod
from forensics.errors import InputError
from forensics.planning import predict
from forensics.planning.predict import Planner
from forensics.planning.what_if import fmt_s
from forensics.store import Store

# budget name -> (the figure it checks, its words in a sentence)
BUDGETS = {"run": ("run_s", "run time"), "request": ("latency_max_s", "request latency"),
           "p95": ("latency_p95_s", "p95 latency")}
VERDICTS = ("pass", "likely pass", "likely fail", "fail")
MAX_NP = 512


def parse_np_range(text: str) -> list[int]:
    """Candidate np from "1-16", "1,2,4,8", "4" or "2-8,16"."""
    out: set[int] = set()
    for part in str(text).replace(" ", "").split(","):
        lo, sep, hi = part.partition("-")
        try:
            a, b = (int(lo), int(hi)) if sep else (int(lo), int(lo))
        except ValueError:
            raise InputError(f"cannot read np range {text!r}", hint='write e.g. "1-16" or "1,2,4,8"') from None
        if a < 1 or b < a or b > MAX_NP:
            raise InputError(f"np range {part!r} is not 1 ≤ low ≤ high ≤ {MAX_NP}", hint='write e.g. "1-16"')
        out.update(range(a, b + 1))
    return sorted(out)


EXTRAPOLATE = 2  # candidates reach at most this many times the widest np measured


def default_candidates(measured: list[int], top: int | None = None) -> list[int]:
    """The np worth predicting when none are asked for: the powers of two (what smoke tests try) up to ``top``
    (default: ``EXTRAPOLATE`` times the widest np measured, at least 2) and every np measured."""
    top = top if top is not None else max(EXTRAPOLATE * max(measured, default=1), 2)
    return sorted({*(2 ** k for k in range(top.bit_length()) if 2 ** k <= top), *measured})


def np_kind(np_: int, measured: list[int], fitted: list[int]) -> str:
    """``measured`` (a healthy run ran there), ``interpolated`` (between the np the model was fitted on),
    ``extrapolated`` (outside them, up to ``EXTRAPOLATE`` times the widest) or ``beyond`` (further: shown, never
    recommended)."""
    if np_ in measured:
        return "measured"
    if fitted and fitted[0] <= np_ <= fitted[-1]:
        return "interpolated"
    return "extrapolated" if np_ <= EXTRAPOLATE * max(fitted or measured or [1]) else "beyond"


def check(value: float | None, low: float | None, high: float | None, limit: float) -> str:
    """One budget's verdict for a value with its band (``low``/``high`` None: a measurement, exact)."""
    if value is None:
        return "fail"  # a budget that cannot be measured fails, as in smoke
    if high is None or low is None:
        return "pass" if value <= limit else "fail"
    if high <= limit:
        return "pass"
    if value <= limit:
        return "likely pass"
    return "likely fail" if low <= limit else "fail"


@dataclass
class Recommendation:
    """The decision table (one row per candidate np), the curve behind the chart, and the answer in words."""

    table: pl.DataFrame
    curve: pl.DataFrame  # np, figure, predicted, low, high, measured (the chart's data)
    np: int | None  # the recommended np; None when no candidate meets the budgets
    cap: int | None
    budgets: dict[str, float]
    rests_on: tuple[str, ...]  # the runs the model was fitted on
    sentence: str
    details: list[str] = field(default_factory=list)  # why the other candidates fail
    notes: list[str] = field(default_factory=list)
    setup: str = ""  # the setup the answer is for (its label)
    left_out: dict[str, str] = field(default_factory=dict)  # the setup's runs left out as broken, with why
    error: str | None = None  # the one line that says what to record, when this setup cannot be predicted


@dataclass(frozen=True)
class Budgets:
    """The smoke budgets in seconds (None: not checked)."""

    run: float | None = None
    request: float | None = None
    p95: float | None = None

    def given(self) -> dict[str, float]:
        out = {k: v for k, v in (("run", self.run), ("request", self.request), ("p95", self.p95)) if v is not None}
        if not out:
            raise InputError("no budget given", hint="pass --max-run, --max-request and/or --max-p95")
        return out


def _measured_at(p: Planner, np_: int, cap: int | None, cut: dict[str, int]) -> list[str]:
    """The setup's healthy runs measured at ``np_`` that the cap would not have changed (never a broken run: a
    runaway's longest request is not the setup's)."""
    return [r for r in p.measured_runs(np_) if cap is None or cut.get(r, 0) == 0]


Prediction = dict[str, tuple[float, float, float]]


def _predicted(p: Planner, np_: int, sources: list[str], cap: int | None) -> Prediction:
    """Each figure at ``np_`` over the sweep's workloads replayed there: (median, lower quartile, upper quartile).
    The quartiles say how much the runs' own workloads differ, a band a prediction from other runs must carry
    (the quartiles, not the extremes: one run's runaway should not swamp the rest)."""
    preds = [p.predict(r, np_, cap=cap)[0] for r in sources]
    return {fig: tuple(float(np.percentile([v[fig] for v in preds], q)) for q in (50, 25, 75))  # type: ignore[misc]
            for fig in predict.FIGURES}


def runs_text(runs: list[str], limit: int = 4, *, last: str = " and ") -> str:
    """Runs in words: "a", "a and b", "a, b and c", the first ``limit`` then how many more."""
    if len(runs) > limit:
        return ", ".join(runs[:limit]) + f"{last}{len(runs) - limit} more"
    return ", ".join(runs[:-1]) + last + runs[-1] if len(runs) > 1 else "".join(runs)


def _row(p: Planner, np_: int, pred: Prediction, sources: list[str], measured: list[str],
         sane: dict[str, predict.Sanity]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The candidate's figures (measured, else predicted with bands) and its points of the curve."""
    row: dict[str, Any] = {"np": np_, "basis": "measured" if measured else "predicted",
                           "from_runs": runs_text(measured or sources, last=", ")}
    meas = p.measured_at(np_, measured) if measured else {}
    curve = []
    for fig in predict.FIGURES:
        rel, _ = p.band(fig, np_)
        mid, q1, q3 = pred[fig]
        lo, hi = (max(q1 * (1 - rel), 0.0), q3 * (1 + rel)) if rel is not None else (None, None)
        if fig in sane:
            mid, (lo, hi) = sane[fig].value, sane[fig].band(lo, hi)
        m_val = meas.get(fig)
        curve.append({"np": np_, "figure": fig, "predicted": mid, "low": lo, "high": hi, "measured": m_val})
        if measured:
            row[fig], row[f"{fig}_low"], row[f"{fig}_high"] = m_val, None, None
        else:
            row[fig], row[f"{fig}_low"], row[f"{fig}_high"] = mid, lo, hi
    return row, curve


def _verdicts(row: dict[str, Any], budgets: dict[str, float]) -> dict[str, Any]:
    for name, limit in budgets.items():
        fig = BUDGETS[name][0]
        row[f"{name}_verdict"] = check(row[fig], row[f"{fig}_low"], row[f"{fig}_high"], limit)
    worst = max((VERDICTS.index(row[f"{n}_verdict"]) for n in budgets), default=0)
    row["verdict"] = VERDICTS[worst]
    return row


TABLE_COLUMNS = ("np", "basis", "kind", "from_runs", "run_s", "run_s_low", "run_s_high", "latency_max_s", "latency_max_s_low",
                 "latency_max_s_high", "latency_p95_s", "latency_p95_s_low", "latency_p95_s_high", "latency_p50_s",
                 "gen_tok_per_s", "ranked_tok_per_s")


def _cap_of(store: Store, runs: list[str], cap: int | str | None) -> tuple[int | None, list[str]]:
    """The cap to predict with: a number, ``auto`` (the cap finding's recommendation for the runs), or none."""
    if cap is None or cap == "none":
        return None, []
    if cap != "auto":
        try:
            value = int(cap)
        except ValueError:
            raise InputError(f"cannot read cap {cap!r}", hint="pass --cap auto, --cap none or a number of tokens") \
                from None
        if value < 1:
            raise InputError(f"cap {value} is not positive", hint="pass --cap auto or a number of tokens")
        return value, []
    from forensics import findings

    res = findings.recommend_cap(store, runs)
    if res.cap is None:
        return None, ["--cap auto: " + "; ".join(res.warnings or ["no normal response to choose a cap from"])]
    return res.cap, []


def recommend(store: Store, runs: list[str] | None, budgets: Budgets, *, np_range: list[int] | None = None,
              cap: int | str | None = None, instance: str | None = None) -> Recommendation:
    """The np (and cap) that meets ``budgets``, for the sweep of ``runs`` (default: every run of the store), all of
    one setup (``recommend_all`` gives one answer per setup)."""
    budgets.given()
    targets = runs_mod.resolve(store, runs).runs
    return recommend_with(predict.planner(store, targets, instance=instance), targets, budgets, np_range=np_range,
                          cap=cap)


def recommend_all(store: Store, runs: list[str] | None, budgets: Budgets, *, np_range: list[int] | None = None,
                  cap: int | str | None = None, instance: str | None = None) -> list[Recommendation]:
    """One recommendation per setup of ``runs`` (``setups.groups``; default: every run of the store), each saying
    which runs it rests on; a setup the store cannot support gets one whose ``error`` says what to record.  Raises
    the ``NotEnoughData`` of the only setup when no setup can be predicted at all."""
    budgets.given()
    targets = runs_mod.resolve(store, runs).runs
    found = predict.planners(store, runs or None, instance=instance)
    planned = [p for p in found if isinstance(p, Planner)]
    if not planned:
        raise next(p.error for p in found if isinstance(p, predict.Unplanned))
    out = []
    for p in found:
        if isinstance(p, Planner):
            out.append(recommend_with(p, [t for t in targets if t in p.targets], budgets, np_range=np_range, cap=cap))
        else:
            out.append(Recommendation(pl.DataFrame(), pl.DataFrame(), None, None, budgets.given(), (), "",
                                      setup=p.setup, error=p.error.one_line()))
    return out


def recommend_with(p: Planner, targets: list[str], budgets: Budgets, *, np_range: list[int] | None = None,
                   cap: int | str | None = None) -> Recommendation:
    """``recommend`` with a planner already built for ``targets``."""
    limits = budgets.given()
    store = p.store
    sources = p.sources([t for t in targets if t in p.runs] or None)
    cap_value, notes = _cap_of(store, sources, cap)
    cut = _cut_counts(store, p.healthy, cap_value)
    measured = sorted({n for n in p.measured_nps() if _measured_at(p, n, cap_value, cut)})
    fitted = sorted(set(p.model.nps))
    cands = np_range or default_candidates(sorted({*measured, *fitted}))
    if len(fitted) == 1:  # a model of one np predicts that np only: the others are said, not refused
        other = [n for n in cands if n != fitted[0]]
        cands = [n for n in cands if n == fitted[0]]
        if other:
            notes.append(f"np {', '.join(str(n) for n in other)} not predicted: only np {fitted[0]} has timed runs "
                         f"({', '.join(p.model.runs)}), and the cost of an extra slot cannot be told from one np; "
                         "record the same workload at another np as well")
    preds: dict[int, Prediction] = {}

    def pred_at(n: int) -> Prediction:
        if n not in preds:
            preds[n] = _predicted(p, n, sources, cap_value)
        return preds[n]
    rows, curve = [], []
    typical = _typical_speed(p, sources)
    for n in cands:
        meas = _measured_at(p, n, cap_value, cut)
        sane = {} if meas else _sanity(p, n, pred_at, measured, lambda m: _measured_at(p, m, cap_value, cut), notes)
        row, pts = _row(p, n, pred_at(n), sources, meas, sane)
        row["kind"] = np_kind(n, [n] if meas else [], fitted)
        ranked = _ranked_throughput(p, n, sources, cap_value, typical)
        tput = sane.get("gen_tok_per_s")
        row["ranked_tok_per_s"] = ranked * tput.factor if tput is not None else ranked
        rows.append(_verdicts(row, limits))
        curve += pts
    table = pl.DataFrame(rows, infer_schema_length=None)
    best = _best(table)
    table = table.with_columns((pl.col("np") == (best if best is not None else -1)).alias("recommended"))
    cols = [*TABLE_COLUMNS, *[f"{n}_verdict" for n in limits], "verdict", "recommended"]
    unrun = [n for n in cands if not _measured_at(p, n, cap_value, cut)]
    notes += [note for n in unrun for note in predict.solo_note(p.model, n)]
    notes += [f"np {n} is beyond {EXTRAPOLATE}x the widest np measured ({max(fitted)}): shown, never recommended"
              for n in cands if row_kind(table, n) == "beyond"]
    rec = Recommendation(table.select(cols), pl.DataFrame(curve, infer_schema_length=None), best, cap_value, limits,
                         p.model.runs, "", notes=[*pool_notes(p), *p.notes, *notes], setup=p.setup,
                         left_out=dict(p.left_out))
    rec.sentence, rec.details = _words(rec, p, sources)
    return rec


NAMED = 3  # runs named one by one, with why, in a note; beyond, a count and the first few


def pool_notes(p: Planner) -> list[str]:
    """Which runs of the setup the answer leaves out of what, and why: runs whose outputs ran away teach the model
    (their tokens still time the server) but no measured figure; broken runs neither."""
    out = []
    if 0 < len(p.runaway) <= NAMED:
        out += [f"{r} teaches the model but no measured figure: {why}" for r, why in p.runaway.items()]
    elif p.runaway:
        out.append(f"{len(p.runaway)} runs whose outputs ran away teach the model but no measured figure: "
                   f"{runs_text(list(p.runaway))} (`forensics runaways` lists them)")
    if 0 < len(p.left_out) <= NAMED:
        out += [f"left out {r} (it measures a broken server): {why}" for r, why in p.left_out.items()]
    elif p.left_out:
        out.append(f"left out {len(p.left_out)} runs that measure a broken server: {runs_text(list(p.left_out))} "
                   "(`forensics verdict` says why)")
    return out


def recommendations_table(recs: list[Recommendation]) -> pl.DataFrame:
    """One table of every setup's candidates, the setup first."""
    frames = [r.table.select(pl.lit(r.setup).alias("setup"), pl.all()) for r in recs if r.table.height]
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame({"setup": []}, schema={"setup": pl.String})


def recommendations_words(recs: list[Recommendation]) -> list[str]:
    """The answers in words, for stderr: each setup's notes, its sentence and why the other candidates fail; with
    several setups every line says which setup it is about."""
    out = []
    for r in recs:
        tag = f"setup {r.setup}: " if len(recs) > 1 else ""
        if r.error is not None:
            out.append(f"{tag}no prediction: {r.error}")
            continue
        out += [f"note: {tag}{n}" for n in r.notes]
        out += [f"{tag}{r.sentence}", *(f"{tag}{d}" for d in r.details)]
    return out


def row_kind(table: pl.DataFrame, np_: int) -> str | None:
    got = table.filter(pl.col("np") == np_)["kind"]
    return str(got[0]) if got.len() else None


def _sanity(p: Planner, np_: int, pred_at: Callable[[int], Prediction], measured: list[int],
            runs_at: Callable[[int], list[str]], notes: list[str]) -> dict[str, predict.Sanity]:
    """The interpolation check (``predict.sanity``) of a candidate between two measured np: its figures against the
    measured neighbours' (the median of their healthy runs) and the model's own figures there."""
    below, above = [m for m in measured if m < np_], [m for m in measured if m > np_]
    if not below or not above:
        return {}
    a, b = below[-1], above[0]
    ma, mb = p.measured_at(a, runs_at(a)), p.measured_at(b, runs_at(b))
    got, said = predict.sanity(np_, (a, b), {f: v[0] for f, v in pred_at(np_).items()},
                               ({f: v[0] for f, v in pred_at(a).items()}, {f: v[0] for f, v in pred_at(b).items()}),
                               (ma, mb))
    notes += said
    return {f: s for f, s in got.items() if s.adjusted}


def _cut_counts(store: Store, runs: list[str], cap: int | None) -> dict[str, int]:
    """How many outputs ``cap`` cuts in each run (a measured run the cap changes is predicted, not measured)."""
    if cap is None:
        return {}
    from forensics import findings

    cuts = findings.cap_cuts(store, runs, cap)
    return dict(cuts.group_by("run").len().iter_rows())


def _typical_speed(p: Planner, sweep: list[str]) -> tuple[float, float]:
    """The median speed of the sweep's runs (``Planner.speed``): the machine as it usually was."""
    speeds = [p.speed(r) for r in sweep]
    return float(np.median([k[0] for k in speeds])), float(np.median([k[1] for k in speeds]))


def _ranked_throughput(p: Planner, np_: int, sweep: list[str], cap: int | None,
                       speed: tuple[float, float]) -> float:
    """The throughput that ranks the candidates: the model's, from the nearest run's workload, at the sweep's
    typical speed for every np, so a run that went fast on a quiet moment does not win by luck."""
    from forensics.planning import costmodel, simulate

    src = p.source_for(np_, among=sweep)
    w = p.workload(src)
    sim = simulate.simulate(w, costmodel.scaled(p.model, *speed), slots=np_, cap=cap)
    return predict.figures(sim, w)["gen_tok_per_s"]


def _best(table: pl.DataFrame) -> int | None:
    """The candidate with the highest ranked throughput whose every budget passes or likely passes: a measured or
    interpolated one when any meets the budgets, an extrapolated one only when none does, never one beyond."""
    ok = table.filter(pl.col("verdict").is_in(["pass", "likely pass"]) & (pl.col("kind") != "beyond"))
    inside = ok.filter(pl.col("kind") != "extrapolated")
    ok = inside if inside.height else ok
    if ok.height == 0:
        return None
    return int(ok.sort(["ranked_tok_per_s", "np"], descending=[True, False], nulls_last=True)["np"][0])


def _fails(row: dict[str, Any], budgets: dict[str, float]) -> list[str]:
    out = []
    for name, limit in budgets.items():
        v = row[f"{name}_verdict"]
        if v in ("fail", "likely fail"):
            fig = BUDGETS[name][0]
            out.append(f"{BUDGETS[name][1]} ({fmt_s(row[fig])} > {fmt_s(limit)}"
                       + (", within its band" if v == "likely fail" else "") + ")")
    return out


def _words(rec: Recommendation, p: Planner, sweep: list[str]) -> tuple[str, list[str]]:
    """The recommendation in one sentence, and one line per candidate that fails."""
    rows = {r["np"]: r for r in rec.table.to_dicts()}
    details = [f"np {n} fails on " + "; ".join(_fails(r, rec.budgets)) for n, r in rows.items()
               if r["verdict"] in ("fail", "likely fail")]
    cap = f" with output cap {rec.cap}" if rec.cap is not None else ""
    rests = f"a model fitted on {', '.join(p.model.runs)}"
    if rec.np is None:
        which = f"np {min(rows)} does not meet" if len(rows) == 1 else f"No np in {min(rows)}–{max(rows)} meets"
        return (f"{which} every budget{cap} ({rests}).", details)
    r = rows[rec.np]
    figs = ", ".join(f"{BUDGETS[n][1]} {fmt_s(r[BUDGETS[n][0]])}" + _range(r, BUDGETS[n][0])
                     + f" against {fmt_s(lim)}" for n, lim in rec.budgets.items())
    shaky = [BUDGETS[n][1] for n in rec.budgets if r[f"{n}_verdict"] == "likely pass"]
    sure = ("" if r["basis"] == "measured" else
            "; every budget holds even at its band's edge" if not shaky else
            f"; {' and '.join(shaky)} {'holds' if len(shaky) == 1 else 'hold'} only inside the band")
    srcs = runs_text(sweep)
    basis = (f"measured on {r['from_runs']}" if r["basis"] == "measured" else
             f"predicted from {srcs}'s workload" if len(sweep) == 1 else
             f"predicted: the median of {srcs}'s workloads")
    if r["kind"] == "extrapolated":
        basis = "not measured, extrapolated: " + basis
    return (f"Recommended np {rec.np}{cap} ({basis}: {figs}{sure}), from {rests}.", details)


def _range(row: dict[str, Any], fig: str) -> str:
    """" (low–high)" of a predicted figure's band; nothing for a measured one."""
    lo, hi = row[f"{fig}_low"], row[f"{fig}_high"]
    return f" ({fmt_s(lo)}–{fmt_s(hi)})" if lo is not None and hi is not None else ""


BUDGET_KEYS = {"run": "max_run_s", "request": "max_request_s", "p95": "max_p95_s"}


def run_budgets(store: Store, run: str) -> dict[str, float]:
    """The budgets in ``run``'s manifest (config.budgets), in seconds."""
    con = store.connect(tables=["runs"])
    try:
        row = con.execute("SELECT any_value(config) FROM runs WHERE run = ?", [run]).fetchone()
    finally:
        con.close()
    try:
        budgets: Any = (json.loads(row[0]) if row and row[0] else {}).get("budgets") or {}
    except (ValueError, AttributeError):
        return {}
    out = {}
    for name, key in BUDGET_KEYS.items():
        v = budgets.get(key) if isinstance(budgets, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            out[name] = float(v)
    return out

"""Predictions with their error: the runs a prediction rests on, the fitted model, and how well it predicted each
of those runs when that run was left out.

``planner`` gathers the pool (the store's healthy runs of the targets' setup: ``setups.groups``, so a dead slot, a
crash or a killed run never teaches the model, and runs of another build, model or context never mix), reads each run's workload once, fits
the cost model on all of them, and runs leave-one-run-out: for each run, fit on the others and predict the run
from its own workload, at its own speed (``Planner.speed``: how fast its requests went against the model, the
machine's load that day).  A prediction's band is the largest relative error of those folds, per figure, taken from
the folds of the same kind: *interpolated* (the np lies between the remaining runs' np) or *extrapolated*.  The band
is the model's error for a given workload; a run whose outputs differ (a runaway the others did not have) differs
by that on top.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath

import numpy as np
import polars as pl

from forensics import metrics
from forensics import runs as runs_mod
from forensics.errors import InputError
from forensics.planning import costmodel, simulate, workload
from forensics.planning.costmodel import CostModel, NotEnoughData
from forensics.planning.workload import Workload
from forensics.store import Store

# The figures predicted for a run, named as in ``metrics.throughput`` (run_s: the run's duration as smoke reads it).
FIGURES = ("run_s", "latency_p50_s", "latency_p95_s", "latency_max_s", "gen_tok_per_s")
REPLAYS = 9  # noisy replays per prediction (seeds 0..8: the same answer every time)
FIGURE_NAMES = {"run_s": "run time", "latency_p50_s": "latency p50", "latency_p95_s": "latency p95",
                "latency_max_s": "latency max", "gen_tok_per_s": "throughput (generated tokens/s)"}


def figures(sim: simulate.Simulated, w: Workload) -> dict[str, float]:
    """The run's figures from a simulation, defined as ``metrics.throughput`` defines them for a measured run."""
    lat = sim.latency[~np.isnan(sim.latency)]
    wall = sim.wall_s
    pct = (lambda q: float(np.percentile(lat, q))) if lat.size else (lambda q: float("nan"))
    return {"run_s": wall + w.run_extra_s, "latency_p50_s": pct(50), "latency_p95_s": pct(95),
            "latency_max_s": float(lat.max()) if lat.size else float("nan"),
            "gen_tok_per_s": float(np.sum(sim.gen_tokens)) / wall if wall > 0 else float("nan"),
            "wall_s": wall}


def measured_figures(m: pl.DataFrame) -> dict[str, dict[str, float]]:
    """Each run's measured figures from ``metrics.throughput`` rows (run time: the manifest's, else the wall time)."""
    out = {}
    for row in m.iter_rows(named=True):
        run_s = row["run_s"] if row["run_s"] is not None else row["wall_s"]
        out[row["run"]] = {"run_s": run_s, **{k: row[k] for k in FIGURES if k != "run_s"}}
    return out


def model_key(slots: pl.DataFrame, run: str) -> str | None:
    """The model that served ``run`` (the file's name without directory or .gguf, lower case) and the llama.cpp
    build when logged: runs of one model on one build share a cost model."""
    mine = slots.filter(pl.col("run") == run)
    names = [m for m in mine["model"].to_list() + mine["run_model"].to_list() if m]
    builds = sorted({int(b) for b in mine["build"].drop_nulls().to_list() if b})
    if not names:
        return None
    name = PurePosixPath(str(names[0]).replace("\\", "/")).name.lower().removesuffix(".gguf")
    return name + (f" (build {builds[0]})" if builds else "")


@dataclass
class Planner:
    """Everything a prediction needs, read once: the pool, its workloads and measured figures, the model, the
    leave-one-run-out folds."""

    store: Store
    pool: list[str]
    basis: str
    left_out: dict[str, str]
    workloads: dict[str, Workload]
    measured: dict[str, dict[str, float]]
    model: CostModel
    folds: pl.DataFrame  # run, np, kind, figure, measured, predicted, error
    sweeps: dict[str, list[str]] = field(default_factory=dict)  # run -> the runs of its sweep
    notes: list[str] = field(default_factory=list)
    _speeds: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)

    def band(self, figure: str, np_: int) -> tuple[float | None, str]:
        """(relative half-width, kind) of the error band of ``figure`` predicted at ``np_``.  Interpolated (``np_``
        within the pool's np): the largest relative error of every fold, since an extrapolated fold errs at least
        as much as an interpolated one would.  Extrapolated: the largest of the extrapolated folds (else of any)."""
        nps = sorted({w.np for r, w in self.workloads.items() if r in self.pool})
        kind = "interpolated" if nps and nps[0] <= np_ <= nps[-1] else "extrapolated"
        f = self.folds.filter(pl.col("figure") == figure)
        same = f.filter(pl.col("kind") == "extrapolated") if kind == "extrapolated" else f
        use = same if same.height else f
        if use.height == 0:
            return None, kind
        return float(use["error"].abs().max()), kind  # type: ignore[arg-type]

    def predict(self, run: str, np_: int, *, cap: int | None = None, concurrency: int | None = None,
                model: CostModel | None = None) -> tuple[dict[str, float], simulate.Simulated]:
        """The figures of ``run``'s workload replayed at ``np_`` slots (and ``cap``): each the median of ``REPLAYS``
        replays with the runs' own noise (a future run is one draw of it), and the replay without noise."""
        w, base = self.workloads[run], model or self.model
        err = costmodel.one_np_only(base, np_)
        if err is not None:
            raise err
        m = costmodel.scaled(base, *self.speed(run, base))
        plain = simulate.simulate(w, m, slots=np_, concurrency=concurrency, cap=cap)
        if not m.decode_noise:
            return figures(plain, w), plain
        draws = [figures(simulate.simulate(w, m, slots=np_, concurrency=concurrency, cap=cap, seed=k), w)
                 for k in range(REPLAYS)]
        return {f: float(np.median([d[f] for d in draws])) for f in draws[0]}, plain

    def speed(self, run: str, model: CostModel | None = None) -> tuple[float, float]:
        """How fast ``run`` went against the model (``costmodel.run_speed``: decode, prefill): a replay of the run is
        at its own speed, the machine's conditions that day, which no other run can tell."""
        m = model or self.model
        key = (run, id(m))
        if key not in self._speeds:
            self._speeds[key] = costmodel.speed_of(m, self.workloads[run])
        return self._speeds[key]

    def source_for(self, np_: int, among: list[str] | None = None, like: str | None = None) -> str:
        """The run whose workload predicts ``np_``: of ``among`` (default the pool), those of ``like``'s sweep when
        given, the nearest in np (the larger on a tie)."""
        cands = among if among is not None else self.pool
        if like is not None:
            same = [r for r in cands if r in self.sweeps.get(like, [])]
            cands = same or cands
        return min(cands, key=lambda r: (abs(self.workloads[r].np - np_), -self.workloads[r].np, r))


def solo_note(model: CostModel, np_: int) -> list[str]:
    """A note for a prediction at np 1 from a model that saw no run at np 1: one sequence decoding alone runs other
    kernels than a batch (on the quiet real CPU sweep a step alone took 4.3 ms, a batch of two about 10 ms: np 2
    was slower than np 1), and runs at np 2 or more hardly ever decode alone, so the fit cannot price that step
    and the band, from runs that share the gap, does not cover it."""
    if np_ != 1 or not model.nps or min(model.nps) <= 1:
        return []
    return [f"np 1 was never run (the model saw np {', '.join(str(n) for n in model.nps)}): one sequence decoding "
            "alone runs other kernels than a batch and may be much faster or slower per step than the model has "
            "it, which its band does not cover; record a run at np 1 to predict it"]


def _pool(store: Store, targets: list[str]) -> tuple[list[str], str, dict[str, str]]:
    """The healthy runs of the targets' setup (``setups.groups``: the one rule of comparable runs), runaways kept:
    the model costs every token a request generated, so a run whose outputs ran away still times the server."""
    from forensics.setups import groups

    found = groups(store, targets, keep=("runaway",))
    if len(found) != 1:
        raise InputError("the runs named measured different setups: " + "; ".join(g.label for g in found),
                         hint="name runs of one setup: `forensics throughput --by np` lists them per setup")
    g = found[0]
    return g.runs, f"the healthy runs of setup {g.label}", g.left_out


def _np(slots: pl.DataFrame, run: str) -> int | None:
    mine = slots.filter(pl.col("run") == run)
    n = mine["n_slots"].drop_nulls()
    c = mine["concurrency"].drop_nulls()
    return int(n.max()) if n.len() else int(c.max()) if c.len() else None  # type: ignore[arg-type]


def planner(store: Store, runs: list[str], *, instance: str | None = None) -> Planner:
    """The planner for ``runs`` (the targets of a prediction): the pool, workloads, fit and folds."""
    targets = runs_mod.resolve(store, runs).runs
    slots = workload.run_slots(store, runs_mod.all_runs(store))
    pool, basis, left_out = _pool(store, targets)
    wanted = list(dict.fromkeys([*pool, *targets]))
    rows = workload.requests_frame(store, wanted)
    loads = {r: workload.read_workload(store, r, instance=instance if r in targets else None, rows=rows, slots=slots)
             for r in wanted}
    try:
        model = costmodel.fit([loads[r] for r in pool])
    except NotEnoughData as exc:
        if left_out:
            exc.message += " (left out as broken: " + ", ".join(left_out) + ")"
        raise
    m = metrics.throughput(store, wanted)
    sweeps: dict[str, list[str]] = {r: list(pool) for r in pool}  # the pool is one setup: one sweep
    p = Planner(store, pool, basis, left_out, loads, measured_figures(m), model, _empty_folds(), sweeps)
    p.folds = leave_one_out(p)
    if p.folds.height == 0:
        p.notes.append("no error band: leaving any run out leaves too few timed runs to fit on; record the "
                       "workload again (at another np, it also lets other np be predicted)")
    return p


FOLD_SCHEMA = {"run": pl.String, "np": pl.Int64, "kind": pl.String, "speed": pl.Float64, "figure": pl.String,
               "measured": pl.Float64, "predicted": pl.Float64, "error": pl.Float64}


def _empty_folds() -> pl.DataFrame:
    return pl.DataFrame(schema=FOLD_SCHEMA)


def leave_one_out(p: Planner) -> pl.DataFrame:
    """One row per pooled run and figure: the run's own workload predicted by a model fitted without it, at the
    run's own speed (``speed``: its decode steps' time against that model's: the machine's load), and the relative
    error (predicted / measured - 1)."""
    rows = []
    for run in p.pool:
        others = [r for r in p.pool if r != run]
        try:
            model = costmodel.fit([p.workloads[r] for r in others])
        except NotEnoughData:
            continue
        np_ = p.workloads[run].np
        if costmodel.one_np_only(model, np_) is not None:
            continue
        pred, _ = p.predict(run, np_, model=model)
        rest = sorted({p.workloads[r].np for r in others})
        kind = "interpolated" if rest[0] <= np_ <= rest[-1] else "extrapolated"
        for fig in FIGURES:
            meas = p.measured.get(run, {}).get(fig)
            if meas is None or not meas or np.isnan(pred[fig]):
                continue
            rows.append({"run": run, "np": np_, "kind": kind, "speed": round(p.speed(run, model)[0], 3),
                         "figure": fig, "measured": meas, "predicted": pred[fig], "error": pred[fig] / meas - 1})
    return pl.DataFrame(rows, schema=FOLD_SCHEMA, orient="row")

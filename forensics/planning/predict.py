"""Predictions with their error: the runs a prediction rests on, the fitted model, and how well it predicted each
np when that np was left out.

``planners`` gathers the pools, one per setup of the runs asked about (``setups.groups``: a dead slot, a crash or a
killed run never teaches the model, runs of another build, model or context never mix, and runs of several setups
get one planner each, never a refusal).  A run whose outputs ran away still times the server, so it may teach the
cost model; measured figures come from the setup's **healthy** runs only (``Planner.healthy``).

The cost does not grow with the number of runs: of each np, at most ``SAMPLE_PER_NP`` runs are read, fitted and
replayed, the most representative ones (``sample``: healthy first, then the closest to that np's median requests,
generated and prompt tokens, then by name: the same runs every time).  The errors are leave-one-np-out
(``folds``): for each np, fit on the other np and predict that np's sampled runs from their own workloads, at their
own speed (``Planner.speed``: how fast its requests went against the model, the machine's load that day); one fit
per np (with runs of one or two np only, one fit per sampled run).  A prediction's band is the largest relative
error of those folds, per figure, taken from the folds of the same kind: *interpolated* (the np lies between the
remaining np) or *extrapolated*.  The band is the model's error for a given workload; a run whose outputs differ (a
runaway the others did not have) differs by that on top.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from forensics import metrics
from forensics import runs as runs_mod
from forensics.errors import InputError
from forensics.planning import costmodel, simulate, workload
from forensics.planning.costmodel import CostModel, NotEnoughData
from forensics.planning.workload import Workload
from forensics.store import Store

if TYPE_CHECKING:
    from forensics.setups import SetupGroup

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


SAMPLE_PER_NP = 3  # runs of each np a planner reads, fits on and replays (the most representative: ``sample``)


@dataclass
class Planner:
    """Everything a prediction for one setup needs, read once: the pool (a sample of the setup's runs), its
    workloads, the measured figures of every run of the setup, the model and the leave-one-np-out folds."""

    store: Store
    pool: list[str]  # the runs the model is fitted on (``sample`` of the setup's runs)
    basis: str
    left_out: dict[str, str]  # the setup's runs left out as broken, with why
    workloads: dict[str, Workload]
    measured: dict[str, dict[str, float]]  # run -> its measured figures (every run of the setup, and the targets)
    model: CostModel
    folds: pl.DataFrame  # run, np, kind, figure, measured, predicted, error
    setup: str = ""  # the setup's label
    runs: list[str] = field(default_factory=list)  # every run of the setup that may teach the model
    healthy: list[str] = field(default_factory=list)  # those whose server was healthy: the measured figures' runs
    nps: dict[str, int] = field(default_factory=dict)  # run -> the slots that served it
    facts: pl.DataFrame | None = None  # the runs' ``metrics.throughput`` rows
    slots: pl.DataFrame | None = None  # ``workload.run_slots`` of the runs
    instance: str | None = None
    targets: list[str] = field(default_factory=list)  # the runs asked about that belong to this setup
    runaway: dict[str, str] = field(default_factory=dict)  # pooled runs whose outputs ran away (why): no measured figure
    notes: list[str] = field(default_factory=list)
    _speeds: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)

    @property
    def fold_kind(self) -> str:
        """How ``folds`` left runs out: one np at a time (three np or more), else one run at a time."""
        return "leave-one-np-out" if len({self.np_of(r) for r in self.pool}) >= 3 else "leave-one-run-out"

    def workload(self, run: str) -> Workload:
        """``run``'s workload, read on first use (a planner reads only the runs it replays)."""
        if run not in self.workloads:
            inst = self.instance if run in self.targets else None
            self.workloads[run] = workload.read_workload(self.store, run, instance=inst, slots=self.slots)
        return self.workloads[run]

    def np_of(self, run: str) -> int:
        return self.workloads[run].np if run in self.workloads else self.nps.get(run, 1)

    def measured_runs(self, np_: int, among: list[str] | None = None) -> list[str]:
        """The setup's healthy runs (of ``among`` when given) that ran at ``np_``: measured figures come from them
        only (a runaway run's longest request is not the setup's)."""
        keep = set(among) if among is not None else None
        return [r for r in self.healthy if self.nps.get(r) == np_ and (keep is None or r in keep)
                and r in self.measured]

    def measured_at(self, np_: int, runs: list[str]) -> dict[str, float | None]:
        """Each figure of ``runs`` (measured at one np): the median over them (one run: its own)."""
        out: dict[str, float | None] = {}
        for fig in FIGURES:
            vals = [v for r in runs if (v := self.measured.get(r, {}).get(fig)) is not None and np.isfinite(v)]
            out[fig] = float(np.median(vals)) if vals else None
        return out

    def measured_nps(self, among: list[str] | None = None) -> list[int]:
        """The np the setup's healthy runs (of ``among``) measured."""
        return sorted({self.nps[r] for r in self.healthy if r in self.nps and (among is None or r in among)})

    def band(self, figure: str, np_: int) -> tuple[float | None, str]:
        """(relative half-width, kind) of the error band of ``figure`` predicted at ``np_``.  Interpolated (``np_``
        within the pool's np): the largest relative error of every fold, since an extrapolated fold errs at least
        as much as an interpolated one would.  Extrapolated: the largest of the extrapolated folds (else of any)."""
        nps = sorted({self.np_of(r) for r in self.pool})
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
        w, base = self.workload(run), model or self.model
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
            self._speeds[key] = costmodel.speed_of(m, self.workload(run))
        return self._speeds[key]

    def sources(self, among: list[str] | None = None) -> list[str]:
        """The workloads a prediction replays: a sample (``sample``) of ``among``'s healthy runs (default: the
        targets pooled in the setup, else every run of it), else of its runs that may teach the model (never a run
        left out as broken)."""
        pooled = [r for r in self.targets if r in self.runs]
        cands = [r for r in (among if among is not None else pooled or self.runs) if r in self.runs]
        healthy = [r for r in cands if r in self.healthy]
        return sample(healthy or cands, self.nps, self.facts, healthy=self.healthy)

    def source_for(self, np_: int, among: list[str] | None = None) -> str:
        """The run whose workload predicts ``np_``: of ``among`` (default the pool), the nearest in np (the larger
        on a tie)."""
        cands = among if among is not None else self.pool
        return min(cands, key=lambda r: (abs(self.np_of(r) - np_), -self.np_of(r), r))


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


def _np(slots: pl.DataFrame) -> dict[str, int]:
    """run -> the slots that served it (its instances' largest n_slots, else the harness's concurrency)."""
    per = slots.group_by("run").agg(pl.col("n_slots").max(), pl.col("concurrency").max())
    return {r: int(n if n is not None else c) for r, n, c in per.iter_rows() if n is not None or c is not None}


SAMPLE_KEYS = ("requests", "gen_tokens", "prompt_tokens")


def sample(runs: list[str], nps: dict[str, int], facts: pl.DataFrame | None, *, k: int = SAMPLE_PER_NP,
           healthy: list[str] | None = None) -> list[str]:
    """At most ``k`` runs of each np of ``runs``, the most representative of that np: healthy ones first, then the
    closest to the np's median requests, generated and prompt tokens (the sum of |log ratio|), then by name.
    Deterministic, and bounded whatever the number of runs: a store of a year of daily runs replays a few."""
    ok = set(healthy or [])
    stats: dict[str, list[float]] = {}
    if facts is not None and facts.height:
        for row in facts.filter(pl.col("run").is_in(runs)).iter_rows(named=True):
            stats[row["run"]] = [float(row[c]) if row.get(c) else 0.0 for c in SAMPLE_KEYS]
    out: list[str] = []
    for n in sorted({nps.get(r, 1) for r in runs}):
        mine = sorted(r for r in runs if nps.get(r, 1) == n)
        med = np.median(np.array([stats.get(r, [0.0] * len(SAMPLE_KEYS)) for r in mine]), axis=0)

        def distance(r: str, med: np.ndarray = med) -> float:
            v = np.array(stats.get(r, [0.0] * len(SAMPLE_KEYS)))
            both = (v > 0) & (med > 0)
            return float(np.sum(np.abs(np.log(v[both] / med[both])))) + float(np.sum(~both & (v != med)))
        out += sorted(mine, key=lambda r: (r not in ok, distance(r), r))[:k]
    return out


def _group_planner(store: Store, g: SetupGroup, targets: list[str], *, instance: str | None,
                   slots: pl.DataFrame) -> Planner:
    """The planner of one setup group."""
    from forensics import setups

    runs = list(g.runs)
    runaway = setups.broken(store, runs)  # pooled but broken: the runs whose outputs ran away
    healthy = [r for r in runs if r not in runaway]
    mine = [t for t in targets if t in runs or t in g.left_out]
    facts = metrics.throughput(store, list(dict.fromkeys([*runs, *mine])))
    nps = _np(slots.filter(pl.col("run").is_in([*runs, *mine])))
    pool = sample(runs, nps, facts, healthy=healthy)
    wanted = list(dict.fromkeys([*pool, *(mine if len(mine) <= SAMPLE_PER_NP else [])]))  # the rest: on use
    rows = workload.requests_frame(store, wanted)
    loads = {r: workload.read_workload(store, r, instance=instance if r in mine else None, rows=rows, slots=slots)
             for r in wanted}
    basis = f"the healthy runs of setup {g.label}"
    try:
        model = costmodel.fit([loads[r] for r in pool], shape_from=healthy)
    except NotEnoughData as exc:
        if g.left_out:
            exc.message += " (left out as broken: " + ", ".join(g.left_out) + ")"
        raise
    p = Planner(store, pool, basis, dict(g.left_out), loads, measured_figures(facts), model, _empty_folds(),
                setup=g.label, runs=runs, healthy=healthy, nps=nps, facts=facts, slots=slots, instance=instance,
                targets=mine, runaway=runaway)
    p.folds = folds(p)
    if p.folds.height == 0:
        p.notes.append("no error band: leaving any np out leaves too few timed runs to fit on; record the "
                       "workload again (at another np, it also lets other np be predicted)")
    return p


@dataclass
class Unplanned:
    """A setup the store cannot support a prediction for: its label, its runs and what to record."""

    setup: str
    runs: list[str]
    targets: list[str]
    error: NotEnoughData


def planners(store: Store, runs: list[str] | None, *, instance: str | None = None) -> list[Planner | Unplanned]:
    """One planner per setup of ``runs`` (``setups.groups``: none named, every run of the store; one, the runs of
    its setup; several, those), each a ``Planner`` or, when the store cannot support it, ``Unplanned``."""
    from forensics import setups

    targets = runs_mod.resolve(store, runs).runs
    slots = workload.run_slots(store, runs_mod.all_runs(store))
    out: list[Planner | Unplanned] = []
    for g in setups.groups(store, runs or None, keep=("runaway",)):
        try:
            out.append(_group_planner(store, g, targets, instance=instance, slots=slots))
        except NotEnoughData as exc:
            out.append(Unplanned(g.label, g.runs, [t for t in targets if t in g.runs or t in g.left_out], exc))
    return out


def each_setup(store: Store, runs: list[str], *, instance: str | None = None) -> list[Planner | Unplanned]:
    """For runs to predict one by one (``whatif``, the report): one planner per setup among ``runs``, each over
    the whole setup (as for one run: the runs of its setup), with the runs of ``runs`` in it as its targets."""
    from forensics import setups

    names = runs_mod.resolve(store, runs).runs
    keys = setups.setups(store, names)
    out: list[Planner | Unplanned] = []
    for _, g in keys.group_by("setup_key", maintain_order=True):
        mine = [r for r in names if r in set(g["run"].to_list())]
        try:
            p = planner(store, mine[:1], instance=instance)
        except NotEnoughData as exc:
            out.append(Unplanned(str(g["setup"][0]), [], mine, exc))
            continue
        p.targets = list(dict.fromkeys([*p.targets, *mine]))
        out.append(p)
    return out


def planner(store: Store, runs: list[str], *, instance: str | None = None) -> Planner:
    """The planner for ``runs`` (the targets of a prediction), all of one setup: the pool, workloads, fit and
    folds.  Runs of several setups have one planner each: ``planners``."""
    from forensics import setups

    targets = runs_mod.resolve(store, runs).runs
    found = setups.groups(store, runs or None, keep=("runaway",))
    if len(found) != 1:
        raise InputError("the runs named measured different setups: " + "; ".join(g.label for g in found),
                         hint="name runs of one setup, or use `planners`: one planner per setup")
    slots = workload.run_slots(store, runs_mod.all_runs(store))
    return _group_planner(store, found[0], targets, instance=instance, slots=slots)


FOLD_SCHEMA = {"run": pl.String, "np": pl.Int64, "kind": pl.String, "speed": pl.Float64, "figure": pl.String,
               "measured": pl.Float64, "predicted": pl.Float64, "error": pl.Float64}


def _empty_folds() -> pl.DataFrame:
    return pl.DataFrame(schema=FOLD_SCHEMA)


def folds(p: Planner) -> pl.DataFrame:
    """Leave-one-np-out: for each np of the pool, the model fitted on the other np predicts that np's runs from
    their own workloads, at each run's own speed (``speed``: its decode steps' time against that model's: the
    machine's load), and the relative error (predicted / measured - 1), one row per run and figure.  With one or
    two np only a fit on one np cannot predict another: the folds leave one run out instead.  One fit per fold
    (``costmodel.fold_groups``), so the cost grows with the np measured, not with the runs."""
    runs = list(p.pool)
    rows = []
    for held in costmodel.fold_groups([p.np_of(r) for r in runs]):
        out = [runs[i] for i in held]
        others = [r for r in runs if r not in out]
        if not others:
            continue
        try:
            model = costmodel.fit([p.workloads[r] for r in others], shape_from=p.healthy)
        except NotEnoughData:
            continue
        rest = sorted({p.np_of(r) for r in others})
        for run in out:
            np_ = p.np_of(run)
            if costmodel.one_np_only(model, np_) is not None:
                continue
            pred, _ = p.predict(run, np_, model=model)
            kind = "interpolated" if rest[0] <= np_ <= rest[-1] else "extrapolated"
            for fig in FIGURES:
                meas = p.measured.get(run, {}).get(fig)
                if meas is None or not meas or np.isnan(pred[fig]):
                    continue
                rows.append({"run": run, "np": np_, "kind": kind, "speed": round(p.speed(run, model)[0], 3),
                             "figure": fig, "measured": meas, "predicted": pred[fig], "error": pred[fig] / meas - 1})
    return pl.DataFrame(rows, schema=FOLD_SCHEMA, orient="row")


# ---------------------------------------------------------------------------------------- between measured np
HIGHER_IS_BETTER = ("gen_tok_per_s",)


def _fmt(figure: str, v: float) -> str:
    return f"{v:.1f} tok/s" if figure in HIGHER_IS_BETTER else f"{v:.2f} s" if v < 10 else f"{v:.0f} s"


@dataclass(frozen=True)
class Sanity:
    """One figure of a prediction between two measured np that beat both measured neighbours: the value shown
    (``value``), the model's own (``model``) and whether the value was moved (``adjusted``)."""

    figure: str
    value: float
    model: float
    adjusted: bool

    @property
    def factor(self) -> float:
        return self.value / self.model if self.model else 1.0

    def band(self, low: float | None, high: float | None) -> tuple[float | None, float | None]:
        """The band widened to hold both the value shown and the model's figure."""
        lo = min(v for v in (low, self.value, self.model) if v is not None)
        hi = max(v for v in (high, self.value, self.model) if v is not None)
        return lo, hi


def sanity(np_: int, neighbours: tuple[int, int], pred: dict[str, float],
           model_there: tuple[dict[str, float], dict[str, float]],
           measured: tuple[dict[str, float | None], dict[str, float | None]]) -> tuple[dict[str, Sanity], list[str]]:
    """A prediction at ``np_`` between the measured np ``neighbours`` (a, b) must not beat both of them (higher
    throughput, or shorter run time or latency than both) unless the model says why.  For each figure that does:

    * when the model's own figures at a and b (``model_there``: the same workloads replayed there) are beaten too,
      its curve peaks between them: kept, and the note says so;
    * else the measured points sit off the fitted curve (noisy runs, or a shape the model misses): the value is
      placed between the measured neighbours where the model's curve places it between its own figures there
      (never beyond them), the band reaches the model's figure, and the note says by how much each neighbour is off.

    Returns the figures checked that beat both (figure -> ``Sanity``) and at most one note."""
    a, b = neighbours
    out: dict[str, Sanity] = {}
    said: list[str] = []
    for fig in FIGURES:
        v, pa, pb = pred.get(fig), model_there[0].get(fig), model_there[1].get(fig)
        ma, mb = measured[0].get(fig), measured[1].get(fig)
        got = [x for x in (v, pa, pb, ma, mb) if x is not None and np.isfinite(x)]
        if len(got) < 5:
            continue
        v, pa, pb, ma, mb = got
        sign = 1.0 if fig in HIGHER_IS_BETTER else -1.0
        if not (sign * (v - ma) > 0 and sign * (v - mb) > 0):
            continue
        name = FIGURE_NAMES[fig]
        if sign * (v - pa) > 0 and sign * (v - pb) > 0:
            out[fig] = Sanity(fig, v, v, False)
            said.append(f"{name} {_fmt(fig, v)} beats both measured neighbours ({_fmt(fig, ma)}, {_fmt(fig, mb)}) "
                        f"because the model's curve peaks between them (its own {_fmt(fig, pa)} and {_fmt(fig, pb)})")
            continue
        t = float(np.clip((v - pa) / (pb - pa), 0.0, 1.0)) if pb != pa else 0.5
        shown = ma + t * (mb - ma)
        out[fig] = Sanity(fig, shown, v, True)
        said.append(f"the model's {name} {_fmt(fig, v)} beat both measured neighbours ({_fmt(fig, ma)}, "
                    f"{_fmt(fig, mb)}), which sit {ma / pa - 1:+.1%} and {mb / pb - 1:+.1%} off its curve (noisy "
                    f"runs, or a shape the model misses): shown at {_fmt(fig, shown)}, between them, with a band "
                    "reaching the model's figure")
    note = (f"np {np_} (between the measured np {a} and {b}): " + "; ".join(said)) if said else ""
    return out, [note] if note else []

"""The server's cost model, fitted on recorded runs: what a prompt token costs to prefill, and what one decode step
costs when ``b`` slots decode at once.

llama-server runs one batch per step: every decoding slot adds one token, and a slot that is prefilling adds its
prompt's tokens.  On a mixture-of-experts model each extra sequence in the batch costs about the same, so

* one decode step with ``b`` slots decoding, holding ``C`` tokens of context between them:
  ``step(b, C) = step_ms + marginal_ms × (b − 1) + knee_ms × max(b − knee, 0) + batch_ms × [b ≥ 2]
  + context_ms_per_token × C`` (a batch of two or more sequences runs other kernels than one alone; attention
  reads every slot's context: a runaway that fills its slot slows every step down).  The knee is the plateau of a
  mixture-of-experts model on a GPU: up to ``knee`` slots a step costs little more than one sequence's (the weights
  are read once for the batch), past it each extra slot reads more experts and the step grows by ``marginal_ms +
  knee_ms`` a slot, so throughput (b / step) stays about flat.  A fit chooses the knee among the np measured, or
  none, by held-out error (``choose_shape``);
* prefilling a batch of prompts of ``p`` tokens in all (cache excluded): ``prefill_base_ms +
  prefill_ms_per_token × p + prefill_busy_ms × b`` (the decode tokens of the ``b`` other slots ride in the same
  batch);
* while a prefill runs, the decoding slots stand still for ``stall_share`` of it (the batch that carries their next
  token carries the prompts too: about all of it on llama-server).

The fit reads each request's llama.cpp timings (prompt_ms, gen_ms) and places them on the run's clock: its
generation ends when the request ended and lasted gen_ms, its prefill lasted prompt_ms before that.  The
busy-slot timeline is the count of requests generating at each moment; a request's generation time per step is
regressed on the (token-weighted) mean number of slots decoding with it, on the mean context they held (each
slot's prompt plus what it had generated, growing linearly over its generation) and on how long a prefill ran
meanwhile; its prefill time on the prompt tokens of its batch (the prompts that ended their prefill with
it after the same time: llama-server prefills waiting prompts together) and the slots decoding meanwhile.  Non-negative
weighted least squares, one robust pass (residuals beyond 4 MADs are dropped once).  The knee and the context term
are kept only when they predict left-out np better (``choose_shape``: leave one np out, or one run out when the runs
span fewer than three np).  Vectorised: numpy step functions, no loop per request.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.errors import InputError
from forensics.planning.workload import Workload


class NotEnoughData(InputError):
    """The store's runs cannot support the model: the message says what to record."""


@dataclass(frozen=True)
class CostModel:
    """Fitted costs in milliseconds (see the module's docstring), with the runs they came from."""

    step_ms: float
    marginal_ms: float
    stall_share: float
    prefill_base_ms: float
    prefill_ms_per_token: float
    prefill_busy_ms: float
    runs: tuple[str, ...]
    nps: tuple[int, ...]
    requests: int
    decode_r2: float | None = None
    prefill_r2: float | None = None
    context_ms_per_token: float = 0.0
    # the measured / fitted ratios of the fit's requests (decode steps, prefills): the runs' own noise, which the
    # replay draws from; and the stretch of time one decode ratio holds (a typical request's generation)
    decode_noise: tuple[float, ...] = ()
    prefill_noise: tuple[float, ...] = ()
    noise_epoch_s: float = 1.0
    batch_ms: float = 0.0  # a step with two or more slots decoding costs this more (a batched kernel, not one row)
    knee: float = 0.0  # slots decoding past which each extra one costs knee_ms more (0: no knee)
    knee_ms: float = 0.0

    def step(self, busy: int | float, context: float = 0.0) -> float:
        """Milliseconds of one decode step with ``busy`` slots decoding and ``context`` tokens held between them."""
        return (self.step_ms + self.marginal_ms * max(float(busy) - 1.0, 0.0) + self.context_ms_per_token * context
                + (self.batch_ms if busy >= 2 else 0.0) + self._past_knee(float(busy)))

    def _past_knee(self, busy: float) -> float:
        return self.knee_ms * max(busy - self.knee, 0.0) if self.knee > 0 else 0.0

    def describe(self) -> str:
        ctx = (f" + {self.context_ms_per_token * 1000:.2f} ms per 1000 tokens of context"
               if self.context_ms_per_token > 0 else "")
        batched = f" (+{self.batch_ms:.1f} ms once two or more decode)" if self.batch_ms > 0 else ""
        knee = (f", {self.marginal_ms + self.knee_ms:.2f} ms per slot past {self.knee:g} (the knee)"
                if self.knee > 0 and self.knee_ms > 0 else "")
        return (f"decode step {self.step_ms:.1f} ms + {self.marginal_ms:.2f} ms per extra slot decoding{knee}"
                f"{batched}{ctx}; "
                f"prefill {self.prefill_ms_per_token * 1000:.0f} µs per prompt token"
                + (f" (the decoding slots stand still for {self.stall_share * 100:.0f} % of it)"
                   if self.stall_share > 0 else "")
                + f"; fitted on {self.requests} requests of {len(self.runs)} runs (np "
                + ", ".join(str(n) for n in self.nps) + ")")


# ---------------------------------------------------------------------------------------- step functions
def step_integral(starts: np.ndarray, ends: np.ndarray, weights: np.ndarray, qa: np.ndarray, qb: np.ndarray,
                  f: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """∫ from qa to qb of f(level(t)) dt for each query, where level(t) = Σ weights of the intervals
    [start, end) holding t (f = identity when None)."""
    if starts.size == 0:
        return np.zeros(qa.shape) if f is None else f(np.zeros(1))[0] * (qb - qa)
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([weights, -weights])
    order = np.argsort(times, kind="stable")
    times, deltas = times[order], deltas[order]
    level = np.cumsum(deltas)
    value = level if f is None else f(level)
    cum = np.concatenate([[0.0], np.cumsum(value[:-1] * np.diff(times))])
    inside = np.interp(qb, times, cum) - np.interp(qa, times, cum)
    if f is None:
        return inside
    zero = float(f(np.zeros(1))[0])  # outside every interval the level is 0
    before = np.clip(np.minimum(qb, times[0]) - qa, 0.0, None)
    after = np.clip(qb - np.maximum(qa, times[-1]), 0.0, None)
    return inside + zero * (before + after)


# ---------------------------------------------------------------------------------------- least squares
def nnls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least squares with every coefficient ≥ 0: the best of the column subsets whose unconstrained
    solution is non-negative (a handful of columns, so every subset is tried)."""
    sw = np.sqrt(w)
    xa, ya = x * sw[:, None], y * sw
    best, best_sse = np.zeros(x.shape[1]), float(np.sum(ya ** 2))
    for k in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), k):
            coef, *_ = np.linalg.lstsq(xa[:, cols], ya, rcond=None)
            if np.any(coef < 0):
                continue
            sse = float(np.sum((ya - xa[:, cols] @ coef) ** 2))
            if sse < best_sse - 1e-12:
                best = np.zeros(x.shape[1])
                best[list(cols)] = coef
                best_sse = sse
    return best


def robust_nnls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, float | None]:
    """``nnls``, then once more without the points whose residual is beyond 4 MADs; (coefficients, r²)."""
    coef = nnls(x, y, w)
    resid = y - x @ coef
    # a floor of 1 % of a typical value: on exact data the MAD is ~0 and would drop all but a few points
    mad = max(float(np.median(np.abs(resid - np.median(resid)))) * 1.4826, 0.01 * float(np.median(np.abs(y))))
    if mad > 0:
        keep = np.abs(resid) <= 4 * mad
        if keep.sum() >= x.shape[1] + 2 and not keep.all():
            x, y, w = x[keep], y[keep], w[keep]
            coef = nnls(x, y, w)
    mean = float(np.average(y, weights=w))
    ss_tot = float(np.sum(w * (y - mean) ** 2))
    r2 = 1 - float(np.sum(w * (y - x @ coef) ** 2)) / ss_tot if ss_tot > 0 else None
    return coef, r2


# ---------------------------------------------------------------------------------------- the fit
@dataclass
class _Rows:
    """Per request of one run's instance: timings and the busy/prompt integrals over its phases."""

    steps: np.ndarray
    gen_ms: np.ndarray
    gen_busy: np.ndarray  # token-weighted mean slots decoding during its generation (itself included)
    gen_prefill: np.ndarray  # milliseconds of its generation during which a prefill ran
    gen_context: np.ndarray  # mean context tokens the decoding slots held during its generation
    gen_batched: np.ndarray  # the share of its steps taken with another slot decoding too
    gen_hinge: np.ndarray  # (requests, knees): token-weighted mean of max(slots decoding - knee, 0), per knee
    prompt: np.ndarray
    prompt_ms: np.ndarray
    prompt_busy: np.ndarray  # mean slots decoding during its prefill
    prompt_batch: np.ndarray  # prompt tokens of its prefill batch (its own and those prefilled with it)


def timed_jobs(w: Workload) -> pl.DataFrame:
    """The jobs of ``w`` the fit can place on the clock: served by the replayed instance, with an end and timings."""
    return w.jobs.filter(pl.col("simulated") & pl.col("end_s").is_not_null() & pl.col("gen_ms").is_not_null()
                         & pl.col("prompt_ms").is_not_null())


def _phases(j: pl.DataFrame) -> dict[str, np.ndarray]:
    end = j["end_s"].to_numpy().astype(float)
    gen_s = np.clip(j["gen_ms"].to_numpy().astype(float), 0, None) / 1000.0
    pr_s = np.clip(j["prompt_ms"].to_numpy().astype(float), 0, None) / 1000.0
    return {"g0": end - gen_s, "g1": end, "p0": end - gen_s - pr_s, "p1": end - gen_s,
            "p": j["prompt_eval"].fill_null(0).to_numpy().astype(float),
            "ctx": j["prompt_tokens"].fill_null(0).to_numpy().astype(float),
            "n": j["gen_tokens"].fill_null(0).to_numpy().astype(float),
            "gen_ms": gen_s * 1000.0, "prompt_ms": pr_s * 1000.0}


def _untimed(w: Workload) -> dict[str, np.ndarray]:
    """The requests that held a slot generating but have no timings (the client gave up on them: a runaway until
    its timeout): they count in the busy timeline from send to end, with their prompt and tokens."""
    j = w.jobs.filter(pl.col("simulated") & pl.col("gen_ms").is_null() & pl.col("send_s").is_not_null()
                      & pl.col("end_s").is_not_null() & (pl.col("gen_tokens") > 1))
    return {"g0": j["send_s"].to_numpy().astype(float), "g1": j["end_s"].to_numpy().astype(float),
            "ctx": j["prompt_tokens"].fill_null(0).to_numpy().astype(float),
            "n": j["gen_tokens"].to_numpy().astype(float)}


BATCH_TOLERANCE_S = 0.010  # prefills that ended together (and lasted as long) to within this were one batch


def batch_tokens(p1: np.ndarray, prompt_ms: np.ndarray, p: np.ndarray) -> np.ndarray:
    """For each prefill, the prompt tokens of its batch: llama-server prefills the prompts waiting together, and
    each one's prompt_ms is the whole batch's time, so batch mates end together after the same time."""
    if p1.size == 0:
        return p1
    order = np.argsort(p1, kind="stable")
    gap = np.diff(p1[order]) > BATCH_TOLERANCE_S
    gap |= np.abs(np.diff(prompt_ms[order])) > BATCH_TOLERANCE_S * 1000.0
    group = np.empty(p1.size, dtype=np.int64)
    group[order] = np.concatenate([[0], np.cumsum(gap)])
    return np.bincount(group, weights=p)[group]


CHUNK = 512  # rows of the pairwise context integral at a time (512 x N doubles)


def context_integral(g0: np.ndarray, g1: np.ndarray, ctx0: np.ndarray, n: np.ndarray, qa: np.ndarray,
                     qb: np.ndarray) -> np.ndarray:
    """∫ from qa to qb of C(t) dt for each query, where C(t) is the context the decoding requests hold: request j
    holds ctx0 + n x (t - g0) / (g1 - g0) tokens from g0 to g1 (its prompt, then one more token per step)."""
    out = np.zeros(qa.shape)
    slope = np.where(g1 > g0, n / np.where(g1 > g0, g1 - g0, 1.0), 0.0)
    for k in range(0, qa.size, CHUNK):
        a = np.maximum(qa[k:k + CHUNK, None], g0[None, :])
        b = np.minimum(qb[k:k + CHUNK, None], g1[None, :])
        ok = b > a
        lin = ((b - g0) ** 2 - (a - g0) ** 2) / 2.0
        out[k:k + CHUNK] = np.where(ok, ctx0 * (b - a) + slope * lin, 0.0).sum(axis=1)
    return out


def _rows(w: Workload, step: Callable[[np.ndarray], np.ndarray], knees: Sequence[float] = ()) -> _Rows:
    ph = _phases(timed_jobs(w))
    un = _untimed(w)
    b0, b1 = np.concatenate([ph["g0"], un["g0"]]), np.concatenate([ph["g1"], un["g1"]])  # the busy timeline
    ones = np.ones(b0.shape)
    g_dur = ph["g1"] - ph["g0"]
    tokens = step_integral(b0, b1, ones, ph["g0"], ph["g1"], lambda b: 1.0 / step(b))
    weighted = step_integral(b0, b1, ones, ph["g0"], ph["g1"], lambda b: b / step(b))
    with np.errstate(invalid="ignore", divide="ignore"):
        gen_busy = np.where(tokens > 0, weighted / tokens, 1.0)
        p_dur = ph["p1"] - ph["p0"]
        prompt_busy = np.where(p_dur > 0, step_integral(b0, b1, ones, ph["p0"], ph["p1"]) / p_dur, 0.0)
    gen_prefill = 1000.0 * step_integral(ph["p0"], ph["p1"], np.ones(ph["p0"].shape), ph["g0"], ph["g1"],
                                         lambda n: (n > 0).astype(float))
    gen_busy = np.where(g_dur > 0, gen_busy, 1.0)
    ctx = context_integral(b0, b1, np.concatenate([ph["ctx"], un["ctx"]]), np.concatenate([ph["n"], un["n"]]),
                           ph["g0"], ph["g1"])
    gen_context = np.where(g_dur > 0, ctx / np.where(g_dur > 0, g_dur, 1.0), ph["ctx"])
    batched = step_integral(b0, b1, ones, ph["g0"], ph["g1"], lambda b: (b >= 2) / step(b))
    hinge = np.zeros((tokens.size, len(knees)))
    for k, knee in enumerate(knees):
        def past_knee(b: np.ndarray, kn: float = knee) -> np.ndarray:
            return np.clip(b - kn, 0.0, None) / step(b)
        past = step_integral(b0, b1, ones, ph["g0"], ph["g1"], past_knee)
        with np.errstate(invalid="ignore", divide="ignore"):
            hinge[:, k] = np.where(tokens > 0, past / tokens, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        gen_batched = np.where(tokens > 0, batched / tokens, 0.0)
    return _Rows(np.clip(ph["n"] - 1, 0, None), ph["gen_ms"], gen_busy, gen_prefill, gen_context, gen_batched, hinge,
                 ph["p"],
                 ph["prompt_ms"], prompt_busy, batch_tokens(ph["p1"], ph["prompt_ms"], ph["p"]))


def _concat(rows: Sequence[_Rows]) -> _Rows:
    return _Rows(*(np.concatenate([getattr(r, f) for r in rows]) for f in _Rows.__dataclass_fields__))


def check_data(workloads: Sequence[Workload]) -> None:
    """Raise ``NotEnoughData`` (one line: what to record) unless some runs have timed requests to fit on."""
    if not any(timed_jobs(w).height >= 3 for w in workloads):
        raise NotEnoughData("no run has request timings on a clock",
                            hint="record the harness's per-request send and end times, or start llama-server with "
                                 "--log-timestamps (or --log-prefix), so each request's time can be placed")


def one_np_only(model: CostModel, np_: int) -> NotEnoughData | None:
    """The error for a prediction at ``np_`` from a model that saw one other np only (the cost of an extra slot
    cannot be told from one np), else None: at the np it saw, a model of one np predicts (a cap, a rerun)."""
    if len(model.nps) != 1 or np_ == model.nps[0]:
        return None
    n = model.nps[0]
    return NotEnoughData(f"only np {n} has timed runs ({', '.join(sorted(model.runs))}): the cost of an extra slot "
                         f"cannot be told from one np, so np {np_} cannot be predicted",
                         hint="record the same workload at another np as well (e.g. "
                              + (f"np {n // 2} and np {n * 2})" if n > 1 else "np 2 and np 4)"))


DECODE_TERMS = ("step_ms", "marginal_ms", "stall_share", "batch_ms", "knee_ms", "context_ms_per_token")


def _decode_xy(r: _Rows, knee: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The decode regression's design, target and weights over the requests that generated two or more tokens:
    per step, its time against 1, the extra slots decoding, the prefill time it sat through per step, the share
    of batched steps, the slots past the knee (column ``knee`` of ``gen_hinge``; zeros for none) and the context
    (``DECODE_TERMS``, in that order)."""
    ok = (r.steps > 0) & (r.gen_ms > 0)
    hinge = r.gen_hinge[ok, knee] if knee is not None else np.zeros(ok.sum())
    cols = [np.ones(ok.sum()), r.gen_busy[ok] - 1.0, r.gen_prefill[ok] / r.steps[ok], r.gen_batched[ok], hinge,
            r.gen_context[ok]]
    steps = r.steps[ok]
    # a request's weight is its steps (its per-step time is that much surer), but no more than four typical
    # requests': one long runaway must not outweigh a run
    weight = np.minimum(steps, 4.0 * float(np.median(steps))) if steps.size else steps
    return np.column_stack(cols), r.gen_ms[ok] / steps, weight


def _fit_decode(x: np.ndarray, y: np.ndarray, w: np.ndarray, *, knee: bool,
                context: bool) -> tuple[np.ndarray, float | None]:
    """``robust_nnls`` on the terms in use (the knee's and the context's only when asked for): the coefficients of
    every ``DECODE_TERMS`` (0 for a term not used) and r²."""
    use = [0, 1, 2, 3] + ([4] if knee else []) + ([5] if context else [])
    coef, r2 = robust_nnls(x[:, use], y, w)
    full = np.zeros(len(DECODE_TERMS))
    full[use] = coef
    return full, r2


def fold_groups(nps: Sequence[int]) -> list[list[int]]:
    """The folds of a held-out check over runs at ``nps``: one per np (leave-one-np-out: a prediction is for an
    np not run) when the runs span three np or more, else one per run (a fit on one np cannot predict another)."""
    distinct = sorted(set(nps))
    if len(distinct) >= 3:
        return [[i for i, n in enumerate(nps) if n == d] for d in distinct]
    return [[i] for i in range(len(nps))]


def _held_out_sse(per_fold: list[_Rows], context: bool, knee: int | None) -> float:
    """Σ over folds of the weighted squared error on that fold of the decode fit on the others."""
    total = 0.0
    for i, held in enumerate(per_fold):
        x, y, w = _decode_xy(_concat([r for j, r in enumerate(per_fold) if j != i]), knee)
        hx, hy, hw = _decode_xy(held, knee)
        if len(y) < x.shape[1] + 2 or len(hy) == 0:
            continue
        coef, _ = _fit_decode(x, y, w, knee=knee is not None, context=context)
        total += float(np.sum(hw * (hy - hx @ coef) ** 2))
    return total


CONTEXT_GAIN = 0.02  # the context term stays when it predicts held-out runs' steps at least this much better
KNEE_GAIN = 0.05  # a knee stays when it predicts held-out np's steps at least this much better than one slope


def knee_candidates(nps: Sequence[int]) -> tuple[float, ...]:
    """The knees a fit tries: every whole number of slots above the smallest np measured and below the second
    largest.  Below and above the knee there must be runs (between two measured np the steps a run takes while its
    last requests drain, at fewer slots than its np, place it), and above it two np at least: with one, the slope
    past the knee is that np's alone, and no left-out np ever tests it."""
    distinct = sorted(set(nps))
    if len(distinct) < 3:
        return ()
    return tuple(float(n) for n in range(distinct[0] + 1, distinct[-2]))


def choose_shape(per_fold: list[_Rows], knees: Sequence[float]) -> tuple[int | None, bool]:
    """(the knee's index in ``knees`` or None, whether the context term is used), chosen together by the error on
    the left-out folds: the best pair, then each term dropped again unless it predicts the left-out folds' steps
    better by its gain (``KNEE_GAIN``, ``CONTEXT_GAIN``: a spurious term fits noise)."""
    if len(per_fold) < 3:
        return None, False
    sse = {(k, c): _held_out_sse(per_fold, c, k) for k in (None, *range(len(knees))) for c in (False, True)}
    knee, context = min(sse, key=lambda kc: (sse[kc], kc[0] is not None, kc[1]))
    if knee is not None and sse[(None, context)] <= sse[(knee, context)] / (1 - KNEE_GAIN):
        knee = None
    if context and sse[(knee, False)] <= sse[(knee, True)] / (1 - CONTEXT_GAIN):
        context = False
    return knee, context


def weighting(step_ms: float, marginal_ms: float, knee: float = 0.0,
              knee_ms: float = 0.0) -> Callable[[np.ndarray], np.ndarray]:
    """The step time that weights a request's moments by how many steps they held (``_rows``), with one slot
    decoding counted at no less than half a two-slot step.  A fit that cannot split the one-slot step from the
    per-slot cost (one np only: every request saw about the same number of slots) may put the step at ~0, and a
    moment alone would then count as thousands of steps and swamp the busy count, the speed and the noise."""
    one = max(step_ms, (step_ms + marginal_ms) / 2.0)

    def step(b: np.ndarray) -> np.ndarray:
        past = knee_ms * np.clip(b - knee, 0.0, None) if knee > 0 else 0.0
        return np.where(b >= 2, step_ms + marginal_ms * np.clip(b - 1.0, 0.0, None) + past, one)
    return step


def fit(workloads: Sequence[Workload], *, shape_from: Collection[str] | None = None) -> CostModel:
    """The cost model fitted on ``workloads`` (``check_data`` first: timed requests).  A model of one np predicts
    that np only (``one_np_only``).  ``shape_from``: the runs whose left-out np choose the knee and the context term
    (``choose_shape``; default all): the healthy ones, since a run whose outputs ran away to the context at one np
    ties its slow steps to that np and the slots decoding there as much as to the context they held; every run
    then prices the terms chosen."""
    check_data(workloads)
    used = [w for w in workloads if timed_jobs(w).height >= 3]
    shaped = [i for i, w in enumerate(used) if shape_from is None or w.run in shape_from]
    if len(fold_groups([used[i].np for i in shaped])) < 3:
        shaped = list(range(len(used)))
    knees = knee_candidates([used[i].np for i in shaped])
    groups = [[shaped[j] for j in g] for g in fold_groups([used[i].np for i in shaped])]
    knee, context = None, False
    weigh = weighting(1.0, 0.0)
    for rounds in range(3):  # the token weighting of the busy count depends on the step cost: fit it again
        per_run = [_rows(w, weigh, knees) for w in used]
        rows = _concat(per_run)
        if int(((rows.steps > 0) & (rows.gen_ms > 0)).sum()) < 3:
            raise NotEnoughData("fewer than three requests generated more than one token",
                                hint="record runs whose requests generate some output")
        if rounds == 1:
            knee, context = choose_shape([_concat([per_run[i] for i in g]) for g in groups], knees)
        x, y, wt = _decode_xy(rows, knee)
        coef, dec_r2 = _fit_decode(x, y, wt, knee=knee is not None, context=context)
        at = knees[knee] if knee is not None else 0.0
        weigh = weighting(max(float(coef[0]), 1e-3), float(coef[1]), at, float(coef[4]))
        if rounds == 1 and knee is None:
            break  # a third round re-weights the steps past the knee; without one it would repeat the second
    pk = (rows.prompt > 0) & (rows.prompt_ms > 0)
    pre = np.zeros(3)
    pre_r2 = None
    if pk.sum() >= 3:
        xp = np.column_stack([np.ones(pk.sum()), rows.prompt_batch[pk], rows.prompt_busy[pk]])
        pre, pre_r2 = robust_nnls(xp, rows.prompt_ms[pk], np.ones(pk.sum()))
    past = knees[knee] if knee is not None and coef[4] > 0 else 0.0
    model = CostModel(max(float(coef[0]), 1e-3), float(coef[1]), float(coef[2]), float(pre[0]), float(pre[1]),
                      float(pre[2]), tuple(w.run for w in used), tuple(sorted({w.np for w in used})), len(y), dec_r2,
                      pre_r2, float(coef[5]), batch_ms=float(coef[3]), knee=past,
                      knee_ms=float(coef[4]) if past else 0.0)
    dec_noise, pre_noise = _noise(model, per_run, knee)
    gen_s = rows.gen_ms[rows.gen_ms > 0] / 1000.0
    epoch = float(np.clip(np.median(gen_s), 0.2, 30.0)) if gen_s.size else 1.0
    return dataclasses.replace(model, decode_noise=dec_noise, prefill_noise=pre_noise, noise_epoch_s=epoch)


NOISE_CLIP = (0.25, 8.0)  # a ratio outside this is a broken measurement, not noise


def _ratios(m: CostModel, r: _Rows, knee: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each request's measured / fitted time per decode step (with its weight) and per prefill, under ``m``
    (``knee``: the column of ``r.gen_hinge`` at ``m``'s knee)."""
    x, y, wt = _decode_xy(r, knee if m.knee > 0 else None)
    fitted = x @ np.array([getattr(m, t) for t in DECODE_TERMS])
    ok = fitted > 0
    pk = (r.prompt > 0) & (r.prompt_ms > 0)
    p_fit = m.prefill_base_ms + m.prefill_ms_per_token * r.prompt_batch[pk] + m.prefill_busy_ms * r.prompt_busy[pk]
    pre = r.prompt_ms[pk][p_fit > 0] / p_fit[p_fit > 0]
    return np.clip(y[ok] / fitted[ok], *NOISE_CLIP), wt[ok], np.clip(pre, *NOISE_CLIP)


def _weighted_median(v: np.ndarray, w: np.ndarray) -> float:
    order = np.argsort(v)
    cum = np.cumsum(w[order])
    return float(v[order][np.searchsorted(cum, cum[-1] / 2.0)])


def run_speed(m: CostModel, per_run: _Rows, knee: int | None = 0) -> tuple[float, float]:
    """How fast one run went against ``m``: the (weighted) median of its decode ratios and of its prefill ratios
    (1 where it has too few): the machine's load, its threads, anything that speeds a whole run up or slows it."""
    dec, wt, pre = _ratios(m, per_run, knee)
    k_d = _weighted_median(dec, wt) if dec.size >= 3 else 1.0
    k_p = float(np.median(pre)) if pre.size >= 3 else 1.0
    return k_d, k_p


def _noise(m: CostModel, per_run: list[_Rows], knee: int | None) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The fit's requests' measured / fitted ratios, each run's divided by its own speed (``run_speed``): the noise
    within a run (every request, the outliers too: a slow moment is real), not how fast its run went."""
    dec_all, pre_all = [], []
    for r in per_run:
        k_d, k_p = run_speed(m, r, knee)
        dec, _, pre = _ratios(m, r, knee)
        dec_all.append(dec / k_d)
        pre_all.append(pre / k_p)
    dec_v = np.clip(np.concatenate(dec_all), *NOISE_CLIP) if dec_all else np.ones(0)
    pre_v = np.clip(np.concatenate(pre_all), *NOISE_CLIP) if pre_all else np.ones(0)
    return tuple(np.round(dec_v, 4).tolist()), tuple(np.round(pre_v, 4).tolist())


def speed_of(m: CostModel, w: Workload) -> tuple[float, float]:
    """``run_speed`` of workload ``w``'s timed requests ((1, 1) without three of them)."""
    if timed_jobs(w).height < 3:
        return 1.0, 1.0
    return run_speed(m, _rows(w, weighting(m.step_ms, m.marginal_ms, m.knee, m.knee_ms), (m.knee,) if m.knee else ()))


def scaled(m: CostModel, decode: float, prefill: float) -> CostModel:
    """``m`` at another speed: every decode cost times ``decode``, every prefill cost times ``prefill``."""
    return dataclasses.replace(m, step_ms=m.step_ms * decode, marginal_ms=m.marginal_ms * decode,
                               batch_ms=m.batch_ms * decode, knee_ms=m.knee_ms * decode,
                               context_ms_per_token=m.context_ms_per_token * decode,
                               prefill_base_ms=m.prefill_base_ms * prefill,
                               prefill_ms_per_token=m.prefill_ms_per_token * prefill,
                               prefill_busy_ms=m.prefill_busy_ms * prefill)

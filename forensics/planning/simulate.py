"""Replay a workload through the cost model: a discrete-event simulation of the harness and one llama-server.

Event-driven, not stepped: between two events (a send, a prefill's end, a request's last token, a worker's next
send) the set of decoding slots is fixed, every step costs ``step(b, C)`` and adds ``b`` tokens to the context
``C``, so the steps done in a stretch of time and the time to the next completion are solved in closed form (a
quadratic), not waited for.  A few events per request, none per token.

Server: ``slots`` slots; a request takes a free slot or waits in a FIFO queue.  Prompts are prefilled in batches,
as llama-server batches them: a prefill begins when the decode step in progress ends (at once on an idle server),
and every prompt waiting then, and those that take a slot within ``BATCH_WINDOW_S`` of its start, go through
together (``prefill_base_ms + prefill_ms_per_token × Σp +
prefill_busy_ms × b``) while the decoding slots stand still for ``stall_share`` of it; then each request decodes its remaining tokens with the others.

Harness (``Harness.policy``): ``chain`` (a worker sends its item's next request ``lag_s`` after the previous one
ended, else takes the next item ``gap_s`` later), ``fifo`` (ready requests queue for any free worker) or
``barrier`` (a stage's first attempts wait until every request of the stage before has ended).  Requests the model
does not replay (another instance served them, or no tokens are known) keep their recorded latency.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.planning.costmodel import CostModel
from forensics.planning.workload import Harness, Workload

INF = math.inf
DONE_EPS = 1e-9  # a decoding request with this few steps left has finished
BATCH_WINDOW_S = 0.025  # a request that takes a slot this soon after a prefill began is prefilled with it


@dataclass
class Simulated:
    """Per job (in the workload's order): when it was sent, got a slot, started generating, ended at the server
    and at the client; and the run's figures computed from them like ``metrics.throughput`` does."""

    send: np.ndarray
    assign: np.ndarray
    prefill_start: np.ndarray
    gen_start: np.ndarray
    server_end: np.ndarray
    client_end: np.ndarray
    latency: np.ndarray
    gen_tokens: np.ndarray  # tokens the run's metrics count (a client's: those of the answers it got)
    gave_up: np.ndarray  # the client gave up on it (its timeout) before the answer came
    simulated: np.ndarray
    wall_s: float
    busy: pl.DataFrame  # t_s, busy: slots in use after each change


class Noise:
    """The runs' own noise, replayed: the decode speed holds a ratio drawn from the fit's measured / fitted ratios for
    one epoch (a typical request's generation time) and every slot feels it (they share a batch); each prefill draws
    its own.  ``seed`` None: no noise (every ratio 1)."""

    def __init__(self, model: CostModel, seed: int | None) -> None:
        self.rng = np.random.default_rng(seed) if seed is not None and model.decode_noise else None
        self.epoch = max(model.noise_epoch_s, 1e-3)
        self.decode_pool = np.asarray(model.decode_noise or (1.0,))
        self.prefill_pool = np.asarray(model.prefill_noise or (1.0,))
        self.factors: list[float] = []

    def decode(self, t: float) -> float:
        if self.rng is None:
            return 1.0
        k = math.floor(t / self.epoch + 1e-9)  # a moment on a boundary belongs to the epoch it opens
        while len(self.factors) <= k:
            self.factors.append(float(self.rng.choice(self.decode_pool)))
        return self.factors[k]

    def boundary(self, t: float) -> float:
        """The next moment the decode ratio may change."""
        return INF if self.rng is None else (math.floor(t / self.epoch + 1e-9) + 1) * self.epoch

    def prefill(self) -> float:
        return 1.0 if self.rng is None else float(self.rng.choice(self.prefill_pool))


class _Server:
    """One llama-server: slots, a slot queue, batched prefills, decoding slots advancing together."""

    def __init__(self, model: CostModel, slots: int, prompt: np.ndarray, steps: np.ndarray,
                 context: np.ndarray, noise: Noise) -> None:
        self.m, self.free, self.prompt, self.steps, self.context = model, slots, prompt, steps, context
        self.noise = noise
        self.t = 0.0
        self.waiting: deque[int] = deque()
        self.prefill_q: deque[int] = deque()
        self.batch: list[int] = []  # the prompts being prefilled together
        self.batch_start, self.prefill_end = -INF, INF
        self.batch_at = INF  # when the next prefill begins: the end of the decode step in progress
        self.dec: list[int] = []
        self.rem: list[float] = []
        self.ctx: list[float] = []  # the context each decoding slot holds (its prompt, then one token per step)
        self.stall = 0.0  # the share of time the decoding slots stand still while the current prefill runs
        n = prompt.size
        self.assign, self.gen_start, self.end = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
        self.prefill_start = np.full(n, np.nan)  # when its prompt went into a batch (llama.cpp's prompt_ms starts)
        self.decoded = np.zeros(n)  # tokens generated: all of them, or those before the client gave up

    def _costs(self) -> tuple[float, float]:
        """(the next step's milliseconds, how many milliseconds each step adds to the next): every step adds one
        token to each decoding slot's context, so the step time grows by context_ms_per_token x b a step."""
        b, f = len(self.dec), self.noise.decode(self.t)
        return self.m.step(b, sum(self.ctx)) * f, self.m.context_ms_per_token * b * f

    def _share(self) -> float:
        """The share of time the decoding slots advance, now (the stretch to the next event has one share)."""
        return 1.0 - self.stall

    def advance(self, t: float) -> None:
        if self.dec and t > self.t:
            s0, g = self._costs()
            ms = (t - self.t) * 1000.0 * self._share()
            # steps n in ms milliseconds: s0 n + g n^2 / 2 = ms, in the form that stays exact as g -> 0
            done = 2.0 * ms / (s0 + math.sqrt(s0 * s0 + 2.0 * g * ms))
            self.rem = [r - done for r in self.rem]
            self.ctx = [c + done for c in self.ctx]
        self.t = max(self.t, t)

    def next_time(self) -> float:
        t_dec = INF
        if self.dec and self._share() > 0:
            s0, g = self._costs()
            m = max(min(self.rem), 0.0)
            t_dec = min(self.t + (s0 * m + g * m * m / 2.0) / 1000.0 / self._share(), self.noise.boundary(self.t))
        return min(t_dec, self.prefill_end, self.batch_at)

    def arrive(self, job: int, t: float) -> None:
        self.advance(t)
        if self.free > 0:
            self._assign(job, t)
        else:
            self.waiting.append(job)

    def _assign(self, job: int, t: float) -> None:
        self.free -= 1
        self.assign[job] = t
        if self.batch and t - self.batch_start <= BATCH_WINDOW_S:  # it joins the prefill that just began
            self.advance(t)
            self.batch.append(job)
            self.prefill_start[job] = t
            self.prefill_end += self.m.prefill_ms_per_token * float(self.prompt[job]) / 1000.0
            return
        self.prefill_q.append(job)
        if self.batch or self.batch_at < INF:
            return
        if self.dec:  # the step in progress ends first: prompts that arrive meanwhile go into the same batch
            self.batch_at = t + self._costs()[0] / 1000.0
        else:
            self._start_prefill(t)

    def _start_prefill(self, t: float) -> None:
        """Every prompt waiting for its prefill goes into one batch, as llama-server batches them."""
        self.batch = list(self.prefill_q)
        self.prefill_q.clear()
        p, b = float(sum(self.prompt[j] for j in self.batch)), len(self.dec)
        dur_ms = (self.m.prefill_base_ms + self.m.prefill_ms_per_token * p + self.m.prefill_busy_ms * b) \
            * self.noise.prefill()
        self.batch_start, self.prefill_end = t, t + dur_ms / 1000.0
        self.stall = min(self.m.stall_share, 1.0)
        for job in self.batch:
            self.prefill_start[job] = t

    def step_to(self, t: float) -> list[int]:
        """Advance to ``t`` (an event of this server's) and return the jobs that ended there."""
        self.advance(t)
        ended: list[int] = []
        if self.batch_at <= t:
            self.batch_at = INF
            if self.prefill_q and not self.batch:
                self._start_prefill(t)
        if self.batch and self.prefill_end <= t:
            batch, self.batch, self.prefill_end, self.stall = self.batch, [], INF, 0.0
            for job in batch:
                self.gen_start[job] = t
                if self.steps[job] > 0:
                    self.dec.append(job)
                    self.rem.append(float(self.steps[job]))
                    self.ctx.append(float(self.context[job]) + 1.0)
                else:
                    ended.append(job)
            if self.prefill_q:
                self._start_prefill(t)
        eps = self._done_eps(t)
        if self.dec and min(self.rem) <= eps:
            keep = [(j, r, c) for j, r, c in zip(self.dec, self.rem, self.ctx, strict=True) if r > eps]
            ended += [j for j, r in zip(self.dec, self.rem, strict=True) if r <= eps]
            self.dec, self.rem, self.ctx = [k[0] for k in keep], [k[1] for k in keep], [k[2] for k in keep]
        for job in ended:
            self.decoded[job] = self.steps[job] + 1
            self._release(job, t)
        return ended

    def _done_eps(self, t: float) -> float:
        """The steps left below which a decoding request has finished: ``DONE_EPS``, or what the clock cannot tell
        apart at ``t`` (a fit whose one-slot step is a few µs leaves steps that take less than a float's resolution
        at a minute: without this the replay would wait for them forever)."""
        if not self.dec or self._share() <= 0:
            return DONE_EPS
        s0 = max(self._costs()[0], 1e-12)
        return max(DONE_EPS, 4.0 * math.ulp(max(t, 1.0)) * 1000.0 * self._share() / s0)

    def _release(self, job: int, t: float) -> None:
        self.end[job] = t
        self.free += 1
        if self.waiting:
            self._assign(self.waiting.popleft(), t)

    def cancel(self, job: int, t: float) -> None:
        """The client gave up on ``job`` at ``t``: the server stops it and frees its slot."""
        self.advance(t)
        if job in self.waiting:  # never had a slot
            self.waiting.remove(job)
            self.end[job] = t
            return
        if job in self.dec:
            k = self.dec.index(job)
            self.decoded[job] = self.steps[job] - max(self.rem[k], 0.0) + 1
            del self.dec[k], self.rem[k], self.ctx[k]
        elif job in self.batch:  # the batch goes on for the others
            self.batch.remove(job)
            if not self.batch:
                self.prefill_end, self.stall = INF, 0.0
                if self.prefill_q:
                    self._start_prefill(t)
        elif job in self.prefill_q:
            self.prefill_q.remove(job)
        self._release(job, t)


SEND, CLIENT_DONE, READY, DISPATCH, GIVE_UP = 0, 1, 2, 3, 4


class _Harness:
    """The client side: workers, the order of sends, dependencies, think times."""

    def __init__(self, h: Harness, jobs: pl.DataFrame, concurrency: int) -> None:
        self.h, self.concurrency = h, concurrency
        self.prev = jobs["prev"].to_numpy()
        self.lag = np.nan_to_num(jobs["lag_s"].to_numpy().astype(float), nan=h.gap_s)
        n = jobs.height
        self.succ = np.full(n, -1, dtype=np.int64)
        has = self.prev >= 0
        self.succ[self.prev[has]] = np.nonzero(has)[0]
        self.stage = jobs["stage_idx"].to_numpy()
        self.heads: deque[int] = deque(int(i) for i in np.nonzero(~has)[0])
        self.ready: deque[int] = deque()
        self.idle = concurrency
        self.gated: dict[int, list[int]] = {}  # barrier: stage -> jobs waiting for the stage before to end
        self.left = np.bincount(self.stage, minlength=int(self.stage.max()) + 1) if n else np.zeros(1, dtype=int)
        if h.policy == "barrier":
            for i in list(self.heads):
                if self.stage[i] > int(self.stage.min()):
                    self.heads.remove(i)
                    self.gated.setdefault(int(self.stage[i]), []).append(i)
            for first in np.nonzero(has & (self.stage != self.stage[np.maximum(self.prev, 0)]))[0]:
                self.succ[self.prev[first]] = -1  # a later stage's first attempt waits for its whole stage, not its item
                self.gated.setdefault(int(self.stage[first]), []).append(int(first))

    def start(self, push: PushFn) -> None:
        """The first sends: one per worker, staggered as recorded."""
        for w in range(min(self.concurrency, len(self.heads))):
            push(w * self.h.stagger_s, SEND, self.heads.popleft())
            self.idle -= 1

    def done(self, job: int, t: float, push: PushFn) -> None:
        """``job`` ended at the client at ``t``: its successor, the next item, the next stage."""
        nxt = int(self.succ[job])
        self.left[self.stage[job]] -= 1
        if self.h.policy == "barrier" and self.left[self.stage[job]] == 0:
            for i in self.gated.pop(int(self.stage[job]) + 1, []):
                self.ready.append(i)
        if nxt >= 0 and self.h.policy == "chain":
            push(t + self.lag[nxt], SEND, nxt)  # the worker keeps its item
            return
        if nxt >= 0:
            push(t + self.lag[nxt], READY, nxt)
        self.idle += 1
        push(t + self.h.gap_s, DISPATCH, -1)

    def dispatch(self, t: float, push: PushFn) -> None:
        while self.idle > 0 and (self.ready or self.heads):
            job = self.ready.popleft() if self.ready else self.heads.popleft()
            self.idle -= 1
            push(t, SEND, job)


class PushFn:
    """Schedules an event on the simulation's heap (a callable, typed for the harness)."""

    def __init__(self, heap: list[tuple[float, int, int, int]]) -> None:
        self.heap, self.seq = heap, 0

    def __call__(self, t: float, kind: int, job: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, job))


def simulate(w: Workload, model: CostModel, *, slots: int, concurrency: int | None = None,
             cap: int | None = None, seed: int | None = None) -> Simulated:
    """Replay ``w`` on a server with ``slots`` slots and the harness at ``concurrency`` (default: the run's own,
    or ``slots`` when the run's harness matched its np), each output cut at ``cap`` tokens when given; with
    ``seed``, with the runs' own noise (``Noise``)."""
    jobs = w.jobs
    conc = concurrency or (slots if w.harness.concurrency == w.np else w.harness.concurrency)
    target = jobs["target"].fill_null(0).to_numpy().astype(float)
    if cap is not None:
        target = np.minimum(target, float(cap))
    sim_mask = jobs["simulated"].to_numpy()
    steps = np.where(sim_mask, np.clip(target - 1, 0, None), 0.0)
    server = _Server(model, slots, jobs["prompt_eval"].fill_null(0).to_numpy().astype(float), steps,
                     jobs["prompt_tokens"].fill_null(0).to_numpy().astype(float), Noise(model, seed))
    harness = _Harness(w.harness, jobs, conc)
    n = jobs.height
    send, client_end = np.full(n, np.nan), np.full(n, np.nan)
    gave_up = np.zeros(n, dtype=bool)
    fixed = jobs["fixed_s"].to_numpy().astype(float)
    deadline = jobs["deadline_s"].to_numpy().astype(float)
    heap: list[tuple[float, int, int, int]] = []
    push = PushFn(heap)
    harness.start(push)
    while heap or server.next_time() < INF:
        t_srv = server.next_time()
        if t_srv < INF and (not heap or t_srv <= heap[0][0]):
            for job in server.step_to(t_srv):
                push(t_srv + w.harness.overhead_s, CLIENT_DONE, job)
            continue
        t, _, kind, job = heapq.heappop(heap)
        if kind == SEND:
            send[job] = t
            if not sim_mask[job]:
                push(t + fixed[job], CLIENT_DONE, job)
                continue
            server.arrive(job, t)
            if not math.isnan(deadline[job]):
                push(t + deadline[job], GIVE_UP, job)
        elif kind in (CLIENT_DONE, GIVE_UP):
            if not math.isnan(client_end[job]):
                continue  # ended before its deadline, or given up before its answer came
            if kind == GIVE_UP:
                server.cancel(job, t)
                gave_up[job] = True
            client_end[job] = t
            harness.done(job, t, push)
        elif kind == READY:
            harness.ready.append(job)
            harness.dispatch(t, push)
        else:
            harness.dispatch(t, push)
    return _result(w, server, send, client_end, gave_up)


def _result(w: Workload, server: _Server, send: np.ndarray, client_end: np.ndarray, gave_up: np.ndarray) -> Simulated:
    sim_mask = w.jobs["simulated"].to_numpy()
    gen = np.where(sim_mask, server.decoded, w.jobs["gen_tokens"].fill_null(0).to_numpy().astype(float))
    if w.source == "records":  # a client counts the tokens of the answers it got, not of those it gave up on
        gen = np.where(gave_up, 0.0, gen)
    if w.source == "records":
        latency = client_end - send
        wall = float(np.nanmax(client_end) - np.nanmin(send)) if send.size else 0.0
    else:  # a server log's latency is llama.cpp's own time, from the slot taking the request
        latency = server.end - server.assign
        wall = float(np.nanmax(server.end) - np.nanmin(server.assign)) if send.size else 0.0
    return Simulated(send, server.assign, server.prefill_start, server.gen_start, server.end, client_end, latency, gen, gave_up, sim_mask, wall,
                     busy_timeline(server.assign[sim_mask], server.end[sim_mask]))


def busy_timeline(starts: np.ndarray, ends: np.ndarray) -> pl.DataFrame:
    """Slots in use after each change: (t_s, busy)."""
    ok = ~np.isnan(starts) & ~np.isnan(ends)
    t = np.concatenate([starts[ok], ends[ok]])
    d = np.concatenate([np.ones(ok.sum(), dtype=np.int64), -np.ones(ok.sum(), dtype=np.int64)])
    df = pl.DataFrame({"t_s": t, "d": d}).group_by("t_s").agg(pl.col("d").sum()).filter(pl.col("d") != 0)
    return df.sort("t_s").select("t_s", pl.col("d").cum_sum().alias("busy"))

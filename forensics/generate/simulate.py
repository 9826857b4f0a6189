"""Discrete-event simulation of a replay harness driving llama-server instances.

Times are integer microseconds since the scenario start.  All randomness comes from one
``random.Random(seed)``; the simulation is deterministic for a seed.

Server model: a request (task) goes to the least recently used free slot, or waits in a FIFO queue.
Prompt processing takes ``prompt_ms_per_token`` per evaluated token; then all generating slots decode
together, one token per step, a step costing ``base + marginal × (busy − 1)`` ms.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from forensics.errors import InternalError
from forensics.generate.model import Run, Scenario, Server

# builds where behaviour changed (see the log format catalog, §10)
CTX_SHIFT_DEFAULT_OFF = 6206  # before: context shift on by default
CTX_REJECT = 6723  # from: too-long prompts are rejected (400) instead of truncated
CTX_TRAIN_LIMIT_END = 6868  # before: infinite generation stops at n_ctx_train


@dataclass
class Req:
    idx: int
    run: str
    item: str
    stage: str
    stage_idx: int
    attempt: int
    server: str
    worker: int
    t_send: int
    prompt: int
    gen_mean: int
    max_tokens: int | None
    runaway: bool = False
    context_error: bool = False
    parse_error: bool = False
    http_500: bool = False
    dead_mode: str | None = None
    state: str = "new"  # new, queued, prompt, gen, done
    slot: int | None = None
    task: int | None = None
    seq: int | None = None
    t_launch: int | None = None
    t_pdone: int | None = None
    t_end: int | None = None
    cached: int = 0
    prompt_logged: int = 0  # n_prompt_tokens after input truncation
    input_truncated: bool = False
    target: int = 0
    done: float = 0.0
    slow: float = 1.0
    gen: int = 0
    stop_reason: str = ""
    truncated: bool = False
    http_status: int | None = None
    error: str | None = None
    error_kind: str | None = None
    cancel_kind: str | None = None  # timeout or killed
    cancel_t: int | None = None  # when a cancelled request was cancelled
    prev_n_past: int = 0
    t_last_prev: int = -1
    n_past_end: int = 0
    shifts: list[tuple[int, int, int]] = field(default_factory=list)
    idle_after: bool = False
    graphs_reused: int = 0
    ctx_train_limited: bool = False

    def times(self) -> tuple[int, int, int]:
        """(t_launch, t_pdone, t_end) in µs, set once a slot has served the request to its end."""
        if self.t_launch is None or self.t_pdone is None or self.t_end is None:
            raise InternalError(f"request {self.seq} of run {self.run!r} was recorded before it was served")
        return self.t_launch, self.t_pdone, self.t_end


@dataclass
class Slot:
    id: int
    t_last: int = -1
    n_past: int = 0
    served: int = 0
    req: Req | None = None


class ServerState:
    def __init__(self, spec: Server, launch_us: int, build: int, rng: random.Random) -> None:
        self.spec = spec
        self.launch_us = launch_us
        self.build = build
        self.slots = [Slot(i) for i in range(spec.np)]
        self.queue: deque[Req] = deque()
        self.gen: list[Req] = []
        self.last_t = launch_us
        self.version = 0
        self.next_task = 0
        self.steps = 0.0
        self.rebuilds = 0
        self.rng = rng
        self.extras: list[dict[str, Any]] = []

    @property
    def ctx_shift(self) -> bool:
        return self.build < CTX_SHIFT_DEFAULT_OFF


@dataclass
class SimResult:
    requests: list[Req]
    attempts: list[dict[str, Any]]
    extras: dict[str, list[dict[str, Any]]]  # per server: events outside requests
    runs: list[dict[str, Any]]
    servers: dict[str, ServerState]


def _us(ms: float) -> int:
    """Milliseconds to microseconds, rounded to 10 µs so that logged ms with 2 decimals are exact."""
    return round(ms * 100.0) * 10


def plant_cause(r: Req, cause: str | None, spec: Server) -> None:
    """What the request a slot dies on was sent with (``DeadSlot.cause``)."""
    if cause == "uncapped":
        r.max_tokens = None
    elif cause == "full_prompt":
        r.prompt = int(0.9 * spec.n_ctx_slot)


def shifts_for(prompt: int, gen: int, n_ctx: int) -> tuple[list[tuple[int, int, int]], int]:
    """Context shifts while generating ``gen`` tokens after ``prompt``: [(gen index, n_left, n_discard)], n_past."""
    n = prompt
    remaining = max(gen - 1, 0)
    j = 0
    shifts: list[tuple[int, int, int]] = []
    while True:
        room = (n_ctx - 1) - n
        if remaining <= room:
            return shifts, n + remaining
        n += room
        remaining -= room
        j += room
        n_left = n - 1
        d = n_left // 2
        shifts.append((j, n_left, d))
        n -= d


class Simulator:
    def __init__(self, scenario: Scenario, builds: dict[str, int], seed: int) -> None:
        self.sc = scenario
        self.rng = random.Random(seed)
        self.cost = scenario.cost
        self.heap: list[tuple[int, int, str, Any, int]] = []
        self.seq = 0
        self.servers = {
            s.name: ServerState(s, _us(s.launch_s * 1000.0), builds[s.name], self.rng) for s in scenario.servers
        }
        self.requests: list[Req] = []
        self.attempts: list[dict[str, Any]] = []
        self.runs: list[dict[str, Any]] = []

    # -- event queue --------------------------------------------------------------------------------
    def push(self, t: int, kind: str, obj: Any, ver: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj, ver))

    def jit(self) -> float:
        return max(0.5, 1.0 + self.cost.jitter * self.rng.gauss(0.0, 1.0))

    # -- server -------------------------------------------------------------------------------------
    def advance(self, srv: ServerState, t: int) -> None:
        dt = t - srv.last_t
        if dt > 0 and srv.gen:
            step = self.cost.step_ms(len(srv.gen)) * 1000.0
            for r in srv.gen:
                r.done += dt / (step * r.slow)
            srv.steps += dt / step
        srv.last_t = max(srv.last_t, t)

    def recompute(self, srv: ServerState, t: int) -> None:
        srv.version += 1
        if not srv.gen:
            return
        step = self.cost.step_ms(len(srv.gen)) * 1000.0
        best = min(srv.gen, key=lambda r: ((r.target - r.done) * step * r.slow, r.idx))
        dt = max((best.target - best.done) * step * best.slow, 0.0)
        self.push(t + max(math.ceil(dt / 10.0) * 10, 10), "gdone", (srv, best), srv.version)

    def arrive(self, srv: ServerState, r: Req, t: int) -> None:
        r.task = srv.next_task
        srv.next_task += 1 + self.rng.randrange(0, 40)
        free = [s for s in srv.slots if s.req is None]
        if free and not srv.queue:
            self.launch(srv, r, t + 60)
        else:
            r.state = "queued"
            srv.queue.append(r)

    def launch(self, srv: ServerState, r: Req, t: int) -> None:
        spec = srv.spec
        free = [s for s in srv.slots if s.req is None]
        slot = min(free, key=lambda s: (s.t_last, s.id))
        slot.req = r
        slot.served += 1
        r.slot, r.seq, r.t_launch, r.state = slot.id, slot.served, t, "prompt"
        r.prev_n_past, r.t_last_prev = slot.n_past, slot.t_last
        for ds in self.sc_run_faults(r).dead_slots:
            if ds.server == srv.spec.name and ds.slot == slot.id and slot.served >= ds.from_request:
                r.dead_mode = ds.mode
                r.slow = ds.slow_factor if ds.mode == "slow" else 1.0
                if slot.served == ds.from_request:
                    plant_cause(r, ds.cause, spec)
        r.prompt_logged = r.prompt
        if r.prompt > spec.n_ctx_slot:
            if srv.build >= CTX_REJECT:
                r.stop_reason, r.http_status, r.error_kind = "error", 400, "context"
                r.error = (f"request ({r.prompt} tokens) exceeds the available context size "
                           f"({spec.n_ctx_slot} tokens), try increasing it")
                r.t_pdone = t
                self.release(srv, r, t + 70, n_past=slot.n_past)
                return
            keep, bs = 0, spec.n_ctx_slot // 2
            erased = (r.prompt - keep - bs) // bs
            r.prompt_logged = r.prompt - erased * bs
            r.input_truncated = True
        r.cached = min(self.run_of(r).shared_prefix, r.prompt_logged - 1) if slot.n_past > 0 else 0
        ms = (r.prompt_logged - r.cached) * self.cost.prompt_ms_per_token * self.jit()
        r.t_pdone = t + max(_us(ms), 10)
        self.push(r.t_pdone, "pdone", (srv, r))

    def pdone(self, srv: ServerState, r: Req, t: int) -> None:
        if r.state != "prompt":
            return
        spec = srv.spec
        if r.dead_mode == "error":
            r.stop_reason, r.http_status, r.error_kind = "error", 500, "slot_exception"
            r.error = "got exception: vector::_M_range_check: __n (which is 0) >= this->size() (which is 0)"
            self.release(srv, r, t + 110, n_past=r.prompt_logged)
            return
        ctx_room = spec.n_ctx_slot - r.prompt_logged
        cap = r.max_tokens
        if r.dead_mode == "one_token":
            target, stop = 1, "eos"
        elif r.runaway:
            if cap is not None:
                target, stop = cap, "limit"
            elif srv.ctx_shift:
                target, stop = max(spec.n_ctx_train - r.prompt_logged, 1), "limit"
                r.ctx_train_limited = True
                r.truncated = True
            else:
                target, stop = max(ctx_room, 1), "context"
                r.truncated = True
        else:
            target = max(1, round(r.gen_mean * math.exp(self.rng.gauss(0.0, 0.35))))
            stop = "eos"
            if cap is not None and target >= cap:
                target, stop = cap, "limit"
            if not srv.ctx_shift and target >= ctx_room:
                target, stop = max(ctx_room, 1), "context"
                r.truncated = True
        if r.input_truncated:
            r.truncated = True
        r.target, r.stop_reason, r.state = target, stop, "gen"
        r.slow *= self.jit()
        self.advance(srv, t)
        srv.gen.append(r)
        srv.rebuilds += 1
        self.recompute(srv, t)

    def gdone(self, srv: ServerState, r: Req, t: int, ver: int) -> None:
        if ver != srv.version or r.state != "gen":
            return
        self.advance(srv, t)
        r.gen = r.target
        r.http_status = 200
        self.release(srv, r, t, n_past=None)

    def release(self, srv: ServerState, r: Req, t: int, n_past: int | None, *, cancelled: bool = False) -> None:
        slot = srv.slots[r.slot] if r.slot is not None else None
        if r in srv.gen:
            srv.gen.remove(r)
            srv.rebuilds += 1
        r.t_end, r.state = t, "done"
        if n_past is None:
            if srv.ctx_shift:
                r.shifts, r.n_past_end = shifts_for(r.prompt_logged, r.gen, srv.spec.n_ctx_slot)
                if r.shifts:
                    r.truncated = True
            else:
                r.n_past_end = r.prompt_logged + max(r.gen - 1, 0)
        else:
            r.n_past_end = n_past
        r.graphs_reused = max(int(srv.steps) - srv.rebuilds, 0)
        if slot is not None:
            slot.req = None
            slot.t_last = t
            slot.n_past = r.n_past_end
        self.requests.append(r)
        while srv.queue and any(s.req is None for s in srv.slots):
            nxt = srv.queue.popleft()
            self.launch(srv, nxt, t + 80)
        r.idle_after = all(s.req is None for s in srv.slots) and not srv.queue
        self.recompute(srv, t)
        if not cancelled:
            self.push(t + 900 + self.rng.randrange(0, 400), "resp", r)

    def cancel(self, srv: ServerState, r: Req, t: int, kind: str) -> None:
        """The client went away: the server cancels the task (no timings are printed)."""
        r.cancel_kind = kind
        srv.next_task += 1  # the cancel task takes an id
        if r.state == "queued":
            srv.queue.remove(r)
            srv.extras.append({"t": t, "kind": "cancel", "task": r.task})
            r.state = "done"
            return
        if r.state == "gen":
            self.advance(srv, t)
            r.gen = max(int(r.done), 0)
        r.stop_reason, r.truncated = "cancelled", r.input_truncated
        r.http_status = 200
        r.cancel_t = t
        self.release(srv, r, t + 410, n_past=None if r.gen > 0 else r.prompt_logged, cancelled=True)

    # -- client -------------------------------------------------------------------------------------
    def run_of(self, r: Req) -> Run:
        return self._runs[r.run]

    def sc_run_faults(self, r: Req):
        return self._runs[r.run].faults

    def simulate(self) -> SimResult:
        self._runs = {run.run_id: run for run in self.sc.runs}
        t_free = 0
        for run in self.sc.runs:
            t0 = max(_us(run.start_s * 1000.0), t_free)
            t_free = self.simulate_run(run, t0) + 5_000_000
        return SimResult(self.requests, self.attempts, {n: s.extras for n, s in self.servers.items()},
                         self.runs, self.servers)

    def simulate_run(self, run: Run, t0: int) -> int:
        """Drive ``run`` from ``t0`` until the event queue is empty; returns when its last attempt ended."""
        f = run.faults
        client = _RunClient(self, run, t0)
        if f.watchdog_s is not None:
            self.push(t0 + _us(f.watchdog_s * 1000.0), "kill", run.run_id)
        for w in range(run.concurrency):
            client.next_job(w, t0 + w * 20_000 + self.rng.randrange(0, 5000))
        while self.heap:
            t, _, kind, obj, ver = heapq.heappop(self.heap)
            client.handle(kind, obj, t, ver)
        killed, t_last = client.killed, client.t_last
        self.runs.append({
            "run": run, "t_start": t0, "t_end": t_last, "ended_how": "killed" if killed else "completed",
            "ended_detail": (f"killed by a watchdog after {f.watchdog_s:g} s" if killed else "all items processed"),
            "after_s": (t_last - t0) / 1e6,
        })
        return t_last


HTTP_500_ERROR = 'HTTP 500: {"error":{"code":500,"message":"Failed to parse messages","type":"server_error"}}'


class _RunClient:
    """The replay harness of one run: each worker takes an item, sends its stages in turn, retries a failed
    attempt up to ``max_attempts`` and takes the next item; a watchdog kill stops everything in flight."""

    def __init__(self, sim: Simulator, run: Run, t0: int) -> None:
        self.sim, self.run, self.rng = sim, run, sim.rng
        self.todo = deque(run.items)
        self.runaway = set(run.faults.runaways)
        self.ctx_err = set(run.faults.context_errors)
        self.inflight: dict[int, Req] = {}
        self.state: dict[int, list[Any]] = {}  # worker -> [item, stage_idx, attempt]
        self.n_req = len(sim.attempts)
        self.killed = False
        self.t_last = t0

    def send(self, w: int, t: int) -> None:
        run, f, rng, sim = self.run, self.run.faults, self.rng, self.sim
        item, si, att = self.state[w]
        stage = run.stages[si]
        srv_name = run.servers[(att - 1) % len(run.servers)]
        pm = run.prompt_tokens[si % len(run.prompt_tokens)]
        r = Req(idx=self.n_req, run=run.run_id, item=item, stage=stage, stage_idx=si, attempt=att, server=srv_name,
                worker=w, t_send=t, prompt=max(8, round(pm * math.exp(rng.gauss(0.0, 0.15)))),
                gen_mean=run.gen_tokens[si % len(run.gen_tokens)], max_tokens=run.max_tokens)
        self.n_req += 1
        r.runaway = (item, stage) in self.runaway or (f.runaway_rate > 0 and rng.random() < f.runaway_rate)
        r.context_error = ((item, stage) in self.ctx_err
                           or (f.context_error_rate > 0 and rng.random() < f.context_error_rate))
        if r.context_error:
            r.prompt = sim.sc.server(srv_name).n_ctx_slot + 200 + rng.randrange(0, 2000)
        r.parse_error = f.parse_error_rate > 0 and rng.random() < f.parse_error_rate
        r.http_500 = f.http_500_rate > 0 and rng.random() < f.http_500_rate
        self.inflight[w] = r
        sim.push(t, "send", r)
        sim.push(t + _us(run.timeout_s * 1000.0), "timeout", r)

    def next_job(self, w: int, t: int) -> None:
        if self.killed:
            return
        if self.todo:
            self.state[w] = [self.todo.popleft(), 0, 1]
            self.send(w, t)

    def record_attempt(self, r: Req, t: int, outcome: str, status: int | None, error: str | None) -> None:
        """The harness's line for one HTTP request (attempts.jsonl)."""
        responded = status is not None and r.slot is not None and r.state == "done" and r.cancel_kind is None
        has_timings = responded and status == 200
        self.sim.attempts.append({
            "run_id": r.run, "item": r.item, "stage": r.stage, "attempt": r.attempt, "server": r.server,
            "t_send": r.t_send, "t_end": t, "http_status": status, "error": error, "outcome": outcome,
            "id_slot": r.slot if responded else None,
            "tokens_evaluated": r.prompt_logged if has_timings else None,
            "tokens_predicted": r.gen if has_timings else None,
            "stop_type": ({"context": "limit"}.get(r.stop_reason, r.stop_reason) if has_timings else None),
            "truncated": r.truncated if has_timings else None,
            "prompt_n": (r.prompt_logged - r.cached) if has_timings else None,
            "prompt_ms": ((r.times()[1] - r.times()[0]) / 1000.0) if has_timings else None,
            "predicted_n": r.gen if has_timings else None,
            "predicted_ms": ((r.times()[2] - r.times()[1]) / 1000.0) if has_timings else None,
            "output_chars": int(r.gen * 3.7) if has_timings else None,
            "max_tokens": r.max_tokens,
        })

    def finish_attempt(self, r: Req, t: int, outcome: str, status: int | None, error: str | None) -> None:
        """Record the attempt, then the worker moves on: next stage, a retry, or the next item."""
        run = self.run
        self.inflight.pop(r.worker, None)
        self.t_last = max(self.t_last, t)
        self.record_attempt(r, t, outcome, status, error)
        w = r.worker
        if self.killed:
            return
        item, si, att = self.state[w]
        gap = _us(self.sim.cost.client_gap_ms * self.sim.jit())
        if outcome == "ok":
            if si + 1 < len(run.stages):
                self.state[w] = [item, si + 1, 1]
                self.send(w, t + gap)
            else:
                self.next_job(w, t + gap)
        elif att < run.max_attempts:
            self.state[w] = [item, si, att + 1]
            self.send(w, t + gap + _us(run.retry_backoff_s * 1000.0))
        else:
            self.next_job(w, t + gap)

    def handle(self, kind: str, obj: Any, t: int, ver: int) -> None:
        """One event from the simulator's queue."""
        if kind == "send":
            self.on_send(obj, t)
        elif kind == "pdone":
            self.sim.pdone(obj[0], obj[1], t)
        elif kind == "gdone":
            self.sim.gdone(obj[0], obj[1], t, ver)
        elif kind == "resp":
            self.on_response(obj, t)
        elif kind == "timeout":
            self.on_timeout(obj, t)
        elif kind == "kill":
            self.on_kill(t)

    def on_send(self, r: Req, t: int) -> None:
        if self.killed:
            return
        srv = self.sim.servers[r.server]
        if r.http_500:
            srv.extras.append({"t": t + 1500, "kind": "exception", "status": 500})
            r.state = "done"
            self.finish_attempt(r, t + 2500, "failed", 500, HTTP_500_ERROR)
        else:
            self.sim.arrive(srv, r, t)

    def on_response(self, r: Req, t: int) -> None:
        if self.killed or self.inflight.get(r.worker) is not r:
            return
        if r.http_status != 200:
            self.finish_attempt(r, t, "failed", r.http_status, f"HTTP {r.http_status}: {r.error}")
        elif r.runaway or r.dead_mode == "one_token" or r.parse_error:
            self.finish_attempt(r, t, "parse_error", 200, "output is not valid JSON")
        else:
            self.finish_attempt(r, t, "ok", 200, None)

    def on_timeout(self, r: Req, t: int) -> None:
        if self.killed or self.inflight.get(r.worker) is not r or r.state == "done":
            return
        self.sim.cancel(self.sim.servers[r.server], r, t, "timeout")
        self.finish_attempt(r, t, "timeout", None, f"timed out after {self.run.timeout_s:g} s")

    def on_kill(self, t: int) -> None:
        if not self.inflight and not self.todo:
            return
        self.killed = True
        for r in list(self.inflight.values()):
            if r.state != "done":
                self.sim.cancel(self.sim.servers[r.server], r, t, "killed")
            self.finish_attempt(r, t, "cancelled", None, "harness killed by the watchdog")
        self.t_last = t

"""Scenario description: llama-server instances, a replay harness driving them, a cost model and faults.

Everything here is plain data (dataclasses); ``simulate`` turns a scenario into requests and attempts,
``writers`` turns those into log files in one llama-server generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone


@dataclass(frozen=True)
class Server:
    """One llama-server process (one log file)."""

    name: str
    port: int = 8080
    np: int = 4
    n_ctx_slot: int = 8192
    host: str = "127.0.0.1"
    n_ctx: int | None = None  # whole-server context; default np * n_ctx_slot
    n_ctx_train: int = 40960
    build: int | None = None  # None: the build of the chosen log format
    model: str = "/models/Qwen3-30B-A3B-Q4_K_M.gguf"
    launch_s: float = 0.0  # launch time, seconds after the scenario start
    n_batch: int = 2048

    @property
    def total_ctx(self) -> int:
        return self.n_ctx if self.n_ctx is not None else self.np * self.n_ctx_slot


@dataclass(frozen=True)
class CostModel:
    """Prompt time ∝ prompt tokens; one decode step costs base + marginal × (busy slots − 1) ms.

    With ``gen_ms_marginal`` > 0 aggregate throughput plateaus (MoE-like): busy / (base + m·(busy−1)).
    """

    prompt_ms_per_token: float = 0.30
    gen_ms_base: float = 22.0
    gen_ms_marginal: float = 6.0
    jitter: float = 0.04  # relative noise on each request's durations
    client_gap_ms: float = 15.0  # client think time between requests of one worker

    def step_ms(self, busy: int) -> float:
        return self.gen_ms_base + self.gen_ms_marginal * max(busy - 1, 0)


@dataclass(frozen=True)
class DeadSlot:
    """From the ``from_request``-th request on ``slot`` of ``server`` on, every request there goes bad.

    mode: ``slow`` (runs abnormally long, the client times out and cancels), ``one_token`` (1 token; the
    client cannot parse it), ``error`` (an exception in the slot, HTTP 500).

    cause: what the request it dies on was sent with (a planted cause, for the incidents' precursors):
    ``uncapped`` (no output cap), ``full_prompt`` (a prompt of 90 % of the slot's context), or None.
    """

    server: str
    slot: int
    from_request: int = 3
    mode: str = "slow"
    slow_factor: float = 40.0
    cause: str | None = None


@dataclass(frozen=True)
class Faults:
    runaways: tuple[tuple[str, str], ...] = ()  # (item, stage) pairs that never stop by themselves
    runaway_rate: float = 0.0  # probability that any request runs away
    dead_slots: tuple[DeadSlot, ...] = ()
    http_500_rate: float = 0.0  # handler exceptions (no task, no slot)
    context_errors: tuple[tuple[str, str], ...] = ()  # (item, stage) whose prompt exceeds the slot context
    context_error_rate: float = 0.0
    parse_error_rate: float = 0.0  # server fine, client cannot parse the output
    watchdog_s: float | None = None  # the harness is killed after this many seconds


@dataclass(frozen=True)
class Run:
    """One harness run: items × stages at client concurrency ``concurrency``."""

    run_id: str
    servers: tuple[str, ...]  # main first; retries go to the next one (backup)
    items: tuple[str, ...]
    stages: tuple[str, ...] = ("extract", "score")
    concurrency: int = 4
    start_s: float = 5.0  # seconds after the scenario start (runs are simulated one after another)
    max_tokens: int | None = None  # the output cap the harness asks for (None = no cap)
    prompt_tokens: tuple[int, ...] = (900, 1400)  # mean prompt tokens per stage (cycled)
    gen_tokens: tuple[int, ...] = (180, 320)  # mean generated tokens per stage (cycled)
    shared_prefix: int = 2  # prompt tokens reusable from a slot's previous prompt
    max_attempts: int = 2
    timeout_s: float = 300.0
    retry_backoff_s: float = 1.0
    http_path: str = "/completion"
    faults: Faults = field(default_factory=Faults)
    config: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    name: str
    servers: tuple[Server, ...]
    runs: tuple[Run, ...]
    cost: CostModel = field(default_factory=CostModel)
    started_at: datetime = datetime(2026, 8, 23, 10, 0, 0, tzinfo=timezone.utc)
    hostname: str = "gpu-node-1"

    def server(self, name: str) -> Server:
        for s in self.servers:
            if s.name == name:
                return s
        raise KeyError(name)


TICKERS = (
    "AAPL", "MSFT", "NVDA", "AMZN", "GOOGL", "META", "TSLA", "AVGO", "JPM", "V", "UNH", "XOM", "MA", "HD",
    "PG", "COST", "JNJ", "ABBV", "WMT", "NFLX", "CRM", "BAC", "KO", "ORCL", "CVX", "MRK", "AMD", "PEP",
    "TMO", "LIN", "ADBE", "ACN", "MCD", "CSCO", "ABT", "WFC", "DHR", "TXN", "QCOM", "INTU",
)


def tickers(n: int) -> tuple[str, ...]:
    """``n`` item names: real tickers first, then synthetic ones (T0040, T0041, ...)."""
    base = list(TICKERS[:n])
    base += [f"T{i:04d}" for i in range(len(base), n)]
    return tuple(base)

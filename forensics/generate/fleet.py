"""A small fleet to try the fleet reading on: three hosts, two runs each, under the same run names.

gpu-a: run-1 has a dead slot (slot 1 of main runs abnormally slow from its 3rd request; retries go to backup),
       run-2 is healthy at np 2.
gpu-b: run-1 has two outputs that never stop (no cap), run-2 has HTTP 500s and prompts over the context.
gpu-c: run-1 has a slot whose requests fail with the same error, run-2 is killed by a watchdog.

Each host's logs are written into ``OUT/<host>/logs`` and can be ingested into ``OUT/<host>/forensics-store``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from forensics.generate.api import generate
from forensics.generate.model import DeadSlot, Faults, Run, Scenario, Server, tickers

FLEET_HOSTS = ("gpu-a", "gpu-b", "gpu-c")


def _host_a(items: tuple[str, ...]) -> Scenario:
    servers = (Server(name="main", np=4), Server(name="backup", port=8081, np=2),
               Server(name="main-np2", port=8082, np=2, n_ctx_slot=4096, launch_s=400.0))
    runs = (Run(run_id="run-1", servers=("main", "backup"), items=tickers(2 * len(items)), concurrency=4,
                timeout_s=50.0, faults=Faults(dead_slots=(DeadSlot("main", slot=1, from_request=2, mode="slow",
                                                                    slow_factor=5.0),))),
            Run(run_id="run-2", servers=("main-np2",), items=items, concurrency=2, start_s=405.0))
    return Scenario(name="fleet-a", servers=servers, runs=runs, hostname="gpu-a")


def _host_b(items: tuple[str, ...]) -> Scenario:
    servers = (Server(name="main", np=2, n_ctx_slot=4096), Server(name="main-np4", port=8082, np=4, launch_s=400.0))
    runs = (Run(run_id="run-1", servers=("main",), items=items, concurrency=2, timeout_s=600.0,
                faults=Faults(runaways=((items[2], "extract"), (items[7], "score")))),
            Run(run_id="run-2", servers=("main-np4",), items=items, concurrency=4, start_s=405.0,
                faults=Faults(http_500_rate=0.08, context_errors=((items[4], "score"),))))
    return Scenario(name="fleet-b", servers=servers, runs=runs, hostname="gpu-b")


def _host_c(items: tuple[str, ...]) -> Scenario:
    servers = (Server(name="main", np=4), Server(name="main-np8", port=8082, np=8, launch_s=400.0))
    runs = (Run(run_id="run-1", servers=("main",), items=items, concurrency=4, timeout_s=20.0,
                faults=Faults(dead_slots=(DeadSlot("main", 2, 3, mode="error"),))),
            Run(run_id="run-2", servers=("main-np8",), items=items, concurrency=8, start_s=405.0,
                faults=Faults(watchdog_s=8.0)))
    return Scenario(name="fleet-c", servers=servers, runs=runs, hostname="gpu-c")


def fleet_scenarios(n_items: int = 16) -> dict[str, Scenario]:
    """The three hosts' scenarios, by host; each host's clock starts an hour after the previous one's."""
    items = tickers(n_items)
    start = datetime(2026, 8, 23, 10, 0, 0, tzinfo=timezone.utc)
    out = {}
    for i, (host, make) in enumerate(zip(FLEET_HOSTS, (_host_a, _host_b, _host_c), strict=True)):
        sc = make(items)
        out[host] = Scenario(name=sc.name, servers=sc.servers, runs=sc.runs, cost=sc.cost,
                             started_at=start.replace(hour=10 + i), hostname=host)
    return out


def fleet_host(host: str) -> Scenario:
    """One host's scenario (``forensics generate DIR --scenario fleet-gpu-a``)."""
    return fleet_scenarios()[host]


FLEET_SCENARIOS = {f"fleet-{h}": (lambda h=h: fleet_host(h)) for h in FLEET_HOSTS}


def generate_fleet(out_dir: str | Path, *, n_items: int = 16, seed: int = 0) -> dict[str, Path]:
    """Write each host's logs and records under ``out_dir/<host>``; returns host -> its logs folder."""
    out = Path(out_dir)
    logs = {}
    for host, scenario in fleet_scenarios(n_items).items():
        generate(scenario, out / host, seed=seed)  # as `forensics generate DIR --scenario fleet-HOST` writes it
        logs[host] = out / host / "logs"
    return logs

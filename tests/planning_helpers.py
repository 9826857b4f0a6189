"""Generated sweeps for the planning tests: the same workload at np 1, 2, 4 and 8 on one MoE-like server (the
generator's cost model: a decode step of 20 ms + 7 ms per extra slot decoding, 0.25 ms per prompt token), and a
run with runaways at np 4 with its rerun under an output cap.

These prove the pipeline end to end (records, logs, the join, the fit, the replay); the real sweeps in
``fixtures/`` prove the model (``real_store`` ingests them).
"""

from __future__ import annotations

from pathlib import Path

from forensics.generate import generate
from forensics.generate.model import CostModel, Faults, Run, Scenario, Server, tickers
from forensics.ingest import IngestOptions, ingest
from forensics.store import Store
from tests.conftest import ROOT

SWEEP_NPS = (1, 2, 4, 8)
REAL_RUNS = ROOT / "fixtures" / "server-runs"  # the real llama-server run folders
COST = CostModel(prompt_ms_per_token=0.25, gen_ms_base=20.0, gen_ms_marginal=7.0)
RUNAWAY_CAP = 1024


def sweep_scenario(nps: tuple[int, ...] = SWEEP_NPS, *, runaways: bool = True) -> Scenario:
    """sweep-npN: 24 items x 2 stages at client concurrency N on a server with N slots; with ``runaways``, also
    runaway-np4 (two outputs that never stop by themselves, no cap) and capped-np4 (the same with a cap)."""
    items = tickers(24)
    servers: list[Server] = []
    runs: list[Run] = []
    t = 0.0
    plan = [(f"sweep-np{n}", n, Faults(), None) for n in nps]
    if runaways:
        bad = Faults(runaways=((items[3], "extract"), (items[14], "score")))
        plan += [("runaway-np4", 4, bad, None), ("capped-np4", 4, bad, RUNAWAY_CAP)]
    for rid, n, faults, cap in plan:
        servers.append(Server(name=f"main-{rid}", np=n, n_ctx_slot=4096, launch_s=t))
        runs.append(Run(run_id=rid, servers=(f"main-{rid}",), items=items, concurrency=n, start_s=t + 5.0,
                        timeout_s=600.0, max_tokens=cap, faults=faults,
                        config={"sweep": "planning", "np": n}))
        t += 2000.0
    return Scenario(name="planning", servers=tuple(servers), runs=tuple(runs), cost=COST)


def build_store(out: Path, scenario: Scenario, *, skip: tuple[str, ...] = (), seed: int = 11) -> Store:
    """Generate ``scenario`` into ``out`` and ingest every run folder but ``skip`` into ``out/store``."""
    gen = generate(scenario, out, fmt="era5", seed=seed)
    folders = sorted({p.parent for p in gen.logs} | {p.parent for p in gen.manifests})
    keep = [f for f in folders if f.name not in skip]
    ingest(out / "store", keep, IngestOptions(keep_going=True))
    return Store(out / "store")


def real_store(root: Path, folders: list[str]) -> Store:
    """The real run ``folders`` of fixtures/server-runs ingested into one store under ``root``."""
    ingest(root / "store", [REAL_RUNS / f for f in folders], IngestOptions(keep_going=True))
    return Store(root / "store")

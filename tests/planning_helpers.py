"""Generated sweeps for the planning tests: the same workload at np 1, 2, 4 and 8 on one MoE-like server (the
generator's cost model: a decode step of 20 ms + 7 ms per extra slot decoding, 0.25 ms per prompt token), and a
run with runaways at np 4 with its rerun under an output cap; and a sweep of a mixture-of-experts model on a GPU
whose throughput rises to np 8 and then stays flat (``plateau_scenario``: the ground truth of the knee).

These prove the pipeline end to end (records, logs, the join, the fit, the replay); the real sweeps in
``fixtures/`` prove the model (``real_store`` ingests them).
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class PlateauCost(CostModel):
    """A mixture-of-experts model on a GPU: up to ``knee`` slots a decode step costs ``gen_ms_base`` +
    ``gen_ms_marginal`` per extra slot (the weights are read once for the whole batch); past the knee each extra
    slot reads more experts and the step grows in proportion to the slots decoding, so throughput (slots / step)
    stays flat: ``step(b) = step(knee) × b / knee``."""

    knee: int = 8

    def step_ms(self, busy: int) -> float:
        b = max(busy, 1)
        below = self.gen_ms_base + self.gen_ms_marginal * (min(b, self.knee) - 1)
        return below * b / self.knee if b > self.knee else below


PLATEAU = PlateauCost(prompt_ms_per_token=0.05, gen_ms_base=9.0, gen_ms_marginal=0.3, jitter=0.04)
PLATEAU_NPS = (1, 2, 4, 6, 8, 12, 16)


def plateau_scenario(nps: tuple[int, ...] = PLATEAU_NPS) -> Scenario:
    """moe-npN: 48 items x 2 stages at client concurrency N on a server with N slots, costs ``PLATEAU``: a step
    of 9 ms + 0.3 ms per extra slot up to 8 slots (11.1 ms), then 11.1 ms x slots / 8."""
    items = tickers(48)
    servers: list[Server] = []
    runs: list[Run] = []
    for k, n in enumerate(nps):
        rid = f"moe-np{n}"
        servers.append(Server(name=f"main-{rid}", np=n, n_ctx_slot=8192, launch_s=3000.0 * k))
        runs.append(Run(run_id=rid, servers=(f"main-{rid}",), items=items, concurrency=n, start_s=3000.0 * k + 5.0,
                        timeout_s=600.0, config={"sweep": "moe", "np": n}))
    return Scenario(name="moe", servers=tuple(servers), runs=tuple(runs), cost=PLATEAU)


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


def held_out(p: object, runs: dict[int, str], np_: int) -> tuple[dict[str, float], dict[str, float]]:
    """np ``np_`` predicted by a model fitted on the other np of ``runs`` (np -> run) of planner ``p``: (recommend's
    figures, the median of the other runs' workloads each at its own speed; whatif's, from the measured np just
    below, its own workload at its own speed)."""
    import dataclasses

    from forensics.planning import costmodel, predict, recommendation

    assert isinstance(p, predict.Planner)
    others = [r for n, r in runs.items() if n != np_]
    q = dataclasses.replace(p, model=costmodel.fit([p.workload(r) for r in others]), _speeds={})
    median = {f: v[0] for f, v in recommendation._predicted(q, np_, others, None).items()}
    below = [n for n in runs if n < np_]
    return median, q.predict(runs[max(below)], np_)[0] if below else median

"""Ready-made scenarios: the demo (np 1..8 with a plateau and every fault), and small focused ones."""

from __future__ import annotations

from forensics.generate.model import CostModel, DeadSlot, Faults, Run, Scenario, Server, tickers


def demo_scenarios() -> Scenario:
    """Runs at np 1..8 on a MoE-like model (throughput flattens past np≈4), with a dead slot, a runaway,
    missing items (a watchdog kill and a run that gives up on an item) and a main and a backup instance."""
    items = tickers(24)
    servers: list[Server] = []
    runs: list[Run] = []
    t = 0.0
    for np_ in range(1, 9):
        rid = f"run-np{np_}"
        servers.append(Server(name=f"main-np{np_}", port=8080, np=np_, n_ctx_slot=8192, launch_s=t))
        faults = Faults()
        srv_names: tuple[str, ...] = (f"main-np{np_}",)
        if np_ == 4:  # a runaway (no cap: it fills the slot's context) and a context-size error
            faults = Faults(runaways=((items[5], "score"),), context_errors=((items[9], "extract"),))
        if np_ == 6:  # a dead slot on main; retries go to the backup instance
            servers.append(Server(name="backup", port=8081, np=2, n_ctx_slot=8192, launch_s=t))
            srv_names = (f"main-np{np_}", "backup")
            faults = Faults(dead_slots=(DeadSlot(server=f"main-np{np_}", slot=2, from_request=2, mode="slow",
                                                 slow_factor=5.0),),
                            runaways=((items[20], "extract"),), parse_error_rate=0.02)
        if np_ == 8:  # the harness is killed by a watchdog: items at the end are never attempted
            faults = Faults(watchdog_s=70.0)
        run_items = tickers(48) if np_ == 6 else items  # long enough for the dead slot to show its pattern
        runs.append(Run(run_id=rid, servers=srv_names, items=run_items, concurrency=np_, start_s=t + 5.0,
                        timeout_s=120.0, faults=faults, config={"harness": "replay", "np": np_}))
        t += 600.0
    return Scenario(name="demo", servers=tuple(servers), runs=tuple(runs),
                    cost=CostModel(prompt_ms_per_token=0.25, gen_ms_base=20.0, gen_ms_marginal=7.0))


def healthy() -> Scenario:
    return Scenario(name="healthy", servers=(Server(name="main", np=4),),
                    runs=(Run(run_id="run-healthy", servers=("main",), items=tickers(24), concurrency=4),))


def deadslot() -> Scenario:
    return Scenario(name="deadslot", servers=(Server(name="main", np=4), Server(name="backup", port=8081, np=2)),
                    runs=(Run(run_id="run-deadslot", servers=("main", "backup"), items=tickers(24), concurrency=4,
                              timeout_s=90.0,
                              faults=Faults(dead_slots=(DeadSlot("main", slot=1, from_request=3, mode="slow"),))),))


def runaway() -> Scenario:
    items = tickers(16)
    return Scenario(name="runaway", servers=(Server(name="main", np=2, n_ctx_slot=4096),),
                    runs=(Run(run_id="run-runaway", servers=("main",), items=items, concurrency=2, timeout_s=600.0,
                              faults=Faults(runaways=((items[3], "extract"), (items[10], "score")))),))


def errors() -> Scenario:
    return Scenario(name="errors", servers=(Server(name="main", np=2),),
                    runs=(Run(run_id="run-errors", servers=("main",), items=tickers(16), concurrency=2, timeout_s=20.0,
                              faults=Faults(http_500_rate=0.05, context_error_rate=0.05,
                                            dead_slots=(DeadSlot("main", 1, 4, mode="error"),))),))


def bench() -> Scenario:
    """One long-lived np 8 server, busy, few faults: the shape of a week of production logs."""
    return Scenario(name="bench", servers=(Server(name="main", np=8, n_ctx_slot=16384),),
                    runs=(Run(run_id="bench", servers=("main",), items=tickers(400), concurrency=8,
                              max_tokens=1024, gen_tokens=(150, 260), timeout_s=600.0,
                              faults=Faults(runaway_rate=0.002, http_500_rate=0.001, context_error_rate=0.001)),))


SCENARIOS = {"demo": demo_scenarios, "healthy": healthy, "deadslot": deadslot, "runaway": runaway, "errors": errors,
             "bench": bench}

"""Scenario generator: simulated llama-server instances serving a replay harness, written as real-looking logs.

    from forensics.generate import generate, demo_scenarios
    result = generate(demo_scenarios(), "out", fmt="era5", seed=0)
"""

from __future__ import annotations

from forensics.generate.api import TRUTH_COLUMNS, GeneratedRun, Repeat, generate, parse_size
from forensics.generate.fleet import FLEET_SCENARIOS
from forensics.generate.model import CostModel, DeadSlot, Faults, Run, Scenario, Server, tickers
from forensics.generate.presets import SCENARIOS, bench, deadslot, demo_scenarios, errors, healthy, runaway
from forensics.generate.writers import ERAS, WRAPPERS

SCENARIOS = {**SCENARIOS, **FLEET_SCENARIOS}

FORMATS = tuple(ERAS)

__all__ = [
    "FORMATS", "SCENARIOS", "TRUTH_COLUMNS", "WRAPPERS", "CostModel", "DeadSlot", "Faults", "GeneratedRun", "Repeat", "Run",
    "Scenario", "Server", "bench", "deadslot", "demo_scenarios", "errors", "generate", "healthy", "parse_size",
    "runaway", "tickers",
]

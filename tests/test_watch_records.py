"""Watch over a replay harness's folder (server logs, run manifest, attempts): the alerts name the item and stage
through the join, and they are exactly the findings `forensics runaways` and `forensics deadslots` list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from forensics import findings
from forensics.generate import generate
from forensics.generate.presets import SCENARIOS
from forensics.store import Store
from forensics.watch import WatchOptions, watch


@pytest.mark.parametrize("scenario", ["runaway", "deadslot"])
def test_alerts_are_the_findings_with_their_items(tmp_path: Path, scenario: str) -> None:
    generate(SCENARIOS[scenario](), tmp_path / "gen")
    alerts: list[dict[str, Any]] = []
    notes: list[str] = []
    summary = watch(WatchOptions(paths=[tmp_path / "gen" / "logs"], store=tmp_path / "store", backlog=True, once=True),
                    on_alert=alerts.append, note=notes.append)
    store = Store(tmp_path / "store")
    runaways = findings.find_runaways(store)
    dead = findings.find_dead_slots(store)
    assert (runaways if scenario == "runaway" else dead).height > 0
    got = sorted((a["kind"], a["run"], a["instance"], a["slot"], a["seq"], a["task"]) for a in alerts)
    want = sorted([("runaway", r["run"], r["instance"], r["slot"], r["seq"], r["task"])
                   for r in runaways.iter_rows(named=True)]
                  + [("dead_slot", r["run"], r["instance"], r["slot"], r["seq"], r["task"])
                     for r in dead.iter_rows(named=True)])
    assert got == want, notes
    assert all(a["status"] == "confirmed" and a["port"] is not None for a in alerts)
    by_task = {(r["run"], r["instance"], r["slot"], r["task"]): r for r in runaways.iter_rows(named=True)}
    for a in alerts:
        if a["kind"] == "runaway":
            row = by_task[(a["run"], a["instance"], a["slot"], a["task"])]
            assert (a["item"], a["stage"]) == (row["item"], row["stage"]) and a["item"] is not None
    assert summary.raised == len(alerts)

"""Which runs are comparable: the one rule, read by every comparison (throughput across runs, the knee, the
report, the charts, the notebook, what-if and recommend).

Runs are comparable when they measured one setup (``run_setup.sql``, worked out once per run by the analysis and
stored in ``run_facts``: build, model, the server's context, context shift, host, the workload's stages and caps;
in a fleet, the store too) and the server was healthy while they ran (no finding that breaks a measurement: a dead
slot, a crash, runaways, a KV-cache stall, a failover, a run that did not complete).  Runs of different setups are
never pooled and never refused: a comparison gives one answer per setup (``groups``), and says which runs each
figure comes from and which were left out, with why.

Library only: no click, no altair.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from forensics import derived, registry
from forensics import runs as runs_mod
from forensics.fleet import HOST_SEP, members_of
from forensics.session import DEFAULTS, VERSION, Analysis, read_derived
from forensics.store import Store
from forensics.verdict import verdict, verdict_frame


@dataclass
class SetupGroup:
    """The runs of one setup a comparison pools, and those of the setup it left out (run -> why)."""

    key: str
    label: str
    runs: list[str]
    basis: str  # how the runs were chosen, in words
    left_out: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """What to tell the user about the pool: the setup, the runs, and each run left out with why."""
        out = [f"setup {self.label}: {self.basis}: {', '.join(self.runs) or 'none'}"]
        out += [f"left out {run} (it measures a broken server): {why}" for run, why in self.left_out.items()]
        return out


def broken_kinds(keep: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The findings that make a run measure a broken server (the registry's ``breaks_throughput``), less ``keep``."""
    return tuple(f.name for f in registry.findings(breaks_throughput=True) if f.name not in keep)


def _current(store: Store, runs: list[str]) -> bool:
    return not derived.state(store).needs(runs, VERSION)


SETUP_COLUMNS = ("run", "setup_key", "setup", "np")


def setups(store: Store, runs: list[str] | None = None, *, columns: tuple[str, ...] = SETUP_COLUMNS) -> pl.DataFrame:
    """Each run's setup (``run_facts``, else worked out by ``run_setup.sql``): run, setup_key, setup (a label), np
    (and any other of ``run_setup``'s ``columns``); in a fleet the key and the label carry the run's store."""
    names = runs_mod.resolve(store, runs).runs
    if _current(store, names):
        facts = read_derived(store, "run_facts", names).select(*columns)
    else:
        with Analysis.open(store, names, stored=False) as s:
            s.prepare(names, requests=False)
            s.bind(["runs", "attempts"])  # run_setup reads the manifest and the harness's caps
            facts = s.query("run_setup", DEFAULTS, names).select(*columns)
    if not any(host for host, _ in members_of(store)):
        return facts
    host = pl.col("run").str.split(HOST_SEP).list.first()
    return facts.with_columns((host + "/" + pl.col("setup_key")).alias("setup_key"),
                              (host + " · " + pl.col("setup")).alias("setup"))


def broken(store: Store, runs: list[str], keep: tuple[str, ...] = ()) -> dict[str, str]:
    """run -> the verdict's sentences that say its server was broken (findings of ``broken_kinds``)."""
    if not runs:
        return {}
    if _current(store, runs):
        facts = read_derived(store, "verdict_facts", runs)
    else:
        facts = verdict_frame(verdict(store, runs))  # the same rows the analysis stores
    facts = facts.filter(
        pl.col("kind").is_in(list(broken_kinds(keep))) & (pl.col("severity") == "finding"))
    return {run: " ".join(g.sort("n")["sentence"].to_list())
            for (run,), g in facts.group_by(["run"], maintain_order=True)}


def groups(store: Store, runs: list[str] | None = None, *, keep: tuple[str, ...] = (),
           healthy: bool = True) -> list[SetupGroup]:
    """The comparable runs for ``runs``, one group per setup: no run named, every run of the store; one run, the
    runs of its setup (its sweep); several, those.  With ``healthy``, the runs whose server was broken (findings of
    ``broken_kinds`` less ``keep``) are left out of each group, with why."""
    known = runs_mod.resolve(store, runs).runs
    every = setups(store)
    if len(known) == 1 and runs:
        key = every.filter(pl.col("run") == known[0])["setup_key"].to_list()
        pool = every.filter(pl.col("setup_key").is_in(key))
        basis = "the runs of its setup"
    else:
        pool = every.filter(pl.col("run").is_in(known))
        basis = "the runs named" if runs else "every run of the store"
    bad = broken(store, pool["run"].to_list(), keep) if healthy else {}
    out = []
    for (key, label), g in pool.sort("np", "run", nulls_last=True).group_by(["setup_key", "setup"],
                                                                            maintain_order=True):
        names = g["run"].to_list()
        out.append(SetupGroup(str(key), str(label), [r for r in names if r not in bad], basis,
                              {r: bad[r] for r in names if r in bad}))
    return sorted(out, key=lambda grp: (-len(grp.runs), grp.label))

"""Throughput across runs: which runs one fit pools, and the fit.

Every place that fits throughput against np (``forensics throughput --by``, the report, the throughput chart,
the notebook) calls ``throughput_fit``, so they pool the same runs: the comparable ones
(``metrics.comparable_runs``: the runs named, one run's sweep, or every run when they share one setup), less
those whose verdict has a finding that breaks a throughput measurement (the registry's ``breaks_throughput``: a
dead slot, a crash, runaways, a KV-cache stall, a failover, a run that did not complete), each named with its
verdict's sentences.

Library only: no click, no altair.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from forensics import metrics
from forensics.metrics import Comparable, Scaling
from forensics.store import Store
from forensics.verdict import RunVerdict, comparable_healthy_runs


@dataclass
class ThroughputFit:
    comparable: Comparable  # the runs pooled, how they were chosen, and those left out with why
    metrics: pl.DataFrame  # metrics.throughput of the pooled runs
    scaling: Scaling | None  # the table against ``by``, the fit and the knee (None: no run to pool)


def throughput_fit(store: Store, runs: list[str] | None = None, *, by: str = "np", source: str = "auto",
                   known: list[RunVerdict] | None = None) -> ThroughputFit:
    """The throughput of the comparable healthy runs for ``runs`` against ``by`` (see the module's docstring);
    ``known``: verdicts already computed."""
    comp = comparable_healthy_runs(store, list(runs or []), known)
    m = metrics.throughput(store, comp.runs, source=source) if comp.runs else pl.DataFrame()
    sc = metrics.scaling(m, by=by, store=store) if m.height else None
    return ThroughputFit(comp, m, sc)


def left_out_lines(comp: Comparable) -> list[str]:
    """What to tell the user about the pool: which runs, chosen how, and each run left out with why."""
    out = [f"compared: {comp.basis}: {', '.join(comp.runs) or 'none'}"]
    out += [f"left out {run} (it measures a broken server): {why}" for run, why in comp.left_out.items()]
    return out

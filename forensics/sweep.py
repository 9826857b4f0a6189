"""Throughput across runs: one fit per setup.

Every place that fits throughput against np (``forensics throughput --by``, the report, the throughput chart,
the notebook) calls ``throughput_fits``, so they pool the same runs: the comparable ones of each setup
(``forensics.setups``: the runs named, one run's setup, or every run of the store, grouped by setup), less those
whose verdict has a finding that breaks a throughput measurement, each named with its verdict's sentences.  Runs
of two setups are never averaged together: each setup has its own table, fit and knee.

Library only: no click, no altair.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from forensics import metrics
from forensics.metrics import Scaling
from forensics.setups import SetupGroup, groups
from forensics.store import Store


@dataclass
class ThroughputFit:
    group: SetupGroup  # the setup, the runs pooled, how they were chosen, and those left out with why
    metrics: pl.DataFrame  # metrics.throughput of the pooled runs
    scaling: Scaling | None  # the table against ``by``, the fit and the knee (None: no run to pool)


def throughput_fits(store: Store, runs: list[str] | None = None, *, by: str = "np",
                    source: str = "auto") -> list[ThroughputFit]:
    """The throughput of the comparable healthy runs for ``runs`` against ``by``, one fit per setup (see the
    module's docstring), the setup with the most runs first."""
    out = []
    for g in groups(store, list(runs or [])):
        m = metrics.throughput(store, g.runs, source=source) if g.runs else pl.DataFrame()
        sc = metrics.scaling(m, by=by, store=store) if m.height else None
        out.append(ThroughputFit(g, m, sc))
    return out


def fit_table(fits: list[ThroughputFit]) -> pl.DataFrame:
    """Every setup's table against ``by`` as one frame, the setup first on each row."""
    frames = [f.scaling.table.select(pl.lit(f.group.label).alias("setup"), pl.all()) for f in fits
              if f.scaling is not None]
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()

"""``mapping init``: what a mapping gives on a sample, in the counts a user checks it by.

The same counts for a proposal and for a mapping written by hand are how a proposal is judged right: the
attempts read, how many ended ok, the failures by outcome, and the items (item x stage) missing at the end of
the run (no attempt ended ok), by the outcome of their last attempt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from forensics.replay.items import build_items
from forensics.replay.records import Records


@dataclass(frozen=True)
class SampleFacts:
    """What a mapping read from a sample."""

    attempts: int = 0
    ok: int = 0
    failed: dict[str, int] = field(default_factory=dict)  # outcome -> attempts, outcomes other than ok
    items: int = 0  # item x stage pairs
    missing: tuple[tuple[str, str, str], ...] = ()  # (item, stage, outcome of the last attempt), sorted

    def missing_by(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, _, outcome in self.missing:
            out[outcome] = out.get(outcome, 0) + 1
        return dict(sorted(out.items()))

    def sentence(self) -> str:
        failed = ", ".join(f"{n} {k}" for k, n in self.failed.items())
        missing = ", ".join(f"{n} {k}" for k, n in self.missing_by().items())
        return (f"{self.attempts} attempts: {self.ok} ok" + (f", {failed}" if failed else "")
                + f"; items missing: {len(self.missing)} of {self.items}" + (f" ({missing})" if missing else ""))


def facts(records: Records) -> SampleFacts:
    """The counts of ``records`` (the attempts of one sample, read through a mapping)."""
    att = records.attempts
    if not att.height:
        return SampleFacts()
    outcomes = dict(att.group_by("outcome").agg(pl.len()).sort("outcome").iter_rows())
    items = build_items(records.runs, att)
    missing = items.filter(~pl.col("done")).select("item", "stage", "outcome").sort("item", "stage")
    return SampleFacts(att.height, int(outcomes.pop("ok", 0)), {str(k): int(v) for k, v in outcomes.items()},
                       items.height, tuple(tuple(map(str, r)) for r in missing.iter_rows()))  # type: ignore[misc]


def read_with(sample: Path, mapping: Path) -> tuple[SampleFacts, list[str]]:
    """The counts ``mapping`` gives on ``sample``, and the problems it met (bad records, the first three)."""
    from forensics.replay.api import load

    recs = load(sample, mapping=mapping)
    return facts(recs), [e.one_line() for e in recs.errors[:3]]

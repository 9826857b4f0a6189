"""The verdict on a run: what went wrong and what to change, in a few sentences written from the findings.

Each sentence is a ``Fact`` built by one finding's sentence function (``forensics.sentences``, named in the
registry) from that finding's rows and nothing else, with the evidence to read (``path:line`` ranges) and
its numbers as fields, so that the CLI, the report, the demo and ``--format json`` say the same thing.  The
findings are the registry's, in its order; a healthy run gets one line (and its notes, which say something
worth knowing that did not harm the run).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from forensics import registry
from forensics.sentences import (  # noqa: F401  (public names of the verdict)
    CRASH_ADVICE,
    FINDING,
    NOTE,
    Fact,
    Locations,
    RunContext,
    crash_advice,
    healthy,
    short_evidence,
)
from forensics.session import DEFAULTS, Analysis, Thresholds, analysis, read_derived
from forensics.store import Store, fetch_pl


@dataclass
class RunVerdict:
    run: str
    requests: int
    facts: list[Fact]

    @property
    def healthy(self) -> bool:
        return all(f.severity != FINDING or f.kind == "healthy" for f in self.facts)

    def paragraph(self, *, evidence: bool = True) -> str:
        """The run's verdict as text: ``run: sentence [where] sentence ...``."""
        return f"{self.run}: " + " ".join(f.sentence + (short_evidence(f.evidence) if evidence else "") for f in self.facts)

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.run, "requests": self.requests, "healthy": self.healthy,
                "facts": [{"kind": f.kind, "sentence": f.sentence, "evidence": f.evidence, "severity": f.severity,
                           **f.fields} for f in self.facts]}


class _ByRun:
    """Each finding's rows of the session, split by run once (a run with no finding costs a few lookups)."""

    def __init__(self, session: Analysis, th: Thresholds, runs: list[str]) -> None:
        self.session, self.th, self.runs = session, th, runs
        self.parts: dict[str, dict[str, pl.DataFrame]] = {}
        self.empty: dict[str, pl.DataFrame] = {}

    def of(self, name: str, run: str) -> pl.DataFrame:
        if name not in self.parts:
            df = self.session.rows(name, self.th, self.runs)
            self.parts[name] = {k[0]: v for k, v in df.partition_by("run", as_dict=True).items()} if df.height else {}
            self.empty[name] = df.clear()
        return self.parts[name].get(run, self.empty[name])

    def reader(self, run: str) -> Callable[[str], pl.DataFrame]:
        return lambda name: self.of(name, run)


def instance_names(session: Analysis, runs: list[str]) -> dict[str, dict[str, str]]:
    """run -> instance -> the name sentences give it: the findings' rows already carry the names
    (``instance_names.sql``, through the session's relations), so each maps to itself."""
    out: dict[str, dict[str, str]] = {}
    for run, name, _ in _names(session, runs).iter_rows():
        out.setdefault(run, {})[name] = name
    return out


def _names(session: Analysis, runs: list[str]) -> pl.DataFrame:
    session.prepare(runs, requests=False)
    return fetch_pl(session.con, "SELECT run, name, sum(served) AS served FROM fx_names WHERE run IN "
                                 "(SELECT unnest($runs)) GROUP BY run, name ORDER BY run, name", {"runs": runs})


def serving_names(session: Analysis, runs: list[str]) -> dict[str, set[str]]:
    """run -> the names of its instances that served requests (how many servers a sentence speaks of)."""
    out: dict[str, set[str]] = {}
    for run, name, served in _names(session, runs).iter_rows():
        if served:
            out.setdefault(run, set()).add(name)
    return out


def _facts(run: str, by_run: _ByRun, ctx: RunContext) -> list[Fact]:
    for f in registry.findings():
        if f.sentence is not None:
            ctx.facts += f.sentence(by_run.of(f.name, run), ctx)
    notes = [fact for fact in ctx.facts if fact.severity == NOTE]
    if all(fact.severity != FINDING for fact in ctx.facts):
        return [healthy(ctx.stats), *notes]
    return [fact for fact in ctx.facts if fact.severity != NOTE] + notes


def verdict(source: Store | Analysis, runs: str | list[str] | None = None,
            th: Thresholds = DEFAULTS) -> list[RunVerdict]:
    """One verdict per run (all runs when none are given), from the findings: as the store's analysis holds it
    (``forensics.analyse``) when the thresholds are the defaults, else worked out."""
    with analysis(source, runs) as s:
        names = s.narrowed(runs)
        if th == DEFAULTS and s.stored is not None and s.stored.current(names):
            return stored_verdicts(s.store, names)
        s.prepare(names, requests=False)
        loc = Locations(s.query("request_locations", th, names))
        stats = {r["run"]: r for r in s.query("run_stats", th, names).iter_rows(named=True)}
        inst, serving = instance_names(s, names), serving_names(s, names)
        by_run = _ByRun(s, th, names)
        out = []
        for run in names:
            ctx = RunContext(run, by_run.reader(run), loc, inst.get(run, {}), stats.get(run, {}),
                             servers=serving.get(run, set()))
            out.append(RunVerdict(run, stats.get(run, {}).get("requests", 0), _facts(run, by_run, ctx)))
    return out


def stored_verdicts(store: Store, runs: list[str]) -> list[RunVerdict]:
    """The verdicts the store's analysis holds for ``runs``, in their order."""
    facts = read_derived(store, "verdict_facts", runs).sort("run", "n", maintain_order=True)
    counts = dict(read_derived(store, "run_facts", runs).select("run", "server_requests").iter_rows())
    told: dict[str, list[Fact]] = {}
    for run, kind, severity, sentence, evidence, fields in facts.select(  # one pass: a store has thousands of runs
            "run", "kind", "severity", "sentence", "evidence", "fields").iter_rows():
        told.setdefault(run, []).append(
            Fact(kind, sentence, list(evidence or []), json.loads(fields) if fields else {}, severity))
    return [RunVerdict(run, int(counts.get(run) or 0), told.get(run, [])) for run in runs]


def verdict_frame(verdicts: list[RunVerdict]) -> pl.DataFrame:
    """The verdicts as rows (``verdict_facts``): one per fact, in order, its evidence a list and its fields JSON."""
    rows = [{"run": v.run, "n": i, "kind": f.kind, "severity": f.severity, "sentence": f.sentence,
             "evidence": list(f.evidence), "fields": json.dumps(f.fields, default=str, sort_keys=True)}
            for v in verdicts for i, f in enumerate(v.facts)]
    schema: dict[str, pl.DataType | type[pl.DataType]] = {"run": pl.String, "n": pl.Int64, "kind": pl.String, "severity": pl.String, "sentence": pl.String,
              "evidence": pl.List(pl.String), "fields": pl.String}
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)

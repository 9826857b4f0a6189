"""The demo pipeline: scenario -> logs and records -> store -> findings -> report.

The scenario generator makes the data, so the README's first command runs on a fresh machine with no data
of the user's.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from forensics import findings, report
from forensics.analyse import ingest_and_analyse
from forensics.errors import InputError
from forensics.generate import demo_scenarios, generate
from forensics.ingest import IngestOptions
from forensics.overview import summary
from forensics.runs import all_runs
from forensics.sql import run_sql
from forensics.store import Store
from forensics.verdict import verdict


@dataclass
class DemoResult:
    store: Path
    sections: list[tuple[str, pl.DataFrame]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    verdict: list[str] = field(default_factory=list)  # one paragraph per run
    real: RealRun | None = None  # the real capture, shown first


@dataclass
class RealRun:
    """A real llama-server run folder the project ships (``fixtures/server-runs``), ingested into a store of its own
    beside the demo's: what a real dead slot looks like, before the generated scenario."""

    name: str
    store: Path
    verdict: list[str]
    dead_slots: pl.DataFrame


# A real run: llama.cpp b11312 on CPU, slot 2 went bad from UNH/analyze and stayed bad (its README's truth).
REAL_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "server-runs" / "b11312-deadslot"


MARKER = ".forensics-demo"  # written into the folder a demo makes: only such a folder is ever replaced


def prepare_out(out: Path) -> None:
    """Make ``out`` an empty folder for the demo: a folder an earlier demo made is emptied; any other
    folder with something in it is refused (never deleted)."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} is a file", hint="pass --out with a folder path")
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise InputError(f"{out} is not empty and was not made by `forensics demo`",
                             hint="pass --out with a new or empty folder")
        for child in out.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("made by `forensics demo`: the next demo with this --out replaces this folder\n")


def build_demo_store(out: Path, *, seed: int = 7, echo: Callable[[str], None] = print) -> Store:
    """The demo's logs and records generated into ``out/logs`` and ingested into ``out/store`` (``out`` is
    prepared as ``prepare_out`` says); the store, ready to explore."""
    prepare_out(out)
    logs = out / "logs"
    gen = generate(demo_scenarios(), out, fmt="era5", seed=seed)
    echo(f"demo: generated {gen.requests} server requests (runs at np 1 to 8, a main and a backup instance, "
         f"a dead slot, a runaway, missing items) in {logs}")
    store_dir = out / "store"
    res = ingest_and_analyse(store_dir, [logs], IngestOptions(keep_going=True))
    t = res.totals
    echo(f"demo: ingested {len(res.files)} files, {t['lines']} lines, {t['requests']} requests into {store_dir}")
    return Store(store_dir)


def add_real_run(out: Path, *, source: Path = REAL_RUN, echo: Callable[[str], None] = print) -> RealRun | None:
    """The real run folder ``source`` copied to ``out/real/<name>`` and ingested into ``out/real-store``: its verdict
    and dead slots.  None (saying why) when the folder is not there: it ships with the source, not the wheel."""
    if not (source / "main.log").is_file():
        echo(f"demo: no real run at {source} (it ships with the source tree, in fixtures/): generated data only")
        return None
    folder = out / "real" / source.name
    shutil.copytree(source, folder)
    store_dir = out / "real-store"
    ingest_and_analyse(store_dir, [folder], IngestOptions(keep_going=True))
    store = Store(store_dir)
    build, slots, requests = run_sql(store, "SELECT max(r.build), sum(i.n_slots), sum(i.requests) FROM instance_facts i "
                                            "JOIN run_facts r USING (run)").row(0)
    echo(f"demo: ingested a real llama-server run ({source.name}: llama.cpp b{build}, {slots} slots, {requests} "
         f"requests) into {store_dir}")
    return RealRun(source.name, store_dir, [v.paragraph() for v in verdict(store)], findings.find_dead_slots(store))


def run_demo(out: Path, *, seed: int = 7, echo: Callable[[str], None] = print) -> DemoResult:
    store = build_demo_store(out, seed=seed, echo=echo)
    store_dir = out / "store"
    result = DemoResult(store_dir, real=add_real_run(out, echo=echo))
    result.verdict = [v.paragraph() for v in verdict(store)]
    result.sections.append(("requests per run", summary(store)["requests"]))
    result.sections.append(("dead slots", findings.find_dead_slots(store)))
    result.sections.append(("runaways", findings.find_runaways(store)))
    runs = all_runs(store)
    if runs:
        run = _most_eventful(result, runs)
        path = report.write_report(store, run, out / "report.html").path
        result.notes.append(f"demo: report on {run} written to {path}")
    return result


def _most_eventful(result: DemoResult, runs: list[str]) -> str:
    """The run with the most findings (dead slots count double), else the last run."""
    score: dict[str, int] = {}
    for title, df in result.sections:
        if title in ("dead slots", "runaways") and "run" in df.columns:
            for run in df["run"].to_list():
                score[run] = score.get(run, 0) + (2 if title == "dead slots" else 1)
    return max(score, key=lambda r: (score[r], r)) if score else runs[-1]

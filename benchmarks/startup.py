"""What one invocation costs: `forensics --help`, a command's `--help`, ingesting a short log end to end, and a
finding, the verdict and `runs` on the small store that leaves.

    python benchmarks/startup.py [--repeat 7] [--out benchmarks/out]

Each command runs as its own process ``--repeat`` times (after one warm-up, so the page cache holds the
interpreter and the libraries); the table gives the median wall and CPU seconds and the fastest wall time, and the
load average before and after, since wall time on a shared machine says little without it.  The project's modules
are compiled to bytecode first, as an installed package is: where PYTHONDONTWRITEBYTECODE is set, an editable
install would otherwise compile every module it imports again in each process.
Targets (issue "fast by design"): --help at most 0.3 s, the short log's ingest 0.6 s, a finding 0.6 s.  The rows
after the commands time importing each library alone in the same run: the floor no invocation that needs it can
go under.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.run import forensics_cmd, machine, run_measured  # noqa: E402

SHORT_LOG = ROOT / "fixtures" / "logs" / "era5-default-b10587.log"  # 33 lines, two requests
TARGETS = {"--help": 0.3, "ingest --help": 0.3, "ingest a 33-line log": 0.6, "deadslots": 0.6, "runaways": 0.6,
           "verdict": 0.6, "runs": 0.6}


def cases(work: Path) -> list[tuple[str, list[str], bool]]:
    """(label, arguments, whether the store is made anew before each run)."""
    store = ["--store", str(work / "store")]
    return [
        ("--help", ["--help"], False),
        ("ingest --help", ["ingest", "--help"], False),
        ("ingest a 33-line log", ["ingest", str(SHORT_LOG), *store], True),
        ("deadslots", ["deadslots", *store], False),
        ("runaways", ["runaways", *store], False),
        ("verdict", ["verdict", *store], False),
        ("runs", ["runs", *store], False),
    ]


def load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def compile_bytecode() -> None:
    """What ``pip install`` does for a package: bytecode beside every module (kept fresh by Python's own check)."""
    for top in ("forensics", "parsers"):
        compileall.compile_dir(ROOT / top, quiet=1)


# What the libraries cost by themselves, measured in the same run: the floor under each invocation.
FLOORS = [("python + click", "import click"), ("import polars", "import polars"), ("import duckdb", "import duckdb"),
          ("import pyarrow", "import pyarrow"), ("import numpy", "import numpy"), ("import altair", "import altair"),
          ("import click, polars, numpy (a short ingest)", "import click, polars, numpy"),
          ("import click, polars, duckdb (a finding)", "import click, polars, duckdb")]


def _timed(cmd: list[str], repeat: int, fresh: Path | None = None) -> tuple[list[float], list[float], int]:
    walls, cpus, rc = [], [], 0
    for i in range(repeat + 1):
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)
        r = run_measured(cmd)
        rc = max(rc, r.rc)
        if i:  # the first run warms the page cache
            walls.append(r.wall)
            cpus.append(r.cpu)
    return walls, cpus, rc


def _row(label: str, walls: list[float], cpus: list[float], rc: int, target: float | None) -> dict[str, object]:
    return {"case": label, "wall_median": statistics.median(walls), "wall_min": min(walls),
            "cpu_median": statistics.median(cpus), "target": target, "rc": rc}


def measure(repeat: int) -> list[dict[str, object]]:
    compile_bytecode()
    fx = forensics_cmd()
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        for label, args, fresh in cases(work):
            walls, cpus, rc = _timed([*fx, *args], repeat, work / "store" if fresh else None)
            if not (work / "store").exists():  # the queries read the store the ingest leaves
                run_measured([*fx, "ingest", str(SHORT_LOG), "--store", str(work / "store")])
            rows.append(_row(f"`forensics {label}`", walls, cpus, rc, TARGETS.get(label)))
    for label, code in FLOORS:
        rows.append(_row(label, *_timed([sys.executable, "-c", code], repeat), None))
    return rows


def table(rows: list[dict[str, object]]) -> str:
    out = ["| invocation | wall s (median) | wall s (fastest) | CPU s (median) | target s | exit |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['case']} | {r['wall_median']:.2f} | {r['wall_min']:.2f} | {r['cpu_median']:.2f} | "
                   f"{r['target'] if r['target'] is not None else '–'} | {r['rc']} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    before = load()
    rows = measure(args.repeat)
    text = f"Machine: {machine()}; {before} before, {load()} after\n\n{table(rows)}\n"
    (args.out / "results-startup.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

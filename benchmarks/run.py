"""Ingest and query benchmark on generated modern-format (era 5) llama-server logs.

    python benchmarks/run.py [--sizes 1GB,4GB] [--out benchmarks/out]

For each size: generate one era-5 log of a busy np 8 server (``--scenario bench``), then measure, each as its
own subprocess: ``forensics ingest`` (wall time, peak RSS), ``grep -c print_timing`` over the same file (the
floor), re-ingest of the unchanged file, ingest after appending 10 MB to the log (the server kept running),
and every finding query on the resulting store; then where ingest time goes, stage by stage
(``benchmarks/stages.py`` on the first 8 chunks of the log).  Prints a markdown table (also written to OUT/results.md,
with the raw numbers in OUT/results.json).  Commands that do not exist yet are reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.stages import duckdb_frame, stages  # noqa: E402
from benchmarks.stages import report as stage_report  # noqa: E402
from forensics.generate import bench, generate, parse_size  # noqa: E402

FINDINGS = ("deadslots", "runaways", "cap", "errors", "throughput")
APPEND_BYTES = 10 << 20


@dataclass
class Measure:
    size: str
    step: str
    seconds: float | None
    peak_rss_mb: float | None
    mb: float | None
    note: str = ""

    @property
    def mb_s(self) -> float | None:
        if self.seconds and self.mb:
            return self.mb / self.seconds
        return None


def forensics_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("forensics")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "forensics.cli"]


# The peak RSS of a child as wait4 reports it starts from its parent's RSS at fork time (Linux keeps the high-water
# mark across exec), and this process holds a generated log's worth of memory.  So each command runs under a small
# wrapper process, and the wrapper's own child (forked from a few MB) is the one measured.
_MEASURE = (
    "import os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[1:])\n"
    "_, st, ru = os.wait4(p.pid, 0)\n"
    "sys.stderr.write(f'\\n@@maxrss_kb={ru.ru_maxrss}\\n')\n"
    "sys.exit(os.waitstatus_to_exitcode(st))\n"
)


def run_measured(cmd: list[str]) -> tuple[int, float, float, str, str]:
    """Run ``cmd``; return its exit code, wall seconds, its own peak RSS in MB, stdout and stderr."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", _MEASURE, *cmd], capture_output=True)
    wall = time.perf_counter() - t0
    err = proc.stderr.decode(errors="replace")
    rss = 0.0
    if "@@maxrss_kb=" in err:
        err, _, tail = err.rpartition("@@maxrss_kb=")
        rss = int(tail.strip()) / 1024
    return proc.returncode, wall, rss, proc.stdout.decode(errors="replace"), err.rstrip("\n")


def first_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:160] if lines else ""


def bench_size(label: str, size: int, out: Path, seed: int, cmds: set[str],
               stage_notes: list[str]) -> list[Measure]:
    res: list[Measure] = []
    gen_dir = out / f"gen-{label}"
    store = out / f"store-{label}"
    if gen_dir.exists():
        shutil.rmtree(gen_dir)
    if store.exists():
        shutil.rmtree(store)
    t0 = time.perf_counter()
    g = generate(bench(), gen_dir, fmt="era5", seed=seed, size=size)
    log = g.logs[0]
    mb = log.stat().st_size / 1e6
    res.append(Measure(label, "generate (era5 log + records)", time.perf_counter() - t0, None, mb,
                       f"{g.requests:,} requests"))
    fx = forensics_cmd()

    if not stage_notes:  # where the time goes, stage by stage (the same on any size)
        rows, n_chunks, n_bytes, n_lines = stages(log, 8)
        stage_notes.append(stage_report(rows, n_bytes, n_lines, n_chunks, duckdb_frame(log, n_bytes)))
    rc, wall, _, out_s, _ = run_measured(["grep", "-c", "print_timing", str(log)])
    res.append(Measure(label, "grep -c print_timing (floor)", wall, None, mb, f"{out_s.strip()} lines"))
    grep_s = wall

    if "ingest" not in cmds:
        res.append(Measure(label, "forensics ingest", None, None, mb, "skipped: no ingest command yet"))
        return res
    ingest = [*fx, "ingest", str(log), "--run", "bench", "--store", str(store)]
    rc, wall, rss, _, err = run_measured(ingest)
    note = "ok" if rc == 0 else f"exit {rc}: {first_line(err)}"
    m = Measure(label, "forensics ingest", wall, rss, mb, note)
    if rc == 0 and grep_s:
        m.note = f"{wall / grep_s:.1f}× grep"
    res.append(m)
    if rc != 0:
        return res
    rc, wall, rss, _, err = run_measured(ingest)
    res.append(Measure(label, "re-ingest (unchanged)", wall, rss, None, "ok" if rc == 0 else f"exit {rc}: {first_line(err)}"))

    # append 10 MB: the same server kept running (the continuation of the generated log, byte for byte)
    tail_dir = out / f"tail-{label}"
    if tail_dir.exists():
        shutil.rmtree(tail_dir)
    t = generate(bench(), tail_dir, fmt="era5", seed=seed, size=APPEND_BYTES, first_tile=g.extra["tiles_end"])
    with log.open("ab") as fh, t.logs[0].open("rb") as src:
        shutil.copyfileobj(src, fh, 1 << 20)
    add_mb = t.logs[0].stat().st_size / 1e6
    shutil.rmtree(tail_dir)
    rc, wall, rss, _, err = run_measured(ingest)
    res.append(Measure(label, f"ingest after appending {add_mb:.0f} MB", wall, rss, add_mb,
                       "ok" if rc == 0 else f"exit {rc}: {first_line(err)}"))

    n_req = "?"
    if "sql" in cmds:
        rc, _, _, out_s, _ = run_measured([*fx, "sql", "select count(*) as n from requests", "--store", str(store),
                                           "--format", "csv"])
        if rc == 0:
            n_req = out_s.strip().splitlines()[-1]
    for name in FINDINGS:
        if name not in cmds:
            res.append(Measure(label, f"forensics {name}", None, None, None, "skipped: command not available yet"))
            continue
        rc, wall, rss, _, err = run_measured([*fx, name, "--store", str(store), "--format", "csv"])
        res.append(Measure(label, f"forensics {name}", wall, rss, None,
                           (f"{n_req} requests in store" if rc in (0, 1) else f"exit {rc}: {first_line(err)}")))
    return res


def table(rows: list[Measure]) -> str:
    lines = ["| size | step | seconds | MB/s | peak RSS MB | note |", "|---|---|---:|---:|---:|---|"]
    for r in rows:
        sec = f"{r.seconds:.2f}" if r.seconds is not None else "–"
        mbs = f"{r.mb_s:.0f}" if r.mb_s is not None else "–"
        rss = f"{r.peak_rss_mb:.0f}" if r.peak_rss_mb is not None else "–"
        lines.append(f"| {r.size} | {r.step} | {sec} | {mbs} | {rss} | {r.note} |")
    return "\n".join(lines)


def machine() -> str:
    mem = ""
    try:
        kb = int(next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal")).split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores{mem}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1GB,4GB", help="comma-separated log sizes (default 1GB,4GB)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out", help="work and result folder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the generated logs and stores")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    from forensics.cli import cli

    cmds = set(cli.commands)
    rows: list[Measure] = []
    stage_notes: list[str] = []
    for label in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        print(f"benchmark {label} ...", file=sys.stderr)
        rows += bench_size(label, parse_size(label), args.out, args.seed, cmds, stage_notes)
        if not args.keep:
            for d in (args.out / f"gen-{label}", args.out / f"store-{label}"):
                shutil.rmtree(d, ignore_errors=True)
    text = f"Machine: {machine()}\n\n{table(rows)}\n"
    if stage_notes:
        text += f"\nIngest stage by stage (benchmarks/stages.py):\n\n{stage_notes[0]}\n"
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps([asdict(r) | {"mb_s": r.mb_s} for r in rows], indent=2) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Ingest and query benchmark on generated llama-server logs (era 5 by default, ``--era era4`` for HTTP lines).

    python benchmarks/run.py [--sizes 1GB,4GB] [--era era5|era4] [--out benchmarks/out]

For each size: generate one log of a busy np 8 server (the ``bench`` scenario), then measure, each as its own
subprocess: ``grep -c print_timing`` over the same file (the floor, and the yardstick that keeps a noisy machine's
figures comparable), ``forensics ingest`` (wall and CPU seconds, peak RSS, MB/s, CPU-seconds per GB, ratio to
grep), re-ingest of the unchanged file, ingest after appending 10 MB to the log (the server kept running), and
every finding query on the resulting store; then where ingest time goes, stage by stage (``benchmarks/stages.py``
on the first 8 chunks of the log).  Prints a markdown table (also written to OUT/results-ERA.md, with the raw
numbers in OUT/results-ERA.json).  A store of thousands of runs is ``benchmarks/runs.py``.
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
from forensics.generate import Repeat, bench, generate, parse_size  # noqa: E402

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
    cpu_s: float | None = None
    grep_s: float | None = None  # the same machine's ``grep -c`` over the same bytes: a noisy machine's yardstick
    loop_cpu_s: float | None = None  # the bare two-regex Python loop's CPU on the same file (benchmarks/bareloop.py)

    @property
    def mb_s(self) -> float | None:
        if self.seconds and self.mb:
            return self.mb / self.seconds
        return None

    @property
    def cpu_s_per_gb(self) -> float | None:
        if self.cpu_s is not None and self.mb:
            return self.cpu_s / (self.mb / 1000)
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
    "sys.stderr.write(f'\\n@@maxrss_kb={ru.ru_maxrss} cpu_s={ru.ru_utime + ru.ru_stime}\\n')\n"
    "sys.exit(os.waitstatus_to_exitcode(st))\n"
)


@dataclass
class Ran:
    """One measured command: exit code, wall seconds, CPU seconds (user + system, all threads), peak RSS in MB."""

    rc: int
    wall: float
    cpu: float
    rss: float
    out: str
    err: str


def run_measured(cmd: list[str], env: dict[str, str] | None = None) -> Ran:
    """Run ``cmd`` under the measuring wrapper."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", _MEASURE, *cmd], capture_output=True, env=env)
    wall = time.perf_counter() - t0
    err = proc.stderr.decode(errors="replace")
    rss = cpu = 0.0
    if "@@maxrss_kb=" in err:
        err, _, tail = err.rpartition("@@maxrss_kb=")
        kb, _, cpu_s = tail.strip().partition(" cpu_s=")
        rss, cpu = int(kb) / 1024, float(cpu_s)
    return Ran(proc.returncode, wall, cpu, rss, proc.stdout.decode(errors="replace"), err.rstrip("\n"))


def first_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:160] if lines else ""


def _ended(r: Ran) -> str:
    return "ok" if r.rc in (0, 1) else f"exit {r.rc}: {first_line(r.err)}"


def bench_size(label: str, size: int, out: Path, opts: argparse.Namespace, stage_notes: list[str]) -> list[Measure]:
    res: list[Measure] = []
    tag = f"{label}-{opts.era}"
    gen_dir, store = out / f"gen-{tag}", out / f"store-{tag}"
    for d in (gen_dir, store):
        shutil.rmtree(d, ignore_errors=True)
    t0 = time.perf_counter()
    g = generate(bench(), gen_dir, fmt=opts.era, seed=opts.seed, repeat=Repeat(size=size))
    log = g.logs[0]
    mb = log.stat().st_size / 1e6
    res.append(Measure(tag, f"generate ({opts.era} log + records)", time.perf_counter() - t0, None, mb,
                       f"{g.requests:,} requests"))
    fx = forensics_cmd()
    if not stage_notes:  # where the time goes, stage by stage (the same on any size)
        rows, n_chunks, n_bytes, n_lines = stages(log, 8)
        stage_notes.append(stage_report(rows, n_bytes, n_lines, n_chunks, duckdb_frame(log, n_bytes)))
    grep = run_measured(["grep", "-c", "print_timing", str(log)])
    res.append(Measure(tag, "grep -c print_timing (floor)", grep.wall, None, mb, f"{grep.out.strip()} lines",
                       cpu_s=grep.cpu))
    loop = run_measured([sys.executable, str(ROOT / "benchmarks" / "bareloop.py"), str(log)])
    res.append(Measure(tag, "bare two-regex Python loop (yardstick)", loop.wall, loop.rss, mb,
                       f"{loop.out.strip()} lines matched", cpu_s=loop.cpu, grep_s=grep.wall, loop_cpu_s=loop.cpu))
    ingest = [*fx, "ingest", str(log), "--run", "bench", "--store", str(store)]
    r = run_measured(ingest)
    res.append(Measure(tag, "forensics ingest", r.wall, r.rss, mb, _ended(r), cpu_s=r.cpu, grep_s=grep.wall,
                       loop_cpu_s=loop.cpu))
    if r.rc != 0:
        return res
    r = run_measured(ingest)
    res.append(Measure(tag, "re-ingest (unchanged)", r.wall, r.rss, None, _ended(r), cpu_s=r.cpu))
    res.append(_append_and_ingest(tag, log, out, opts, g.extra["tiles_end"], ingest))
    n_req = run_measured([*fx, "sql", "select count(*) as n from requests", "--store", str(store), "--format", "csv"])
    for name in FINDINGS:
        r = run_measured([*fx, name, "--store", str(store), "--format", "csv"])
        note = f"{n_req.out.strip().splitlines()[-1]} requests in store" if r.rc in (0, 1) else _ended(r)
        res.append(Measure(tag, f"forensics {name}", r.wall, r.rss, None, note, cpu_s=r.cpu))
    return res


def _append_and_ingest(tag: str, log: Path, out: Path, opts: argparse.Namespace, first_tile: int,
                       ingest: list[str]) -> Measure:
    """Append 10 MB (the same server kept running: the continuation of the generated log, byte for byte) and
    ingest again."""
    tail_dir = out / f"tail-{tag}"
    shutil.rmtree(tail_dir, ignore_errors=True)
    t = generate(bench(), tail_dir, fmt=opts.era, seed=opts.seed,
                 repeat=Repeat(size=APPEND_BYTES, first_tile=first_tile))
    with log.open("ab") as fh, t.logs[0].open("rb") as src:
        shutil.copyfileobj(src, fh, 1 << 20)
    add_mb = t.logs[0].stat().st_size / 1e6
    shutil.rmtree(tail_dir)
    r = run_measured(ingest)
    return Measure(tag, f"ingest after appending {add_mb:.0f} MB", r.wall, r.rss, add_mb, _ended(r), cpu_s=r.cpu)


def _num(x: float | None, fmt: str) -> str:
    return format(x, fmt) if x is not None else "–"


def table(rows: list[Measure]) -> str:
    lines = ["| size | step | wall s | CPU s | MB/s | CPU-s/GB | × grep | × loop (CPU) | peak RSS MB | note |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        ratio = r.seconds / r.grep_s if r.seconds and r.grep_s else None
        vs_loop = r.cpu_s / r.loop_cpu_s if r.cpu_s and r.loop_cpu_s else None
        lines.append(f"| {r.size} | {r.step} | {_num(r.seconds, '.2f')} | {_num(r.cpu_s, '.1f')} | "
                     f"{_num(r.mb_s, '.0f')} | {_num(r.cpu_s_per_gb, '.1f')} | {_num(ratio, '.1f')} | "
                     f"{_num(vs_loop, '.2f')} | {_num(r.peak_rss_mb, '.0f')} | {r.note} |")
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
    ap.add_argument("--era", default="era5", help="log format generation: era5 (default), era4 (with HTTP lines)")
    ap.add_argument("--keep", action="store_true", help="keep the generated logs and stores")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[Measure] = []
    stage_notes: list[str] = []
    for label in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        print(f"benchmark {label} ...", file=sys.stderr)
        rows += bench_size(label, parse_size(label), args.out, args, stage_notes)
        if not args.keep:
            for d in (args.out / f"gen-{label}-{args.era}", args.out / f"store-{label}-{args.era}"):
                shutil.rmtree(d, ignore_errors=True)
    text = f"Machine: {machine()}\n\n{table(rows)}\n"
    if stage_notes:
        text += f"\nIngest stage by stage (benchmarks/stages.py):\n\n{stage_notes[0]}\n"
    (args.out / f"results-{args.era}.md").write_text(text)
    (args.out / f"results-{args.era}.json").write_text(json.dumps([asdict(r) | {"mb_s": r.mb_s, "cpu_s_per_gb": r.cpu_s_per_gb} for r in rows], indent=2) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

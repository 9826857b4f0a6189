"""How fast `forensics watch` raises an alert, and what it costs the machine it guards.

    python benchmarks/watch.py [--probes 12] [--gaps 15,5] [--seconds 90] [--rate-mb 1.0]

1. **Delay**: a log of the real 2026 server (fixtures/server-runs/real-2026) is followed with the default
   options; every GAP seconds (one series per value of ``--gaps``) a runaway request is appended in one write, and
   the hook (a shell command) writes the time it started.  Reported: the delay from the write to the hook's start
   (median, p90, max).
2. **CPU at a busy server's rate**: normal requests are appended at ``--rate-mb`` MB/s for ``--seconds``; the watch
   process's CPU (user + system, its threads included, from /proc) over that time, as a share of one core; then a
   runaway is appended and the delay to its hook measured, with the log still growing.

Every step runs a fresh `forensics watch` process (the default poll interval and CPU budget unless given).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import watch_log as L  # noqa: E402 (the log's lines are shared with the tests)

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


class Watch:
    def __init__(self, tmp: Path, extra: list[str]) -> None:
        self.starts = tmp / "hook-starts.txt"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "forensics", "watch", "logs", "--store", str(tmp / "store"),
             "--on-runaway", f"date +%s.%N >> {self.starts}; cat > /dev/null", *extra],
            cwd=tmp, stdout=subprocess.DEVNULL, stderr=(tmp / "stderr.txt").open("w"),
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.err = tmp / "stderr.txt"
        deadline = time.monotonic() + 60
        while "following" not in self.err.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)

    def hook_starts(self) -> list[float]:
        return [float(x) for x in self.starts.read_text().split()] if self.starts.exists() else []

    def wait_starts(self, n: int, timeout: float = 120.0) -> list[float]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.hook_starts()
            if len(got) >= n:
                return got
            time.sleep(0.01)
        raise SystemExit(f"no hook start after {timeout} s:\n{self.err.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=120)


def new_log(tmp: Path) -> Path:
    log = tmp / "logs" / "live" / "server.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(L.banner() + L.normal_requests()), encoding="utf-8")
    return log


def write(log: Path, lines: list[str]) -> float:
    with log.open("a", encoding="utf-8") as fh:
        fh.write("".join(lines))
    return time.time()


def quiet_delays(probes: int, gap: float, extra: list[str]) -> list[float]:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        log = new_log(tmp)
        w = Watch(tmp, extra)
        delays, at = [], 40.0
        try:
            for i in range(probes):
                time.sleep(gap)
                t = write(log, L.request(i % 2, 10_000 + i, at, 200, 3000))
                at += 60.0
                delays.append(w.wait_starts(i + 1)[-1] - t)
        finally:
            w.stop()
    return delays


def busy(seconds: float, rate_mb: float, warmup: float, extra: list[str]) -> tuple[float, float, float, int]:
    """(watch's CPU share of one core over the whole time, the same after ``warmup`` seconds (once the budget's
    initial burst is spent), the delay to a runaway's hook while the log grows, bytes written)"""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        log = new_log(tmp)
        w = Watch(tmp, extra)
        at, task, written = 40.0, 20_000, 0
        try:
            c0, t0 = cpu_s(w.proc.pid), time.monotonic()
            c1, t1 = None, None
            step = 0.1
            while time.monotonic() - t0 < seconds:
                if c1 is None and time.monotonic() - t0 >= warmup:
                    c1, t1 = cpu_s(w.proc.pid), time.monotonic()
                lines: list[str] = []
                size = 0
                while size < rate_mb * 1e6 * step:
                    block = L.request(task % 8, task, at, 150 + task % 50, 40 + task % 24)
                    lines += block
                    size += sum(len(x) for x in block)
                    task, at = task + 1, at + 0.01
                write(log, lines)
                written += size
                time.sleep(max(0.0, t0 + written / (rate_mb * 1e6) - time.monotonic()))
            share = (cpu_s(w.proc.pid) - c0) / (time.monotonic() - t0)
            steady = (cpu_s(w.proc.pid) - (c1 or c0)) / (time.monotonic() - (t1 or t0))
            t = write(log, L.request(0, task, at, 200, 3000))
            end = time.monotonic() + 120
            while time.monotonic() < end and not w.hook_starts():  # keep the log growing meanwhile
                write(log, L.request(1, task + 1, at, 150, 40))
                task, at = task + 2, at + 0.01
                time.sleep(0.05)
            delay = w.wait_starts(1)[0] - t
        finally:
            w.stop()
    return share, steady, delay, written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probes", type=int, default=12)
    ap.add_argument("--gaps", default="15,5", help="seconds between two appended runaways, one series per value")
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--rate-mb", type=float, default=1.0)
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds before the steady-state CPU is measured")
    ap.add_argument("--watch-args", default="", help="extra options for forensics watch, e.g. '--cpu-budget 0.1'")
    args = ap.parse_args()
    extra = args.watch_args.split()
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    for gap in (float(g) for g in args.gaps.split(",") if g):
        d = sorted(quiet_delays(args.probes, gap, extra))
        p90 = d[min(len(d) - 1, round(0.9 * (len(d) - 1)))]
        print(f"{len(d)} runaways {gap:g} s apart: write -> hook start median {statistics.median(d):.2f} s, "
              f"p90 {p90:.2f} s, max {d[-1]:.2f} s")
    share, steady, delay, written = busy(args.seconds, args.rate_mb, args.warmup, extra)
    print(f"log growing at {written / 1e6 / args.seconds:.2f} MB/s for {args.seconds:g} s: watch CPU {100 * share:.1f} % "
          f"of one core over the whole time, {100 * steady:.1f} % after the first {args.warmup:g} s; a runaway "
          f"written meanwhile reached its hook after {delay:.2f} s")


if __name__ == "__main__":
    main()

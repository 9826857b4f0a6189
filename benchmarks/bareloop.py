"""The yardstick of ingest's cost per line: a bare Python loop that only matches two regexes per line (the slot
frame and the timing lines), nothing kept.  ``benchmarks/run.py`` runs it on the same file in the same run and
reports ingest's CPU as a multiple of it, so figures from a busy machine stay comparable.

    python benchmarks/bareloop.py LOG
"""

from __future__ import annotations

import re
import sys

SLOT = re.compile(r"^slot\s+(\w+): id\s+(\d+) \| task (-?\d+) \| (.*)$")
TIMING = re.compile(r"^\s*(prompt eval|eval|total) time =\s+([\d.]+) ms /\s+(\d+) tokens")


def main(path: str) -> int:
    n = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if SLOT.match(line) or TIMING.match(line):
                n += 1
    print(n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

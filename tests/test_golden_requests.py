"""Golden request rows: each fixture log under fixtures/logs has a hand-derived `<case>.requests.csv`.

The expected rows were worked out by hand from the lines of each fixture, not by running the code; they
are compared exactly: rows sorted by line_first,
floats to 2 decimals, booleans as true/false, times as ISO-8601 UTC, null as an empty cell.
Each log is ingested from a copy whose mtime is pinned to MTIME: syslog prefixes carry no year, and the
parser takes it from the file's mtime, so the expected times must not depend on when the checkout was made.
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pytest

from forensics.ingest import IngestOptions, ingest
from forensics.store import Store

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
COLUMNS = ["run", "instance", "slot", "task", "seq", "prompt_tokens", "cached_tokens", "gen_tokens", "prompt_ms",
           "gen_ms", "total_ms", "stop_reason", "truncated", "http_status", "error", "t_start", "elapsed_start_s",
           "line_first", "line_last"]
MTIME = datetime(2026, 8, 24, 0, 0, tzinfo=timezone.utc).timestamp()


def _cases() -> list[Path]:
    return sorted(p for p in FIXTURES.glob("*.log") if p.with_suffix(".requests.csv").exists())


def _as_text(df: pl.DataFrame) -> list[dict[str, str]]:
    out = []
    for row in df.select(COLUMNS).iter_rows(named=True):
        cells = {}
        for k, v in row.items():
            if v is None:
                cells[k] = ""
            elif isinstance(v, bool):
                cells[k] = "true" if v else "false"
            elif isinstance(v, float):
                cells[k] = f"{v:.2f}"
            elif hasattr(v, "strftime"):
                cells[k] = v.strftime("%Y-%m-%dT%H:%M:%S") + (f".{v.microsecond // 1000:03d}" if v.microsecond else "") + "Z"
            else:
                cells[k] = str(v)
        out.append(cells)
    return out


@pytest.mark.parametrize("log", _cases(), ids=lambda p: p.stem)
def test_requests_match_golden(log: Path, tmp_path: Path) -> None:
    copy = tmp_path / "logs" / log.name
    copy.parent.mkdir()
    shutil.copyfile(log, copy)
    os.utime(copy, (MTIME, MTIME))
    ingest(tmp_path / "store", [copy], IngestOptions(run="golden"))
    got = _as_text(Store(tmp_path / "store").table("requests").sort("line_first"))
    expected = pl.read_csv(log.with_suffix(".requests.csv"), infer_schema=False).fill_null("").to_dicts()
    assert got == expected

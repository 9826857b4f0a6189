"""Digests of what ingest makes of a log: its requests, its events and its instances, in a form that does not depend
on how the store lays them out (wide or narrow parts, column order, which columns a kind leaves null).

A faster engine must change no output: ``tests/test_engine_equivalence.py`` compares the digests of every
fixture log and of a generated log with ``fixtures/engine-digests.json``, written by the engine it replaced.
Regenerate (only when an output is meant to change, and say why in the commit) with
``python -m tests.engine_digest write``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
DIGESTS = ROOT / "fixtures" / "engine-digests.json"
GENERATED = {"era5": "6MB", "era4": "6MB"}  # the bench scenario (seed 3) in two log generations, of these sizes
SKIP_EVENT_COLUMNS = {"run", "path", "seq_global"}  # the same for every line of a file: where it is stored


def fixture_logs() -> list[Path]:
    fx = ROOT / "fixtures"
    return sorted([*fx.glob("logs/*.log"), *fx.glob("real/*.log"), *fx.glob("server-runs/*/server.log")])


def _canonical(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def digest_rows(df: pl.DataFrame, order: list[str], skip: set[str]) -> tuple[int, str]:
    """(rows, sha256) of ``df``'s rows as JSON objects of their non-null values, in ``order``."""
    h = hashlib.sha256()
    cols = sorted(c for c in df.columns if c not in skip)
    for row in df.sort(order, nulls_last=True).select(cols).iter_rows(named=True):
        h.update(json.dumps({k: _canonical(v) for k, v in row.items() if v is not None}, sort_keys=True,
                            default=str).encode())
        h.update(b"\n")
    return df.height, h.hexdigest()


def digest_log(log: Path, workdir: Path) -> dict[str, Any]:
    """Ingest ``log`` alone (mtime pinned, so syslog years do not depend on the checkout) and digest it."""
    import os

    from forensics.ingest import IngestOptions, ingest
    from forensics.store import Store

    copy = workdir / "logs" / log.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(log, copy)
    os.utime(copy, (1_787_600_000, 1_787_600_000))
    ingest(workdir / "store", [copy], IngestOptions(run="d", keep_going=True))
    store = Store(workdir / "store")
    req_n, req_h = digest_rows(store.table("requests"), ["instance", "line_first", "slot", "task"], {"path", "clock"})
    ev_n, ev_h = digest_rows(store.table("events"), ["line_no", "kind"], SKIP_EVENT_COLUMNS)
    inst_n, inst_h = digest_rows(store.table("instances"), ["line_first", "instance"], {"run", "path"})
    files = store.table("files").select("lines_total", "lines_parsed", "lines_skipped", "lines_unparsed").rows()
    return {"requests": [req_n, req_h], "events": [ev_n, ev_h], "instances": [inst_n, inst_h],
            "lines": [list(r) for r in files]}


def generated_logs(workdir: Path) -> dict[str, Path]:
    from forensics.generate import Repeat, bench, generate

    out = {}
    for fmt, size in GENERATED.items():
        generate(bench(), workdir / fmt, fmt=fmt, seed=3, repeat=Repeat(size=size))
        out[f"generated-{fmt}"] = next((workdir / fmt).rglob("*.log"))
    return out


def all_digests() -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        logs = {log.relative_to(ROOT).as_posix(): log for log in fixture_logs()} | generated_logs(Path(d))
        for i, (key, log) in enumerate(logs.items()):
            out[key] = digest_log(log, Path(d) / f"w{i}")
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["write"]:
        DIGESTS.write_text(json.dumps(all_digests(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    else:
        print(json.dumps(all_digests(), indent=1, sort_keys=True))

"""Logs as users have them: written as UTF-16 by Windows PowerShell, or cut without a final newline and left
alone (a paste, a server killed mid-line).  Both read the same facts as the plain log."""

from __future__ import annotations

import os
import time
from pathlib import Path

import polars as pl
import pytest

from forensics.ingest import IngestOptions, ingest
from forensics.store import Store

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
LOG = REAL / "crash-ikllama-687.log"  # a real log with requests, ending in a CUDA error
FACTS = ["instance", "slot", "task", "prompt_tokens", "gen_tokens", "stop_reason", "truncated", "complete"]


def facts(store: Path) -> tuple[pl.DataFrame, int, int]:
    s = Store(store)
    files = s.table("files")
    req = s.table("requests").select(FACTS).sort("instance", "slot", "task")
    return req, int(files["lines_total"].sum()), int(s.table("events").height)


def ingest_one(path: Path, store: Path) -> None:
    res = ingest(store, [path], IngestOptions(run="r"))
    assert not res.errors, res.errors


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le-bom", "utf-16-be"])
def test_a_utf16_log_reads_as_the_utf8_one(tmp_path: Path, encoding: str) -> None:
    text = LOG.read_text(encoding="utf-8")
    data = {"utf-16": text.encode("utf-16"), "utf-16-le-bom": b"\xff\xfe" + text.encode("utf-16-le"),
            "utf-16-be": b"\xfe\xff" + text.encode("utf-16-be")}[encoding]
    wide, plain = tmp_path / "w" / "server.log", tmp_path / "p" / "server.log"
    for path, content in ((wide, data), (plain, LOG.read_bytes())):  # the same name: the instance is named by it
        path.parent.mkdir()
        path.write_bytes(content)
    ingest_one(plain, tmp_path / "plain")
    ingest_one(wide, tmp_path / "wide")
    want, got = facts(tmp_path / "plain"), facts(tmp_path / "wide")
    assert want[0].height > 0
    assert got[0].equals(want[0]) and got[1:] == want[1:]
    assert Store(tmp_path / "wide").table("files")["compression"].to_list() == ["utf-16"]


def test_a_settled_log_cut_without_a_newline_reads_its_last_line(tmp_path: Path) -> None:
    data = LOG.read_bytes()
    assert data.endswith(b"CUDA error\n")
    cut = tmp_path / "server.log"
    cut.write_bytes(data[:-1])
    res = ingest(tmp_path / "fresh", [cut], IngestOptions(run="r"))  # being written now: the last line waits for its newline
    assert any("last line has no newline yet" in w for w in res.warnings)
    old = time.time() - 600
    os.utime(cut, (old, old))  # left alone for ten minutes: the log ends there
    ingest_one(cut, tmp_path / "cut")
    whole = tmp_path / "w" / "server.log"
    whole.parent.mkdir()
    whole.write_bytes(data)
    ingest_one(whole, tmp_path / "whole")
    assert facts(tmp_path / "cut")[1:] == facts(tmp_path / "whole")[1:]
    assert facts(tmp_path / "cut")[0].equals(facts(tmp_path / "whole")[0])

    # the server wrote on after all: the file is read again whole, never with its last line split in two
    with cut.open("ab") as fh:
        fh.write(b" (out of memory)\nAborted (core dumped)\n")
    ingest_one(cut, tmp_path / "cut")
    grown = tmp_path / "g" / "server.log"
    grown.parent.mkdir()
    grown.write_bytes(cut.read_bytes())
    ingest_one(grown, tmp_path / "grown")
    assert facts(tmp_path / "cut")[1:] == facts(tmp_path / "grown")[1:]
    assert facts(tmp_path / "cut")[0].equals(facts(tmp_path / "grown")[0])
    lines = Store(tmp_path / "cut").table("files")["lines_total"].to_list()
    assert lines == [data.count(b"\n") + 1]

"""Evidence lines read back from the logs: spots, one request's own lines, compressed logs, moved logs."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from forensics import evidence
from forensics.errors import InputError
from forensics.ingest import IngestOptions, ingest
from forensics.store import Store

LOG = [f"line {i}" for i in range(1, 5001)]


@pytest.mark.parametrize("name", ["a.log", "a.log.gz"])
def test_spots_read_the_lines_they_name(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    data = ("\n".join(LOG) + "\n").encode()
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    got = evidence.evidence_lines([f"{path}:3-5", f"{path}:4999"], max_lines=12)
    assert got.select("line_no", "text").rows() == [(3, "line 3"), (4, "line 4"), (5, "line 5"),
                                                      (4999, "line 4999")]
    long = evidence.evidence_lines([f"{path}:100-4000"], max_lines=4)
    assert long["line_no"].to_list() == [100, 101, 3999, 4000]  # the start and the end of what happened


def test_bad_spot_and_moved_log(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"not a log spot: 'main\.log'"):
        evidence.parse_spot("main.log")
    with pytest.raises(InputError, match="the log is not there any more"):
        evidence.evidence_lines([f"{tmp_path / 'gone.log'}:1-2"])


def test_a_requests_own_lines(tmp_path: Path) -> None:
    """Two slots interleaved: the request's lines are its own, not the other slot's in between."""
    src = Path(__file__).resolve().parents[1] / "fixtures" / "server-runs" / "real-2026" / "server.log"
    ingest(tmp_path / "store", [src], IngestOptions(run="r"))
    store = Store(tmp_path / "store")
    con = store.connect(tables=["requests"])
    slot, task, first, last = con.execute(
        "SELECT slot, task, line_first, line_last FROM requests ORDER BY line_first LIMIT 1").fetchone()
    con.close()
    got = evidence.request_lines(store, "r", store.table("requests")["instance"][0], slot, task, max_lines=100)
    assert got["line_no"].to_list()[0] == first and got["line_no"].to_list()[-1] == last
    assert all(f"id  {slot}" in t or f"id {slot}" in t or f"task {task}" in t for t in got["text"].to_list())
    lines = src.read_text(encoding="utf-8", errors="replace").splitlines()
    assert got["text"].to_list() == [lines[n - 1] for n in got["line_no"].to_list()]

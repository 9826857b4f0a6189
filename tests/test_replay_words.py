"""A word a harness invents for an enumerated field never loses its record (docs/replay.md, Record schema).

The real case: b11434-ctxshift-runaway's manifest ends ``"how": "drained"`` (the harness stopped the servers with
requests in flight), a word the schema does not list.  The manifest used to be rejected whole, and the run lost
its servers, items and stages.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from forensics import replay
from forensics.cli import cli
from tests.conftest import ROOT

DRAINED = ROOT / "fixtures" / "server-runs" / "b11434-ctxshift-runaway"


def test_a_manifest_ending_in_an_unknown_word_is_kept_with_the_word_in_its_detail() -> None:
    recs = replay.load([DRAINED / "manifest.json"])
    assert recs.errors == []
    truth = json.loads((DRAINED / "manifest.json").read_text())
    row = recs.runs.row(0, named=True)
    assert (row["ended_how"], row["ended_detail"]) == ("unknown", f"drained: {truth['ended']['detail']}")
    assert json.loads(row["items"]) == truth["items"] and json.loads(row["stages"]) == truth["stages"]
    assert [s["name"] for s in json.loads(row["servers"])] == ["main"]
    assert recs.notes == [f"{DRAINED / 'manifest.json'}: ended.how 'drained' is not one of completed, killed, crashed, "
                          "unknown: read as 'unknown', the word kept in the detail (1 record)"]


def test_outcome_words_are_read_as_the_listed_one_they_mean_else_failed_with_the_word_kept(tmp_path: Path) -> None:
    rows = [("A", "Success", None), ("B", "timed-out", None), ("C", "server_shutdown", "RemoteDisconnected"),
            ("D", "server_shutdown", None), ("E", "CANCELED", None), ("F", "ok", None)]
    path = tmp_path / "attempts.jsonl"
    path.write_text("".join(json.dumps({"run_id": "r", "item": i, "stage": "s", "outcome": o, "error": e}) + "\n"
                            for i, o, e in rows))
    recs = replay.load(path)
    assert recs.errors == []
    assert recs.attempts.select("item", "outcome", "error").rows() == [
        ("A", "ok", None), ("B", "timeout", None), ("C", "failed", "RemoteDisconnected (outcome 'server_shutdown')"),
        ("D", "failed", "outcome 'server_shutdown'"), ("E", "cancelled", None), ("F", "ok", None)]
    assert recs.notes == [
        f"{path}: outcome 'Success' read as 'ok' (1 record)",
        f"{path}: outcome 'timed-out' read as 'timeout' (1 record)",
        f"{path}: outcome 'server_shutdown' is not one of ok, failed, parse_error, timeout, cancelled: read as "
        "'failed', the word kept in error (2 records)",
        f"{path}: outcome 'CANCELED' read as 'cancelled' (1 record)",
    ]


def test_the_drained_run_folder_keeps_its_manifest(tmp_path: Path) -> None:
    store = str(tmp_path / "s")
    res = CliRunner().invoke(cli, ["ingest", str(DRAINED), "--store", store])
    assert res.exit_code == 0, res.stderr
    assert "ended.how 'drained' is not one of" in res.stderr
    out = CliRunner().invoke(cli, ["sql", "SELECT run, items_expected, ended_how FROM runs", "--store", store,
                                   "--format", "csv"]).stdout
    assert out == "run,items_expected,ended_how\nb11434-ctxshift-runaway,16,unknown\n"

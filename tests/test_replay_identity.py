"""Run identity: a run folder's server log and the harness's records are one run, whatever id the records
carry; commands asked about a run with only one of the two halves say so.

The server log is a real one (fixtures/server-runs/real-2026: 48 requests at -np 2, launched at
2026-11-29T15:26:07.924Z, elapsed times).  Its first two requests, read off the log by hand: slot 1 task 0
(206 prompt + 64 generated tokens, lines 10-17) and slot 0 task 2 (202 + 64, lines 12-22).
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from forensics.cli import cli
from tests.conftest import ROOT

LOG = ROOT / "fixtures" / "server-runs" / "real-2026" / "server.log"
MANIFEST = {"run_id": "bench-7", "started_at": "2026-11-29T15:26:08Z", "ended_at": "2026-11-29T15:26:40Z",
            "concurrency": 2, "items": ["AAPL", "MSFT", "NVDA"], "stages": ["extract"]}
ATTEMPTS = [
    {"run_id": "bench-7", "item": "AAPL", "stage": "extract", "outcome": "ok", "id_slot": 1,
     "started_at": "2026-11-29T15:26:08.230Z", "ended_at": "2026-11-29T15:26:09.530Z",
     "tokens_evaluated": 206, "tokens_predicted": 64, "max_tokens": 64},
    {"run_id": "bench-7", "item": "MSFT", "stage": "extract", "outcome": "parse_error", "id_slot": 0,
     "started_at": "2026-11-29T15:26:08.479Z", "ended_at": "2026-11-29T15:26:09.541Z",
     "tokens_evaluated": 202, "tokens_predicted": 64, "max_tokens": 64, "error": "JSON cut off"},
]


def run_folder(parent: Path, name: str = "nightly-1129", *, log: bool = True, records: bool = True) -> Path:
    folder = parent / name
    folder.mkdir(parents=True)
    if log:
        (folder / "server.log").write_bytes(LOG.read_bytes())
    if records:
        (folder / "manifest.json").write_text(json.dumps(MANIFEST))
        (folder / "attempts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in ATTEMPTS))
    return folder


def forensics(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_records_beside_a_log_are_the_logs_run_with_their_id_as_alias(tmp_path: Path) -> None:
    folder = run_folder(tmp_path)
    store = str(tmp_path / "s")
    code, _, err = forensics("ingest", str(folder), "--store", store, "-v")
    assert code == 0, err
    assert ("warning: records of run 'bench-7' are run 'nightly-1129' (the server log in the same folder); "
            "'bench-7' is kept as its alias\n") in err
    assert "warning: join: 2 attempts matched, 0 ambiguous, 0 unmatched\n" in err
    code, out, _ = forensics("runs", "--store", store, "--format", "csv")
    assert out == ("run,alias,np,items_expected,items_done,items_missing,attempts,requests,wall_s,ended,from\n"
                   "nightly-1129,bench-7,2,3,1,2,2,48,32.0,unknown,records\n")
    # asked by either name, missing answers with the server's evidence for the parse error
    code, by_alias, err = forensics("missing", "bench-7", "--store", store, "--format", "csv")
    assert (code, err) == (0, "note: run 'bench-7' is stored as 'nightly-1129' (its records were tied to that run)\n")
    assert by_alias == forensics("missing", "nightly-1129", "--store", store, "--format", "csv")[1]
    # the log (verbosity 3) does not show the request's own cap of 64 tokens; its record does: stop limit
    assert by_alias.splitlines() == [
        "item,stage,reason,detail,evidence",
        'MSFT,extract,parse_error,JSON cut off (attempts: 1),"server slot 0 task 2: 202 prompt + 64 generated tokens, '
        'not truncated, stop limit [server.log:12-22]"',
        'NVDA,extract,never_attempted,no attempt was made,""']
    code, out, err = forensics("runaways", "bench-7", "--store", store, "--format", "csv")
    assert (code, err) == (0, "note: run 'bench-7' is stored as 'nightly-1129' (its records were tied to that run)\n")


def test_a_log_ingested_after_its_records_ties_them(tmp_path: Path) -> None:
    """The records came first (their own run); ingesting the folder again with its log makes them one run."""
    folder = run_folder(tmp_path, log=False)
    store = str(tmp_path / "s")
    assert forensics("ingest", str(folder), "--store", store)[0] == 0
    assert forensics("runs", "--store", store, "--format", "csv")[1].splitlines()[1].startswith("bench-7,,2,3,")
    (folder / "server.log").write_bytes(LOG.read_bytes())
    code, _, err = forensics("ingest", str(folder), "--store", store, "-v")
    assert code == 0, err
    assert f"unchanged {folder / 'attempts.jsonl'}  records:attempts\n" in err
    assert forensics("runs", "--store", store, "--format", "csv")[1].splitlines()[1:] == [
        "nightly-1129,bench-7,2,3,1,2,2,48,32.0,unknown,records"]


def test_run_option_names_every_file_of_the_ingest(tmp_path: Path) -> None:
    folder = run_folder(tmp_path)
    store = str(tmp_path / "s")
    code, _, err = forensics("ingest", str(folder), "--run", "r42", "--store", store)
    assert code == 0, err
    assert "warning: records of run 'bench-7' are run 'r42' (--run); 'bench-7' is kept as its alias\n" in err
    code, out, _ = forensics("sql", "SELECT DISTINCT run FROM requests UNION SELECT run FROM attempts", "--store",
                             store, "--format", "csv")
    assert out == "run\nr42\n"


def test_commands_say_which_half_a_run_is_missing(tmp_path: Path) -> None:
    run_folder(tmp_path / "in", "records-only", log=False)
    run_folder(tmp_path / "in", "log-only", records=False)
    store = str(tmp_path / "s")
    assert forensics("ingest", str(tmp_path / "in"), "--store", store)[0] == 0
    for command in ("runaways", "deadslots"):
        code, out, err = forensics(command, "bench-7", "--store", store)
        assert (code, out) == (2, "")
        assert err == (f"forensics: error: run 'bench-7' has replay records but no server requests: {command} reads "
                       "the server log (ingest the run's llama-server log with its records (same folder, or --run "
                       "bench-7))\n")
    code, out, err = forensics("errors", "bench-7", "--store", store)
    assert (code, out) == (2, "")
    assert err.startswith("forensics: error: run 'bench-7' has replay records but no server log: errors reads ")
    code, out, err = forensics("missing", "log-only", "--store", store)
    assert (code, out) == (2, "")
    assert err == ("forensics: error: run 'log-only' has server requests but no replay records: missing reads the "
                   "harness's records (ingest the run's records with its log (same folder, or --run log-only))\n")


def test_several_record_runs_beside_one_log_stay_apart(tmp_path: Path) -> None:
    """A sweep against one server: each harness run is its own run; the join splits the log among them."""
    folder = run_folder(tmp_path)
    other = [dict(a, run_id="bench-8") for a in ATTEMPTS]
    (folder / "attempts-8.jsonl").write_text("".join(json.dumps(a) + "\n" for a in other))
    code, _, err = forensics("ingest", str(folder), "--store", str(tmp_path / "s"))
    assert code == 0, err
    assert ("warning: records of runs bench-7, bench-8 sit beside the server log of run 'nightly-1129': kept apart "
            "(the join splits the log among them by time)\n") in err
    out = forensics("runs", "--store", str(tmp_path / "s"), "--format", "csv")[1]
    assert [line.split(",")[:2] for line in out.splitlines()[1:]] == [["bench-7", ""], ["bench-8", ""]]


def test_a_request_stopped_by_its_own_cap_is_limit(tmp_path: Path) -> None:
    """The real log does not print the client's n_predict (64); the attempts that it served say max_tokens = 64
    and the server generated 64 tokens: those requests stopped at their cap (the others keep what the log says)."""
    folder = run_folder(tmp_path)
    store = str(tmp_path / "s")
    assert forensics("ingest", str(folder), "--store", store)[0] == 0
    out = forensics("sql", "SELECT task, gen_tokens, stop_reason FROM requests WHERE task IN (0, 2, 67) ORDER BY task",
                    "--store", store, "--format", "csv")[1]
    assert out == "task,gen_tokens,stop_reason\n0,64,limit\n2,64,limit\n67,43,eos\n"  # task 67 (lines 24-31) ended by itself

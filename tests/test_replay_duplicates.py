"""The same content twice in one run is read once, and ingest says which file it repeats.

The log is a real one (fixtures/server-runs/real-2026/server.log, 48 requests) that its server wrote with
``--log-file server.log``; the copies are what a user also has: the same lines captured from stderr, a copy
taken while the server was still writing (a prefix), a gzipped copy, a copied records file.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from click.testing import CliRunner

from forensics.cli import cli
from tests.conftest import ROOT

LOG = ROOT / "fixtures" / "server-runs" / "real-2026" / "server.log"
REQUESTS = 48


def forensics(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.stderr


def requests(store: str) -> str:
    return forensics("sql", "SELECT count(*) AS n, count(DISTINCT path) AS files FROM requests", "--store", store,
                     "--format", "csv")[1]


def test_a_log_and_its_stderr_copy_are_one_log(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "server.log").write_bytes(LOG.read_bytes())
    (run / "server.stderr.log").write_bytes(LOG.read_bytes())
    store = str(tmp_path / "s")
    code, _, err = forensics("ingest", str(run), "--store", store)
    assert code == 0, err
    assert (f"duplicate {run / 'server.stderr.log'}  duplicate  duplicate of {run / 'server.log'} (same content): not "
            "read again\n") in err
    assert requests(store) == f"n,files\n{REQUESTS},1\n"
    instances = forensics("sql", "SELECT count(*) AS n FROM instances", "--store", store, "--format", "csv")[1]
    assert instances == "n\n1\n"
    # again: still one
    assert forensics("ingest", str(run), "--store", store)[0] == 0
    assert requests(store) == f"n,files\n{REQUESTS},1\n"


def test_a_copy_taken_while_the_log_was_written_is_its_prefix(tmp_path: Path) -> None:
    lines = LOG.read_bytes().splitlines(keepends=True)
    run = tmp_path / "run"
    run.mkdir()
    (run / "early-copy.log").write_bytes(b"".join(lines[:100]))
    (run / "server.log").write_bytes(LOG.read_bytes())
    (run / "server.log.gz").write_bytes(gzip.compress(LOG.read_bytes()))
    store = str(tmp_path / "s")
    code, _, err = forensics("ingest", str(run), "--store", store)
    assert code == 0, err
    assert (f"duplicate {run / 'early-copy.log'}  duplicate  duplicate of {run / 'server.log'} (its beginning): not "
            "read again\n") in err
    assert f"duplicate {run / 'server.log.gz'}  duplicate  duplicate of {run / 'server.log'} (same content)" in err
    assert requests(store) == f"n,files\n{REQUESTS},1\n"


def test_a_longer_copy_ingested_later_replaces_the_stored_prefix(tmp_path: Path) -> None:
    lines = LOG.read_bytes().splitlines(keepends=True)
    run = tmp_path / "run"
    run.mkdir()
    (run / "a-early.log").write_bytes(b"".join(lines[:100]))
    store = str(tmp_path / "s")
    assert forensics("ingest", str(run), "--store", store)[0] == 0
    first = requests(store)
    assert first != f"n,files\n{REQUESTS},1\n"
    (run / "b-full.log").write_bytes(LOG.read_bytes())
    code, _, err = forensics("ingest", str(run), "--store", store)
    assert code == 0, err
    assert f"duplicate {run / 'a-early.log'}  duplicate  duplicate of {run / 'b-full.log'} (its beginning)" in err
    assert requests(store) == f"n,files\n{REQUESTS},1\n"


def test_files_of_different_runs_are_never_duplicates(tmp_path: Path) -> None:
    for name in ("run-a", "run-b"):
        (tmp_path / "in" / name).mkdir(parents=True)
        (tmp_path / "in" / name / "server.log").write_bytes(LOG.read_bytes())
    store = str(tmp_path / "s")
    code, _, err = forensics("ingest", str(tmp_path / "in"), "--store", store)
    assert code == 0 and "duplicate" not in err
    assert requests(store) == f"n,files\n{2 * REQUESTS},2\n"


def test_a_copied_records_file_is_read_once(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    line = {"run_id": "run", "item": "AAPL", "stage": "s", "outcome": "ok"}
    (run / "attempts.jsonl").write_text(json.dumps(line) + "\n")
    (run / "attempts (copy).jsonl").write_text(json.dumps(line) + "\n")
    store = str(tmp_path / "s")
    code, _, err = forensics("ingest", str(run), "--store", store)
    assert code == 0, err
    assert "duplicate attempt" not in err
    assert f"duplicate {run / 'attempts.jsonl'}  duplicate  duplicate of {run / 'attempts (copy).jsonl'}" in err
    assert forensics("sql", "SELECT count(*) AS n FROM attempts", "--store", store, "--format", "csv")[1] == "n\n1\n"

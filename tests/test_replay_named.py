"""A file named on the command line with an explicit ``--mapping`` is read by content when the mapping's
``files`` globs do not name it (a renamed file); when no table of the mapping fits, the refusal says which
tables were tried and why each failed.  On llmperf's real files (fixtures/replay/real/llmperf), renamed."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from forensics import replay
from forensics.cli import cli
from tests.replay_helpers import FIX

LLMPERF = FIX / "real" / "llmperf"
MAPPING = Path(replay.shipped_mappings()["llmperf"])


def forensics(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_a_renamed_individual_responses_file_is_read_by_its_content(tmp_path: Path) -> None:
    data = tmp_path / "groq-run3.json"
    shutil.copy(LLMPERF / "groq_70b_individual_responses.json", data)
    store = tmp_path / "s"
    code, _, err = forensics("ingest", str(data), "--mapping", "llmperf", "--store", str(store), "-v")
    assert code == 0, err
    assert f"ingested  {data}  records:mapped\n" in err
    out = forensics("sql", "SELECT run, count(*) AS n, sum(tokens_predicted) AS out FROM attempts GROUP BY run",
                    "--store", str(store), "--format", "csv")[1]
    # facts of the file (its provenance, counted by hand): 10 requests, 1500 output tokens; the run is its stem
    assert out == "run,n,out\ngroq-run3,10,1500\n"


def test_a_renamed_summary_is_read_by_its_content(tmp_path: Path) -> None:
    data = tmp_path / "summary-groq.json"
    shutil.copy(LLMPERF / "groq_70b_summary.json", data)
    recs = replay.load(data, mapping="llmperf")
    assert recs.runs.select("run", "summary_requests", "summary_ok").row(0) == ("summary-groq", 150, 150)


def test_no_table_fits_and_the_refusal_says_which_were_tried_and_why(tmp_path: Path) -> None:
    data = tmp_path / "result.json"
    shutil.copy(FIX / "real" / "vllm" / "Meta-Llama-3-8B-Instruct_tp1_len2000.json", data)
    code, _, err = forensics("ingest", str(data), "--mapping", "llmperf", "--store", str(tmp_path / "s"))
    assert code == 2
    line = next(x for x in err.splitlines() if x.startswith("error "))
    assert line.startswith(f"error     {data}  records:?  {MAPPING}: result.json: no table of mapping llmperf fits it "
                           "by content: [manifest] (files *_summary.json): ")
    assert "[attempts] (files *_individual_responses.json): " in line
    assert err.splitlines()[-1] == ("forensics: error: the mapping read nothing from the 1 file it names (see the "
                                    "errors above; the other files were ingested)")


def test_a_log_named_with_a_mapping_is_still_read_as_a_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    shutil.copy(FIX.parent / "server-runs" / "real-2026" / "server.log", log)
    code, _, err = forensics("ingest", str(log), "--mapping", "llmperf", "--store", str(tmp_path / "s"), "-v")
    assert code == 0, err
    assert f"ingested  {log}  llama-common  lines=345" in err

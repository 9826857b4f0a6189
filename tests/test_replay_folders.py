"""``--mapping`` on a run folder as users have them: the mapping reads the files its ``files`` globs name,
everything else is read as usual (the server log, the run manifest, the server's /metrics dump), a JSON file
of another kind is passed over and counted, ``--keep-going`` keeps going past any file that cannot be read,
and no manifest is dropped.

The folder holds real files: a llama-server log (fixtures/server-runs/real-2026) and a vLLM benchmark result
(fixtures/replay/real/vllm), next to a harness manifest, a Prometheus dump and an unrelated JSON file.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from forensics.cli import cli
from tests.conftest import ROOT
from tests.replay_helpers import FIX

LOG = ROOT / "fixtures" / "server-runs" / "real-2026" / "server.log"
VLLM = FIX / "real" / "vllm" / "Meta-Llama-3-8B-Instruct_tp1_len2000.json"


def forensics(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.stderr


def folder(tmp_path: Path, *, extra_json: bool = False) -> Path:
    run = tmp_path / "bench-0907"
    run.mkdir()
    (run / "server.log").write_bytes(LOG.read_bytes())
    (run / "result.json").write_bytes(VLLM.read_bytes())
    (run / "manifest.json").write_text(json.dumps({"run_id": "bench-0907", "concurrency": 10,
                                                   "started_at": "2024-09-07T08:28:50Z", "stages": ["serve"]}))
    (run / "metrics.prom").write_text("# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 9888\n")
    if extra_json:
        (run / "config.json").write_text(json.dumps({"threads": 8}))
    return run


def test_the_mapping_reads_its_files_and_everything_else_is_read_as_usual(tmp_path: Path) -> None:
    run = folder(tmp_path)
    store = str(tmp_path / "s")
    code, _, err = forensics("ingest", str(run), "--mapping", "vllm-bench", "--store", store, "-v")
    assert code == 0, err
    lines = [line for line in err.splitlines() if not line.startswith(("warning: ", "total: "))]
    assert lines == [
        f"ingested  {run / 'manifest.json'}  records:manifest",
        f"ingested  {run / 'metrics.prom'}  server:metrics  1 sample: prompt_tokens_total=9888",
        f"ingested  {run / 'result.json'}  records:mapped",
        f"ingested  {run / 'server.log'}  llama-common  lines=345 parsed=345 skipped=0 unparsed=0 requests=48",
    ]
    # the manifest and the result are one run: the harness's manifest, completed by vLLM's summary
    out = forensics("sql", "SELECT run, concurrency, model, summary_requests, alias FROM runs", "--store", store,
                    "--format", "csv")[1]
    assert out == ("run,concurrency,model,summary_requests,alias\n"
                   "bench-0907,10,meta-llama/Meta-Llama-3-8B-Instruct,10,result\n")
    # a text note nothing reads is passed over and counted; --exclude leaves it out
    (run / "notes.txt").write_text("restarted the server twice before this run\n")
    code, _, err = forensics("ingest", str(run), "--mapping", "vllm-bench", "--store", str(tmp_path / "s2"))
    assert code == 0, err
    assert "warning: passed over 1 file of the run folders: " in err
    code, _, err = forensics("ingest", str(run), "--mapping", "vllm-bench", "--store", str(tmp_path / "s3"),
                             "--exclude", "*.txt")
    assert code == 0, err
    assert f"warning: left out 1 file by --exclude (e.g. {run / 'notes.txt'})\n" in err


def test_a_json_file_of_another_kind_is_passed_over_and_counted(tmp_path: Path) -> None:
    """config.json matches the mapping's ``*.json`` glob but has none of vLLM's fields: not vLLM's file."""
    run = folder(tmp_path, extra_json=True)
    store = str(tmp_path / "s")
    code, _, err = forensics("ingest", str(run), "--mapping", "vllm-bench", "--store", store, "-v")
    assert code == 0, err
    assert (f"skipped   {run / 'config.json'}  other  not read: config.json has none of the fields mapping vllm-bench "
            "reads (it has: threads)\n") in err
    assert ("warning: passed over 1 file of the run folders: not a log, replay records (or a file the mapping reads) "
            "or a server dump (config.json); -v says why for each, --format NAME reads a log of a format not detected, "
            "--exclude GLOB leaves files out\n") in err
    assert f"ingested  {run / 'result.json'}  records:mapped\n" in err
    attempts = forensics("sql", "SELECT count(*) AS n FROM attempts", "--store", store, "--format", "csv")[1]
    assert attempts == "n\n10\n"


def test_a_file_named_on_the_command_line_is_read_by_a_mapping_without_globs(tmp_path: Path) -> None:
    data = tmp_path / "requests.jsonl"
    data.write_text(json.dumps({"job": "AAPL", "ok": True, "msg": "read timeout"}) + "\n")
    m = tmp_path / "m.toml"
    m.write_text('[attempts.fields]\nitem = "job"\noutcome = { path = "ok", map = { "true" = "ok", "*" = "failed" } }\n'
                 '[attempts.set]\nrun_id = "r"\nstage = "s"\n')
    code, _, err = forensics("ingest", str(data), "--mapping", str(m), "--store", str(tmp_path / "s"), "-v")
    assert code == 0, err
    assert f"ingested  {data}  records:mapped\n" in err


def test_a_harness_never_seen_is_read_by_a_15_line_mapping_in_one_command(tmp_path: Path) -> None:
    """fixtures/replay/newharness: a shell harness's run.json and results.csv (monotonic send times, status and
    parse flag in two columns, a warm-up row), beside the real server log; see its README."""
    mapping = FIX / "newharness" / "bench.toml"
    assert len(mapping.read_text().splitlines()) <= 15
    run = tmp_path / "run-1129"
    run.mkdir()
    for name in ("run.json", "results.csv"):
        (run / name).write_bytes((FIX / "newharness" / "run-1129" / name).read_bytes())
    (run / "server.log").write_bytes(LOG.read_bytes())
    store = str(tmp_path / "s")
    code, _, err = forensics("ingest", str(run), "--mapping", str(mapping), "--store", store)
    assert code == 0, err
    assert f"ingested  {run / 'results.csv'}  records:mapped  where left out 1 of 7 records\n" in err
    assert "warning: join: 4 attempts matched, 0 ambiguous, 2 unmatched\n" in err
    assert forensics("runs", "--store", store, "--format", "csv")[1] == (
        "run,alias,np,items_expected,items_done,items_missing,attempts,requests,wall_s,ended,from\n"
        "run-1129,,2,5,1,4,6,48,65.2,unknown,records\n")
    matches = forensics("sql", "SELECT item, stage, match, task FROM matches ORDER BY stage, item", "--store", store,
                        "--format", "csv")[1]
    assert matches.splitlines() == ["item,stage,match,task", "AAPL,extract,matched,0", "MSFT,extract,matched,2",
                                    "NVDA,extract,matched,67", "TSLA,extract,matched,68", "NVDA,summarize,unmatched,",
                                    "TSLA,summarize,unmatched,"]
    assert forensics("missing", "run-1129", "--store", store, "--format", "csv")[1].splitlines() == [
        "item,stage,reason,detail,evidence",
        'AMZN,extract,never_attempted,no attempt was made,""',
        'MSFT,extract,parse_error,output did not parse (attempts: 1),"server slot 0 task 2: 202 prompt + 64 generated '
        'tokens, not truncated, stop eos [server.log:12-22]"',
        'MSFT,summarize,never_attempted,earlier stage extract not done,""',  # it failed extract and went no further
        "NVDA,summarize,http_error,HTTP 503 (attempts: 1),rejected before a slot: no slot request in the log",
        "TSLA,summarize,timeout,client gave up after 30.0 s (attempts: 1),never reached a slot"]


def _replay_doc_blocks(after: str) -> list[str]:
    text = (ROOT / "docs" / "replay.md").read_text(encoding="utf-8").split(after, 1)[1]
    return [b.split("\n", 1)[1] for b in text.split("```")[1::2] if b.startswith("toml")]


def test_the_documented_mapping_examples_are_mappings(tmp_path: Path) -> None:
    from forensics import replay

    syntax = tmp_path / "syntax.toml"
    syntax.write_text(_replay_doc_blocks("### Syntax")[0])
    m = replay.load_mapping(syntax)
    assert m.attempts is not None and m.attempts.where == "phase <> 'warmup'" and m.attempts.anchors == ("manifest",)
    shown = _replay_doc_blocks("### A harness forensics has never seen")[0]
    assert shown == (FIX / "newharness" / "bench.toml").read_text()
    excerpts = _replay_doc_blocks("### What the shipped mappings say")[0]
    shipped = "".join(p.read_text() for p in replay.shipped_mappings().values())
    for line in excerpts.splitlines():
        if line and not line.startswith("#"):
            assert line in shipped, line

"""Strings from files and users are data, never SQL or markup: a hostile run id and item go everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.ingest import IngestOptions, ingest
from forensics.store import Store

INJ = "'; drop table requests; --"
XSS = "<script>alert(1)</script>"

LOG = """\
0.00.000.093 I cmn  common_param: common_params_print_info: verbosity = 3 (adjust with the `-lv N` CLI arg)
0.02.871.455 I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 4096, kv_unified = 'false'
0.02.955.301 I srv  llama_server: listening on http://127.0.0.1:8080
0.15.002.384 I slot launch_slot_: id  0 | task 0 | processing task, is_child = 0
0.23.041.984 I slot print_timing: id  0 | task 0 | prompt eval time =     228.40 ms /   812 tokens (    0.28 ms per token,  3555.17 tokens per second)
0.23.041.987 I slot print_timing: id  0 | task 0 |        eval time =    7811.20 ms /   178 tokens (   44.13 ms per token,    22.66 tokens per second)
0.23.041.990 I slot print_timing: id  0 | task 0 |       total time =    8039.60 ms /   990 tokens
0.23.042.015 I slot      release: id  0 | task 0 | stop processing: n_tokens = 989, truncated = 0
0.24.000.000 E srv    send_error: task id = 7, error: <script>alert(1)</script>
"""


@pytest.fixture
def hostile_store(tmp_path: Path) -> Path:
    run_dir = tmp_path / "logs" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "main.log").write_text(LOG)
    manifest = {"run_id": INJ, "started_at": "2026-03-02T10:00:00Z", "ended_at": "2026-03-02T10:01:00Z",
                "concurrency": 1, "servers": [{"name": "main", "host": "127.0.0.1", "port": 8080,
                                               "log_file": "main.log", "launched_at": "2026-03-02T09:59:45Z"}],
                "items": [INJ, XSS], "stages": ["extract"]}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    attempt = {"run_id": INJ, "item": INJ, "stage": "extract", "attempt": 1, "server": "main",
               "started_at": "2026-03-02T10:00:00.000Z", "ended_at": "2026-03-02T10:00:08.100Z",
               "http_status": 200, "outcome": "ok", "id_slot": 0, "tokens_evaluated": 812, "tokens_predicted": 178}
    (run_dir / "attempts.jsonl").write_text(json.dumps(attempt) + "\n")
    store = tmp_path / "store"
    ingest(store, [tmp_path / "logs"], IngestOptions(run=INJ))
    return store


def test_hostile_names_are_plain_data(hostile_store: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["--store", str(hostile_store)]
    for args in (["runs"], ["missing", INJ], ["deadslots", INJ], ["runaways", INJ], ["errors", INJ],
                 ["cap", INJ], ["throughput", INJ], ["summary"], ["check"]):
        res = runner.invoke(cli, [*args, *base, "--format", "json"] if args[0] != "check" else [*args, *base])
        assert res.exit_code == 0, (args, res.output)
    s = Store(hostile_store)
    req = s.table("requests")
    assert req.height == 1 and req["run"].to_list() == [INJ]  # the table is still there, the name intact
    items = s.table("items")
    assert sorted(items["item"].to_list()) == sorted([INJ, XSS])
    res = runner.invoke(cli, ["missing", INJ, *base, "--format", "json"])
    assert [row["item"] for row in json.loads(res.stdout)] == [XSS]
    out = tmp_path / "report.html"
    res = runner.invoke(cli, ["report", INJ, "-o", str(out), *base])
    assert res.exit_code == 0, res.output
    html = out.read_text()
    assert XSS not in html  # the item and the server's error text appear, escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html or "\\u003cscript" in html

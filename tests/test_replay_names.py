"""Long run names: the table cuts them with an ellipsis (keeping their end, where the runs of a sweep differ);
csv and json give them whole.  The run is a real vLLM result, named as users name their runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from forensics.cli import cli
from forensics.render import shorten
from tests.replay_helpers import FIX

NAME = "2026-11-29_qwen3-30b-a3b-instruct-2507-fp8_tp2_np8_ctx32768_sweep-run-03"


def test_the_table_cuts_a_long_run_name_with_an_ellipsis_and_csv_json_keep_it(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    shutil.copy(FIX / "real" / "vllm" / "Meta-Llama-3-8B-Instruct_tp1_len2000.json", result)
    store = str(tmp_path / "s")
    runner = CliRunner()
    res = runner.invoke(cli, ["ingest", str(result), "--mapping", "vllm-bench", "--run", NAME, "--store", store])
    assert res.exit_code == 0, res.output
    table = runner.invoke(cli, ["runs", "--store", store]).stdout.splitlines()
    cell = table[2].split("  ")[0]
    assert len(cell) == 60 and "\u2026" in cell
    assert cell == NAME[:40] + "\u2026" + NAME[-19:]
    assert runner.invoke(cli, ["runs", "--store", store, "--format", "csv"]).stdout.splitlines()[1].startswith(NAME + ",")
    assert json.loads(runner.invoke(cli, ["runs", "--store", store, "--format", "json"]).stdout)[0]["run"] == NAME


def test_a_name_that_fits_is_kept_whole() -> None:
    assert shorten("run-np4", 60) == "run-np4"
    assert shorten("a" * 61, 60) == "a" * 40 + "\u2026" + "a" * 19

"""A run folder as the harness leaves it ingests in one command: the server's /metrics and /slots dumps are
read, the labels file is not taken for the manifest, and every other file is either read or counted.

fixtures/replay/rundir/b11312-dumps is a real recording (llama.cpp b11312, see its README): a server log, a
/metrics dump taken at the end, /slots dumps taken during and after the last request, a manifest and a labels
file written by hand from what was done.  The facts checked here were read off the files by hand: the four
requests' prompt tokens in the log's timings (13 + 27 + 13 + 5 = 58) and their n_predict (16 + 16 + 16 + 200 =
248, random weights never stop early), the counters in metrics_end.prom, the slots in the two JSON dumps.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.replay import sidefiles
from tests.replay_helpers import FIX

DUMPS = FIX / "rundir" / "b11312-dumps"
PROMPT_TOKENS, GENERATED = 58, 248  # by hand, see the module docstring


def forensics(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.stderr


def csv(store: Path, query: str) -> list[str]:
    code, out, err = forensics("sql", query, "--store", str(store), "--format", "csv")
    assert code == 0, err
    return out.splitlines()


@pytest.fixture
def run(tmp_path: Path) -> Path:
    folder = tmp_path / "dumps-0030"
    shutil.copytree(DUMPS, folder)
    return folder


def test_the_run_folder_ingests_in_one_command_and_every_extra_file_is_used_or_counted(run: Path, tmp_path: Path) -> None:
    store = tmp_path / "s"
    code, _, err = forensics("ingest", str(run), "--store", str(store))
    assert code == 0, err
    assert err.splitlines()[:-1] == [
        f"ingested  {run / 'metrics_end.prom'}  server:metrics  15 samples: prompt_tokens_total={PROMPT_TOKENS}, "
        f"tokens_predicted_total={GENERATED}, requests_processing=0",
        f"ingested  {run / 'slots.json'}  server:slots  2 slots, 0 processing",
        f"ingested  {run / 'slots_mid.json'}  server:slots  2 slots, 1 processing",
        f"warning: {run / 'labels.json'}: not read as a run manifest: manifest.json in the same folder is the run's "
        "manifest (a folder's manifest is the file named manifest.json)",
        f"warning: metrics_end.prom: the server's counters agree with the 4 requests of its log ({PROMPT_TOKENS} "
        f"prompt tokens evaluated; {GENERATED} tokens generated)",
    ]
    assert err.splitlines()[-1].startswith("total: files=7 (5 ingested, 2 skipped) lines=")
    # the run's manifest is manifest.json, not labels.json (which also has a run_id and items)
    assert csv(store, "SELECT run, concurrency, items_expected, servers LIKE '%server.log%' AS named FROM runs") == [
        "run,concurrency,items_expected,named", "dumps-0030,1,,true"]
    assert csv(store, "SELECT source FROM runs")[1].endswith("/manifest.json")


def test_the_dumps_land_in_their_tables(run: Path, tmp_path: Path) -> None:
    store = tmp_path / "s"
    assert forensics("ingest", str(run), "--store", str(store))[0] == 0
    counters = csv(store, "SELECT name, value, type, taken FROM server_metrics WHERE name IN "
                          "('llamacpp:prompt_tokens_total', 'llamacpp:tokens_predicted_total', "
                          "'llamacpp:requests_processing') ORDER BY name")
    assert counters == ["name,value,type,taken", f"llamacpp:prompt_tokens_total,{PROMPT_TOKENS}.0,counter,end",
                        "llamacpp:requests_processing,0.0,gauge,end",
                        f"llamacpp:tokens_predicted_total,{GENERATED}.0,counter,end"]
    slots = csv(store, "SELECT regexp_extract(path, '[^/]+$') AS file, slot, id_task, is_processing, n_decoded, "
                       "n_remain, has_next_token, n_prompt_tokens, n_ctx FROM slot_states ORDER BY file, slot")
    assert slots == ["file,slot,id_task,is_processing,n_decoded,n_remain,has_next_token,n_prompt_tokens,n_ctx",
                     "slots.json,0,51,false,0,-1,false,206,512", "slots.json,1,0,false,0,-1,false,28,512",
                     # taken while the 200-token request was on slot 0: 4 generated, 196 left of its cap
                     "slots_mid.json,0,51,true,4,196,true,10,512", "slots_mid.json,1,0,false,0,-1,false,28,512"]


def test_a_log_cut_short_disagrees_with_the_servers_counters(run: Path, tmp_path: Path) -> None:
    """The log copied before the last request's timings: the server counted tokens the log does not show."""
    lines = (run / "server.log").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "task 51 | n_gen =    100" in line)
    (run / "server.log").write_text("".join(lines[:cut]))
    code, _, err = forensics("ingest", str(run), "--store", str(tmp_path / "s"))
    assert code == 0, err
    note = next(line for line in err.splitlines() if "the server's counters" in line)
    assert note == ("warning: metrics_end.prom: the server's counters disagree with the 4 requests of its log (prompt "
                    "tokens evaluated: 58 by the server, 53 in the log, 5 in requests the log does not show; tokens "
                    "generated: 248 by the server, 48 in the log, 200 in requests the log does not show)")


def test_without_a_file_named_manifest_the_other_manifest_is_read(run: Path, tmp_path: Path) -> None:
    (run / "manifest.json").unlink()
    store = tmp_path / "s"
    code, _, err = forensics("ingest", str(run), "--store", str(store))
    assert code == 0, err
    assert csv(store, "SELECT items_expected FROM runs") == ["items_expected", "4"]
    assert csv(store, "SELECT source FROM runs")[1].endswith("/labels.json")


def test_every_other_file_of_a_folder_is_passed_over_and_counted(run: Path, tmp_path: Path) -> None:
    (run / "results.json").write_text(json.dumps({"throughput": 12.5, "notes": "smoke"}))
    (run / "timings.csv").write_text("step,seconds\nwarmup,3.1\n")
    (run / "cmdlines.txt").write_text("llama-server -m tiny.gguf -np 2 --metrics --slots\n")
    code, _, err = forensics("ingest", str(run), "--store", str(tmp_path / "s"), "-v")
    assert code == 0, err
    assert f"skipped   {run / 'results.json'}  other  {sidefiles.OTHER} (data)\n" in err
    assert f"skipped   {run / 'timings.csv'}  other  {sidefiles.OTHER} (data)\n" in err
    assert f"skipped   {run / 'cmdlines.txt'}  other  {sidefiles.OTHER} (text without llama-server lines)\n" in err
    assert ("warning: passed over 3 files of the run folders: not a log, replay records (or a file the mapping "
            "reads) or a server dump (cmdlines.txt, results.json, timings.csv); -v says why for each, --format NAME "
            "reads a log of a format not detected, --exclude GLOB leaves files out\n") in err
    code, _, err = forensics("ingest", str(run), "--store", str(tmp_path / "s2"), "--exclude", "cmdlines.*")
    assert code == 0, err
    assert f"warning: left out 1 file by --exclude (e.g. {run / 'cmdlines.txt'})\n" in err
    assert "passed over 2 files" in err
    named = forensics("ingest", str(run / "cmdlines.txt"), "--store", str(tmp_path / "s3"))
    assert named[0] == 2  # named on the command line, nothing reads it: an error


def test_a_dump_named_on_the_command_line_is_read(tmp_path: Path) -> None:
    code, _, err = forensics("ingest", str(DUMPS / "slots_mid.json"), "--store", str(tmp_path / "s"), "--run", "r")
    assert code == 0, err
    assert csv(tmp_path / "s", "SELECT run, count(*) AS n FROM slot_states GROUP BY run") == ["run,n", "r,2"]


def test_exclude_matches_a_path_below_the_folder(run: Path, tmp_path: Path) -> None:
    sub = run / "extra"
    sub.mkdir()
    (sub / "client.txt").write_text("sent 4 requests\n")
    code, _, err = forensics("ingest", str(run), "--store", str(tmp_path / "s"), "--exclude", "extra/*")
    assert code == 0, err


def test_prometheus_text_and_slot_shapes_of_every_era_parse() -> None:
    """The parser on the real dump, and the /slots shapes of 2024 (state, next_token object) and 2026."""
    samples = sidefiles.parse_metrics((DUMPS / "metrics_end.prom").read_text())
    assert len(samples) == 15 and all(s["type"] in ("counter", "gauge") for s in samples)
    labelled = sidefiles.parse_metrics('# TYPE x counter\nllamacpp:x{position="0",a="b\\"c"} 3 1700000000000\n')
    assert labelled[0]["labels"] == '{"a": "b\\"c", "position": "0"}' and labelled[0]["sample_ts"] == 1700000000000
    with pytest.raises(sidefiles.DumpError, match="line 2 is not a Prometheus sample"):
        sidefiles.parse_metrics("llamacpp:x 1\nthis is prose\n")
    with pytest.raises(sidefiles.DumpError, match="line 1 is not a Prometheus TYPE or HELP line"):
        sidefiles.parse_metrics("# TYPE llamacpp:x\nllamacpp:x 1\n")
    typed = sidefiles.parse_metrics("\n# HELP llamacpp:n_busy Busy slots\n# TYPE llamacpp:n_busy counter\n"
                                    "llamacpp:n_busy 1.5\n# TYPE llamacpp:t_total counter\nllamacpp:t_total 2\n")
    assert [(s["name"], s["type"], s["help"], s["line"]) for s in typed] == [
        ("llamacpp:n_busy", "counter", "Busy slots", 4), ("llamacpp:t_total", "counter", None, 6)]
    old = sidefiles._slot_row({"id": 1, "id_task": 7, "n_ctx": 2048, "state": 1, "n_predict": 128,
                               "next_token": {"has_next_token": True, "n_remain": 100, "n_decoded": 28}})
    assert (old["is_processing"], old["n_decoded"], old["n_remain"], old["n_predict"]) == (True, 28, 100, 128)
    assert sidefiles.server_of("metrics_backup_end.prom") == ("backup", "end")
    assert sidefiles.server_of("slots.json") == (None, None)


def test_a_readme_quoting_log_lines_is_a_note_not_a_log(run: Path, tmp_path: Path) -> None:
    """A run folder's README pastes a few of the server's lines: it is still the folder's notes."""
    quoted = (run / "server.log").read_text().splitlines()[9:13]
    (run / "README.md").write_text("# what happened\n\n```\n" + "\n".join(quoted) + "\n```\n")
    store = tmp_path / "s"
    code, _, err = forensics("ingest", str(run), "--store", str(store), "-v")
    assert code == 0, err
    assert f"skipped   {run / 'README.md'}  not a log  a .md file that is not a log: not read\n" in err
    assert csv(store, "SELECT count(*) AS n FROM instances") == ["n", "1"]

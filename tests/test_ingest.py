"""Ingest: real logs, line accounting on hostile input, incremental behaviour, the CLI."""

from __future__ import annotations

import gzip
import json
import os
import random
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pyarrow.dataset as ds
import pytest
import zstandard
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import InputError
from forensics.ingest import FilesNotRead, IngestOptions, ingest
from forensics.store import Store

RUNS = Path(__file__).resolve().parent.parent / "fixtures" / "server-runs"
REAL = RUNS / "real-2026" / "server.log"
REAL_B4747 = RUNS / "real-b4747" / "server.log"

ERA5 = """\
0.00.000.093 I cmn  common_param: common_params_print_info: verbosity = 3 (adjust with the `-lv N` CLI arg)
0.00.011.820 I srv    load_model: loading model '/models/m.gguf'
0.02.871.455 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 4096, kv_unified = 'false'
0.02.955.118 I srv  llama_server: model loaded
0.02.955.301 I srv  llama_server: listening on http://127.0.0.1:8080
0.15.002.210 I slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1
0.15.002.384 I slot launch_slot_: id  0 | task 0 | processing task, is_child = 0
0.23.041.984 I slot print_timing: id  0 | task 0 | prompt eval time =     228.40 ms /   812 tokens (    0.28 ms per token,  3555.17 tokens per second)
0.23.041.987 I slot print_timing: id  0 | task 0 |        eval time =    7811.20 ms /   178 tokens (   44.13 ms per token,    22.66 tokens per second)
0.23.041.990 I slot print_timing: id  0 | task 0 |       total time =    8039.60 ms /   990 tokens
0.23.041.993 I slot print_timing: id  0 | task 0 |    graphs reused =        176
0.23.042.015 I slot      release: id  0 | task 0 | stop processing: n_tokens = 989, truncated = 0
"""


def _requests(store_dir: Path):
    return Store(store_dir).table("requests")


def _files(store_dir: Path):
    return Store(store_dir).table("files")


def _accounting_holds(store_dir: Path) -> None:
    for row in _files(store_dir).iter_rows(named=True):
        assert row["lines_parsed"] + row["lines_skipped"] + row["lines_unparsed"] == row["lines_total"], row


def test_real_2026_sample(store_dir: Path) -> None:
    ingest(store_dir, [REAL])
    files = _files(store_dir)
    assert files["lines_unparsed"].to_list() == [0]
    req = _requests(store_dir)
    assert req.height == 48
    assert sorted(req["slot"].unique().to_list()) == [0, 1]
    assert req["gen_tokens"].sum() == 2584
    inst = Store(store_dir).table("instances")
    assert inst.select("n_slots", "n_ctx_slot", "host", "port", "time_basis").row(0) == (
        2, 2048, "127.0.0.1", 18102, "elapsed")
    _accounting_holds(store_dir)


def test_real_b4747_sample(store_dir: Path) -> None:
    ingest(store_dir, [REAL_B4747])
    req = _requests(store_dir)
    assert req.height == 48
    assert req["gen_tokens"].sum() == 2575
    assert sorted(req["slot"].unique().to_list()) == [0, 1, 2, 3]
    assert req["http_status"].to_list() == [200] * 48
    inst = Store(store_dir).table("instances")
    assert inst.select("build", "n_slots", "port", "time_basis").row(0) == (4747, 4, 18710, "order")
    assert _files(store_dir)["lines_unparsed"].to_list() == [0]


def test_era5_request_fields(tmp_path: Path, store_dir: Path) -> None:
    log = tmp_path / "run-1" / "server.log"
    log.parent.mkdir()
    log.write_text(ERA5)
    ingest(store_dir, [tmp_path])
    row = _requests(store_dir).row(0, named=True)
    assert row["run"] == "run-1"
    assert (row["slot"], row["task"], row["seq"]) == (0, 0, 1)
    # n_tokens at release (989) - generated (178) + 1 = 812 prompt tokens; all evaluated, none cached
    assert (row["prompt_tokens"], row["prompt_eval_tokens"], row["cached_tokens"], row["gen_tokens"]) == (812, 812, 0, 178)
    assert (row["prompt_ms"], row["gen_ms"], row["total_ms"]) == (228.40, 7811.20, 8039.60)
    assert row["stop_reason"] == "eos" and row["truncated"] is False
    assert row["elapsed_start_s"] == pytest.approx(15.002384)
    assert row["elapsed_end_s"] == pytest.approx(23.042015)
    assert (row["line_first"], row["line_last"]) == (7, 12)  # slot selection (line 6) has task -1
    assert row["t_start"] is None


def test_started_at_anchors_elapsed_times(tmp_path: Path, store_dir: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(ERA5)
    from forensics.ingest import parse_time

    ingest(store_dir, [log], IngestOptions(started_at=parse_time("2026-11-29T15:26:07Z")))
    row = _requests(store_dir).row(0, named=True)
    assert row["t_start"].isoformat() == "2026-11-29T15:26:22.002384+00:00"


@pytest.mark.parametrize("case", ["random", "nul", "invalid_utf8", "crlf", "empty", "long_line", "mixed"])
def test_line_accounting_on_hostile_input(tmp_path: Path, store_dir: Path, case: str) -> None:
    rng = random.Random(7)
    if case == "random":
        data = ERA5.encode() + bytes(rng.randrange(256) for _ in range(5000)) + b"\n"
    elif case == "nul":
        data = ERA5.encode().replace(b"slot", b"sl\x00ot", 2)
    elif case == "invalid_utf8":
        data = ERA5.encode() + b"\xff\xfe broken \xc3\x28 line\n"
    elif case == "crlf":
        data = ERA5.replace("\n", "\r\n").encode()
    elif case == "empty":
        data = ERA5.encode() + b"\n\n\n"
    elif case == "long_line":
        data = ERA5.encode() + b"x" * (10 * 1024 * 1024) + b"\n"
    else:  # mixed: era-5 then era-4 bare lines after a restart with other flags
        data = (ERA5 + "build: 4747 (c392e509) with cc (GCC) 12.2.0 for x86_64-linux-gnu\n"
                "slot launch_slot_: id  0 | task 0 | processing task\n"
                "slot      release: id  0 | task 0 | stop processing: n_past = 20, truncated = 0\n").encode()
    path = tmp_path / "server.log"
    path.write_bytes(data)
    ingest(store_dir, [path])
    _accounting_holds(store_dir)
    files = _files(store_dir)
    expected_lines = data.count(b"\n")
    assert files["lines_total"].to_list() == [expected_lines]
    req = _requests(store_dir)
    assert req.filter(req["task"] == 0)["gen_tokens"].to_list()[:1] == [178]
    if case == "crlf":
        assert files["lines_unparsed"].to_list() == [0]
    if case == "invalid_utf8":
        text = Store(store_dir).table("unparsed")["text"].to_list()
        assert any("\ufffd" in t for t in text)
    if case == "mixed":
        inst = Store(store_dir).table("instances").sort("line_first")
        assert inst["instance"].to_list() == ["server", "server#2"]
        assert inst["build"].to_list() == [None, 4747]


def test_unterminated_last_line_is_read_once_complete(tmp_path: Path, store_dir: Path) -> None:
    path = tmp_path / "server.log"
    head, tail = ERA5.rsplit("\n", 2)[0], ERA5.rsplit("\n", 2)[1]
    path.write_text(head + "\n" + tail)  # last line without newline
    ingest(store_dir, [path])
    files = _files(store_dir)
    assert files["lines_total"].to_list() == [11]
    assert files["held_back_bytes"].to_list() == [len(tail)]
    with path.open("a") as fh:
        fh.write("\n")
    ingest(store_dir, [path])
    assert _files(store_dir)["lines_total"].to_list() == [12]
    assert _requests(store_dir)["stop_reason"].to_list() == ["eos"]


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_compressed_and_truncated(tmp_path: Path, store_dir: Path, codec: str) -> None:
    raw = ERA5.encode() * 3 if codec == "gzip" else ERA5.encode() * 3000  # zstd blocks are 128 KiB
    blob = gzip.compress(raw) if codec == "gzip" else zstandard.ZstdCompressor().compress(raw)
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "a.log.x").write_bytes(blob)
    ingest(store_dir, [tmp_path / "ok"], IngestOptions(run="ok"))
    assert _files(store_dir)["lines_total"].to_list() == [raw.count(b"\n")]
    cut = tmp_path / "cut.log"
    cut.write_bytes(blob[: len(blob) * 2 // 3])
    result = ingest(store_dir, [cut], IngestOptions(run="cut"))
    _accounting_holds(store_dir)
    assert any("ends early" in w or "damaged" in w for w in result.warnings)



def test_reingest_unchanged_adds_nothing_and_replaced_file_is_reread(tmp_path: Path, store_dir: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text(ERA5)
    ingest(store_dir, [path])
    before = Store(store_dir).manifest["parts"]
    result = ingest(store_dir, [path])
    assert [f.status for f in result.files] == ["unchanged"]
    assert Store(store_dir).manifest["parts"] == before
    path.write_text(ERA5.replace("178 tokens", "179 tokens").replace("verbosity = 3", "verbosity = 4"))
    os.utime(path, (1, 1))
    result = ingest(store_dir, [path])
    assert [f.status for f in result.files] == ["replaced"]
    assert _requests(store_dir)["gen_tokens"].to_list() == [179]
    assert Store(store_dir).table("events").height == 12


def test_unknown_file_fails_clearly_unless_keep_going(tmp_path: Path, store_dir: Path) -> None:
    """Named on the command line, a file nothing reads is an error (in a folder it is passed over and counted,
    see tests/test_replay_rundir.py)."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "server.log").write_text(ERA5)
    notes = tmp_path / "logs" / "notes.txt"
    notes.write_text("shopping list\nmilk\n")
    named = [tmp_path / "logs" / "server.log", notes]
    with pytest.raises(FilesNotRead) as exc:
        ingest(store_dir, named)
    assert exc.value.result.errors == [
        f"{notes}: not a llama-server log or replay record this version knows (pass "
        "--format NAME to force a log format, --mapping FILE for harness records, or --keep-going to load the "
        "other files)"]
    assert _requests(store_dir).height == 1  # the other files still load
    res = CliRunner().invoke(cli, ["ingest", "--store", str(tmp_path / "cli"), *map(str, named)])
    assert res.exit_code == 2
    assert f"error     {notes}  ?  {notes}: not a llama-server log" in res.stderr
    assert res.stderr.splitlines()[-1] == ("forensics: error: 1 file could not be read; the others were ingested "
                                           "(fix or remove them, or pass --keep-going to accept this)")
    assert _requests(tmp_path / "cli").height == 1
    result = ingest(tmp_path / "kg", named, IngestOptions(keep_going=True))
    assert sorted(f.status for f in result.files) == ["error", "ingested"]
    assert _requests(tmp_path / "kg").height == 1
    folder = CliRunner().invoke(cli, ["ingest", "--store", str(tmp_path / "folder"), str(tmp_path / "logs")])
    assert folder.exit_code == 0, folder.output
    assert "warning: passed over 1 file of the run folders: " in folder.stderr


def test_cli_sql_json_and_exit_codes(tmp_path: Path, store_dir: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text(ERA5)
    runner = CliRunner()
    res = runner.invoke(cli, ["ingest", "--store", str(store_dir), str(path)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["sql", "--store", str(store_dir), "--format", "json",
                              "select slot, task, gen_tokens, stop_reason from requests"])
    assert res.exit_code == 0
    assert json.loads(res.stdout) == [{"slot": 0, "task": 0, "gen_tokens": 178, "stop_reason": "eos"}]
    res = runner.invoke(cli, ["sql", "--store", str(store_dir), "--format", "csv", "select slot, task from requests"])
    assert res.stdout == "slot,task\n0,0\n"


def test_store_reads_with_pyarrow_hive_partitioning(tmp_path: Path, store_dir: Path) -> None:
    log = tmp_path / "run-42" / "server.log"
    log.parent.mkdir()
    log.write_text(ERA5)
    ingest(store_dir, [tmp_path])
    table = ds.dataset(store_dir / "requests", format="parquet", partitioning="hive").to_table()
    assert table.column("run").to_pylist() == ["run-42"]
    assert table.column("gen_tokens").to_pylist() == [178]


def test_tiny_chunks_give_the_same_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk boundaries (multi-line chat template, timing blocks) do not change what is parsed."""
    from parsers import reader

    one = tmp_path / "one"
    ingest(one, [REAL_B4747], IngestOptions(run="r"))
    monkeypatch.setattr(reader, "CHUNK_BYTES", 300)
    many = tmp_path / "many"
    ingest(many, [REAL_B4747], IngestOptions(run="r"))
    cols = ["slot", "task", "prompt_tokens", "gen_tokens", "total_ms", "http_status", "line_first", "line_last"]
    assert Store(many).table("requests").select(cols).sort("line_first").equals(
        Store(one).table("requests").select(cols).sort("line_first"))
    keep = ["lines_total", "lines_parsed", "lines_skipped", "lines_unparsed", "skipped_by_kind"]
    assert Store(many).table("files").select(keep).rows() == Store(one).table("files").select(keep).rows()


FIXTURE_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
FIXTURE_LOGS = sorted(FIXTURE_DIR.glob("*.log"))


@pytest.mark.parametrize("chunk_bytes", [200, 700])
@pytest.mark.parametrize("log", FIXTURE_LOGS, ids=lambda p: p.name)
def test_every_fixture_gives_the_same_requests_in_tiny_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               log: Path, chunk_bytes: int) -> None:
    """Chunk and batch boundaries anywhere (era-2 timings before their `released` line, timing blocks, restarts,
    router ports, wrappers) change no request and no line count."""
    from parsers import reader

    ingest(tmp_path / "one", [log], IngestOptions(run="r"))
    monkeypatch.setattr(reader, "CHUNK_BYTES", chunk_bytes)
    ingest(tmp_path / "many", [log], IngestOptions(run="r"))
    one, many = Store(tmp_path / "one"), Store(tmp_path / "many")
    assert many.table("requests").sort("line_first").equals(one.table("requests").sort("line_first"))
    keep = ["lines_total", "lines_parsed", "lines_skipped", "lines_unparsed", "skipped_by_kind", "bytes_read"]
    assert many.table("files").select(keep).rows() == one.table("files").select(keep).rows()


def _era4_request(slot: int, task: int, part: str) -> list[str]:
    if part == "start":
        return [f"slot launch_slot_: id  {slot} | task {task} | processing task",
                f"slot update_slots: id  {slot} | task {task} | new prompt, n_ctx_slot = 2048, n_keep = 0, "
                "n_prompt_tokens = 100"]
    return [f"slot      release: id  {slot} | task {task} | stop processing: n_past = 149, truncated = 0",
            f"slot print_timing: id  {slot} | task {task} | ",
            "prompt eval time =      80.00 ms /   100 tokens (    0.80 ms per token,  1250.00 tokens per second)",
            "       eval time =    1185.00 ms /    50 tokens (   23.70 ms per token,    42.19 tokens per second)",
            "      total time =    1265.00 ms /   150 tokens"]


@pytest.mark.parametrize("chunk_bytes", [None, 150, 300])
def test_an_http_line_tied_to_nothing_does_not_shift_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 chunk_bytes: int | None) -> None:
    """A POST rejected before any slot took it (nothing had closed yet) is tied to no request, and the lines
    after it still go to their own requests however the log is cut: each status below is the request's own."""
    from parsers import reader

    def http(status: int) -> list[str]:
        return [f"srv  log_server_r: request: POST /v1/chat/completions 127.0.0.1 {status}"]

    req = _era4_request
    lines = ((FIXTURE_DIR / "era4-bare-b4747.log").read_text().splitlines()[:23] + http(400)
             + req(0, 1, "start") + req(1, 2, "start") + req(0, 1, "end") + req(1, 2, "end") + http(200) + http(500)
             + req(0, 3, "start") + req(0, 3, "end") + http(201) + req(1, 7, "start") + req(0, 5, "start")
             + req(0, 5, "end") + http(202) + req(1, 7, "end") + http(502))
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    if chunk_bytes is not None:
        monkeypatch.setattr(reader, "CHUNK_BYTES", chunk_bytes)
    ingest(tmp_path / "store", [log], IngestOptions(run="r"))
    got = Store(tmp_path / "store").table("requests").sort("line_first").select("task", "http_status").rows()
    assert got == [(1, 200), (2, 500), (3, 201), (7, 502), (5, 202)]


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("log", FIXTURE_LOGS, ids=lambda p: p.name)
def test_a_log_read_while_it_grows_gives_the_same_requests(tmp_path: Path, log: Path, seed: int) -> None:
    """Ingesting a log three times as it grows (cut at random lines: inside timing blocks, between a request and
    its HTTP line, across restarts) ends with exactly the requests of one ingest of the whole file."""
    lines = log.read_bytes().split(b"\n")
    cuts = sorted(random.Random(seed).sample(range(8, len(lines)), 3))
    whole = tmp_path / "whole" / log.name
    whole.parent.mkdir()
    whole.write_bytes(log.read_bytes())
    ingest(tmp_path / "one", [whole], IngestOptions(run="r"))
    growing = tmp_path / "growing" / log.name
    growing.parent.mkdir()
    prev = 0
    for cut in [*cuts, len(lines)]:
        with growing.open("ab") as fh:
            fh.write(b"\n".join(lines[prev:cut]) + (b"\n" if cut < len(lines) else b""))
        prev = cut
        ingest(tmp_path / "grown", [growing], IngestOptions(run="r"))
    drop = ["path"]
    got = Store(tmp_path / "grown").table("requests").drop(drop).sort("line_first")
    assert got.equals(Store(tmp_path / "one").table("requests").drop(drop).sort("line_first"))
    inst = ["instance", "n_slots", "n_ctx_slot", "model", "line_first", "line_last", "requests"]
    assert Store(tmp_path / "grown").table("instances").select(inst).sort("instance").equals(
        Store(tmp_path / "one").table("instances").select(inst).sort("instance"))
    ev = ["line_no", "kind", "slot", "task", "instance"]
    assert Store(tmp_path / "grown").table("events").select(ev).sort("line_no").equals(
        Store(tmp_path / "one").table("events").select(ev).sort("line_no"))


def test_syslog_times_in_a_local_zone(tmp_path: Path) -> None:
    """journald writes local time without a zone: --tz says which (CEST is UTC+2 in August)."""
    log = tmp_path / "server.log"
    log.write_text("".join(f"Aug 23 12:00:{15 + i:02d} gpu1 llama-server[42]: {line}\n"
                           for i, line in enumerate(ERA5.splitlines())))
    os.utime(log, (1_787_600_000, 1_787_600_000))  # written last on 2026-08-24: the year of the syslog times
    ingest(tmp_path / "utc", [log], IngestOptions(run="r"))
    ingest(tmp_path / "berlin", [log], IngestOptions(run="r", tz="Europe/Berlin"))
    utc = _requests(tmp_path / "utc").row(0, named=True)["t_start"]
    berlin = _requests(tmp_path / "berlin").row(0, named=True)["t_start"]
    assert utc.isoformat() == "2026-08-23T12:00:21+00:00"  # line 7 of the log: second 15 + 6
    assert berlin.isoformat() == "2026-08-23T10:00:21+00:00"
    with pytest.raises(InputError):
        ingest(tmp_path / "bad", [log], IngestOptions(tz="Mars/Olympus"))


def test_two_logs_growing_in_one_ingest_keep_their_own_open_requests(tmp_path: Path, store_dir: Path) -> None:
    """Each grown file continues from its own open requests, not from those of another file in the same ingest."""
    lines = ERA5.splitlines(keepends=True)
    head, tail = "".join(lines[:8]), "".join(lines[8:])  # cut after the prompt timing: task 0 still open
    logs = tmp_path / "logs"
    logs.mkdir()
    for name, port in (("a.log", "8080"), ("b.log", "8081")):  # two servers: the same content would be one file
        (logs / name).write_text(head.replace("8080", port))
    ingest(store_dir, [logs], IngestOptions(run="r"))
    for name in ("a.log", "b.log"):
        with (logs / name).open("a") as fh:
            fh.write(tail)
    result = ingest(store_dir, [logs], IngestOptions(run="r"))
    assert [f.status for f in result.files] == ["appended", "appended"]
    req = _requests(store_dir).sort("path")
    assert req.select("path", "task", "gen_tokens", "stop_reason").rows() == [
        (str(logs / "a.log"), 0, 178, "eos"), (str(logs / "b.log"), 0, 178, "eos")]


def _long_request_log(path: Path, n_lines: int) -> int:
    """Slot 0 runs one request spanning ``n_lines`` lines, logging a context shift now and then, while slot 1
    serves short requests beside it (most of the lines).  Returns the number of short requests."""
    lines = ["slot launch_slot_: id  0 | task 0 | processing task",
             "slot update_slots: id  0 | task 0 | new prompt, n_ctx_slot = 4096, n_keep = 0, n_prompt_tokens = 100"]
    shift = "slot update_slots: id  0 | task 0 | slot context shift, n_keep = 0, n_left = 4094, n_discard = 2047"
    task = 1
    while len(lines) < n_lines:
        lines += _era4_request(1, task, "start") + _era4_request(1, task, "end")
        task += 1
        if task % 4000 == 0:
            lines.append(shift)
    lines += ["slot      release: id  0 | task 0 | stop processing: n_past = 4000, truncated = 1",
              "slot print_timing: id  0 | task 0 | ",
              "prompt eval time =      80.00 ms /   100 tokens (    0.80 ms per token,  1250.00 tokens per second)",
              "       eval time = 1500000.00 ms / 30000 tokens (   50.00 ms per token,    20.00 tokens per second)",
              "      total time = 1500080.00 ms / 30100 tokens"]
    path.write_text("\n".join(lines) + "\n")
    return task - 1


@pytest.mark.parametrize("chunk_bytes", [None, 64 * 1024, 1024 * 1024, 3 * 1024 * 1024 + 17])
def test_a_long_request_stays_one_request_however_the_log_is_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  chunk_bytes: int | None) -> None:
    """A request whose lines span 100 000 lines (a runaway) is one row, complete, at every chunk size."""
    from parsers import reader

    log = tmp_path / "long.log"
    short = _long_request_log(log, 100_000)
    if chunk_bytes is not None:
        monkeypatch.setattr(reader, "CHUNK_BYTES", chunk_bytes)
    ingest(tmp_path / "s", [log], IngestOptions(run="r"))
    req = Store(tmp_path / "s").table("requests").sort("slot", "task")
    slot0 = req.filter(pl.col("slot") == 0).select("task", "gen_tokens", "stop_reason", "complete", "truncated").rows()
    assert slot0 == [(0, 30000, "context", True, True)]
    assert req.filter(pl.col("slot") == 1)["task"].to_list() == list(range(1, short + 1))
    assert req.filter(pl.col("slot") == 1)["gen_tokens"].to_list() == [50] * short


def test_syslog_dates_in_any_locale_and_across_new_year(tmp_path: Path) -> None:
    """journald prints month names in the system's locale, and a syslog date has no year: a log that began in
    December and was last written in January has its December lines in the year before."""
    log = tmp_path / "server.log"
    log.write_text(
        "Dez 31 23:59:58 gpu1 llama-server[7]: slot launch_slot_: id  0 | task 1 | processing task\n"
        "Jan 01 00:00:03 gpu1 llama-server[7]: slot      release: id  0 | task 1 | stop processing: n_past = 9, "
        "truncated = 0\n"
        "ago 05 17:27:04 gpu1 llama-server[7]: slot launch_slot_: id  0 | task 2 | processing task\n")
    mtime = datetime(2026, 1, 1, 0, 5, tzinfo=timezone.utc).timestamp()
    os.utime(log, (mtime, mtime))
    ingest(tmp_path / "s", [log], IngestOptions(run="r"))
    got = Store(tmp_path / "s").table("requests").sort("task").select("task", "t_start", "t_end").rows()
    assert got == [(1, datetime(2025, 12, 31, 23, 59, 58, tzinfo=timezone.utc),
                    datetime(2026, 1, 1, 0, 0, 3, tzinfo=timezone.utc)),
                   (2, datetime(2025, 8, 5, 17, 27, 4, tzinfo=timezone.utc),
                    datetime(2025, 8, 5, 17, 27, 4, tzinfo=timezone.utc))]

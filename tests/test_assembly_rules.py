"""The assembly rules that judge (docs/formats.md, "Rules that judge"), each on a short excerpt of a real log from
fixtures/real (line ranges of the file, so the excerpt is the user's text), or on lines written in the documented
format where no real log shows the shape alone."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import polars as pl

from forensics.ingest import IngestOptions, ingest
from forensics.store import Store

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "real"


def excerpt(name: str, first: int = 1, last: int | None = None) -> str:
    """Lines ``first``..``last`` (1-based, inclusive) of a real corpus log, as text (bytes that are not UTF-8 kept
    as they were)."""
    lines = (REAL / f"{name}.log").read_bytes().decode("utf-8", "surrogateescape").split("\n")
    return "\n".join(lines[first - 1:last]) + "\n"


def read(tmp_path: Path, text: str, name: str = "server.log") -> dict[str, pl.DataFrame]:
    log = tmp_path / "logs" / name
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(text.encode("utf-8", "surrogateescape"))
    ingest(tmp_path / "store", [log], IngestOptions(run="r"))
    store = Store(tmp_path / "store")
    return {t: store.table(t) for t in ("requests", "instances", "events")}


def request(tables: dict[str, pl.DataFrame], task: int) -> dict:
    rows = tables["requests"].filter(pl.col("task") == task)
    assert rows.height == 1, rows
    return rows.row(0, named=True)


# ------------------------------------------------------------------ where a process (instance segment) starts

def test_a_banner_line_after_a_served_request_or_an_end_starts_the_next_process(tmp_path: Path) -> None:
    """e4-armage: run 1's last request and `cleaning up before exit`, run 2's banner and failed model load
    (`exiting due to model loading error`), run 3's banner with `main: n_parallel is set to auto` first."""
    t = read(tmp_path, excerpt("e4-armage"))
    inst = t["instances"].sort("line_first")
    assert inst["instance"].to_list() == ["server", "server#2", "server#3"]
    assert inst["line_first"].to_list()[1:] == [20, 47]  # each at its first banner line
    assert inst.select("n_slots", "build").rows()[1:] == [(4, 8470), (4, 8470)]
    assert t["requests"].filter(pl.col("task") == 0)["instance"].to_list() == ["server#3"]


def test_lines_before_the_first_banner_line_are_that_process(tmp_path: Path) -> None:
    """e4-llamarunner-a: backend and Metal probes and a refused download come before `build_info:`."""
    t = read(tmp_path, excerpt("e4-llamarunner-a", 1, 40))
    assert t["instances"].select("instance", "build").rows() == [("server", 8680)]


def test_an_unknown_line_inside_a_banner_does_not_split_it(tmp_path: Path) -> None:
    """The trace-verbosity (-lv 4) banner of a 2026 build, in its documented shape, with a line no kind knows
    between its banner lines."""
    t = read(tmp_path, "\n".join([
        "0.00.007.836 I srv  llama_server: initializing ...",
        "0.00.013.542 I cmn  common_param: common_params_print_info: build 11312 (0c1e57098) with GNU 12.2.0 for Linux x86_64",
        "0.00.015.000 I something no format knows",
        "0.00.016.039 I cmn  common_param: common_params_print_info: verbosity = 4 (adjust with the `-lv N` CLI arg)",
        "0.00.021.884 I srv    load_model: loading model 'models/m.gguf'",
    ]) + "\n")
    assert t["instances"].select("instance", "build", "line_first").rows() == [("server", 11312, 1)]


def test_task_ids_back_at_zero_start_a_new_process_without_a_banner(tmp_path: Path) -> None:
    """Two runs pasted one after the other (`cat a.log b.log`): e4-nemoclaw-setup's first request twice."""
    run = excerpt("e4-nemoclaw-setup", 239, 264)
    t = read(tmp_path, run + run)
    assert t["requests"].sort("line_first").select("instance", "task").rows() == [("server", 0), ("server#2", 0)]


def test_a_process_that_exits_on_its_arguments_then_starts_again(tmp_path: Path) -> None:
    """crash-openmono-23: `error: invalid argument` ends each of three starts."""
    t = read(tmp_path, excerpt("crash-openmono-23"))
    assert t["instances"].height == 3


def test_two_servers_writing_into_one_journal_are_told_apart_by_their_alternating_tasks(tmp_path: Path) -> None:
    """fork-ollama-18090-a: tasks 1549 and 4121 progress on slot 0 at once, neither released."""
    t = read(tmp_path, excerpt("fork-ollama-18090-a"))
    assert t["requests"].sort("task").select("task", "instance", "gen_tokens").rows() == [
        (1549, "server", 271), (4121, "server@2", 386)]


def test_a_diff_of_two_logs_is_two_instances(tmp_path: Path) -> None:
    """`diff a.log b.log` of two runs of e4-kbagent's first request (< side, > side)."""
    release = excerpt("e4-kbagent", 4, 4).strip()
    other = release.replace("n_tokens = 3199", "n_tokens = 3300")
    t = read(tmp_path, f"4c4\n< {release}\n---\n> {other}\n")
    assert t["requests"].sort("instance").select("instance", "n_past_end").rows() == [
        ("server", 3199), ("server@2", 3300)]


# ------------------------------------------------------------------ which request a line belongs to

def test_timing_lines_whose_header_was_cut_belong_to_the_release_after_them(tmp_path: Path) -> None:
    t = read(tmp_path, excerpt("e4-kbagent", 1, 6))
    r = request(t, 1227)
    assert (r["prompt_ms"], r["gen_ms"], r["gen_tokens"], r["http_status"]) == (1551.07, 1482.34, 71, 200)


def test_a_timing_block_no_release_follows_is_a_request_of_its_own(tmp_path: Path) -> None:
    """e4-llamacpp-12237: a user pasted only the block, inside markdown fences."""
    t = read(tmp_path, excerpt("e4-llamacpp-12237"))
    assert t["requests"].select("slot", "task", "prompt_ms", "gen_ms", "gen_tokens", "complete", "stop_reason").rows() \
        == [(0, 7, 8734.21, 1075.76, 19, True, "eos")]


def test_an_n_ctx_train_cap_record_with_no_ids_is_a_request_that_stopped_at_its_limit(tmp_path: Path) -> None:
    t = read(tmp_path, excerpt("old-llamacpp-6638"))
    assert t["requests"].select("gen_tokens", "stop_reason").rows() == [(2048, "limit")]
    assert t["instances"].select("n_slots", "n_ctx", "n_ctx_train").rows() == [(1, 4096, 2048)]


def test_a_streamed_responses_http_line_inside_its_task_is_that_tasks(tmp_path: Path) -> None:
    """e4-kbagent: `done request` after `prompt processing done`, before the timings, one slot."""
    t = read(tmp_path, excerpt("e4-kbagent", 101, 149))
    assert [request(t, task)["http_status"] for task in (2352, 3342)] == [200, 200]


def test_a_requests_http_line_may_come_between_its_cancel_and_its_release(tmp_path: Path) -> None:
    """e4-nemo: the client hung up (cancel task), the HTTP line, then the release; two slots."""
    t = read(tmp_path, excerpt("e4-nemo", 224, 250))
    assert [(request(t, k)["http_status"], request(t, k)["stop_reason"]) for k in (100, 102)] == [
        (200, "cancelled"), (200, "cancelled")]


def test_a_failure_status_inside_a_task_is_a_refused_request_not_the_task(tmp_path: Path) -> None:
    """A handler-level 500 (tools param requires --jinja) printed while one task runs is not that task's line;
    the task takes the line after its own release (fixtures/logs era4-bare-b4747)."""
    text = (REAL.parent / "logs" / "era4-bare-b4747.log").read_text(encoding="utf-8")
    t = read(tmp_path, text)
    assert request(t, 2)["http_status"] == 200


def test_a_request_still_running_when_the_text_ends_takes_no_http_line(tmp_path: Path) -> None:
    """e4-cheatingsentiment: tasks 35, 36 and 49 are cut; the last HTTP line is task 48's."""
    t = read(tmp_path, excerpt("e4-cheatingsentiment", 355, 431))
    assert [request(t, k)["http_status"] for k in (35, 48)] == [None, 200]


def test_an_untagged_exception_after_a_release_and_cancel_is_that_tasks_error(tmp_path: Path) -> None:
    """e4-llamacpp-20761: release, idle, cancel, `got exception: {...500...}`, HTTP 500."""
    t = read(tmp_path, excerpt("e4-llamacpp-20761"))
    r = request(t, 98)
    assert (r["stop_reason"], r["http_status"], r["error"] is not None) == ("error", 500, True)


def test_llama_box_requests_are_keyed_by_their_request_id(tmp_path: Path) -> None:
    t = read(tmp_path, excerpt("fork-llamabox-1399"))
    assert t["requests"].sort("line_first").select(
        "slot", "prompt_tokens", "cached_tokens", "gen_tokens", "http_status", "complete", "stop_reason").rows() == [
        (None, 4, 0, 17, 200, True, "eos"), (None, None, None, None, None, False, "unknown")]
    t = read(tmp_path / "b", excerpt("fork-llamabox-852"))
    assert t["requests"].select("n_predict", "stop_reason").rows() == [(1024, "error")]


# ------------------------------------------------------------------ how a request ended

def test_a_prompt_that_fills_its_slot_and_generates_nothing_did_not_stop_at_the_context(tmp_path: Path) -> None:
    t = read(tmp_path, excerpt("e4-llamacpp-13689", 5, 10))
    assert request(t, 526)["stop_reason"] == "eos"


def test_which_timing_lines_say_a_request_ended(tmp_path: Path) -> None:
    """A text block's generation line does (its total cut off: e5-qwen38rtx3090-147); a lone prompt-eval line
    does not (e5-llamacpp-27752), nor a record's generation line cut short (old-llamacpp-6646-b)."""
    assert request(read(tmp_path / "a", excerpt("e5-qwen38rtx3090-147")), 234)["complete"] is True
    assert request(read(tmp_path / "b", excerpt("e5-llamacpp-27752")), 6571)["complete"] is False
    assert request(read(tmp_path / "c", excerpt("old-llamacpp-6646-b")), 52676)["complete"] is False


# ------------------------------------------------------------------ facts a person works out

def test_the_output_cap_is_n_decoded_plus_n_remaining(tmp_path: Path) -> None:
    assert request(read(tmp_path / "a", excerpt("e4-llamacpp-14938")), 1112)["n_predict"] == 32768
    assert request(read(tmp_path / "b", excerpt("e4-llamacpp-19522")), 0)["n_predict"] == -1  # no cap


def test_the_slot_count_is_idle_plus_processing_slots(tmp_path: Path) -> None:
    assert read(tmp_path, excerpt("fork-ollama-3418"))["instances"]["n_slots"].to_list() == [8]


def test_a_failure_stated_in_words_is_an_error_unless_its_level_says_otherwise(tmp_path: Path) -> None:
    """e4-llamacpp-14097's level-less lines are errors; the same message at W (era 5) is a warning, at E an error."""
    lines = excerpt("e4-llamacpp-14097", 1, 2) + "\n".join([
        "0.01.234.567 W decode: failed to find a memory slot for batch of size 512",
        "0.01.234.600 E decode: failed to find a memory slot for batch of size 256",
    ]) + "\n"
    ev = read(tmp_path, lines)["events"].sort("line_no")
    assert ev.select("line_no", "role").rows() == [(1, "error"), (2, "error"), (3, "failure"), (4, "error")]


# ------------------------------------------------------------------ time

def test_a_journald_stamp_yields_to_the_records_own_epoch(tmp_path: Path) -> None:
    """crash-llamafile-785: journald's local 06:19:14 and the JSON record's epoch 1754540354 (04:19:14 UTC)."""
    t = read(tmp_path, excerpt("crash-llamafile-785"))
    assert t["requests"]["t_start"].to_list() == [datetime(2025, 8, 7, 4, 19, 14, tzinfo=timezone.utc)]


def test_a_syslog_dates_year_is_the_one_the_lines_state(tmp_path: Path) -> None:
    """old-ollama-1365: `Dec 03 14:58:42` beside records stamped 1701615522 (2023), whatever the file's mtime."""
    started = read(tmp_path, excerpt("old-ollama-1365"))["instances"]["started_at"].to_list()
    assert [s.year for s in started] == [2023]


def test_log_jsonl_time_is_microseconds_since_start_and_typed_objects_are_events(tmp_path: Path) -> None:
    """llama-server's 2026 --log-jsonl objects, in their documented shape."""
    t = read(tmp_path, "\n".join([
        '{"type":"log","time":1348334,"level":"info","msg":"slot get_availabl: id  3 | task -1 | selected slot by LRU, t_last = -1\\n"}',
        '{"type":"log","time":1348399,"level":"info","msg":"slot launch_slot_: id  3 | task 0 | processing task, is_child = 0\\n"}',
        '{"type":"fit_memory_breakdown","data":{"unit":"MiB","rows":[{"kind":"host","name":"Host","self":94}]}}',
    ]) + "\n")
    assert request(t, 0)["elapsed_start_s"] == 1.348399
    assert t["instances"]["time_basis"].to_list() == ["elapsed"]
    assert t["events"].sort("line_no")["kind"].to_list() == ["slot_select", "slot_start", "jsonl_event"]

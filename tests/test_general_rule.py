"""The general rule for a line layout no format knows (parsers/formats/general.toml), and the rules this round made
general, each on an excerpt of a real log of fixtures/real (docs/formats.md, "Rules that judge")."""

from __future__ import annotations

import tempfile
from pathlib import Path

import polars as pl
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forensics.cli import cli
from tests.test_assembly_rules import excerpt, read, request

# One field of a fork's request line, written in one of the ways a layout may write it: (text, field, value).
SEP = st.sampled_from(["=", ": ", " ", "="])


@st.composite
def general_line(draw: st.DrawFn) -> tuple[str, dict[str, float | int]]:
    """A request line of a made-up layout: slot and task ids, prompt and generated tokens and both times, in any
    order, with any of the separators layouts use; returns the line and the values it states."""
    slot, task = draw(st.integers(0, 63)), draw(st.integers(0, 10**6))
    pt, gt = draw(st.integers(1, 10**5)), draw(st.integers(0, 10**4))
    pms, gms = draw(st.integers(1, 10**6)) / 100, draw(st.integers(1, 10**7)) / 100
    sep = draw(SEP)
    parts = [f"slot{sep}{slot}", f"task{sep}{task}", f"prompt{sep}{pt} tok", f"gen{sep}{gt} tok",
             f"pp{sep}{pms:.2f} ms", f"tg{sep}{gms:.2f} ms"]
    order = draw(st.permutations(range(len(parts))))
    joiner = draw(st.sampled_from([", ", " | ", " ", "; "]))
    head = draw(st.sampled_from(["", "done: ", "[fork] "]))
    return head + joiner.join(parts[i] for i in order), {"slot": slot, "task": task, "prompt_tokens": pt,
                                                          "gen_tokens": gt, "prompt_ms": pms, "gen_ms": gms}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(general_line())
def test_a_line_of_an_unknown_layout_is_a_request_whatever_its_order(case: tuple[str, dict]) -> None:
    line, want = case
    with tempfile.TemporaryDirectory() as d:
        t = read(Path(d), f"build: 7001 (abc1234) with cc for x86_64\n{line}\n")
        r = request(t, want["task"])
        assert {k: r[k] for k in want} == want
        assert (r["read_by"], r["complete"], r["stop_reason"]) == ("general", True, "eos")


def test_a_file_of_a_forks_lines_alone_is_read_and_ingest_says_how(tmp_path: Path) -> None:
    log = tmp_path / "fork.log"
    log.write_text("[slot 1|task 42] prompt=512 tok, gen=128 tok, pp=230.5 ms, tg=4012.3 ms\n"
                   "[slot 0|task 43] prompt=100 tok, gen=20 tok, pp=23.5 ms, tg=401.3 ms\n", encoding="utf-8")
    res = CliRunner().invoke(cli, ["ingest", str(log), "--store", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert ("note: 2 requests were read by the general rule from lines no format knows (a slot or task id with token "
            "counts or timings): check them with `forensics sql \"select * from requests where read_by = 'general'\"`"
            ) in res.output


def test_a_line_a_format_knows_is_never_the_general_rules(tmp_path: Path) -> None:
    """e4-radarllm: upstream's slot and server lines no kind knows (`need to evaluate at least 1 token ...`,
    `srv  try_clear_id: purging slot 2 with 1518 tokens`) stay upstream's: no request is read by the rule."""
    t = read(tmp_path, excerpt("e4-radarllm", 260, 329))
    assert set(t["requests"]["read_by"]) == {"format"}
    assert t["requests"]["task"].to_list() == [246, 335, 422, 512]
    assert "general_request_line" not in set(t["events"]["kind"].cast(pl.String))


def test_an_embedding_task_after_metrics_tasks_on_an_ollama_debug_log(tmp_path: Path) -> None:
    """fork-ollama-lc24190: the runner's DEBUG-level records, two `slot data` metrics tasks, then task 237."""
    t = read(tmp_path, excerpt("fork-ollama-lc24190"))
    assert t["requests"].select("slot", "task", "cached_tokens", "complete").rows() == [(0, 237, 0, False)]
    assert t["instances"]["n_slots"].to_list() == [1]


def test_the_http_line_of_a_request_whose_start_the_excerpt_does_not_show(tmp_path: Path) -> None:
    """e4-llamacpp-19955: the excerpt starts with a streamed response's `done request`, printed before the
    timings of task 291, the only request there is: it was in flight when the text began."""
    r = request(read(tmp_path, excerpt("e4-llamacpp-19955")), 291)
    assert (r["http_status"], r["prompt_ms"], r["gen_tokens"]) == (200, 23524.19, 128)


def test_the_training_context_from_whichever_line_states_it(tmp_path: Path) -> None:
    """e4-llamacpp-12171 (`llama_init_from_model: n_ctx_per_seq (512) < n_ctx_train (131072)`), e4-geminicli
    (`n_ctx_per_seq (4096) > n_ctx_train (2048)`), and the whole context from `n_ctx =`."""
    one = read(tmp_path / "a", excerpt("e4-llamacpp-12171"))["instances"]
    assert one.select("n_ctx", "n_ctx_train").rows() == [(512, 131072)]
    two = read(tmp_path / "b", excerpt("e4-geminicli", 98, 113))["instances"]
    assert two.select("n_ctx", "n_ctx_slot", "n_ctx_train").rows() == [(4096, 4096, 2048)]


def test_a_paste_of_a_models_loading_alone_is_a_log(tmp_path: Path) -> None:
    """fork-ramalama-2124: only `print_info:` lines of the loader; read as one instance, not refused."""
    t = read(tmp_path, excerpt("fork-ramalama-2124"))
    assert t["instances"].height == 1 and t["requests"].height == 0


def test_a_task_already_running_beside_another_is_another_servers(tmp_path: Path) -> None:
    """fork-ollama-18090-b: task 2044 starts on slot 0 and is not released when task 4121, with no start of its own,
    reports 673 generated tokens on slot 0: two servers in one journal."""
    t = read(tmp_path, excerpt("fork-ollama-18090-b"))
    assert t["requests"].sort("line_first").select("instance", "task").rows() == [("server", 2044), ("server@2", 4121)]


def test_progress_lines_before_a_timing_block_are_its_request(tmp_path: Path) -> None:
    """fork-koboldcpp-678: `Generating (k / 512 tokens)` lines with the access lines between them, then the
    `llama_print_timings` block that is the request: its cap is 512."""
    r = read(tmp_path, excerpt("fork-koboldcpp-678"))["requests"]
    assert r.select("n_predict", "gen_tokens").rows() == [(512, 26)]

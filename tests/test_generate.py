"""The scenario generator: determinism, line shapes (catalog §14 regexes), consistent numbers, size mode, CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.generate import (
    DeadSlot,
    Faults,
    Repeat,
    Run,
    Scenario,
    Server,
    demo_scenarios,
    errors,
    generate,
    healthy,
    runaway,
    tickers,
)

# -- the catalog's regex cheat-sheet (§14), as written there --------------------------------------------
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ROUTER = re.compile(r"^\[\s*(?P<port>\d+)\] (?P<rest>.*)$")
PREFIX = re.compile(r"^(?:(?P<min>\d+)\.(?P<sec>\d{2})\.(?P<ms>\d{3})\.(?P<us>\d{3}) )?(?:(?P<lvl>[IWED]) )?(?P<body>.*)$")
SLOT = re.compile(r"^slot (?P<func>.{12}): id\s+(?P<slot>\d+) \| task (?P<task>-?\d+) \| (?P<msg>.*)$")
SRV = re.compile(r"^(?P<comp>srv|que|res|cmn)  (?P<func>.{12}): (?P<msg>.*)$")
SLOT_MSGS = [re.compile(p) for p in [
    r"^processing task(?:, is_child = (?P<child>\d))?$",
    r"^new prompt, n_ctx_slot = (?P<nctx>\d+), n_keep = (?P<keep>-?\d+), (?:n_prompt_tokens|task\.n_tokens) = (?P<np>\d+)$",
    r"^(?:kv cache rm \[(?P<p0>\d+), end\)|(?:cached )?(?:n_past|n_tokens) = \d+, memory_seq_rm \[(?P<p0b>\d+), end\))$",
    r"^prompt processing progress, (?:n_past = (?P<past>\d+), n_tokens = (?P<bt>\d+)|n_tokens = (?P<nt>\d+), batch\.n_tokens = (?P<bt2>\d+)), progress = (?P<p>[\d.]+)$",
    r"^prompt processing, n_tokens = +(?P<n>\d+), progress = (?P<p>[\d.]+), t = +(?P<s>[\d.]+) s / (?P<tps>[\d.]+|inf|nan) tokens per second$",
    r"^(?:n_decoded|n_gen) = +(?P<n>\d+), tg = +(?P<tps>[\d.]+) t/s(?:, tg_3s = +(?P<tps3>[\d.]+) t/s)?$",
    r"^prompt (?:processing )?done, (?:n_past = (?P<past>\d+), n_tokens = (?P<bt>\d+)|n_tokens = (?P<nt>\d+), batch\.n_tokens = (?P<bt2>\d+))$",
    r"^selected slot by (?P<how>LRU|LCP similarity|lcs similarity|lcp similarity|id)\b(?P<rest>.*)$",
    r"^new slot(?: n_ctx_slot = |, n_ctx = )(?P<nctx>\d+)$",
    r"^input truncated, n_ctx = (?P<nctx>\d+), n_keep = (?P<keep>\d+), n_left = (?P<left>\d+), n_prompt_tokens = (?P<np>\d+)$",
    r"^\s*$",
    r"^slot context shift, n_keep = (?P<keep>\d+), n_left = (?P<left>\d+), n_discard = (?P<disc>\d+)$",
    r"^stop processing: (?:n_past|n_tokens) = (?P<n>\d+), truncated = (?P<tr>[01])$",
    r"^sampler chain: .* $",
    r"^n_predict \(-1\) is set for infinite generation\. Limiting generated tokens to n_ctx_train \(\d+\) .*$",
    r"^got exception: .*$",
]]
T_PROMPT = re.compile(r"^\r?prompt eval time = +(?P<ms>[\d.]+) ms / +(?P<n>\d+) tokens \( *(?P<mspt>[-\d.]+|inf|nan|-nan) ms per token, +(?P<tps>[-\d.]+|inf|nan|-nan) tokens per second\)$")
T_EVAL = re.compile(r"^\r? {7}eval time = +(?P<ms>[\d.]+) ms / +(?P<n>\d+) tokens \( *(?P<mspt>[-\d.]+|inf|nan|-nan) ms per token, +(?P<tps>[-\d.]+|inf|nan|-nan) tokens per second\)$")
T_TOTAL = re.compile(r"^\r? {6}total time = +(?P<ms>[\d.]+) ms / +(?P<n>\d+) tokens$")
GRAPHS = re.compile(r"^ {3}graphs reused = +(?P<n>\d+)$")
HTTP = re.compile(r"^(?:srv  log_server_r: )?(?:done )?request: (?P<method>[A-Z]+) (?P<path>\S+) (?P<ip>\S+) (?P<status>\d{3})$")
SEND_ERROR = re.compile(r"^task id = (?P<task>\d+), error: (?P<err>.*)$")
CANCEL = re.compile(r"^cancel task, id_task = (?P<task>\d+)$")
LISTEN = re.compile(r"(?:server is listening on|listening on|llama server listening at) (?P<url>(?:https?|unix)://\S+?)(?: - starting the main loop)?$")
BUILD = re.compile(r"^build: (?P<build>\d+) \((?P<commit>[0-9a-f]+)\) with (?P<cc>.*) for (?P<target>\S+)")
JOURNALD = re.compile(r"^(?P<ts>[A-Z][a-z]{2} \d{2} \d{2}:\d{2}:\d{2}) (?P<host>\S+) llama-server\[(?P<pid>\d+)\]: (?P<rest>.*)$")
DOCKER = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z) (?P<rest>.*)$")
SRV_MSGS = [SEND_ERROR, CANCEL, LISTEN, re.compile(r"^(?:request: .*|got exception: .*|all slots are idle|Chat format: .*|"
                                                   r"loading model .*|initializing.*|model loaded|.*NOTICE.*|\s+ref: .*|"
                                                   r"common_params_print_info: .*|proxying request .*|.*router mode.*|"
                                                   r"prompt cache is enabled.*|.*model name=.*)$")]
# banner lines of era 4 that are not server component lines (library and main: lines, template dump)
BANNER_OK = re.compile(r"^(?:build: |system info: |system_info: |main: |llama_|print_info: |init: |start: |load_model: |"
                       r"You are|<\|im_start\|>|Hello|Hi there|How are you|'$|$)")


def classify(body: str) -> str:
    """Name of the catalog shape a line body matches, or raise."""
    m = SLOT.match(body)
    if m:
        msg = m.group("msg")
        if any(p.match(msg) for p in SLOT_MSGS):
            return "slot"
        for name, rx in (("prompt", T_PROMPT), ("eval", T_EVAL), ("total", T_TOTAL), ("graphs", GRAPHS)):
            if rx.match(msg):
                return name
        raise AssertionError(f"unknown slot message: {body!r}")
    m = SRV.match(body)
    if m:
        msg = m.group("msg")
        if HTTP.match(body) or any(p.match(msg) for p in SRV_MSGS):
            return "srv"
        raise AssertionError(f"unknown srv message: {body!r}")
    for name, rx in (("prompt", T_PROMPT), ("eval", T_EVAL), ("total", T_TOTAL), ("http", HTTP)):
        if rx.match(body):
            return name
    if body.startswith("got exception: ") or BUILD.match(body) or BANNER_OK.match(body):
        return "other"
    raise AssertionError(f"line matches no catalog shape: {body!r}")


def read_log(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1]


def small() -> Scenario:
    items = tickers(10)
    return Scenario(name="small", servers=(Server(name="main", np=3, n_ctx_slot=4096),),
                    runs=(Run(run_id="run-small", servers=("main",), items=items, concurrency=3, timeout_s=60.0,
                              faults=Faults(runaways=((items[2], "score"),), context_errors=((items[4], "extract"),),
                                            dead_slots=(DeadSlot("main", 1, 3, mode="slow"),))),))


def all_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- determinism ----------------------------------------------------------------------------------------

def test_same_seed_same_bytes_different_seed_different(tmp_path: Path) -> None:
    generate(small(), tmp_path / "a", seed=7)
    generate(small(), tmp_path / "b", seed=7)
    generate(small(), tmp_path / "c", seed=8)
    a, b, c = all_files(tmp_path / "a"), all_files(tmp_path / "b"), all_files(tmp_path / "c")
    assert sorted(a) == ["logs/run-small/attempts.jsonl", "logs/run-small/main.log", "logs/run-small/manifest.json",
                         "truth/requests.jsonl"]
    assert a == b
    assert a["logs/run-small/main.log"] != c["logs/run-small/main.log"]


# -- line shapes ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["era5", "era4", "era4-prefix"])
def test_every_line_matches_a_catalog_shape(tmp_path: Path, fmt: str) -> None:
    res = generate(small(), tmp_path, fmt=fmt, seed=1)
    kinds: dict[str, int] = {}
    for line in read_log(res.logs[0]):
        m = PREFIX.match(line)
        assert m
        if fmt == "era4":
            assert m.group("min") is None and m.group("lvl") is None, line
        body = m.group("body")
        if fmt != "era4" and m.group("min") is None:  # era 4 timing body lines and dumps carry no prefix
            assert fmt == "era4-prefix", line
        k = classify(body)
        kinds[k] = kinds.get(k, 0) + 1
    n = len(res.truth)
    timed = int(res.truth["total_ms"].is_not_null().sum())
    assert kinds["prompt"] == kinds["eval"] == kinds["total"] == timed
    if fmt == "era5":
        assert kinds["graphs"] == timed
        assert "http" not in kinds  # no request lines at the default verbosity of era 5
    else:
        assert kinds.get("graphs", 0) == 0
    text = res.logs[0].read_text()
    assert text.count("processing task") == n
    assert text.count("stop processing:") == n


def test_era5_spacing_matches_the_sample_exactly(tmp_path: Path) -> None:
    res = generate(small(), tmp_path, fmt="era5", seed=1)
    lines = read_log(res.logs[0])
    assert lines[0] == ("0.00.000.093 I cmn  common_param: common_params_print_info: verbosity = 3 "
                        "(adjust with the `-lv N` CLI arg)")
    assert "0.02.871.455 I srv    load_model: initializing, n_slots = 3, n_ctx_slot = 4096, kv_unified = 'false'" in lines
    launch = next(x for x in lines if "launch_slot_" in x)
    assert re.fullmatch(r"\d+\.\d\d\.\d{3}\.\d{3} I slot launch_slot_: id  0 \| task 0 \| processing task, is_child = 0",
                        launch)
    timing = next(x for x in lines if "prompt eval time" in x)
    assert re.search(r"\| prompt eval time = {1,9}\d+\.\d\d ms / {1,5}\d+ tokens \( {0,7}\d+\.\d\d ms per token, "
                     r" {0,7}\d+\.\d\d tokens per second\)$", timing)


def test_era4_timing_header_has_trailing_space_and_release_comes_first(tmp_path: Path) -> None:
    res = generate(healthy(), tmp_path, fmt="era4", seed=3)
    lines = read_log(res.logs[0])
    i = next(j for j, x in enumerate(lines) if x.startswith("slot print_timing:"))
    assert lines[i].endswith(" | ")
    assert lines[i - 1].startswith("slot      release:")
    assert T_PROMPT.match(lines[i + 1]) and T_EVAL.match(lines[i + 2]) and T_TOTAL.match(lines[i + 3])
    assert HTTP.match(lines[i + 4]).group("status") == "200"  # type: ignore[union-attr]
    assert sum(1 for x in lines if HTTP.match(x)) == len(res.truth)


def test_era4_prefix_timings_come_before_release(tmp_path: Path) -> None:
    res = generate(healthy(), tmp_path, fmt="era4-prefix", seed=3)
    lines = read_log(res.logs[0])
    i = next(j for j, x in enumerate(lines) if " slot print_timing:" in x)
    assert lines[i].endswith(" | ") and PREFIX.match(lines[i]).group("lvl") == "I"  # type: ignore[union-attr]
    assert T_TOTAL.match(lines[i + 3])
    assert " slot      release: " in lines[i + 4]


# -- numbers add up -------------------------------------------------------------------------------------

def test_timings_add_up_and_match_the_ground_truth(tmp_path: Path) -> None:
    res = generate(small(), tmp_path, fmt="era5", seed=2)
    truth = {(r["slot"], r["task"]): r for r in res.truth.iter_rows(named=True)}
    seen: dict[tuple[int, int], dict[str, float]] = {}
    for line in read_log(res.logs[0]):
        m = SLOT.match(PREFIX.match(line).group("body"))  # type: ignore[union-attr]
        if not m or m.group("task") == "-1":
            continue
        key = (int(m.group("slot")), int(m.group("task")))
        msg = m.group("msg")
        rec = seen.setdefault(key, {})
        for name, rx in (("prompt", T_PROMPT), ("eval", T_EVAL), ("total", T_TOTAL)):
            t = rx.match(msg)
            if t:
                rec[name + "_ms"] = float(t.group("ms"))
                rec[name + "_n"] = int(t.group("n"))
        s = re.match(r"^stop processing: n_tokens = (\d+), truncated = ([01])$", msg)
        if s:
            rec["n_tokens"], rec["truncated"] = int(s.group(1)), int(s.group(2))
    assert set(seen) == set(truth)
    timed = 0
    for key, rec in seen.items():
        t = truth[key]
        assert rec["n_tokens"] == t["n_past_end"]
        assert rec["truncated"] == int(t["truncated"])
        if "total_ms" not in rec:
            continue
        timed += 1
        assert abs(rec["total_ms"] - (rec["prompt_ms"] + rec["eval_ms"])) < 0.011
        assert rec["total_n"] == rec["prompt_n"] + rec["eval_n"]
        assert rec["prompt_n"] == t["prompt_eval_tokens"] and rec["eval_n"] == t["gen_tokens"]
        assert t["prompt_tokens"] == t["prompt_eval_tokens"] + t["cached_tokens"]
        # era 5: the last sampled token is not decoded, so the slot holds prompt + gen - 1 tokens
        assert rec["n_tokens"] == t["prompt_tokens"] + t["gen_tokens"] - 1
        assert (rec["prompt_ms"], rec["eval_ms"], rec["total_ms"]) == (t["prompt_ms"], t["gen_ms"], t["total_ms"])
    assert timed >= 12


def test_faults_show_up_in_truth_log_and_records(tmp_path: Path) -> None:
    res = generate(small(), tmp_path, fmt="era5", seed=2)
    t = res.truth
    run_away = t.filter(t["runaway"] & t["cancelled"].not_())
    for r in run_away.iter_rows(named=True):  # no cap: generation fills the slot's context
        assert r["prompt_tokens"] + r["gen_tokens"] == 4096 and r["truncated"] and r["stop_reason"] == "context"
    ctx = t.filter(t["context_error"])
    assert len(ctx) >= 1 and set(ctx["http_status"]) == {400} and set(ctx["stop_reason"]) == {"error"}
    text = res.logs[0].read_text()
    assert "exceeds the available context size (4096 tokens), try increasing it" in text
    dead = t.filter(t["dead_slot"])
    assert len(dead) >= 1 and set(dead["slot"]) == {1} and dead["cancelled"].all()
    assert text.count("W srv          stop: cancel task, id_task = ") == int(t["cancelled"].sum())
    attempts = [json.loads(x) for x in res.attempts[0].read_text().splitlines()]
    assert {a["outcome"] for a in attempts} >= {"ok", "failed", "timeout"}
    assert set(attempts[0]) == {"run_id", "item", "stage", "attempt", "server", "started_at", "ended_at", "http_status",
                                "error", "outcome", "id_slot", "tokens_evaluated", "tokens_predicted", "stop_type",
                                "truncated", "timings", "output_chars", "max_tokens"}
    manifest = json.loads(res.manifests[0].read_text())
    assert set(manifest) == {"run_id", "started_at", "ended_at", "concurrency", "model", "servers", "items", "stages",
                             "budgets", "config", "ended"}
    assert manifest["servers"][0]["log_file"] == "main.log"
    assert manifest["ended"]["how"] == "completed"


def test_demo_has_every_ingredient(tmp_path: Path) -> None:
    res = generate(demo_scenarios(), tmp_path, seed=0)
    t = res.truth
    assert sorted({p.parent.name for p in res.logs}) == [f"run-np{i}" for i in range(1, 9)]
    assert {"main-np1", "main-np8", "backup"} <= set(t["instance"])
    assert t["runaway"].any() and t["dead_slot"].any() and t["context_error"].any()
    m8 = json.loads((tmp_path / "logs/run-np8/manifest.json").read_text())
    assert m8["ended"]["how"] == "killed" and m8["ended"]["detail"] == "killed by a watchdog after 70 s"
    attempted = {json.loads(x)["item"] for x in (tmp_path / "logs/run-np8/attempts.jsonl").read_text().splitlines()}
    assert len(attempted) < len(m8["items"])  # missing items: never attempted


# -- wrappers -------------------------------------------------------------------------------------------

def test_wrappers_keep_the_plain_lines(tmp_path: Path) -> None:
    plain = read_log(generate(errors(), tmp_path / "p", seed=4).logs[0])
    j = read_log(generate(errors(), tmp_path / "j", wrapper="journald", seed=4).logs[0])
    d = read_log(generate(errors(), tmp_path / "d", wrapper="docker", seed=4).logs[0])
    a = read_log(generate(errors(), tmp_path / "a", wrapper="ansi", seed=4).logs[0])
    assert [JOURNALD.match(x).group("rest") for x in j] == plain  # type: ignore[union-attr]
    assert JOURNALD.match(j[0]).group("ts") == "Aug 23 10:00:00"  # type: ignore[union-attr]
    assert [DOCKER.match(x).group("rest") for x in d] == plain  # type: ignore[union-attr]
    assert d[0].startswith("2026-08-23T10:00:00.000093000Z 0.00.000.093 I cmn")
    assert [ANSI.sub("", x) for x in a] == plain
    assert a[0].startswith("\x1b[34m0.00.000.093\x1b[0m \x1b[32mI \x1b[0mcmn  common_param")
    w = next(i for i, x in enumerate(plain) if " W " in x[:20])
    assert a[w + 1].startswith("\x1b[0m")  # the reset of a W line lands at the start of the next line


def test_router_wrapper_tags_child_lines(tmp_path: Path) -> None:
    lines = read_log(generate(healthy(), tmp_path, wrapper="router", seed=1).logs[0])
    child = [ROUTER.match(x) for x in lines if x.startswith("[")]
    assert child and all(m and m.group("port") == "8080" for m in child)
    assert sum("proxy_reques: proxying request" in x for x in lines) == 48
    assert all(PREFIX.match(x).group("lvl") for x in lines if not x.startswith("["))  # type: ignore[union-attr]


def test_old_formats_refuse_router_and_colours(tmp_path: Path) -> None:
    from forensics.errors import InputError

    with pytest.raises(InputError, match="router"):
        generate(healthy(), tmp_path, fmt="era4", wrapper="router")
    with pytest.raises(InputError, match="ansi"):
        generate(healthy(), tmp_path, fmt="era4", wrapper="ansi")


def test_era4_runaway_shifts_context_instead_of_stopping(tmp_path: Path) -> None:
    res = generate(runaway(), tmp_path, fmt="era4", seed=1)
    text = res.logs[0].read_text()
    # b4747 has context shift on by default: a runaway shifts (n_left = 4096 - 2, n_discard = n_left / 2)
    assert "slot context shift, n_keep = 1, n_left = 4094, n_discard = 2047" in text
    assert res.truth["context_shift"].any()


# -- size mode and CLI ----------------------------------------------------------------------------------

def test_size_mode_reaches_the_size(tmp_path: Path) -> None:
    res = generate(healthy(), tmp_path, seed=0, repeat=Repeat(size="1MB"))
    assert res.bytes_written >= 1 << 20
    assert res.logs[0] == tmp_path / "logs/main.log" and res.logs[0].stat().st_size == res.bytes_written
    truth_lines = res.truth_path.read_text().splitlines()
    assert len(truth_lines) == res.requests == res.logs[0].read_text().count("processing task")
    runs = sorted(p.name for p in (tmp_path / "logs").iterdir() if p.is_dir())
    assert runs[0] == "run-healthy-0000" and len(runs) == res.requests // 48


def test_cli_generate(tmp_path: Path) -> None:
    out = tmp_path / "o"
    r = CliRunner().invoke(cli, ["generate", str(out), "--scenario", "healthy", "--format", "era4", "--seed", "5"])
    assert r.exit_code == 0, r.output
    assert f"ground truth: {out / 'truth/requests.jsonl'}" in r.output
    assert "wrote 48 slot requests" in r.output
    r = CliRunner().invoke(cli, ["generate", str(out), "--requests", "5", "--size", "1MB"])
    assert r.exit_code == 2 and "give --requests or --size, not both" in r.output
    r = CliRunner().invoke(cli, ["generate", str(out), "--format", "era9"])
    assert r.exit_code == 2

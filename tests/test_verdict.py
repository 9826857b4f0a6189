"""The verdict: one paragraph per run, written from the findings, with its evidence; healthy runs get one line.

Expected sentences are worked out by hand from the scenarios' definitions (fixtures/findings/scenarios.py) and
from the real logs' text, not by running the code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.findings.scenarios import build
from forensics.cli import cli
from forensics.ingest import IngestOptions, ingest
from forensics.store import Store
from forensics.verdict import verdict

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "real"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return build(tmp_path_factory.mktemp("verdict") / "s")


def test_a_healthy_run_gets_one_line(store: Store) -> None:
    [v] = verdict(store, "healthy")  # 4 slots x 12 requests, one 2.5x slower: nothing to report
    assert v.healthy and v.paragraph() == "healthy: 48 requests on 4 slots, nothing abnormal found."


def test_a_dead_slot_says_when_and_how(store: Store) -> None:
    # slot 1 from its 5th request runs 1000 ms per token: requests of 88..395 tokens take 88.3..395.3 s where its
    # first four took 3.65..10.44 s; it died 1.0 + (8.45 + 8.7 + 3.65 + 10.436) + 4 x 0.05 = 32.436 s in
    [v] = verdict(store, "dead")
    assert v.paragraph(evidence=False).startswith(
        "dead: Slot 1 of `main` died 32.4 s after the server started and never recovered: 6 requests ran abnormally "
        "slowly (88.3–395.3 s vs 3.6–10.4 normal). Cost: ")
    # the first request it died on is the 14th written (i = 13): lines 10 + 13 x 7 = 101 to 106
    assert v.facts[0].evidence[0] == "server.log:101-106"
    assert not v.healthy


def test_the_cost_of_a_dead_slot(store: Store) -> None:
    """Had slot 1 stayed normal, the run would have ended when its busiest slot did: slot 2, whose ten requests
    (0.3 s of prompt + tokens x ms per token each, 0.05 s apart) run from 2.0 s to 85.604 s; slot 1's own
    ten would have ended at 72.1 s.  Its last slow request ended at 1467.486 s: 1381.9 s lost."""
    [v] = verdict(store, "dead")
    cost = v.facts[-1]
    assert cost.kind == "cost"
    assert cost.fields == {"run_s": 1467.486, "needed_s": 85.604, "lost_s": 1381.9}
    assert cost.sentence == ("Cost: the run took 24 min 27 s where its requests needed about 1 min 26 s at normal "
                             "speed (23 min 02 s lost).")


def test_a_runaway_and_the_cap_that_would_have_stopped_it(store: Store) -> None:
    # slot 0's 4th request filled the 4096-token context with 3900 tokens; the normal ones stay at or under 362;
    # no request set n_predict, and any cap above the normal ones stops the one runaway and cuts no normal one
    [v] = verdict(store, "one-runaway")
    assert [f.kind for f in v.facts] == ["runaway", "cap", "cost"]
    assert v.facts[2].fields["runaway_tokens"] == 3900
    assert v.facts[0].sentence == "1 output ran to the context (3900 tokens where normal responses stay under 362)."
    assert v.facts[1].fields == {"cap": v.facts[1].fields["cap"], "capped": False, "runaways_stopped": 1,
                                 "normal_cut": 0}


def test_a_crash_in_a_real_log(tmp_path: Path) -> None:
    log = REAL / "crash-ikllama-687.log"  # CUDA out of memory while task 3 filled its prompt
    ingest(tmp_path / "s", [log], IngestOptions(run="r"))
    [v] = verdict(Store(tmp_path / "s"), "r")
    assert v.facts[0].kind == "crash"
    assert v.facts[0].sentence.startswith("The server crashed ")
    assert v.facts[0].sentence.endswith(" with slot 0 task 3 in flight: CUDA error: out of memory. The GPU ran out "
                                        "of memory: lower -c, -np or -ub, offload fewer layers (-ngl), or use a "
                                        "smaller quant.")
    assert v.facts[0].fields["advice"].startswith("The GPU ran out of memory")
    assert v.facts[0].evidence == [f"{log}:16-19"]


def test_an_assert_crash_says_to_update_or_report(tmp_path: Path) -> None:
    log = REAL / "crash-llamacpp-12817.log"  # GGML_ASSERT on a non-causal model with a small ubatch
    ingest(tmp_path / "s", [log], IngestOptions(run="r"))
    [v] = verdict(Store(tmp_path / "s"), "r")
    assert v.facts[0].kind == "crash" and "GGML_ASSERT" in v.facts[0].sentence
    assert v.facts[0].sentence.endswith("A failed assert is a bug or an unsupported setting in this build: update "
                                        "llama.cpp, or report it upstream with the build and these lines.")


def test_the_command_prints_json_and_gates(store: Store) -> None:
    res = CliRunner().invoke(cli, ["verdict", "healthy", "dead", "--format", "json", "--fail-on", "any",
                                   "--store", str(store.root)])
    assert res.exit_code == 1  # dead is not healthy
    got = json.loads(res.stdout)
    assert [(v["run"], v["healthy"]) for v in got] == [("healthy", True), ("dead", False)]
    assert got[1]["facts"][0]["kind"] == "dead_slot" and got[1]["facts"][0]["slot"] == 1
    res = CliRunner().invoke(cli, ["verdict", "healthy", "--fail-on", "any", "--store", str(store.root)])
    assert (res.exit_code, res.stdout) == (0, "healthy: 48 requests on 4 slots, nothing abnormal found.\n")
    res = CliRunner().invoke(cli, ["verdict", "nope", "--store", str(store.root)])
    assert res.exit_code == 2 and res.stderr.startswith("forensics: error: no run 'nope' in the store")


def test_sentences_name_servers_as_the_manifest_does(tmp_path: Path) -> None:
    """A -lv 4 log's empty first start (`server`) and its real one (`server#2`), and a backup: with a manifest
    naming `main` (log file server.log) and `backup` (port 8081), the sentences say `main` and `backup`; without
    one, the only start of server.log that served requests is `server`, never `server#2`."""
    from forensics.session import Analysis
    from forensics.verdict import instance_names
    from tests.throughput_helpers import req, write

    inst = [{"run": r, "instance": i, "path": f"/logs/{r}/{p}", "port": port, "requests": n, "line_first": lf}
            for r in ("named", "bare")
            for i, p, port, n, lf in (("server", "server.log", None, 0, 1), ("server#2", "server.log", 18102, 3, 3),
                                      ("b", "b.log", 8081, 1, 1))]
    servers = '[{"name": "main", "log_file": "server.log"}, {"name": "backup", "port": 8081}]'
    store = write(tmp_path / "s", {
        "instances": inst,
        "runs": [{"run": "named", "servers": servers}],
        "requests": [req(r, 0, 1, 1, 0, 1, 1000, 10, 900, 10, instance="server#2") for r in ("named", "bare")]})
    with Analysis.open(store) as s:
        s.prepare(["bare", "named"], requests=False)  # the session's relations carry each instance's one name
        got = s.con.execute("SELECT run, instance, name FROM fx_names ORDER BY run, instance").fetchall()
        told = instance_names(s, ["bare", "named"])
    names: dict[str, dict[str, str]] = {}
    for run, instance, name in got:
        names.setdefault(run, {})[instance] = name
    assert names["named"] == {"server": "main", "server#2": "main", "b": "backup"}
    assert names["bare"] == {"server": "server", "server#2": "server", "b": "b"}
    assert told == {"named": {"main": "main", "backup": "backup"}, "bare": {"server": "server", "b": "b"}}


def test_a_kv_cache_stall_is_named_and_short_retries_are_not(tmp_path: Path) -> None:
    """`stall`: 40 "failed to find free space" lines with no request released between them (lines 200..239) while
    slots 0 and 1 held a request each; `bursts`: the same 40 lines as ten bursts of four, each followed by a release
    (the server halved its batch and went on): no stall."""
    import polars as pl

    from fixtures.findings.scenarios import Builder, normal, write

    msg = ("update_slots: failed to find free space in the KV cache, retrying with smaller batch size - try "
           "increasing it via the context size or enable defragmentation, i = -512, n_batch = 512, ret = 1")
    store = Store(tmp_path / "s", create=True)
    for run, bursts in (("stall", False), ("bursts", True)):
        b = Builder(run)
        for i in range(12):
            gen, ms = normal(i)
            b.add(i % 2, gen, ms_tok=ms, line_first=190 if i < 2 else 300 + 10 * i, line_last=250 if i < 2 else
                  305 + 10 * i)
        write(store, "requests", b.frame(), run)
        rows = [{"kind": "srv_other", "level": "W", "line_no": 200 + k, "msg": msg, "task": None} for k in range(40)]
        if bursts:
            rows += [{"kind": "release", "level": "I", "line_no": 200 + k + 0.5, "msg": None, "task": k}
                     for k in range(3, 40, 4)]
        ev = pl.DataFrame(rows, schema={"kind": pl.String, "level": pl.String, "line_no": pl.Float64,
                                        "msg": pl.String, "task": pl.Int64})
        ev = ev.sort("line_no").with_row_index("i").with_columns(pl.col("i").cast(pl.Int64) + 200).drop("line_no") \
            .rename({"i": "line_no"})
        write(store, "events", ev, run)
    store = Store(tmp_path / "s")
    [v] = verdict(store, "stall")
    fact = next(f for f in v.facts if f.kind == "kv_stall")
    assert fact.fields == {"instance": "main", "lines": 40, "stretches": 1, "requests": 2, "seconds": None}
    assert fact.sentence.startswith("The KV cache of the server ran out of room: 40 lines of `update_slots: failed "
                                    "to find free space in the KV cache` with nothing released (from line 200), "
                                    "while 2 requests were in flight: ")
    assert not v.healthy
    [b] = verdict(store, "bursts")
    assert b.healthy, b.paragraph()

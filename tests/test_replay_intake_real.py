"""Records as users have them, read right with no editing (issue 32).

- ``forensics mapping init`` on real record files of tools the project did not know: the proposal, unedited,
  gives exactly the attempts, ok rows, failures by outcome and missing items that a mapping written by hand
  from the tool's docs gives (``*.hand.toml`` beside each file), and those agree with the facts counted by hand
  in each file's provenance.  fixtures/replay/unshipped-holdout/ holds files kept out of development.
- An event stream (llama-benchy's progress stream from a real llama-server): one row per request, token sums
  exact.
- A real run folder (logs, records, manifest, /metrics and /slots dumps, unrelated JSON) ingests with exit 0
  under any mapping, and a records file passed over says that ``mapping init`` proposes a mapping for it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.replay.init_check import read_with
from tests.replay_helpers import FIX

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REAL = FIX / "unshipped"  # real files of tools no shipped mapping reads (test_replay_real_tools has those)
HARNESS = REAL / "gpu-kit-harness" / "dead-slot-c1024"
DEV = {  # sample -> the mapping written by hand for its tool
    HARNESS / "client_requests.jsonl": REAL / "gpu-kit-harness" / "harness.hand.toml",
    REAL / "llm-load-test" / "output.json": REAL / "llm-load-test" / "llm-load-test.hand.toml",
    REAL / "openai-batch" / "batch_output.jsonl": REAL / "openai-batch" / "openai-batch.hand.toml",
    REAL / "jmeter" / "results.jtl": REAL / "jmeter" / "jmeter.hand.toml",
    REAL / "llama-benchy" / "progress.jsonl": REAL / "llama-benchy" / "llama-benchy.hand.toml",
}
HOLDOUT = {p: FIX / "unshipped-holdout" / "jmeter" / "jmeter.hand.toml"
           for p in sorted((FIX / "unshipped-holdout" / "jmeter").glob("*.jtl"))}


def forensics(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.stderr


def _proposal(sample: Path, tmp_path: Path, *picks: str) -> Path:
    out = tmp_path / "proposed.toml"
    code, _, err = forensics("mapping", "init", str(sample), "-o", str(out), *picks)
    assert code == 0, err
    return out


def _facts(sample: Path) -> dict:
    return tomllib.loads(Path(f"{sample}.provenance.toml").read_text())["facts"]


@pytest.mark.parametrize("sample", list(DEV), ids=lambda p: p.parent.name)
def test_the_unedited_proposal_gives_what_a_hand_written_mapping_gives(tmp_path: Path, sample: Path) -> None:
    proposed, problems = read_with(sample, _proposal(sample, tmp_path))
    by_hand, hand_problems = read_with(sample, DEV[sample])
    assert problems == hand_problems == []
    assert proposed == by_hand
    facts = _facts(sample)
    assert (proposed.attempts, proposed.ok) == (facts["requests"], facts["ok"])
    assert sum(proposed.failed.values()) == facts["requests"] - facts["ok"]


def test_the_harness_dead_slot_run_is_read_with_its_parse_failures(tmp_path: Path) -> None:
    proposal = _proposal(HARNESS / "client_requests.jsonl", tmp_path).read_text()
    for line in ('run_id = "run_id"', 'server = "server"', 'attempt = "attempt"', 'item = "ticker"',
                 'started_at = { path = "t_start", unit = "iso" }', 'ended_at = { path = "t_end", unit = "iso" }',
                 'id_slot = "id_slot"', 'truncated = "truncated"', 'stop_type = "stop_type"', 'error = "error"'):
        assert line in proposal
    facts, _ = read_with(HARNESS / "client_requests.jsonl", tmp_path / "proposed.toml")
    labels = json.loads((HARNESS / "labels.json").read_text())
    truth = {(t, s) for s, ts in labels["missing_by_stage"].items() for t in ts}
    assert {(i, s) for i, s, _ in facts.missing} == truth
    assert facts.failed == {"parse_error": len(labels["unparsed_requests"])}
    _, _, err = forensics("mapping", "init", str(HARNESS / "client_requests.jsonl"), "-o", str(tmp_path / "x"))
    assert "on the sample: 18 attempts: 12 ok, 6 parse_error; items missing: 4 of 16 (4 parse_error)" in err


def test_an_undecided_field_is_asked_for_and_a_pick_settles_it(tmp_path: Path) -> None:
    sample = REAL / "openai-batch" / "batch_output.jsonl"
    code, proposal, err = forensics("mapping", "init", str(sample))
    assert code == 0
    assert "undecided: latency_ms: response.body.usage.total_time has values from" in err
    assert "--pick latency_ms=response.body.usage.total_time:s" in err
    assert "# UNDECIDED latency_ms" in proposal and "\nlatency_ms =" not in proposal
    picked = _proposal(sample, tmp_path, "--pick", "latency_ms=response.body.usage.total_time:s").read_text()
    assert 'latency_ms = { path = "response.body.usage.total_time", unit = "s" }' in picked
    assert "undecided:" not in forensics("mapping", "init", str(sample), "--pick",
                                        "latency_ms=response.body.usage.total_time:s")[2]
    code, _, err = forensics("mapping", "init", str(sample), "--pick", "latency_ms")
    assert code == 2 and "FIELD=CHOICE" in err


def test_an_event_stream_is_one_row_per_request_with_exact_token_sums(tmp_path: Path) -> None:
    sample = REAL / "llama-benchy" / "progress.jsonl"
    events = [json.loads(x) for x in sample.read_text().splitlines() if x.strip()]
    ends = {e["request_id"]: e for e in events if e["type"] == "request_end"}
    from forensics import replay

    recs = replay.load(sample, mapping=_proposal(sample, tmp_path))
    att = recs.attempts.sort("item")
    assert att["item"].to_list() == sorted(str(k) for k in ends)
    assert att["tokens_predicted"].to_list() == [ends[int(i)]["total_tokens"] for i in att["item"]]
    assert att["tokens_predicted"].sum() == _facts(sample)["sum_output_tokens"]
    starts = {str(e["request_id"]): e["ts"] for e in events if e["type"] == "request_start"}
    assert [round(t.timestamp(), 3) for t in att["started_at"]] == [round(starts[i], 3) for i in att["item"]]
    summed = tmp_path / "sum.toml"
    summed.write_text((REAL / "llama-benchy" / "llama-benchy.hand.toml").read_text().replace(
        "tokens_predicted = { path = \"total_tokens\", when = \"type = 'request_end'\" }",
        "tokens_predicted = { path = \"count\", when = \"type = 'tokens'\", take = \"sum\" }"))
    chunks = replay.load(sample, mapping=summed).attempts
    assert chunks["tokens_predicted"].sum() == sum(e["count"] for e in events if e["type"] == "tokens")


MAPPINGS = ["", "proposal", "globless", "vllm-bench", "guidellm", "aiperf", "llmperf", "sglang", "genai-bench"]


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_a_run_folder_as_it_lies_ingests_with_any_mapping(tmp_path: Path, mapping: str) -> None:
    folder = tmp_path / "dead-slot"
    shutil.copytree(HARNESS, folder)
    args = ["ingest", str(folder), "--store", str(tmp_path / "store")]
    if mapping == "proposal":
        args += ["--mapping", str(_proposal(folder / "client_requests.jsonl", tmp_path))]
    elif mapping == "globless":
        (tmp_path / "g.toml").write_text('[attempts]\n[attempts.fields]\nitem = "ticker"\nstage = "stage"\n'
                                          '[attempts.set]\noutcome = "ok"\n')
        args += ["--mapping", str(tmp_path / "g.toml")]
    elif mapping:
        args += ["--mapping", mapping]
    code, out, err = forensics(*args)
    assert code == 0, err
    assert "server:metrics" in out + err and "server:slots" in out + err
    assert "Traceback" not in err
    if mapping in ("vllm-bench", "llmperf"):
        assert (f"client_requests.jsonl: looks like a harness's per-request records (run_id, server, ticker, stage, "
                f"attempt): `forensics mapping init {folder / 'client_requests.jsonl'}` proposes a mapping") in err
    if mapping == "":  # no mapping: the proposal is sure of this file, and ingest reads it with it
        assert (f"records: {folder / 'client_requests.jsonl'} read with a proposed mapping (`forensics mapping init "
                f"{folder / 'client_requests.jsonl'}` shows it)") in err
    if mapping in ("", "proposal"):
        assert "join: 18 attempts matched" in err


@pytest.mark.parametrize("sample", list(HOLDOUT), ids=lambda p: p.name)
def test_held_out_files_scored_once(tmp_path: Path, sample: Path) -> None:
    proposed, _ = read_with(sample, _proposal(sample, tmp_path))
    assert proposed == read_with(sample, HOLDOUT[sample])[0]
    assert (proposed.attempts, proposed.ok) == (_facts(sample)["requests"], _facts(sample)["ok"])

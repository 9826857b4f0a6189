"""The real run folders recorded this round (fixtures/server-runs/b11434-*, b4579-*) read with the records
their harness wrote (``client_requests.jsonl``), and records read without ``--mapping`` (docs/replay.md).

- Every development folder, ingested with the unedited ``mapping init`` proposal for its records, and again
  with no mapping at all (ingest applies the proposal itself when it is sure): attempts, ok, failures by outcome
  and the missing (item, stage) pairs are those of the folder's ``labels.json``, the truth the harness wrote from
  what it sent and received.  The harness's words map to the schema's outcomes: ``http_4xx``/``http_5xx``/
  ``conn_error``/``server_shutdown`` are failed requests, ``timeout`` a timeout, ``parse_error`` an answer that
  did not parse, and a stage ``skipped`` after an earlier one failed is never attempted.
- A records file the proposal is not sure of is passed over with the hint, saying why.
- GuideLLM's report, JSON or YAML, is told by its content and read with the shipped mapping.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics import replay
from forensics.cli import cli
from tests.conftest import ROOT
from tests.replay_helpers import FIX

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RUNS = ROOT / "fixtures" / "server-runs"
DEV = sorted([*RUNS.glob("b11434-*"), *RUNS.glob("b4579-*")])
OUTCOME = {"ok": "ok", "timeout": "timeout", "parse_error": "parse_error", "skipped": "never_attempted"}
GUIDELLM = FIX / "real" / "guidellm"
QWEN = "Qwen_Qwen3-4B-Thinking-2507_tp4_quant-fp8_benchmarks"


def forensics(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.stderr


def sql(store: Path, query: str) -> list[dict]:
    code, out, err = forensics("sql", query, "--store", str(store), "--format", "json")
    assert code == 0, err
    return json.loads(out)


def truth(folder: Path) -> tuple[dict[str, int], list[tuple[str, str, str]]]:
    """Attempts by outcome and the missing (item, stage, outcome) of the folder, from its labels.json."""
    labels = json.loads((folder / "labels.json").read_text())
    outcomes: Counter[str] = Counter()
    for word, n in labels["outcomes"].items():
        outcomes[OUTCOME.get(word, "failed")] += n
    missing = sorted((m["item"], m["stage"], OUTCOME.get(m["reason"], "failed")) for m in labels["missing"])
    assert sum(outcomes.values()) == labels["n_requests"]
    return dict(outcomes), missing


def read(store: Path) -> tuple[dict[str, int], list[tuple[str, str, str]]]:
    outcomes = {r["outcome"]: r["n"] for r in sql(store, "SELECT outcome, count(*) AS n FROM attempts GROUP BY 1")}
    missing = sorted((r["item"], r["stage"], r["outcome"])
                     for r in sql(store, "SELECT item, stage, outcome FROM items WHERE NOT done"))
    return outcomes, missing


@pytest.mark.parametrize("folder", DEV, ids=lambda p: p.name)
def test_the_unedited_proposal_and_no_mapping_give_the_folders_truth(tmp_path: Path, folder: Path) -> None:
    proposal = tmp_path / "proposed.toml"
    code, _, err = forensics("mapping", "init", str(folder / "client_requests.jsonl"), "-o", str(proposal))
    assert code == 0, err
    want = truth(folder)
    code, _, err = forensics("ingest", str(folder), "--mapping", str(proposal), "--store", str(tmp_path / "a"))
    assert code == 0, err
    assert read(tmp_path / "a") == want
    code, _, err = forensics("ingest", str(folder), "--store", str(tmp_path / "b"))
    assert code == 0, err
    assert f"records: {folder / 'client_requests.jsonl'} read with a proposed mapping" in err
    assert read(tmp_path / "b") == want
    # the store keeps the proposal it read the file with, and it is mapping init's
    used = _files_meta(tmp_path / "b")
    assert len(used) == 1 and Path(used[0]).read_text() == proposal.read_text()


def _files_meta(store: Path) -> list[str]:
    from forensics.store import Store

    files = Store(store).meta("files", {}) or {}
    return [m["mapping"] for m in files.values() if str(m.get("path", "")).endswith("client_requests.jsonl")]


def test_the_cap_is_the_first_of_max_tokens_and_n_predict_that_is_set(tmp_path: Path) -> None:
    """The harness sends n_predict on /completion (max_tokens null there) and max_tokens on chat requests."""
    folder = RUNS / "b11434-client-errors"
    code, proposal, _ = forensics("mapping", "init", str(folder / "client_requests.jsonl"))
    assert code == 0 and 'max_tokens = { sql = "coalesce(max_tokens, n_predict)" }' in proposal
    (tmp_path / "p.toml").write_text(proposal)
    att = replay.load(folder / "client_requests.jsonl", mapping=tmp_path / "p.toml").attempts
    sent = [json.loads(x) for x in (folder / "client_requests.jsonl").read_text().splitlines()]
    caps = json.loads((folder / "labels.json").read_text())["caps"]
    got = {(r["item"], r["stage"], r["attempt"]): r["max_tokens"] for r in att.iter_rows(named=True)}
    for rec in sent:
        cap = rec["max_tokens"] if rec["max_tokens"] is not None else rec["n_predict"]
        assert got[(rec["ticker"], rec["stage"], rec["attempt"])] == cap
    normal = [r for r in sent if not r["injected"] and r["endpoint"] == "/completion"]
    assert normal and all(got[(r["ticker"], r["stage"], r["attempt"])] == caps[r["stage"]] for r in normal)


def test_a_records_file_the_proposal_is_unsure_of_keeps_the_hint(tmp_path: Path) -> None:
    """JMeter's results name no run and no item (a label per sampler): not read, and the hint says why."""
    folder = tmp_path / "jmeter"
    folder.mkdir()
    shutil.copy(FIX / "unshipped" / "jmeter" / "results.jtl", folder)
    code, _, err = forensics("ingest", str(folder), "--store", str(tmp_path / "s"))
    assert code == 0, err
    sample = folder / "results.jtl"
    assert (f"warning: {sample}: looks like a harness's per-request records (timeStamp, elapsed, label, responseCode, "
            f"failureMessage): `forensics mapping init {sample}` proposes a mapping for it (not read with it: no field "
            "of the records gives run_id, item) (then ingest with --mapping)\n") in err
    assert "read with a proposed mapping" not in err
    assert not (tmp_path / "s" / "_mappings").exists()


def test_a_proposal_without_the_run_id_in_the_records_is_not_sure(tmp_path: Path) -> None:
    """The records carry no run id (the proposal would name the run after the file): not read unasked."""
    folder = tmp_path / "run"
    folder.mkdir()
    lines = [json.loads(x) for x in (RUNS / "b11434-cache" / "client_requests.jsonl").read_text().splitlines()]
    (folder / "client_requests.jsonl").write_text("".join(
        json.dumps({k: v for k, v in rec.items() if k != "run_id"}) + "\n" for rec in lines))
    code, _, err = forensics("ingest", str(folder), "--store", str(tmp_path / "s"))
    assert code == 0, err
    assert "(not read with it: no field of the records gives run_id)" in err


# ---------------------------------------------------------------------------------------------- GuideLLM
def _facts(path: Path) -> dict:
    return tomllib.loads(Path(f"{path}.provenance.toml").read_text())["facts"]


@pytest.mark.parametrize("name", [f"{QWEN}.yaml", f"{QWEN}.json", "benchmarks_stripped.yaml",
                                  "benchmarks_stripped.json"])
def test_a_guidellm_report_is_told_by_its_content_and_read_without_a_mapping(tmp_path: Path, name: str) -> None:
    path = GUIDELLM / name
    folder = tmp_path / "bench"
    folder.mkdir()
    shutil.copy(path, folder / name)
    for target, store in ((path, tmp_path / "a"), (folder, tmp_path / "b")):  # the file named, and its folder
        code, _, err = forensics("ingest", str(target), "--store", str(store))
        assert code == 0, err
        shown = path if target == path else folder / name
        assert f"records: {shown} read with the shipped mapping guidellm (told by its content)" in err
        facts = _facts(path)
        att = sql(store, "SELECT count(*) AS n, count(*) FILTER (WHERE outcome <> 'ok') AS failed, "
                         "sum(tokens_evaluated) AS i, sum(tokens_predicted) AS o FROM attempts")[0]
        assert (att["n"], att["failed"], att["i"], att["o"]) == (facts["requests"], facts["failed"],
                                                                 facts["sum_input_tokens"], facts["sum_output_tokens"])


def test_guidellms_yaml_and_json_reports_of_one_run_give_the_same_rows() -> None:
    """The 0.5 YAML was written by GuideLLM's own save_file from the real JSON report (its provenance); the v0.3
    pair is the maintainers' (our copy of their JSON has its output cut to 80 characters, the YAML not)."""
    for stem, cut in ((QWEN, []), ("benchmarks_stripped", ["output_text", "output_chars"])):
        as_json = replay.load(GUIDELLM / f"{stem}.json", mapping="guidellm")
        as_yaml = replay.load(GUIDELLM / f"{stem}.yaml", mapping="guidellm")
        assert as_json.errors == as_yaml.errors == []
        assert as_yaml.attempts.drop("source", *cut).equals(as_json.attempts.drop("source", *cut))
        assert as_yaml.runs.drop("source").equals(as_json.runs.drop("source"))


def test_a_tuple_guidellm_dumps_as_python_tuple_is_read_as_a_list(tmp_path: Path) -> None:
    """GuideLLM writes yaml.dump(report.model_dump()): a tuple field (a distribution's pdf) comes out tagged."""
    tupled = "        pdf:\n        - !!python/tuple\n          - 1.5\n          - 2.5\n"  # as yaml.dump writes it
    text = (GUIDELLM / f"{QWEN}.yaml").read_text().replace("        pdf: null\n", tupled, 1)
    assert "!!python/tuple" in text
    (tmp_path / "b.yaml").write_text(text)
    recs = replay.load(tmp_path / "b.yaml", mapping="guidellm")
    assert recs.errors == [] and recs.attempts.height == 4


def test_a_json_of_another_tool_with_a_benchmarks_list_is_not_taken_for_guidellm(tmp_path: Path) -> None:
    """pytest-benchmark also writes a top-level ``benchmarks`` list: without GuideLLM's request lists it is not
    GuideLLM's report."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "bench.json").write_text(json.dumps({"machine_info": {}, "benchmarks": [
        {"name": "test_parse", "stats": {"min": 0.1, "max": 0.2, "mean": 0.15, "rounds": 10}}]}))
    code, _, err = forensics("ingest", str(folder), "--store", str(tmp_path / "s"))
    assert code == 0, err
    assert "shipped mapping" not in err and "passed over 1 file" in err

"""The real-log corpus (fixtures/real): logs users pasted into public issues, with facts checked by hand.

One ingest of the whole corpus: no file refused, no internal error, every file's lines accounted for, every
hand-checked fact exact, and almost no line of server output left unparsed.  Then the same corpus under every
format forced by ``--format``: never a traceback.  The held-out folder (fixtures/real-holdout) is only checked for
well-formed sidecars here: it is scored once, at the end of a round, never by the suite.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.store import Store
from parsers.spec import ALIASES, format_names, grammar
from tests import real_corpus


@pytest.fixture(scope="module")
def corpus_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_corpus.ingest_corpus(real_corpus.corpus(), tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def scores(corpus_store: Path) -> dict[str, real_corpus.Score]:
    """Every corpus log's score, the store's tables read once."""
    return {s.name: s for s in real_corpus.score_all(real_corpus.corpus(), corpus_store)}


def test_the_corpus_is_big_and_well_formed() -> None:
    sidecars = real_corpus.corpus()
    assert len(sidecars) >= 60
    assert {s.source["fork"] for s in sidecars} >= {"upstream", "ollama", "ik_llama.cpp", "llamafile", "localai",
                                                      "llama-swap"}
    assert {s.source["era"] for s in sidecars} == {1, 2, 3, 4, 5}
    assert [(s.name, p) for s in sidecars for p in real_corpus.problems(s)] == []


def test_every_real_log_is_read_and_accounted_for(corpus_store: Path) -> None:
    files = Store(corpus_store).table("files")
    assert files.height == len(real_corpus.corpus())
    assert files.filter(pl.col("format").is_in(["?", "empty"])).height == 0
    bad = files.filter(pl.col("lines_parsed") + pl.col("lines_skipped") + pl.col("lines_unparsed")
                       != pl.col("lines_total"))
    assert bad.height == 0
    for sc in real_corpus.corpus():
        row = files.filter(pl.col("run") == sc.name).row(0, named=True)
        assert row["lines_total"] == sc.line_count(), sc.name


def test_the_holdout_is_well_formed_and_apart() -> None:
    """Held-out sidecars are checked without ingesting their logs; no log is in both folders."""
    held = real_corpus.corpus(real_corpus.HOLDOUT)
    assert (real_corpus.HOLDOUT / "README.md").exists()
    assert [(s.name, p) for s in held for p in real_corpus.problems(s)] == []
    assert {s.name for s in held}.isdisjoint({s.name for s in real_corpus.corpus()})
    dev_text = {s.log.read_bytes() for s in real_corpus.corpus()}
    assert [s.name for s in held if s.log.read_bytes() in dev_text] == []


def test_a_fact_read_by_hand_is_scored_exactly(tmp_path: Path) -> None:
    """The scorer itself: ms to within 0.01, `error` as whether any error is tied, instance facts in order, and a
    wrong fact is named (one real log, its sidecar rewritten with some facts off)."""
    log = real_corpus.CORPUS / "fork-ikllama-1201.log"
    (tmp_path / log.name).write_bytes(log.read_bytes())
    (tmp_path / "fork-ikllama-1201.toml").write_text("""
[source]
repo = "ikawrakow/ik_llama.cpp"
url = "https://github.com/ikawrakow/ik_llama.cpp/issues/1201"
date = "2026-01-29"
fork = "ik_llama.cpp"
era = 3
[file]
instances = 1
restarts = 0
crashes = 0
requests = 2
errors = 1
[[instance]]
n_ctx_train = 4096
[[request]]
slot = 0
task = 1609
prompt_ms = 503.255
gen_ms = 63140.0
error = false
[[request]]
slot = 0
task = 3515
error = true
""", encoding="utf-8")
    [score] = real_corpus.measure(folder=tmp_path)
    assert score.facts == 10
    assert sorted(score.wrong) == [
        "file errors: expected 1, got 0",
        "instance 1 n_ctx_train: expected 4096, got None",
        "request {'slot': 0, 'task': 1609} gen_ms: expected 63140.0, got 63140.41",
        "request {'slot': 0, 'task': 3515} error: expected True, got None",
    ]
    assert score.right == 6


@pytest.mark.parametrize("sidecar", real_corpus.corpus(), ids=lambda s: s.name)
def test_every_hand_checked_fact_is_right(scores: dict[str, real_corpus.Score], sidecar: real_corpus.Sidecar) -> None:
    score = scores[sidecar.name]
    assert score.wrong == []
    assert score.right == score.facts


def test_almost_no_server_line_is_left_unparsed(scores: dict[str, real_corpus.Score]) -> None:
    server = sum(s.server_lines for s in scores.values())
    unparsed = sum(len(s.unparsed_server) for s in scores.values())
    assert unparsed <= 0.02 * server, [(s.name, s.unparsed_server) for s in scores.values() if s.unparsed_server]


def test_an_alias_is_its_format() -> None:
    """``--format`` accepts the aliases; each is the same grammar as its format, so the test below forcing
    every format covers them."""
    for alias, target in ALIASES.items():
        assert grammar(alias) == grammar(target), alias


@pytest.mark.parametrize("fmt", [None, *format_names()])
def test_no_traceback_under_any_forced_format(tmp_path: Path, fmt: str | None) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    fixtures = Path(__file__).resolve().parent.parent / "fixtures"
    for i, log in enumerate(sorted([*fixtures.glob("real/*.log"), *fixtures.glob("logs/*.log")])):
        (logs / f"{i:03d}-{log.name}").write_bytes(log.read_bytes())
    args = ["ingest", str(logs), "--store", str(tmp_path / "s"), "--keep-going", *(["--format", fmt] if fmt else [])]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output and "internal error" not in res.output


def test_the_docs_say_what_the_corpus_holds_and_measures(scores: dict[str, real_corpus.Score]) -> None:
    """docs/formats.md's coverage table and numbers, and fixtures/real/README.md's source table, are current
    (`python -m tests.real_corpus write` regenerates both)."""
    sidecars = real_corpus.corpus()
    page = real_corpus.FORMATS_PAGE.read_text(encoding="utf-8")
    coverage = real_corpus.coverage_markdown(sidecars, [scores[sc.name] for sc in sidecars])
    assert real_corpus.updated(page, "coverage", coverage) == page
    for folder in (real_corpus.CORPUS, real_corpus.HOLDOUT):
        index = (folder / "README.md").read_text(encoding="utf-8")
        provenance = real_corpus.provenance_markdown(real_corpus.corpus(folder))
        assert real_corpus.updated(index, "provenance", provenance) == index, folder.name


def test_crashes_are_listed_with_their_evidence_and_the_tasks_in_flight(tmp_path: Path) -> None:
    from forensics import findings

    real = Path(__file__).resolve().parent.parent / "fixtures" / "real"
    logs = [real / "crash-llamacpp-12817.log", real / "crash-ikllama-687.log"]
    from forensics.ingest import IngestOptions, ingest

    ingest(tmp_path / "s", logs, IngestOptions(run="r"))
    errors = findings.error_groups(Store(tmp_path / "s"), "r")
    crashes = errors.filter(pl.col("kind") == "crash").select("example", "in_flight", "evidence").rows()
    assert crashes == [
        ("CUDA error: out of memory", "slot 0 task 3", f"{logs[1]}:16-19"),
        ('GGML_ASSERT((cparams.causal_attn || cparams.n_ubatch >= n_tokens_all) && "non-causal attention requires '
         'n_ubatch >= n_tokens") failed', "slot 1 task 2, slot 2 task 3", f"{logs[0]}:8"),
    ]
    assert errors["kind"][0] == "crash"  # crashes first

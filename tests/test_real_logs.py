"""The real-log corpus (fixtures/real): logs users pasted into public issues, with facts checked by hand.

One ingest of the whole corpus: no file refused, no internal error, every file's lines accounted for, every
hand-checked fact exact, and almost no line of server output left unparsed.  Then the same corpus under every
format forced by ``--format``: never a traceback.
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
    index = (real_corpus.CORPUS / "README.md").read_text(encoding="utf-8")
    assert real_corpus.updated(index, "provenance", real_corpus.provenance_markdown(sidecars)) == index


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

"""The registry of findings: a new finding is its SQL, one registry entry and its docs, nothing else.

A sample finding (requests that generated nothing without an error) is added with ``registry.added``: its SQL in a
folder of its own, its sentence a small function.  The verdict, the request classes (the charts), the report,
compare, watch and the CLI all show it without a line of theirs changing.  Every built-in finding is documented.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import polars as pl
import pytest
from click.testing import CliRunner

from fixtures.findings.scenarios import Builder, normal, write
from forensics import compare, findings, registry, report, sentences
from forensics.session import Analysis, thresholds
from forensics.store import Store
from tests.conftest import ROOT

SQL = """-- empty_output: requests that generated nothing, with no error (a sample finding of the registry's test).
-- Parameters: none.  Relations: fx_requests.
SELECT run, instance, slot, task, seq, gen_tokens, path, line_first, line_last,
       path || ':' || line_first || '-' || line_last AS evidence
FROM fx_requests
WHERE gen_logged = 0 AND error IS NULL
ORDER BY run, instance, slot, seq
"""


def empty_sentence(rows: pl.DataFrame, ctx: sentences.RunContext) -> list[sentences.Fact]:
    if rows.height == 0:
        return []
    return [sentences.Fact("empty_output", f"{sentences.plural(rows.height, 'request')} generated nothing.",
                           rows["evidence"].to_list(), {"empty": rows.height})]


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> registry.Finding:
    folder = tmp_path_factory.mktemp("sql")
    (folder / "empty_output.sql").write_text(SQL, encoding="utf-8")
    return registry.Finding(
        "empty_output", "Empty outputs", "Requests that generated nothing, with no error.", query="empty_output",
        sql_dir=folder, sentence=empty_sentence, request_class="empty output", compare="empty outputs",
        watch=True, command="empties", examples=(("forensics empties run-42", "the empty outputs of run-42"),))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """Two runs of 12 normal requests on 2 slots; in ``empty``, the 6th and the 9th generated 0 tokens."""
    root = tmp_path_factory.mktemp("registry") / "s"
    st = Store(root, create=True)
    for run, empties in (("fine", ()), ("empty", (5, 8))):
        b = Builder(run)
        for i in range(12):
            gen, ms = normal(i)
            b.add(i % 2, 0 if i in empties else gen, ms_tok=ms)
        write(st, "requests", b.frame(), run)
    return Store(root)


def test_the_sample_finding_shows_everywhere(sample: registry.Finding, store: Store, tmp_path: Path) -> None:
    from forensics.verdict import verdict

    with registry.added(sample):
        # its listing, through the same function as every finding
        got = findings.rows(store, "empty_output")
        assert got.select("run", "slot", "seq").rows() == [("empty", 0, 5), ("empty", 1, 3)]  # i = 8 and 5
        # the verdict: its sentence, and the run is no longer healthy; the other run still is
        v = {x.run: x for x in verdict(store)}
        assert v["fine"].healthy and not v["empty"].healthy
        assert "2 requests generated nothing." in v["empty"].paragraph()
        # the charts' classes
        classes = findings.request_classes(store, "empty")
        assert classes.group_by("class").len().sort("class").rows() == [("empty output", 2), ("normal", 10)]
        # compare: its row, counted from its rows
        rows = {r["metric"]: r for r in compare.compare(store, "fine", "empty").table.iter_rows(named=True)}
        assert (rows["empty outputs"]["fine"], rows["empty outputs"]["empty"]) == (0.0, 2.0)
        # the report: a section of its own, linked from the verdict
        page = report.write_report(store, "empty", tmp_path / "r.html").path.read_text(encoding="utf-8")
        assert '<h3 id="empty-outputs">Empty outputs</h3>' in page
        assert '<a href="#empty-outputs">' in page
        # the CLI: its command, made from its entry, with its gate
        group = click.Group()
        from forensics.commands import findings as finding_commands

        finding_commands.register(group)
        res = CliRunner().invoke(group, ["empties", "empty", "--store", str(store.root), "--format", "csv",
                                         "--fail-on", "any"])
        assert res.exit_code == 1, res.output
        assert res.stdout.splitlines()[0] == "run,instance,slot,task,seq,gen_tokens,path,line_first,line_last,evidence"
        # watch: raised as an alert
        assert [c.alert["kind"] for c in _watch(store) if c.alert["kind"] == "empty_output"] == ["empty_output"] * 2
    assert "empty_output" not in registry.FINDINGS and "empties" not in _commands()


def _watch(store: Store) -> list[object]:
    from forensics.watch import detect

    li = detect.LiveInputs(now=0.0, followed={}, clocks={}, first_seen={}, servers=[], few_tokens=3)
    cands, _ = detect.evaluate(store.root, ["empty"], li, detect.Identity({}), {})
    return cands


def _commands() -> set[str]:
    from forensics.cli import cli

    return set(cli.list_commands(click.Context(cli)))


def test_every_finding_is_documented_and_has_its_sql() -> None:
    text = (ROOT / "docs" / "findings.md").read_text(encoding="utf-8")
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}
    for f in registry.FINDINGS.values():
        if f.title:
            assert f.doc in anchors, f"{f.name}: docs/findings.md has no section #{f.doc}"
        if f.query:
            assert (ROOT / "forensics" / "queries" / f"{f.query}.sql").is_file(), f.name


def test_a_session_computes_each_finding_once_per_run(store: Store) -> None:
    """Rows are kept per run, keyed by the finding, the run, the run's part files and the thresholds: a second
    ask is a lookup, other thresholds are a new computation, and new content of the run a new key."""
    with Analysis.open(store) as s:
        first = s.rows("runaway")
        assert len(s.cache.frames) == 2  # type: ignore[attr-defined]  # one entry per run
        assert s.rows("runaway").equals(first)
        assert len(s.cache.frames) == 2  # type: ignore[attr-defined]
        s.rows("runaway", thresholds(factor=2.0))
        assert len(s.cache.frames) == 4  # type: ignore[attr-defined]
        key = s.cache_key(registry.finding("runaway"), "fine", thresholds())
        assert key[2:4] == ("fine", s.content_key("fine")) and s.content_key("fine") != s.content_key("empty")


def test_the_dead_slot_rule_lives_in_its_sql() -> None:
    """No Python decides a dead slot: the registry's dead slots are a filter of deadslots.sql's rows."""
    import inspect

    src = inspect.getsource(registry._dead_slots)
    assert "dead_seq" in src and "for " not in src

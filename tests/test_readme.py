"""The README stays a short front page: two-command quick start, the report's picture near the top, a commands
table with one example per command that really runs on the demo's store, links that lead somewhere; the docs
pages hold the rest, and the table reference is generated from the schema."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.conftest import ROOT
from tools import docs

README = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ROW = re.compile(r"^\| `(\w+)` \| (.+) \| `(forensics [^`]+)` \|$", flags=re.MULTILINE)
# The examples that exit 1 on purpose: a gate that finds the dead slot, a budget run-np6 breaks.
EXIT_ONE = {"deadslots", "smoke"}


def _examples() -> dict[str, str]:
    table = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(3) for m in ROW.finditer(table)}


def test_table_reference_is_current() -> None:
    page = docs.TABLES_PAGE.read_text(encoding="utf-8")
    assert docs.updated(page) == page, "run `make docs`"


def test_quick_start_is_two_commands() -> None:
    block = README.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert [re.split(r"\s+#", c)[0].strip() for c in commands] == ["make demo", "make test"]


def test_the_readme_is_a_front_page() -> None:
    assert len(README.encode("utf-8")) <= 12 * 1024, "the README is over 12 KB: move the detail to docs/"
    assert README.index("docs/img/report-first-screen.png") < README.index("## Quick start")


def test_every_command_is_documented_and_has_help() -> None:
    from forensics.cli import cli

    examples = _examples()
    assert set(examples) == set(cli.commands), "the README's commands table must have one row per command"
    for name, command in cli.commands.items():
        assert shlex.split(examples[name])[:2] == ["forensics", name], examples[name]
        assert (command.help or "").strip(), f"`forensics {name}` has no help text"


def test_every_readme_example_runs_on_the_demo_store(demo: tuple[Path, Any], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """As the README says: after `make demo`, with FORENSICS_STORE=demo-out/store.  `demo` itself is what the
    demo fixture runs; the other examples run on a copy of its folder."""
    from forensics.cli import cli

    shutil.copytree(demo[0], tmp_path / "demo-out")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FORENSICS_STORE", "demo-out/store")
    outputs = {}
    for name, example in _examples().items():
        if name == "demo":
            assert example == "forensics demo --out demo-out"
            continue
        res = CliRunner().invoke(cli, shlex.split(example)[1:])
        assert res.exit_code == (1 if name in EXIT_ONE else 0), f"{example}: {res.output}"
        outputs[name] = res.stdout
    shown = README.split("```\n$ forensics deadslots --fail-on any\n", 1)[1].split("$ echo $?", 1)[0]
    assert outputs["deadslots"] == shown
    assert (tmp_path / "report.html").stat().st_size and (tmp_path / "timeline.html").stat().st_size


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}


def test_every_link_between_the_pages_leads_somewhere() -> None:
    assert {p.name for p in PAGES} >= {"README.md", "tables.md", "formats.md", "replay.md", "findings.md",
                                       "metrics.md", "performance.md", "scale.md", "development.md",
                                       "architecture.md", "watch.md"}
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{page.name}: link to {target}: no such file"
            if anchor:
                assert anchor in _anchors(dest), f"{page.name}: link to {target}: no such heading"


def test_the_slug_is_githubs() -> None:
    assert _slug("`forensics deadslots [RUN]`") == "forensics-deadslots-run"
    assert _slug("Adding a log format or a fork's lines") == "adding-a-log-format-or-a-forks-lines"
    assert _slug("One run: the records and the server log") == "one-run-the-records-and-the-server-log"

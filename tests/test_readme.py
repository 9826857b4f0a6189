"""The docs document every table column (generated from the schema) and the README keeps a two-command quick start."""

from __future__ import annotations

import re

from forensics import docs
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_table_reference_is_current() -> None:
    page = docs.TABLES_PAGE.read_text(encoding="utf-8")
    assert docs.updated(page) == page, "run `python -m forensics.docs --write`"


def test_quick_start_is_two_commands() -> None:
    block = README.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert [re.split(r"\s+#", c)[0].strip() for c in commands] == ["make demo", "make test"]


def test_every_command_is_documented_and_has_help() -> None:
    from forensics.cli import cli

    for name, command in cli.commands.items():
        assert f"forensics {name}" in README, f"README does not mention `forensics {name}`"
        assert (command.help or "").strip(), f"`forensics {name}` has no help text"

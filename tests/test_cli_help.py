"""The CLI teaches itself: every command's help shows real examples, and every example parses."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from forensics import schema
from forensics.cli import cli
from forensics.store import Store, view_names

COMMANDS = sorted(cli.list_commands(click.Context(cli)))
EXAMPLE = re.compile(r"^\s+(forensics \S.*?)(?:\s{2,}.*)?$")


def _examples(name: str) -> list[str]:
    res = CliRunner().invoke(cli, [name, "--help"])
    assert res.exit_code == 0, res.output
    text = res.stdout
    assert "Examples:" in text, f"`forensics {name} --help` shows no example"
    tail = text.split("Examples:", 1)[1]
    return [m.group(1) for line in tail.splitlines() if (m := EXAMPLE.match(line))]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_examples_that_parse(name: str) -> None:
    examples = _examples(name)
    assert examples, f"`forensics {name} --help` has an Examples section without a command"
    command = cli.commands[name]
    for example in examples:
        argv = shlex.split(example)
        argv = argv[:next((i for i, a in enumerate(argv) if a in {">", ">>", "|"}), len(argv))]  # the shell's part
        assert argv[:2] == ["forensics", name], example
        # parse the arguments as the command would (options, choices, required arguments), without running it
        command.make_context(name, argv[2:])


def test_the_group_help_lists_every_command() -> None:
    res = CliRunner().invoke(cli, ["--help"])
    assert res.exit_code == 0
    listed = set(re.findall(r"^  (\w+)\s", res.stdout.split("Commands:", 1)[1], flags=re.MULTILINE))
    assert listed == set(COMMANDS)


def test_the_sql_help_names_every_table_a_query_sees(demo: tuple[Path, object]) -> None:
    """The tables in `forensics sql --help` come from forensics.schema: every view of an analysed store is named
    there (a finding's rows as finding_<name>), and every table named is one the schema declares."""
    res = CliRunner().invoke(cli, ["sql", "--help"])
    assert res.exit_code == 0
    shown = " ".join(res.stdout.split("Options:", 1)[0].split())
    stored, derived = re.findall(r"tables \(([^)]*)\)", shown)
    assert derived.endswith(", and finding_<name> for each finding")
    named = {*stored.split(", "), *derived.removesuffix(", and finding_<name> for each finding").split(", ")}
    con = Store(demo[0] / "store").connect()
    try:
        views = view_names(con)
    finally:
        con.close()
    assert {v for v in views if not v.startswith("finding_")} <= named
    assert any(v.startswith("finding_") for v in views)
    assert named == {*schema.TABLES, *schema.DERIVED}

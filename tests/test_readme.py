"""The README documents every table column and the quick start stays two commands."""

from __future__ import annotations

import re

from forensics import schema
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_column_is_documented() -> None:
    for table, cols in schema.TABLES.items():
        section = README.split(f"### `{table}`", 1)
        assert len(section) == 2, f"README has no section for table {table}"
        body = section[1].split("###", 1)[0]
        for c in cols:
            assert f"`{c.name}`" in body, f"README does not document {table}.{c.name}"


def test_quick_start_is_two_commands() -> None:
    block = README.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert [re.split(r"\s+#", c)[0].strip() for c in commands] == ["make demo", "make test"]

"""Generate the table reference, docs/tables.md, from ``forensics.schema`` (``make docs``: ``python -m tools.docs --write``).

The page keeps the generated text between ``<!-- tables:start -->`` and ``<!-- tables:end -->``; a test fails
when it is stale, so the documentation cannot drift from the contract.  A tool of the checkout, not of the
installed package: the page is not installed with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl

from forensics import schema

START, END = "<!-- tables:start -->", "<!-- tables:end -->"
TABLES_PAGE = Path(__file__).resolve().parent.parent / "docs" / "tables.md"


def _type(dtype: pl.DataType) -> str:
    if isinstance(dtype, pl.Datetime):
        return "timestamp (UTC)"
    if isinstance(dtype, pl.List):
        return "list of string"
    return {pl.Int64(): "int64", pl.Float64(): "float64", pl.Boolean(): "bool"}.get(dtype, "string")


def tables_markdown() -> str:
    out: list[str] = []
    for title, tables in (("", schema.TABLES), ("Derived: ", schema.DERIVED)):
        for table, cols in tables.items():
            out += [f"## {title}`{table}`", "", "| column | type | meaning |", "|---|---|---|"]
            out += [f"| `{c.name}` | {_type(c.dtype)} | {c.description} |" for c in cols]
            out.append("")
    return "\n".join(out)


def updated(page: str) -> str:
    """``page`` with the text between the markers replaced by the current table reference."""
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{tables_markdown()}\n{END}{tail}"


def main() -> None:
    text = TABLES_PAGE.read_text(encoding="utf-8")
    new = updated(text)
    if "--write" in sys.argv:
        TABLES_PAGE.write_text(new, encoding="utf-8")
    elif new != text:
        print("docs/tables.md is stale: run `make docs` (python -m tools.docs --write)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Rendering for the terminal and for programs: table cells wrap and are never cut."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from forensics.render import to_table


def test_a_long_cell_wraps_in_its_column() -> None:
    df = pl.DataFrame({"n": [1, 22], "evidence": ["short", "server stopped with the client: backup slot 0 (5677 "
                                                  "tokens) [backup.log:7-49] and /logs/run-np6/main-np6.log:810"]})
    assert to_table(df, max_width=40) == "\n".join([
        " n  evidence",
        "--  " + "-" * 38,
        " 1  short",
        "22  server stopped with the client: backup",
        "    slot 0 (5677 tokens) [backup.log:7-49]",
        "    and /logs/run-np6/main-np6.log:810",
    ])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=200), min_size=1,
                max_size=5), st.integers(min_value=5, max_value=60))
def test_wrapping_never_loses_a_character(cells: list[str], width: int) -> None:
    """Every non-space character of every cell is in the table, in order; no line of a cell is wider than
    the limit."""
    out = to_table(pl.DataFrame({"c": cells}), max_width=width).splitlines()[2:]
    assert all(len(line) <= max(width, 1) for line in out)
    assert "".join("".join(line.split()) for line in out) == "".join("".join(c.split()) for c in cells)

"""Named SQL: one ``.sql`` file per query in ``forensics/queries/``, with a header comment.

The header is the leading block of ``--`` comment lines: what the query finds and its parameters.
Values always reach a query as bound parameters (``$name``), never formatted into its text.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from forensics.errors import QueryError

QUERIES_DIR = Path(__file__).resolve().parent / "queries"


@dataclass(frozen=True)
class Query:
    name: str
    text: str
    header: str  # the leading comment block, without the ``--`` markers


@cache
def load_query(name: str) -> Query:
    """The query ``forensics/queries/<name>.sql`` with its header comment."""
    path = QUERIES_DIR / f"{name}.sql"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise QueryError(f"no named query {name!r}", path=str(path),
                         hint="the package is incomplete; reinstall it") from exc
    header = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        header.append(line[2:].removeprefix(" "))
    return Query(name, text, "\n".join(header).strip())

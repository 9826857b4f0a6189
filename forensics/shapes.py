"""A message's shape: the text with what varies between occurrences (numbers, ids, quoted names) masked, so that
the same error written with other numbers groups together.

One rule set (``MASKS``), applied in order, used by every part of the project that groups text by shape: the
errors finding, and ingest's most common unknown line shapes.  ``mask_shape`` masks one text, ``mask_series`` a
column (each distinct text once: a log repeats the same line thousands of times).  Only the ``regex`` package is
needed, so any layer can import this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import regex

if TYPE_CHECKING:
    import polars as pl


def _mask_quoted(m: regex.Match[str]) -> str:
    text = m.group(0)
    if m.group(1) is not None or any(ch.isspace() for ch in text):
        return text
    return '"<s>"'


# Masking rules, applied in order: (regex, replacement text or function of the match).
MASKS: list[tuple[str, str | Callable[[regex.Match[str]], str]]] = [
    (r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b", "<uuid>"),
    (r"\b0x[0-9a-fA-F]+\b", "<hex>"),
    (r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b", "<hex>"),
    (r"'[^'\n]*'", "'<s>'"),  # single-quoted strings
    # double-quoted strings: one word (an id, a name, a path) is masked; JSON keys and sentences are kept
    (r'"(?:[^"\\]|\\.)*"(\s*:)?', _mask_quoted),
    (r"(?<![A-Za-z_<])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", "N"),  # numbers
]
_COMPILED = [(regex.compile(p), r) for p, r in MASKS]


def mask_shape(text: str | None) -> str:
    """The shape of ``text``: ``MASKS`` applied in order, whitespace squeezed."""
    out = text or ""
    for rx, rep in _COMPILED:
        out = rx.sub(rep, out)
    return " ".join(out.split())


def mask_series(texts: pl.Series) -> pl.Series:
    """``mask_shape`` of every value of ``texts`` (null gives the shape of an empty text), each distinct value
    masked once."""
    import polars as pl

    distinct = texts.drop_nulls().unique()
    shapes = pl.Series([mask_shape(t) for t in distinct.to_list()], dtype=pl.String)
    return texts.replace_strict(distinct, shapes, default=mask_shape(None), return_dtype=pl.String)

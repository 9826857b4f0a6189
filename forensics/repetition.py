"""Repetition in generated text: the signal that an output ran away by looping.

For one output text:

* ``tail_period``: the exact-period check (like vLLM's repetition detection): the period ``p`` whose
  repetition covers the longest stretch at the end of the text, and how many whole times the last
  ``p`` characters repeat there.  Found with the Z-function of the reversed text in linear time.
* ``distinct_n``: distinct n-grams / all n-grams over word tokens (n = 1, 2, 3); low means repetitive.
* ``degenerate``: the text ends in a loop (a block of at least ``min_block`` characters repeated at least
  ``min_repeats`` times, covering at least ``min_coverage`` of the text and ``min_chars`` characters),
  or a long text has very few distinct word trigrams (distinct-3 below ``max_distinct3`` over at least
  ``min_words`` words).

Pure Python and polars: no click, no altair.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import polars as pl
import regex

WORD = regex.compile(r"\w+|[^\w\s]")

# Defaults of the degenerate rule (documented in docs/findings.md).
MIN_REPEATS = 3
MIN_BLOCK = 1
MIN_CHARS = 200
MIN_COVERAGE = 0.3
MIN_WORDS = 100
MAX_DISTINCT3 = 0.25


@dataclass(frozen=True)
class Repetition:
    period: int  # length of the repeating block at the end (0: no repetition)
    repeats: int  # whole repetitions of that block at the end
    block: str  # the block (at most 80 characters shown)
    tail_coverage: float  # share of the text covered by the repetition at its end
    distinct_1: float | None
    distinct_2: float | None
    distinct_3: float | None
    degenerate: bool


def z_function(s: str) -> list[int]:
    """z[i] = length of the longest common prefix of ``s`` and ``s[i:]`` (z[0] = len(s))."""
    n = len(s)
    z = [0] * n
    if n == 0:
        return z
    z[0] = n
    left = right = 0
    for i in range(1, n):
        if i < right:
            z[i] = min(right - i, z[i - left])
        while i + z[i] < n and s[z[i]] == s[i + z[i]]:
            z[i] += 1
        if i + z[i] > right:
            left, right = i, i + z[i]
    return z


def tail_period(text: str, *, min_repeats: int = 2) -> tuple[int, int]:
    """(period, repeats) of the repetition covering the most characters at the end of ``text``.

    The end of ``text`` consists of ``repeats`` whole copies of its last ``period`` characters (plus
    possibly a partial copy before them).  Ties go to the shortest period.  (0, 0) when no block
    repeats at least ``min_repeats`` times.
    """
    n = len(text)
    if n < 2:
        return 0, 0
    z = z_function(text[::-1])
    best_p, best_cover = 0, 0
    for p in range(1, n // max(min_repeats, 1) + 1):
        cover = p + z[p] if p < n else p  # length of the periodic stretch at the end
        if cover // p >= min_repeats and cover > best_cover:
            best_p, best_cover = p, cover
    if best_p == 0:
        return 0, 0
    return best_p, best_cover // best_p


def distinct_n(tokens: list[str], n: int) -> float | None:
    """Distinct n-grams / n-grams (None when there are none)."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return None
    return len(set(grams)) / len(grams)


@dataclass(frozen=True)
class DegenerateRule:
    """The thresholds of the degenerate rule (see the module docstring)."""
    min_repeats: int = MIN_REPEATS
    min_block: int = MIN_BLOCK
    min_chars: int = MIN_CHARS
    min_coverage: float = MIN_COVERAGE
    min_words: int = MIN_WORDS
    max_distinct3: float = MAX_DISTINCT3


DEFAULT_RULE = DegenerateRule()


def analyze(text: str | None, rule: DegenerateRule = DEFAULT_RULE) -> Repetition:
    """The repetition score of one output text (see the module docstring for the rule)."""
    text = text or ""
    period, repeats = tail_period(text, min_repeats=rule.min_repeats)
    covered = period * repeats
    coverage = covered / len(text) if text else 0.0
    tokens = WORD.findall(text)
    d1, d2, d3 = (distinct_n(tokens, k) for k in (1, 2, 3))
    looping = (period >= rule.min_block and repeats >= rule.min_repeats and covered >= rule.min_chars
               and coverage >= rule.min_coverage)
    flat = len(tokens) >= rule.min_words and d3 is not None and d3 < rule.max_distinct3
    block = text[len(text) - period:] if period else ""
    return Repetition(period, repeats, block[:80], round(coverage, 4), d1, d2, d3, degenerate=bool(looping or flat))


REPETITION_SCHEMA = {
    "period": pl.Int64, "repeats": pl.Int64, "block": pl.String, "tail_coverage": pl.Float64,
    "distinct_1": pl.Float64, "distinct_2": pl.Float64, "distinct_3": pl.Float64, "degenerate": pl.Boolean,
}


def score_texts(df: pl.DataFrame, column: str = "output_text", rule: DegenerateRule = DEFAULT_RULE) -> pl.DataFrame:
    """``df`` with the Repetition fields added for its ``column`` (rows without text get nulls)."""
    rows = [asdict(analyze(t, rule)) if t is not None else dict.fromkeys(REPETITION_SCHEMA)
            for t in df[column].to_list()]
    extra = pl.DataFrame(rows, schema=REPETITION_SCHEMA, orient="row")
    return pl.concat([df, extra], how="horizontal")

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from forensics.repetition import analyze, distinct_n, tail_period, z_function


def primitive(block: str) -> bool:
    """Not a power of a shorter string."""
    return (block + block).find(block, 1) == len(block)


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="abc ", min_size=1, max_size=12).filter(primitive), st.integers(min_value=2, max_value=30))
def test_block_repeated_k_times_has_period_len_block(block: str, k: int) -> None:
    period, repeats = tail_period(block * k)
    assert (period, repeats) == (len(block), k)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="xyz", max_size=20), st.text(alphabet="ab", min_size=1, max_size=6).filter(primitive),
       st.integers(min_value=3, max_value=20))
def test_prefix_does_not_hide_the_loop(prefix: str, block: str, k: int) -> None:
    period, repeats = tail_period(prefix + block * k)
    assert len(block) % period == 0 or period % len(block) == 0
    assert period * repeats >= len(block) * k - len(block)


@given(st.text(max_size=40))
def test_z_function_matches_definition(s: str) -> None:
    z = z_function(s)
    for i in range(1, len(s)):
        n = 0
        while i + n < len(s) and s[n] == s[i + n]:
            n += 1
        assert z[i] == n


def test_no_repetition() -> None:
    assert tail_period("abcdef") == (0, 0)
    assert tail_period("") == (0, 0)


def test_distinct_n() -> None:
    assert distinct_n(["a", "b", "a", "b"], 1) == 0.5
    assert distinct_n(["a", "b", "a", "b"], 2) == 2 / 3
    assert distinct_n(["a"], 2) is None


def test_degenerate_flag() -> None:
    loop = analyze('{"summary": "' + "The revenue grew. " * 40)
    assert (loop.period, loop.repeats, loop.block, loop.degenerate) == (18, 40, "The revenue grew. ", True)
    fine = analyze('{"summary": "Revenue grew 12% on strong services demand; margins held.", "score": 7}')
    assert fine.degenerate is False
    assert analyze(None).degenerate is False
    spaces = analyze('{"a": 1' + " " * 300)
    assert (spaces.period, spaces.repeats, spaces.degenerate) == (1, 300, True)

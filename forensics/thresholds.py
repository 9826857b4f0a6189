"""The rules' knobs (``Thresholds``): the defaults every finding uses, each one a command option of the findings
that read it.

A module of its own, light on purpose (no DuckDB, no polars): the CLI builds its options and their help from these
fields, and ``forensics --help`` should not load the query engine.  ``forensics.session`` re-exports the names.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from forensics.errors import QueryError


def _knob(default: float | int | bool, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Thresholds:
    """The rules' knobs: each a command option of the findings that use it (``help``: its text there)."""

    factor: float = _knob(3.0, "Runaway: tokens > FACTOR x the group's normal quantile")
    quantile: float = _knob(0.9, "Quantile of normal generated tokens used as the baseline")
    min_tokens: int = _knob(256, "Runaway: at least this many generated tokens")
    min_group: int = _knob(5, "Smaller stage/instance groups use the whole run's baseline")
    ctx_slack: int = _knob(8, "Reached the context: n_past_end >= n_ctx_slot - SLACK")
    long_factor: float = _knob(5.0, "Abnormally long: seconds > X x the group's median")
    min_seconds: float = _knob(1.0, "Abnormally long: and at least this many seconds")
    slow_factor: float = _knob(4.0, "Abnormally slow: ms/token > X x the group's median")
    few_tokens: int = _knob(3, "A handful of tokens: at most this many ...")
    few_normal: float = _knob(100.0, "... where the group's median is at least this many")
    include_recovered: bool = _knob(False, "Also list slots that served normally again at the end (recovered = true)")
    margin: float = _knob(0.2, "Headroom above the longest normal response before rounding up")
    stall_lines: int = _knob(20, "KV-cache stall: at least this many 'no free space' lines in one instance")
    cache_waste: float = _knob(0.05, "Prompt cache: told when the prompt tokens computed again that the slot's cache "
                                     "could have served are at least this share of the instance's prompt tokens")

    def __post_init__(self) -> None:
        if not 0 < self.quantile <= 1:
            raise QueryError(f"quantile {self.quantile} is not in (0, 1]", hint="pass e.g. --quantile 0.9")
        for name in ("factor", "long_factor", "slow_factor"):
            if getattr(self, name) <= 0:
                raise QueryError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("min_tokens", "min_group", "ctx_slack", "few_tokens", "stall_lines"):
            if getattr(self, name) < 0:
                raise QueryError(f"{name} must not be negative, got {getattr(self, name)}")
        if not 0 <= self.cache_waste <= 1:
            raise QueryError(f"cache_waste {self.cache_waste} is not in [0, 1]", hint="pass e.g. --cache-waste 0.05")
        if self.margin < 0:
            raise QueryError(f"margin must not be negative, got {self.margin}", hint="pass e.g. --margin 0.2")

    def digest(self) -> str:
        return _digest(self)


@functools.cache
def _digest(th: Thresholds) -> str:
    """What a finding's rows depend on among the knobs, as a short key (computed once per value)."""
    return hashlib.sha1(json.dumps(asdict(th), sort_keys=True).encode()).hexdigest()[:16]


def thresholds(**overrides: float | int | bool | None) -> Thresholds:
    """Thresholds with the given overrides (None values keep the default)."""
    known = {f.name for f in fields(Thresholds)}
    bad = [k for k in overrides if k not in known]
    if bad:
        raise QueryError(f"unknown threshold {bad[0]!r}", hint=f"thresholds: {', '.join(sorted(known))}")
    return Thresholds(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]


DEFAULTS = Thresholds()

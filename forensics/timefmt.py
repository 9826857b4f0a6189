"""When something happened, written the same way everywhere: one home for the project's time formats.

A finding's time is a *stamp*: the ISO time with milliseconds when the log has absolute time
(``2026-08-23T10:50:19.855Z``), else the server's own clock in seconds since it started (``32.436s``), else a
fallback that places it (``seq 4``, ``line 672``).  ``stamp`` writes one, ``stamp_expr`` a column of them (the
same text, vectorised), and ``spoken`` turns a stamp into the words of a sentence (``at 10:50:19``,
``32.4 s after the server started``).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from forensics.lazy import lazy_import

if TYPE_CHECKING:
    import polars as pl
else:  # loaded on first use: the CLI imports this module to build its commands (forensics.lazy)
    pl = lazy_import("polars")


ISO_MS = "%Y-%m-%dT%H:%M:%S%.3fZ"


def stamp(ts: datetime | None, elapsed_s: float | None, fallback: str) -> str:
    """``ts`` as ISO time with milliseconds (UTC, ``Z``), else ``elapsed_s`` as ``"12.345s"``, else ``fallback``."""
    if ts is not None:
        return ts.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if elapsed_s is not None:
        return f"{elapsed_s:.3f}s"
    return fallback


def stamp_expr(ts: pl.Expr, elapsed_s: pl.Expr, fallback: pl.Expr) -> pl.Expr:
    """``stamp`` of every row, as one polars expression (no Python call per row)."""
    ms = (elapsed_s.abs() * 1000).round(0).cast(pl.Int64)
    sign = pl.when(elapsed_s < 0).then(pl.lit("-")).otherwise(pl.lit(""))
    elapsed = pl.format("{}{}.{}s", sign, ms // 1000, (ms % 1000).cast(pl.String).str.zfill(3))
    return (pl.when(ts.is_not_null()).then(ts.dt.convert_time_zone("UTC").dt.to_string(ISO_MS))
            .when(elapsed_s.is_not_null()).then(elapsed).otherwise(fallback))


def wall_expr(ts: pl.Expr) -> pl.Expr:
    """A wall-clock time as ISO text with milliseconds (``2026-08-23T10:50:19.855Z``), null when there is none: what
    every time column of a listing holds (a line number or a process's own seconds go in columns of their own)."""
    return ts.dt.convert_time_zone("UTC").dt.to_string(ISO_MS)


def spoken(text: object) -> str:
    """A stamp as a sentence says it: the clock time of an ISO stamp, the server's clock in seconds since it
    started, else the fallback (``at line 672``, ``at request 4 on the slot``)."""
    s = str(text)
    if len(s) >= 19 and s[10] == "T":
        return f"at {s[11:19]}"
    if s.startswith("line "):
        return f"at {s}"
    if s.endswith("s") and s[:-1].lstrip("-").replace(".", "", 1).isdigit():
        return f"{float(s[:-1]):.1f} s after the server started"
    return f"at request {s.removeprefix('seq ')} on the slot" if s.startswith("seq") else f"at {s}"


def seconds(value: float) -> str:
    """A duration for a sentence: ``0.4 s``, ``47.6 s``, ``3 min 12 s``, ``1 h 05 min``."""
    if value < 59.95:
        return f"{value:.1f} s"
    whole = round(value)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    minutes = round(value / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min"

"""Names the CLI offers as choices, kept here so that building the options loads no heavy module
(polars, DuckDB, Altair) and each list has one home."""

from __future__ import annotations

SOURCES = ("auto", "server", "records")  # where a run's requests come from (metrics.request_intervals)
CHART_KINDS = ("throughput", "latency", "timeline", "tokens", "busy")  # charts.build

"""Replay runs: the harness's records (run manifests and request attempts), their join to the server's
requests, and the questions asked of them (``runs``, ``missing``).

Public API::

    detect(path) -> "manifest" | "attempts" | None       what kind of record file a path is, by content
    load(paths, *, mapping=None, run=None) -> Records     runs + attempts frames and per-record errors
    load_mapping(path) -> Mapping                          a harness mapping file (TOML), or a shipped name
    build_items(runs, attempts) -> DataFrame               one row per expected item x stage, final outcome
    ingest_records(store_or_txn, records, ...)             write runs, attempts and items into the store
    join(requests, instances, runs, attempts) -> JoinResult   attempts <-> server requests
    join_store(store) -> JoinResult                        the same over the store's tables
    (the ``forensics runs`` and ``missing RUN`` listings over the stored join are in ``forensics.replay.tables``)
    check_run(store, run, need=..., command=...) -> RunCheck   a run asked for by a command (alias, halves)
"""

from __future__ import annotations

import importlib
from typing import Any

# ``join`` is both a module and its function: bound here, so that the package attribute stays the function
from forensics.replay.join import JoinResult as JoinResult
from forensics.replay.join import join as join
from forensics.replay.join import join_store as join_store

# Each public name and the module that defines it: importing the package (which ingest does for every run folder)
# loads a module only when one of its names is first used.
_HOME = {
    "Mapping": "mapping", "load_mapping": "mapping", "shipped_mappings": "mapping",
    "RecordIssue": "records", "Records": "records", "detect": "records",
    "RunCheck": "identity", "check_run": "identity",
    "build_items": "items", "ingest_into": "intake",
    "load": "api", "ingest_records": "api",
}

__all__ = sorted([*_HOME, "JoinResult", "join", "join_store"])


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'forensics.replay' has no attribute {name!r}")
    return getattr(importlib.import_module(f"forensics.replay.{_HOME[name]}"), name)

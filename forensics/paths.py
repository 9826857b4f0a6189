"""Names derived from file names, shared by ingest (runs, instance labels) and the replay code (a
server named by its log file's stem, ``{stem}`` in mappings), so that they always agree; and the
default store location."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_STORE = "forensics-store"
# compression first, then the content extensions (server.log.gz -> server)
EXTENSIONS = (".gz", ".zst", ".log", ".txt", ".out", ".err", ".jsonl", ".ndjson", ".json", ".csv", ".yaml", ".yml")


def file_stem(name: str) -> str:
    """``name`` without the extensions above, in that order."""
    for ext in EXTENSIONS:
        name = name.removesuffix(ext)
    return name


def default_store_path() -> Path:
    """$FORENSICS_STORE, else ./forensics-store (here, not in store.py, so the CLI starts without DuckDB)."""
    return Path(os.environ.get("FORENSICS_STORE") or DEFAULT_STORE)

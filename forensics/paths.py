"""Names derived from file names, shared by ingest (runs, instance labels) and the replay code (a
server named by its log file's stem, ``{stem}`` in mappings), so that they always agree."""

from __future__ import annotations

# compression first, then the content extensions (server.log.gz -> server)
EXTENSIONS = (".gz", ".zst", ".log", ".txt", ".out", ".err", ".jsonl", ".ndjson", ".json", ".csv")


def file_stem(name: str) -> str:
    """``name`` without the extensions above, in that order."""
    for ext in EXTENSIONS:
        name = name.removesuffix(ext)
    return name

"""llama-forensics: offline forensics for llama-server logs and batch replay runs.

Public API (also used by the notebooks)::

    import forensics
    store = forensics.open_store("forensics-store")
    store.table("requests")          # polars DataFrame
    con = store.connect()            # DuckDB connection with one view per table
"""

from __future__ import annotations

from forensics.errors import ForensicsError
from forensics.store import Store, default_store_path

__all__ = ["ForensicsError", "Store", "default_store_path", "open_store"]
__version__ = "0.1.0"


def open_store(path: str | None = None, *, create: bool = False) -> Store:
    """Open the store at ``path`` (default: $FORENSICS_STORE or ./forensics-store)."""
    return Store(path if path is not None else default_store_path(), create=create)

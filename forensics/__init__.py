"""llama-forensics: offline forensics for llama-server logs and batch replay runs.

Public API (also used by the notebooks)::

    import forensics
    store = forensics.open_store("forensics-store")
    store.table("requests")          # polars DataFrame
    con = store.connect()            # DuckDB connection with one view per table
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from forensics.errors import ForensicsError
from forensics.paths import default_store_path

if TYPE_CHECKING:
    from forensics.store import Store

__all__ = ["ForensicsError", "Store", "default_store_path", "open_store"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Store (DuckDB, polars) loads on first use: importing any forensics module, the CLI included,
    # does not pay for them up front.
    if name == "Store":
        from forensics.store import Store

        return Store
    raise AttributeError(f"module 'forensics' has no attribute {name!r}")


def open_store(path: str | None = None, *, create: bool = False) -> Store:
    """Open the store at ``path`` (default: $FORENSICS_STORE or ./forensics-store)."""
    from forensics.store import Store

    return Store(path if path is not None else default_store_path(), create=create)

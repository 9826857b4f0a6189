"""llama-forensics: offline forensics for llama-server logs and batch replay runs.

Public API (also used by the notebooks)::

    import forensics
    store = forensics.open_store("forensics-store")
    store.table("requests")          # polars DataFrame
    con = store.connect()            # DuckDB connection with one view per table
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any


def _own_parsers() -> None:
    """Load ``parsers`` from the folder beside this package, before anything imports it by name.

    ``parsers`` is a common name: with ``python -m forensics`` the working directory comes first on ``sys.path``,
    so a user's own ``parsers/`` folder there would otherwise be imported in place of ours (or, under an editable
    install, merge with it).  A ``parsers`` already imported from elsewhere is refused with one line."""
    here = Path(__file__).resolve().parent.parent / "parsers"
    loaded = sys.modules.get("parsers")
    if loaded is not None:
        where = [str(Path(p).resolve()) for p in getattr(loaded, "__path__", [])]
        if where != [str(here)]:
            other = ", ".join(where) or repr(loaded)
            raise ImportError(f"forensics needs its own `parsers` package ({here}), but another one is already "
                              f"imported ({other}): import forensics first, or rename yours")
        return
    spec = importlib.util.spec_from_file_location("parsers", here / "__init__.py",
                                                  submodule_search_locations=[str(here)])
    if spec is None or spec.loader is None:  # pragma: no cover - the package is installed whole
        raise ImportError(f"forensics is installed without its parsers ({here}): reinstall llama-forensics")
    module = importlib.util.module_from_spec(spec)
    sys.modules["parsers"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["parsers"]
        raise


_own_parsers()

from forensics.errors import ForensicsError  # noqa: E402  (after the parsers it re-exports are ours)
from forensics.paths import default_store_path  # noqa: E402

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

"""A module imported on first use: ``pl = LazyModule("polars")`` costs nothing until ``pl.col`` is read.

The modules the CLI needs to build its commands (the registry of findings, its sentences, the thresholds) use
polars only inside their functions; with a lazy name they can be imported by ``forensics --help`` without paying
the 0.2-0.3 s that importing polars takes.  Each such module imports the real one under ``TYPE_CHECKING`` so type
checkers see polars itself.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule:
    """Stands for module ``name``; the first attribute read imports it (``importlib`` holds the import lock)."""

    __slots__ = ("_module", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        state = "loaded" if self._module is not None else "not loaded yet"
        return f"<lazy module {self._name!r} ({state})>"

"""A module imported on first use: ``pl = lazy_import("polars")`` costs nothing until ``pl.col`` is read.

The standard library's ``importlib.util.LazyLoader`` does the work: the module is found and put into
``sys.modules`` at once, and executed when one of its attributes is first read.  The modules the CLI needs to
build its commands (the registry of findings, its sentences, the time format, the schema) use polars only inside
their functions; with a lazy module they can be imported by ``forensics --help`` without paying the 0.2-0.3 s
that importing polars takes.  Each such module imports the real one under ``TYPE_CHECKING`` so type checkers see
polars itself.

Python before 3.12 does not lock a lazy module's first load: the first attribute read of each lazy module happens
in the main thread (the ingest's workers and the store's writer start after the data libraries are in use).
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_import(name: str) -> ModuleType:
    """Module ``name``, executed when one of its attributes is first read; the module itself when it is loaded
    already.  A module that is not installed raises ModuleNotFoundError here, not on first use."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def is_loaded(name: str) -> bool:
    """Whether module ``name`` has been executed (a lazy module not read yet sits in ``sys.modules`` unexecuted)."""
    module = sys.modules.get(name)
    return module is not None and type(module).__name__ != "_LazyModule"  # LazyLoader's class until the first read

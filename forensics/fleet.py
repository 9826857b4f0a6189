"""A fleet: several hosts' stores read as one.

Each host keeps ingesting (or watching) into its own store; a fleet reads them together, on DuckDB or Spark,
with the same views and so the same named SQL.  A run of one host never mixes with a run of the same name on
another: in a fleet, every table's ``run`` reads ``<host>:<run>``, and so does every other column that holds a
run's name (``RUN_NAME_COLUMNS``: ``requests.replay_run``); instances are named within their run, so they stay
apart too.  A fleet only reads: ingest, compact, check and watch work on one store.

    fleet = open_fleet(["gpu-a=stores/a", "gpu-b=stores/b", "stores/c"])
    verdict.compute(fleet)                  # runs gpu-a:run-42, gpu-b:run-42, c:run-7, ...

A store named without ``HOST=`` is labelled by its folder (by the folder above it when the folder is the default
``forensics-store``); a pattern (``stores/*``) names every store it matches.
"""

from __future__ import annotations

import glob
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from forensics.errors import StoreError
from forensics.paths import DEFAULT_STORE
from forensics.store import MANIFEST, Store, escape_partition, run_of_part, sql_string

HOST_SEP = ":"  # <host>:<run>
# columns besides ``run`` that hold a run's name, by table: qualified the same way, so that they still meet ``run``
RUN_NAME_COLUMNS: dict[str, tuple[str, ...]] = {"requests": ("replay_run",)}
READ_ONLY = "pass one --store: ingest, compact, check and watch write to one host's store"


def qualified(host: str, run: str) -> str:
    """A fleet's name for ``run`` of ``host``."""
    return f"{host}{HOST_SEP}{run}"


def host_label(path: Path) -> str:
    """The host a store stands for when none is given: its folder's name, or the folder above a default-named
    store (``gpu-a/forensics-store`` is ``gpu-a``)."""
    path = path.resolve()
    return path.parent.name if path.name == Path(DEFAULT_STORE).name else path.name


def expand(specs: list[str]) -> list[tuple[str | None, Path]]:
    """``[HOST=]PATH`` specs as (host or None, path); a PATH with ``*``, ``?`` or ``[`` that names no folder
    itself is a pattern for every store folder it matches."""
    out: list[tuple[str | None, Path]] = []
    for spec in specs:
        host, sep, path = spec.partition("=")
        if not sep or not host or "/" in host:
            host, path = "", spec
        if any(ch in path for ch in "*?[") and not Path(path).exists():
            found = sorted(p for p in glob.glob(path) if (Path(p) / MANIFEST).exists())
            if not found:
                raise StoreError(f"no store matches {path}", hint="each store is a folder with a _manifest.json")
            out.extend((None, Path(p)) for p in found)
        else:
            out.append((host or None, Path(path)))
    return out


def open_fleet(specs: list[str]) -> Store:
    """The stores ``specs`` name (``[HOST=]PATH`` or patterns) read as one: the store itself when there is one."""
    places = expand(specs)
    if len(places) == 1:
        return Store(places[0][1])
    members: list[tuple[str, Store]] = []
    for host, path in places:
        members.append((host or host_label(path), Store(path)))
    labels = [h for h, _ in members]
    dup = next((h for h in labels if labels.count(h) > 1), None)
    if dup is not None:
        raise StoreError(f"two stores stand for host {dup!r}", hint="name each: --store HOST=PATH")
    bad = next((h for h in labels if HOST_SEP in h), None)
    if bad is not None:
        raise StoreError(f"host {bad!r} has a {HOST_SEP!r} in it", hint="name it: --store HOST=PATH")
    return Fleet(members)


class Fleet(Store):
    """Several stores read as one; see the module's docstring.  It answers the reading half of ``Store``: the
    views (``connect``, ``table``), run names, parts and meta."""

    def __init__(self, members: list[tuple[str, Store]]) -> None:  # no super().__init__: no manifest of its own
        if not members:
            raise StoreError("a fleet needs at least one store", hint="pass --store PATH")
        self.members = members
        self.root = members[0][1].root  # a fleet's messages and keys name its first store
        self._names_cache: dict[tuple[str, ...], list[str] | None] = {}
        self.recovered: list[str] = []
        self.engine: Any = None

    @property
    def hosts(self) -> list[str]:
        return [h for h, _ in self.members]

    @property
    def manifest(self) -> dict[str, Any]:
        raise StoreError("a fleet of stores has no manifest of its own", hint=READ_ONLY)

    def parts(self, table: str) -> list[str]:
        """Every member's parts of ``table``, each named as if the fleet held it: its ``run=`` folder reads
        ``host:run`` (``run_of_part`` gives the fleet's run name)."""
        return [_qualified_part(h, p) for h, s in self.members for p in s.parts(table)]

    def packs(self, table: str) -> list[dict[str, Any]]:
        raise StoreError("a fleet of stores has no packs of its own", hint=READ_ONLY)

    def meta(self, key: str, default: Any = None) -> Any:
        """A member's meta when they all agree; else None, or True for a ``..._pending`` flag (one member
        pending means the fleet is)."""
        values = [s.meta(key, default) for _, s in self.members]
        if all(v == values[0] for v in values):
            return values[0]
        return True if key.endswith("_pending") and any(values) else None

    @contextmanager
    def lock(self, *, wait: bool = True, on_wait: Any = None) -> Iterator[None]:
        raise StoreError("several stores are read together and none is written", hint=READ_ONLY)
        yield  # pragma: no cover

    def transaction(self) -> Any:
        raise StoreError("several stores are read together and none is written", hint=READ_ONLY)

    def _run_names(self, tables: list[str]) -> list[str] | None:
        names: list[str] = []
        for host, store in self.members:
            mine = store.run_names(tables)
            if mine is None:
                return None
            names.extend(qualified(host, r) for r in mine)
        return sorted(names)

    def view_source(self, table: str, existing_only: bool = False) -> str | None:
        """Every member's rows of ``table``, ``run`` qualified by the member's host."""
        selects = []
        others = RUN_NAME_COLUMNS.get(table, ())
        for host, store in self.members:
            source = store.view_source(table, existing_only)
            if source is None:
                continue
            prefix = sql_string(host + HOST_SEP)
            named = "".join(f", {prefix} || CAST({c} AS VARCHAR) AS {c}" for c in others)
            if others:  # a member whose parts predate such a column reads it as NULL
                nulls = ", ".join(f"CAST(NULL AS VARCHAR) AS {c}" for c in others)
                source = f"(SELECT * FROM {source} UNION ALL BY NAME SELECT {nulls} WHERE false)"
            selects.append(f"SELECT * REPLACE ({prefix} || CAST(run AS VARCHAR) AS run{named}) FROM {source}")
        return "(" + " UNION ALL BY NAME ".join(selects) + ")" if selects else None


def _qualified_part(host: str, rel: str) -> str:
    return "/".join(f"run={escape_partition(qualified(host, run_of_part(seg) or ''))}" if seg.startswith("run=")
                    else seg for seg in rel.split("/"))


def members_of(store: Store) -> list[tuple[str | None, Store]]:
    """(host, store) of each store ``store`` reads: its members for a fleet, else itself with no host."""
    if isinstance(store, Fleet):
        return list(store.members)
    return [(None, store)]


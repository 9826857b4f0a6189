"""The store: Parquet tables in a hive layout, a manifest, atomic commits, and DuckDB views.

Layout::

    STORE/
      _manifest.json                    # which part files make up each table (the only truth)
      <table>/run=<escaped run>/<part>.parquet
      _meta/<key>-<txn>.json            # a meta value that grows with the store (the files read), named by it
      .lock                             # held while an ingest writes
      .txn/<id>.json                    # journal of a commit in progress

The ``run`` column is the hive partition key: it lives in the directory name, not inside the files, so
DuckDB, Spark and Trino read the same folders the same way.  A commit writes new parts under a
temporary name, journals the planned renames and deletions, then applies them and replaces the
manifest with an atomic rename.  An interrupted commit is rolled forward (journal complete) or
discarded (journal incomplete) by the next writer, under the lock: readers never change or delete
anything, and they only ever see the store as it was before or after an ingest (the manifest is
replaced in one rename, and it names only parts that are already in place).

``FAULT`` is a test hook: when set, it is called with the name of every step of a commit (the journal
write, each rename, the manifest write, each deletion), so a test can stop the process at exactly
that step.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from forensics import packing, schema
from forensics.errors import NotFoundError, StoreError
from forensics.lazy import lazy_import
from forensics.paths import DEFAULT_STORE as DEFAULT_STORE  # re-exported: the store's public names
from forensics.paths import default_store_path as default_store_path

if TYPE_CHECKING:
    import duckdb
else:  # loaded when a query runs: an ingest writes Parquet and needs no SQL engine (forensics.lazy)
    duckdb = lazy_import("duckdb")

MANIFEST = "_manifest.json"
PACKS_DIR = "packs"  # <table>/packs/<pack>.parquet: many parts' rows in one file (``compact``)
FAULT: Callable[[str], None] | None = None


@dataclass(frozen=True)
class Migration:
    """One step of the store's format: a store of version ``to - 1`` read as one of version ``to``.

    ``manifest`` returns the manifest of the older version as the newer one has it (a pure function: readers
    apply it in memory and never write; a writer, under the lock, writes the result back once).  A change of the
    store's format is one entry at the end of ``MIGRATIONS``, and ``FORMAT_VERSION`` follows from it."""

    to: int
    why: str
    manifest: Callable[[dict[str, Any]], dict[str, Any]]


class NewerStoreError(StoreError):
    """The store (or a commit of it) was written by a newer version of llama-forensics."""


def _as_is(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest


MIGRATIONS: tuple[Migration, ...] = (
    # Version 1 stores lack the analysis' tables (forensics.derived) or hold them from an older analysis: the
    # analysis derives what a store lacks by itself on first use (forensics.analyse.ensure), so the manifest
    # stays as it is.
    Migration(2, "the analysis' derived tables, kept in the manifest's `derived` entry", _as_is),
)
FORMAT_VERSION = MIGRATIONS[-1].to  # the version this code writes, and the newest it reads


def _step(name: str) -> None:
    if FAULT is not None:
        FAULT(name)


def run_of_part(rel: str) -> str | None:
    """The run a part belongs to, from its path's ``run=`` folder (``escape_partition`` undone); None for a
    path without one."""
    segs = rel.split("/", 2)
    if len(segs) > 1 and segs[1].startswith("run="):  # <table>/run=<run>/...: every part the store writes
        seg: str | None = segs[1]
    else:
        seg = next((s for s in rel.split("/") if s.startswith("run=")), None)
    if seg is None:
        return None
    return seg[4:] if "%" not in seg else urllib.parse.unquote(seg[4:], errors="strict")


def sql_string(value: str) -> str:
    """``value`` as a SQL string literal (paths and names put into DuckDB statements that take no parameters)."""
    return "'" + value.replace("'", "''") + "'"


def sql_strings(values: list[str]) -> str:
    """``values`` as a comma-separated list of SQL string literals."""
    return ", ".join(sql_string(v) for v in values)


def view_names(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The views a connection has (a store's tables it bound, and any a caller added)."""
    if not isinstance(con, duckdb.DuckDBPyConnection):  # another engine's connection knows its own
        return con.view_names()
    return {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}


def escape_partition(value: str) -> str:
    """Escape a run name for a hive directory: no separators, no '..', no NUL; reversible."""
    out = []
    for ch in value.replace("\x00", ""):
        if ch.isascii() and (ch.isalnum() or ch in "-_~+@"):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out) or "%20"


@dataclass
class Transaction:
    """Parts to add and remove, committed together."""

    store: Store
    txn_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    adds: dict[str, list[str]] = field(default_factory=dict)  # table -> final relative paths
    staged: list[tuple[str, str]] = field(default_factory=list)  # (tmp rel path, final rel path)
    removes: dict[str, set[str]] = field(default_factory=dict)
    meta_updates: dict[str, Any] = field(default_factory=dict)
    packs_add: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # table -> new packs (compaction)
    packs_drop: dict[str, set[str]] = field(default_factory=dict)  # table -> pack files a new pack replaces
    freed: set[str] = field(default_factory=set)  # own files of parts the new packs hold: deleted after
    # edits of the new manifest made at commit (forensics.derived): each returns the files it leaves unused
    edits: list[Callable[[dict[str, Any]], set[str]]] = field(default_factory=list)
    pack_small: bool = False  # small parts go into packs (a bulk ingest: ``forensics.packing``)
    _buffer: packing.PartBuffer = field(default_factory=packing.PartBuffer)
    _counter: int = 0
    _writer: ThreadPoolExecutor | None = None
    _pending: list[Future] = field(default_factory=list)

    def write(self, table: str, df: pl.DataFrame, *, run: str, name: str) -> None:
        """Stage ``df`` (already conformed; must not contain ``run``) as a new part of ``table``: its own file, or
        (``pack_small``) rows of a pack written when enough wait (``forensics.packing``)."""
        if df.height == 0:
            return
        if "run" in df.columns:
            df = df.drop("run")
        self._counter += 1
        rel = f"{table}/run={escape_partition(run)}/{name}-{self.txn_id}-{self._counter:05d}.parquet"
        self.adds.setdefault(table, []).append(rel)
        if self.pack_small and table in schema.TABLES and df.height <= packing.PART_ROWS:
            if self._buffer.add(table, rel, run, df):
                self._write_pack(table)
            return
        tmp = f"{rel}.tmp-{self.txn_id}"
        path = self.store.root / tmp
        path.parent.mkdir(parents=True, exist_ok=True)
        self.staged.append((tmp, rel))
        # events are most of what an ingest writes: LZ4 costs a quarter less CPU than zstd for them
        level: dict[str, Any] = {} if table == "events" else {"compression_level": 1}
        self._submit(df.write_parquet, path, compression="lz4" if table == "events" else "zstd", **level,
                     statistics=table != "events")

    def _submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Parquet encoding runs on a writer thread (it releases the GIL) so parsing goes on meanwhile; at most a
        few parts wait in memory, and commit() waits for all of them."""
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1)
        while len(self._pending) >= 3:
            self._pending.pop(0).result()
        self._pending.append(self._writer.submit(fn, *args, **kwargs))

    def _write_pack(self, table: str) -> None:
        """Write the table's waiting small parts as one pack of this commit."""
        rows, parts = self._buffer.take(table)
        self._counter += 1
        final = f"{table}/{PACKS_DIR}/pack-{self.txn_id}-{self._counter:05d}.parquet"
        tmp = f"{final}.tmp-{self.txn_id}"
        path = self.store.root / tmp
        path.parent.mkdir(parents=True, exist_ok=True)
        self.staged.append((tmp, final))
        self.packs_add.setdefault(table, []).append({"path": final, "parts": parts})
        self._submit(rows.write_parquet, path, compression="zstd", compression_level=1, statistics=True,
                     row_group_size=100_000)

    def flush(self) -> None:
        """Write the waiting small parts, then wait until every staged file is on disk (raises the first write
        error)."""
        for table in self._buffer.tables():
            self._write_pack(table)
        self._wait()

    def _wait(self) -> None:
        while self._pending:
            self._pending.pop(0).result()
        if self._writer is not None:
            self._writer.shutdown()
            self._writer = None

    def remove(self, table: str, rel_paths: list[str]) -> None:
        self.removes.setdefault(table, set()).update(rel_paths)

    def savepoint(self) -> tuple[int, dict[str, int], dict[str, set[str]]]:
        """A point to roll back to if the work that follows fails (one file of an ingest, say)."""
        return (len(self.staged), {t: len(v) for t, v in self.adds.items()},
                {t: set(v) for t, v in self.removes.items()})

    def rollback_to(self, point: tuple[int, dict[str, int], dict[str, set[str]]]) -> None:
        """Forget everything staged since ``point`` and delete the parts it wrote."""
        n_staged, n_adds, removes = point
        for table in list(self.adds):
            del self.adds[table][n_adds.get(table, 0):]
        self._buffer.keep_only(self.adds)
        self._wait()
        # a pack written since holds earlier parts too: it stays, the undone parts' rows in it are dead
        packs = {pk["path"] for entries in self.packs_add.values() for pk in entries}
        for tmp, final in self.staged[n_staged:]:
            if final not in packs:
                (self.store.root / tmp).unlink(missing_ok=True)
        self.staged[n_staged:] = [s for s in self.staged[n_staged:] if s[1] in packs]
        self.removes = {t: set(v) for t, v in removes.items()}

    def commit(self) -> None:
        self.flush()
        self.store._commit(self)


# Meta values that grow with the store (one entry per ingested file) live in a file of their own, named in the
# manifest: every command reads the manifest, only ingest and watch read these.
DETACHED_META = {"files"}
META_DIR = "_meta"


def _is_detached(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"detached"}


def refuse_a_file(root: Path) -> None:
    """A store is a folder: a file given as one is an input error, before anything is written beside it."""
    if root.exists() and not root.is_dir():
        raise StoreError(f"{root} is a file, not a store folder", hint="pass --store DIR with a folder path")


class Store:
    """A forensics store on disk."""

    def __init__(self, root: Path | str, *, create: bool = False) -> None:
        self.root = Path(root)
        refuse_a_file(self.root)
        if not (self.root / MANIFEST).exists():
            if not create:
                raise StoreError(f"no store at {self.root}", hint="run `forensics ingest PATH` first, or pass --store DIR")
            self._init()
        self._manifest = self._read_manifest()
        self._names_cache: dict[tuple[str, ...], list[str] | None] = {}
        self._detached: dict[str, Any] = {}  # the detached meta value last read, by its file
        self.recovered: list[str] = []  # what the last ``lock`` found to finish or discard
        self.engine: Any = None  # None: DuckDB in this process; else the engine whose connections read it

    # ------------------------------------------------------------------ layout
    def _init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        manifest = {"version": FORMAT_VERSION, "parts": {t: [] for t in schema.TABLES}, "meta": {}}
        self._write_json(self.root / MANIFEST, manifest)

    @staticmethod
    def _write_json(path: Path, data: Any) -> None:
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def _read_manifest(self) -> dict[str, Any]:
        """The manifest, brought up to ``FORMAT_VERSION`` in memory (``migrated``); a store written by a newer
        version is refused."""
        try:
            data = json.loads((self.root / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise StoreError(f"cannot read {self.root / MANIFEST}: {exc}",
                             hint="run `forensics check` to see how to repair the store") from exc
        if not isinstance(data, dict):
            raise StoreError(f"cannot read {self.root / MANIFEST}: not a JSON object",
                             hint="run `forensics check` to see how to repair the store")
        data = migrated(data, self.root)
        for t in schema.TABLES:
            data.setdefault("parts", {}).setdefault(t, [])
        data.setdefault("meta", {})
        data.setdefault("packs", {})
        return data

    @property
    def manifest(self) -> dict[str, Any]:
        return self._manifest

    def parts(self, table: str) -> list[str]:
        """The table's parts, by name: each is a file of its own, or rows inside a pack (see ``packs``)."""
        return list(self._manifest["parts"].get(table, []))

    def packs(self, table: str) -> list[dict[str, Any]]:
        """The table's packs: ``{"path": file, "parts": [the parts whose rows it holds]}``.  A pack holds many
        parts' rows, sorted by run, each row tagged with its part (``_part``) and run; a part dropped after it
        was packed stays in the file until the next compaction, and the views leave its rows out."""
        return list(self._manifest.get("packs", {}).get(table, []))

    def packed(self, table: str) -> dict[str, str]:
        """Part name -> the pack file holding its rows, for the table's packed parts."""
        return {part: pk["path"] for pk in self.packs(table) for part in pk["parts"]}

    def file_of(self, table: str, rel: str, packed: dict[str, str] | None = None) -> str:
        """The file a part's rows are in: its own, or its pack."""
        return (packed if packed is not None else self.packed(table)).get(rel, rel)

    def read_parts(self, table: str, rels: list[str]) -> pl.DataFrame:
        """The rows of the parts ``rels`` of ``table`` as written (without ``run``), own files or packed."""
        packed = self.packed(table)
        frames = [pl.read_parquet(self.root / rel) for rel in rels if rel not in packed]
        by_pack: dict[str, list[str]] = {}
        for rel in rels:
            if rel in packed:
                by_pack.setdefault(packed[rel], []).append(rel)
        for pack, mine in by_pack.items():
            rows = pl.scan_parquet(self.root / pack).filter(pl.col("_part").is_in(mine)).collect()
            frames.append(rows.drop("_part", "run"))
        return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()

    def meta(self, key: str, default: Any = None) -> Any:
        value = self._manifest["meta"].get(key, default)
        if _is_detached(value):  # kept in a file of its own (DETACHED_META), read when first asked for
            path = value["detached"]
            if path not in self._detached:
                try:
                    self._detached = {path: json.loads((self.root / path).read_text(encoding="utf-8"))}
                except (OSError, json.JSONDecodeError) as exc:
                    raise StoreError(f"cannot read {self.root / path}: {exc}",
                                     hint="run `forensics check` to see how to repair the store") from exc
            return self._detached[path]
        return value

    def _stage_meta(self, txn: Transaction, key: str, value: Any, renames: list[tuple[str, str]]) -> str:
        """Write a detached meta value as a staged file of the commit; returns its final path."""
        final = f"{META_DIR}/{key}-{txn.txn_id}.json"
        tmp = f"{final}.tmp-{txn.txn_id}"
        (self.root / META_DIR).mkdir(exist_ok=True)
        with (self.root / tmp).open("w", encoding="utf-8") as fh:
            json.dump(value, fh, separators=(",", ":"), sort_keys=True, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        renames.append((tmp, final))
        return final

    # ------------------------------------------------------------------ locking and commits
    @contextlib.contextmanager
    def lock(self, *, wait: bool = True, on_wait: Any = None) -> Iterator[None]:
        """Serialize writers (``filelock``: an OS lock on ``.lock``, released by the OS if the process dies).  A
        second ingest waits (after saying so), or fails if ``wait`` is False."""
        import filelock  # 35 ms: loaded when a writer starts, not by every reader

        self.root.mkdir(parents=True, exist_ok=True)
        held = filelock.FileLock(self.root / ".lock")
        try:
            held.acquire(timeout=0)
        except filelock.Timeout:
            if not wait:
                raise StoreError(f"another ingest is writing to {self.root}",
                                 hint="wait for it to finish, then run again") from None
            if on_wait is not None:
                on_wait()
            held.acquire()
        try:
            self.recovered = self.recover()
            self._manifest = self._read_manifest()
            self._names_cache = {}
            self._write_upgrade()
            yield
        finally:
            held.release()

    def _write_upgrade(self) -> None:
        """A writer holding the lock keeps a store it brought up to date (``MIGRATIONS``) as it read it."""
        if self._manifest.pop("upgraded_from", None) is not None:
            self._write_json(self.root / MANIFEST, self._manifest)

    def transaction(self) -> Transaction:
        return Transaction(self)

    def _commit(self, txn: Transaction) -> None:
        manifest = json.loads(json.dumps(self._manifest))
        manifest.pop("upgraded_from", None)  # written at FORMAT_VERSION, as every commit is
        packed = {t: set(self.packed(t)) for t in manifest.get("packs", {})}
        own_removed = {rel for t, rels in txn.removes.items() for rel in rels if rel not in packed.get(t, set())}
        for table, rels in txn.removes.items():
            manifest["parts"][table] = [p for p in manifest["parts"].get(table, []) if p not in rels]
        for table, added in txn.adds.items():
            manifest["parts"].setdefault(table, []).extend(added)
        renames, dead_meta = list(txn.staged), set[str]()
        for key, value in txn.meta_updates.items():
            old = manifest["meta"].get(key)
            if _is_detached(old):
                dead_meta.add(old["detached"])
            if value is None:
                manifest["meta"].pop(key, None)
            elif key in DETACHED_META:
                manifest["meta"][key] = {"detached": self._stage_meta(txn, key, value, renames)}
            else:
                manifest["meta"][key] = value
        dead_packs = self._update_packs(manifest, txn)
        changed = {run_of_part(rel) for rels in (*txn.adds.values(), *txn.removes.values()) for rel in rels}
        if changed - {None}:  # the runs whose rows change: their analysis is out of date (forensics.derived)
            from forensics import derived

            derived.mark_stale_in(manifest, {r for r in changed if r is not None})
        for edit in txn.edits:
            dead_packs |= edit(manifest)
        missing = [tmp for tmp, _ in renames if not (self.root / tmp).exists()]
        if missing:
            raise StoreError(f"commit refused: the staged part {missing[0]} is missing",
                             hint="nothing was changed; run the ingest again")
        journal = {
            "txn": txn.txn_id,
            "renames": renames,
            "deletes": sorted(own_removed | txn.freed | dead_packs | dead_meta),
            "manifest": manifest,
            "complete": True,
        }
        jdir = self.root / ".txn"
        jdir.mkdir(exist_ok=True)
        _step("journal:before")
        self._write_json(jdir / f"{txn.txn_id}.json", journal)  # the commit point
        _step("journal:after")
        self._apply(journal)
        (jdir / f"{txn.txn_id}.json").unlink(missing_ok=True)
        self._manifest = manifest
        self._names_cache = {}

    @staticmethod
    def _update_packs(manifest: dict[str, Any], txn: Transaction) -> set[str]:
        """Add the commit's new packs, drop the packs they replace and the packs none of whose parts is left;
        return the pack files to delete."""
        packs = manifest.setdefault("packs", {})
        dead: set[str] = set()
        for table, paths in txn.packs_drop.items():
            packs[table] = [pk for pk in packs.get(table, []) if pk["path"] not in paths]
            dead |= paths
        for table, entries in txn.packs_add.items():
            packs.setdefault(table, []).extend(entries)
        for table in list(packs):
            live = set(manifest["parts"].get(table, []))
            keep = [pk for pk in packs[table] if any(p in live for p in pk["parts"])]
            dead |= {pk["path"] for pk in packs[table] if pk not in keep}
            packs[table] = keep
        return dead

    def _apply(self, journal: dict[str, Any]) -> None:
        """Rename the staged parts into place, replace the manifest, delete the parts it dropped.

        The manifest is written only when every part the commit adds is in place: a manifest never names
        a missing part (StoreError instead, and the store stays as it was).
        """
        for i, (tmp, final) in enumerate(journal["renames"]):
            src, dst = self.root / tmp, self.root / final
            _step(f"rename:{i}:before")
            if src.exists():
                os.replace(src, dst)
            _step(f"rename:{i}:after")
        absent = [final for _, final in journal["renames"] if not (self.root / final).exists()]
        if absent:
            raise StoreError(f"commit {journal.get('txn')} cannot complete: its part {absent[0]} is missing",
                             hint="the store is as it was before that ingest; run the ingest again")
        _step("manifest:before")
        self._write_json(self.root / MANIFEST, journal["manifest"])
        _step("manifest:after")
        for i, rel in enumerate(journal["deletes"]):
            with contextlib.suppress(FileNotFoundError):
                (self.root / rel).unlink()
            with contextlib.suppress(OSError):  # a run's folder left empty (its parts packed or replaced)
                (self.root / rel).parent.rmdir()
            _step(f"delete:{i}")

    def recover(self) -> list[str]:
        """Finish or discard an interrupted commit; remove stray temporary files.

        Only a writer holding the lock may call this (``lock`` does): the temporary files it removes are
        the staged parts of whoever is writing.
        """
        notes: list[str] = []
        jdir = self.root / ".txn"
        if jdir.exists():
            for jpath in sorted(jdir.glob("*.json")):
                try:
                    journal = json.loads(jpath.read_text(encoding="utf-8"))
                    if journal.get("complete"):
                        migrated(dict(journal["manifest"]), self.root)  # refuses one a newer version wrote
                        self._apply(journal)
                        notes.append(f"completed interrupted commit {journal.get('txn')}")
                except (OSError, json.JSONDecodeError, KeyError, TypeError):
                    notes.append(f"discarded incomplete commit journal {jpath.name}")
                except NewerStoreError:  # another version's commit: left for it to finish
                    raise
                except StoreError as exc:
                    notes.append(f"discarded commit journal {jpath.name}: {exc.message}")
                jpath.unlink(missing_ok=True)
            for stray in jdir.glob(".*"):
                stray.unlink(missing_ok=True)
        for stray in [*_run_strays(self.root), *self.root.glob(f"*/{PACKS_DIR}/*.tmp-*"),
                      *self.root.glob(f"{META_DIR}/*.tmp-*"), *self.root.glob("_derived/*/*.tmp-*")]:
            stray.unlink(missing_ok=True)
            notes.append(f"removed unfinished part {stray.relative_to(self.root)}")
        for stray in self.root.glob(".*.tmp-*"):
            stray.unlink(missing_ok=True)
        return notes

    # ------------------------------------------------------------------ reading
    def connect(self, *, tables: list[str] | None = None, existing_only: bool = False,
                local: bool = False) -> duckdb.DuckDBPyConnection:
        """A connection with one view per table (same names as the tables): an in-memory DuckDB connection, or
        the ``engine``'s (``forensics.spark``) when one is set.  Either way it is the seam the analysis runs
        on: ``execute``, ``sql`` (for ``fetch_pl``), ``register``, ``unregister`` and ``close``.  ``local``:
        DuckDB in this process whatever the engine (stored rows read back, nothing computed: a Spark job per
        small file would cost seconds each).

        A part listed in the manifest but missing on disk raises StoreError, unless ``existing_only``.
        """
        if self.engine is not None and not local:
            return self.engine.connect(self, tables=tables, existing_only=existing_only)
        con = duckdb.connect(":memory:")
        con.execute("SET TimeZone = 'UTC'")
        # Parts never change once committed: a query that scans a table again (a finding reads several)
        # reuses the footers read when the view was bound instead of opening every file once more.
        con.execute("SET parquet_metadata_cache = true")
        if tables is None:  # every table: the store's and the analysis' (forensics.derived)
            from forensics import derived

            tables = [*schema.TABLES, *sorted(derived.state(self).tables)]
        for table in tables:
            self._create_view(con, table, existing_only)
        return con

    def attach(self, con: duckdb.DuckDBPyConnection, tables: list[str]) -> None:
        """Add views of ``tables`` to a connection ``connect`` opened (a session that finds it needs one more)."""
        for table in tables:
            self._create_view(con, table)

    def table_files(self, table: str, existing_only: bool = False) -> tuple[list[str], list[tuple[str, list[str]]]]:
        """The files holding ``table``'s rows: its parts' own files (``run`` in their hive path) and its packs,
        each with the parts dropped since packing (their rows are left out).  A listed file missing on disk
        raises StoreError, unless ``existing_only`` (then it is left out)."""
        packed = self.packed(table)
        own = [str(self.root / p) for p in self.parts(table) if p not in packed]
        live = set(self.parts(table))
        packs = [(str(self.root / pk["path"]), [x for x in pk["parts"] if x not in live]) for pk in self.packs(table)
                 if any(x in live for x in pk["parts"])]
        missing = [p for p in [*own, *(path for path, _ in packs)] if not Path(p).exists()]
        if missing and not existing_only:
            raise StoreError(f"{missing[0]} is listed in the store's manifest but missing",
                             hint="run `forensics check` to see how to repair the store")
        return [p for p in own if p not in missing], [(path, dead) for path, dead in packs if path not in missing]

    def view_source(self, table: str, existing_only: bool = False) -> str | None:
        """The FROM of ``table``'s DuckDB view, None when no file holds its rows (a derived table: its batches')."""
        if table not in schema.TABLES:
            from forensics import derived

            return derived.view_source(self, table)
        own, packs = self.table_files(table, existing_only)
        return self._source(own, packs) if own or packs else None

    def _create_view(self, con: duckdb.DuckDBPyConnection, table: str, existing_only: bool = False) -> None:
        if self.engine is not None and not isinstance(con, duckdb.DuckDBPyConnection):  # the engine's binds its own
            con.bind(self, table, existing_only)
            return
        source = self.view_source(table, existing_only)
        if source is None and table not in schema.TABLES:
            raise StoreError(f"the store has no derived table {table!r}",
                             hint="run `forensics ingest` again, or `forensics check`")
        if source is None:
            cols = ", ".join(
                f'CAST(NULL AS {_duck_type(c.dtype)}) AS "{c.name}"' for c in schema.TABLES[table]
            )
            con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT {cols} WHERE false")
            return
        try:
            try:
                con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT {self._columns(table, None)} FROM {source}")
            except duckdb.BinderException:  # parts written before a column was added: it reads as NULL
                have = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
                con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT {self._columns(table, have)} FROM {source}")
        except duckdb.Error as exc:  # a damaged part: say so, never read it as "no rows"
            raise StoreError(f"cannot read the {table} table: {str(exc).splitlines()[0]}",
                             hint="run `forensics check` to see how to repair the store") from exc

    @staticmethod
    def _source(own: list[str], packs: list[tuple[str, list[str]]]) -> str:
        """The FROM of a table's view: its own part files (``run`` from the hive path) and its packs (``run`` a
        column, rows of parts dropped since packing left out)."""
        own_files = f"read_parquet([{sql_strings(own)}], hive_partitioning = true, union_by_name = true)" if own else ""
        if not packs:
            return own_files
        selects = [f"SELECT * FROM {own_files}"] if own else []
        for path, dead in packs:  # one select per pack: each has its own dropped parts
            where = f" WHERE _part NOT IN ({sql_strings(dead)})" if dead else ""
            selects.append(f"SELECT * EXCLUDE (_part) FROM read_parquet([{sql_string(path)}], "
                           f"hive_partitioning = false){where}")
        return "(" + " UNION ALL BY NAME ".join(selects) + ")"

    @staticmethod
    def _columns(table: str, have: set[str] | None) -> str:
        """The view's select list: the schema's columns in order (NULL of the column's type for one that no
        part has, when ``have`` says which they have); events keep their format-specific fields too.  A derived
        table (``forensics.derived``) is read with the columns its files have."""
        if table not in schema.TABLES:
            return "*"
        declared = schema.TABLES[table]
        cols = [f'"{c.name}"' if have is None or c.name in have else
                f'CAST(NULL AS {_duck_type(c.dtype)}) AS "{c.name}"' for c in declared]
        if table == "events":
            known = [f'"{c.name}"' for c in declared if have is None or c.name in have]
            cols.append("* EXCLUDE (" + ", ".join(known) + ")" if known else "*")
        return ", ".join(cols)

    def run_names(self, tables: list[str]) -> list[str] | None:
        """The runs with rows in any of ``tables``, sorted, read from the manifest's part paths (no file is
        opened): the same as ``SELECT DISTINCT run ... ORDER BY run`` over those views, since a part is
        only ever written with rows.  None when a name could read differently through DuckDB (hive
        partition values that look like a number, date or timestamp are typed as such): ask the views then.

        A part listed in the manifest but missing on disk raises StoreError, as ``connect`` does.
        """
        key = tuple(tables)
        if key not in self._names_cache:  # emptied whenever the manifest is read or replaced
            self._names_cache[key] = self._run_names(tables)
        return self._names_cache[key]

    def _run_names(self, tables: list[str]) -> list[str] | None:
        names: set[str] = set()
        for table in tables:
            got = self._table_runs(table)
            if got is None:
                return None
            names |= got
        if not names:
            return []
        plain = self._names_cache.setdefault(("\x00plain",), [])  # names already found to read as text
        if plain is not None and names <= set(plain):
            return sorted(names)
        con = duckdb.connect(":memory:")
        try:
            row = con.execute(
                "SELECT count(*) FROM unnest($names) AS t(v) WHERE TRY_CAST(v AS BIGINT) IS NOT NULL "
                "OR TRY_CAST(v AS DOUBLE) IS NOT NULL OR TRY_CAST(v AS DATE) IS NOT NULL "
                "OR TRY_CAST(v AS TIMESTAMP) IS NOT NULL OR TRY_CAST(v AS BOOLEAN) IS NOT NULL "
                "OR upper(trim(v)) IN ('', 'NULL')",
                {"names": sorted(names)}).fetchone()
        finally:
            con.close()
        if row is None or row[0]:
            return None
        if plain is not None:
            plain.extend(names - set(plain))
        return sorted(names)

    def _table_runs(self, table: str) -> set[str] | None:
        """The runs with parts in ``table``, read once per manifest (a command asks for several sets of tables);
        None when a part's path has no run."""
        key = ("\x00table", table)
        if key not in self._names_cache:
            names: set[str] = set()
            packed = self.packed(table)
            there: set[str] = set()  # the files seen on disk (a pack holds thousands of parts: looked at once)
            for rel in self.parts(table):
                file = self.file_of(table, rel, packed)
                if file not in there:
                    if not (self.root / file).exists():
                        raise StoreError(f"{self.root / rel} is listed in the store's manifest but missing",
                                         hint="run `forensics check` to see how to repair the store")
                    there.add(file)
                run = run_of_part(rel)
                if run is None:
                    self._names_cache[key] = None
                    break
                names.add(run)
            else:
                self._names_cache[key] = sorted(names)
        got = self._names_cache[key]
        return None if got is None else set(got)

    def table(self, name: str) -> pl.DataFrame:
        """A whole table as a polars DataFrame (columns in contract order)."""
        if name not in schema.TABLES:
            raise NotFoundError(f"no table {name!r}", hint=f"tables: {', '.join(schema.TABLES)}")
        con = self.connect(tables=[name])
        try:
            df = fetch_pl(con, f"SELECT * FROM {name}")
        except duckdb.Error as exc:  # a damaged part: say so, never read it as "no rows"
            raise StoreError(f"cannot read the {name} table: {str(exc).splitlines()[0]}",
                             hint="run `forensics check` to see how to repair the store") from exc
        finally:
            con.close()
        return schema.conform(df, name) if name != "events" else df


def migrated(manifest: dict[str, Any], root: Path) -> dict[str, Any]:
    """``manifest`` as ``FORMAT_VERSION`` has it: each later step of ``MIGRATIONS`` applied in turn, the version it
    was written at kept under ``upgraded_from`` (for the writer that saves it).  A store of a newer version, or
    of no version this code knows, is a StoreError (one line, exit 2)."""
    version = manifest.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise StoreError(f"{root / MANIFEST} has no valid store format version ({version!r})",
                         hint="run `forensics check` to see how to repair the store")
    if version > FORMAT_VERSION:
        raise NewerStoreError(f"the store at {root} was written by a newer llama-forensics (store format {version}; this "
                         f"one reads up to {FORMAT_VERSION})",
                         hint="upgrade llama-forensics (pip install -U llama-forensics) to read it")
    for step in MIGRATIONS:
        if version < step.to:
            manifest = {**step.manifest(manifest), "version": step.to, "upgraded_from": version}
    return manifest


def fetch_pl(con: duckdb.DuckDBPyConnection, sql: str, params: Any = None) -> pl.DataFrame:
    """Run ``sql`` with bound ``params`` and return a polars DataFrame."""
    rel = con.sql(sql, params=params) if params is not None else con.sql(sql)
    if rel is None:
        return pl.DataFrame()
    # Through the Arrow C stream interface: the same Arrow data as rel.to_arrow_table(), without
    # loading pyarrow (and numpy) into a command that only needs polars; rechunked like from_arrow.
    return pl.DataFrame(rel).rechunk()


class ArrowStream:
    """A polars frame DuckDB can ``register`` as a relation, through the Arrow C stream interface
    (``DataFrame.to_arrow()`` would load pyarrow): every scan of the relation reads a fresh stream."""

    def __init__(self, df: pl.DataFrame) -> None:
        self.df = df

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        return self.df.__arrow_c_stream__(requested_schema)


def _duck_type(dtype: pl.DataType) -> str:
    if dtype == pl.Int64():
        return "BIGINT"
    if dtype == pl.Float64():
        return "DOUBLE"
    if dtype == pl.Boolean():
        return "BOOLEAN"
    if isinstance(dtype, pl.Datetime):
        return "TIMESTAMPTZ"
    return "VARCHAR"


def _run_strays(root: Path) -> list[Path]:
    """``root.glob("*/run=*/*.tmp-*")`` with one ``scandir`` a folder: a store of thousands of runs has thousands
    of run folders, and every writer looks through them for what an interrupted one left."""
    return [Path(f.path) for table in _entries(str(root)) if table.is_dir()
            for part in _entries(table.path) if part.name.startswith("run=") and part.is_dir()
            for f in _entries(part.path) if ".tmp-" in f.name]


def _entries(folder: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except OSError:
        return []

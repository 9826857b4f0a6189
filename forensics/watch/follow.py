"""Following logs and harness records as they are written: which files are new, grown, truncated, replaced,
rotated by rename or compressed; and which *lineage* each file belongs to, so that a finding keeps its
identity when its log is renamed to ``server.log.1`` or compressed to ``server.log.1.gz``.

A lineage (an "epoch" of a log) is the content of one file from its first byte: it follows the file's inode
through renames, and a compressed copy joins the lineage whose first bytes it repeats.  A truncated file, or a
new file created under an old name, starts a new lineage.  The store itself keys files by path, so when a
followed file moves, its rows would be in the store twice (under the old path and the new one): once the new
path is ingested, the old path's rows are dropped (``forget``), as only one copy of the content is left on disk.

Library only: no click.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex

from forensics.ingest import discover, file_id_of, strip_exts
from forensics.store import Store
from parsers.reader import compression_of, open_binary, read_head

HEAD = 4096
_DATE = r"[-._](?:\d{8}(?:[-T_]?\d{2,6})?|\d{4}-\d{2}-\d{2}(?:[-T_]\d{2}(?::?\d{2}){0,2})?)$"
_ROTATION = regex.compile(r"\.\d{1,3}$|" + _DATE)  # logrotate's .1 .. .999, and dateext suffixes
_DATED = regex.compile(_DATE)


def stream_label(path: Path | str) -> str:
    """The log's name without compression, rotation and content suffixes:
    server.log, server.log.1, server.log.2.gz, server.log-20260101, server-2026-01-01.log -> server."""
    name = Path(path).name
    for ext in (".gz", ".zst"):
        name = name.removesuffix(ext)
    name = _ROTATION.sub("", name)
    stem = strip_exts(name)
    return _DATED.sub("", stem) or stem


def _head_sha(path: Path, size: int) -> tuple[str, int]:
    head = read_head(path, HEAD) if size else b""
    return hashlib.sha256(head).hexdigest(), len(head)


@dataclass
class FileSeen:
    path: str
    dev: int
    ino: int
    size: int
    mtime: float
    epoch: str
    head_sha: str
    head_len: int
    compressed: bool

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class Changes:
    ingest: list[Path] = field(default_factory=list)  # new, grown, truncated or replaced files
    gone: list[str] = field(default_factory=list)  # followed paths no longer there
    moved: list[str] = field(default_factory=list)  # gone paths whose content lives on under another path
    notes: list[str] = field(default_factory=list)


class Follower:
    """The files under the followed paths, compared with what was seen before (kept in ``state``)."""

    def __init__(self, paths: list[Path], store_root: Path, state: dict[str, Any]) -> None:
        self.paths = paths
        self.inside = store_root.resolve()
        self.state = state  # persisted: {"files": {path: FileSeen dict}, "epochs": {epoch: {...}}, "since": {...}}
        self.state.setdefault("files", {})
        self.state.setdefault("epochs", {})
        self.state.setdefault("since", {})  # path -> wall time watch began following it
        self.seen: dict[str, FileSeen] = {p: FileSeen(**v) for p, v in self.state["files"].items()}
        self.new_epochs: set[str] = set()  # lineages started during this watch

    def files(self) -> list[Path]:
        found: list[Path] = []
        for p in self.paths:
            if not p.exists():
                continue
            files, _hidden = discover([p])
            found.extend(f for f, _ in files if not f.resolve().is_relative_to(self.inside))
        return found

    def scan(self, now: float) -> Changes:
        ch = Changes()
        current: dict[str, FileSeen] = {}
        by_inode = {(f.dev, f.ino): f for f in self.seen.values()}
        for path in self.files():
            try:
                st = path.stat()
            except OSError:
                continue
            key = str(path)
            prev = self.seen.get(key)
            if prev is not None and (prev.dev, prev.ino) == (st.st_dev, st.st_ino) and st.st_size >= prev.size:
                if (st.st_size, st.st_mtime) != (prev.size, prev.mtime):
                    ch.ingest.append(path)
                    if prev.head_len < HEAD:
                        prev.head_sha, prev.head_len = _head_sha(path, st.st_size)
                        lin = self.state["epochs"].get(prev.epoch)
                        if lin is not None and lin.get("head_len", 0) < prev.head_len:
                            lin.update(head_sha=prev.head_sha, head_len=prev.head_len)
                prev.size, prev.mtime = st.st_size, st.st_mtime
                current[key] = prev
                continue
            head_sha, head_len = _head_sha(path, st.st_size)
            epoch = self._lineage(path, prev, (st.st_dev, st.st_ino), by_inode, (head_sha, head_len), ch)
            current[key] = FileSeen(key, st.st_dev, st.st_ino, st.st_size, st.st_mtime, epoch, head_sha, head_len,
                                    compression_of(path) is not None)
            self.state["since"].setdefault(key, now)
            ch.ingest.append(path)
        for key, prev in self.seen.items():
            if key not in current:
                ch.gone.append(key)
                self.state["since"].pop(key, None)
                if any(f.epoch == prev.epoch for f in current.values()):
                    ch.moved.append(key)
        self.seen = current
        self.state["files"] = {k: v.as_dict() for k, v in current.items()}
        return ch

    def _lineage(self, path: Path, prev: FileSeen | None, inode: tuple[int, int], by_inode: dict[tuple[int, int], FileSeen],
                 head: tuple[str, int], ch: Changes) -> str:
        """The lineage of a file seen for the first time under this path, or whose inode or size changed.

        Only a path never seen before can continue a lineage (a rename keeps the inode; a copy, compressed
        or not, repeats the first bytes of a log of the same name in the same folder).  A truncated or
        replaced file is new content by definition, even when it starts with the same banner."""
        if prev is not None:
            same = (prev.dev, prev.ino) == inode
            ch.notes.append(f"{path}: {'truncated' if same else 'replaced by a new file'}, read anew")
        elif inode in by_inode and by_inode[inode].path != str(path):
            old = by_inode[inode]
            ch.notes.append(f"{path}: is {old.path} renamed (rotated)")
            return old.epoch
        else:
            match = self._copy_of(path, head[1])
            if match is not None:
                ch.notes.append(f"{path}: is a copy of {match[1]}")
                return match[0]
        epoch = uuid.uuid4().hex[:12]
        self.state["epochs"][epoch] = {"label": stream_label(path), "dir": str(path.parent), "first_path": str(path),
                                       "head_sha": head[0], "head_len": head[1]}
        self.new_epochs.add(epoch)
        return epoch

    def _copy_of(self, path: Path, head_len: int) -> tuple[str, str] | None:
        """(lineage, where it was first seen) of a log of the same name in the same folder whose first bytes
        this file repeats, longest head first."""
        label, folder = stream_label(path), str(path.parent)
        cands = [(e, v) for e, v in self.state["epochs"].items()
                 if v.get("label") == label and v.get("dir") == folder and 0 < int(v.get("head_len", 0)) <= head_len]
        for epoch, v in sorted(cands, key=lambda ev: -int(ev[1]["head_len"])):
            if hashlib.sha256(read_head(path, int(v["head_len"]))).hexdigest() == v["head_sha"]:
                return epoch, str(v.get("first_path", label))
        return None

    def epoch_of(self, path: str) -> str | None:
        f = self.seen.get(path)
        return f.epoch if f is not None else None


def forget(store_root: Path, paths: list[str]) -> int:
    """Drop the store's rows of files that are no longer on disk because their content moved to another path
    that is followed (a rotation): every part the file wrote (parts are named after the file's id, see ingest)
    and its entry in the files record.  One commit under the writer lock; returns the parts dropped."""
    if not paths:
        return 0
    store = Store(store_root)
    with store.lock():
        fids = {file_id_of(Path(p)) for p in paths}
        txn = store.transaction()
        dropped = 0
        for table, parts in store.manifest["parts"].items():
            mine = [p for p in parts if any(f"/{fid}-" in p for fid in fids)]
            if mine:
                txn.remove(table, mine)
                dropped += len(mine)
        files_meta = dict(store.meta("files", {}) or {})
        if not dropped and not any(fid in files_meta for fid in fids):
            return 0
        txn.meta_updates["files"] = {k: v for k, v in files_meta.items() if k not in fids}
        txn.commit()
    return dropped


class LineIndex:
    """Reads given lines of a log back (the evidence of a finding), starting from the nearest known line start
    (every ingest tells where the lines it read end) instead of from the top of a large file."""

    def __init__(self) -> None:
        self.marks: dict[str, list[tuple[int, int]]] = {}  # path -> [(lines before, byte offset)], ascending

    def mark(self, path: str, lines: int, offset: int) -> None:
        marks = self.marks.setdefault(path, [(0, 0)])
        if lines > marks[-1][0] and offset > marks[-1][1]:
            marks.append((lines, offset))
            if len(marks) > 512:  # keep every other mark: still close enough, and bounded
                self.marks[path] = marks[:1] + marks[1:-1:2] + marks[-1:]

    def forget(self, path: str) -> None:
        self.marks.pop(path, None)

    def read(self, path: str, first: int, last: int, limit: int = 20) -> list[str]:
        """Lines ``first``..``last`` (1-based, inclusive); at most ``limit``: the first and the last half."""
        if first < 1 or last < first:
            return []
        wanted = set(range(first, min(last, first + limit // 2 - 1) + 1))
        wanted |= set(range(max(first, last - (limit - len(wanted)) + 1), last + 1))
        p = Path(path)
        start_line, offset = 0, 0
        if compression_of(p) is None:
            for lines, off in self.marks.get(path, [(0, 0)]):
                if lines < first:
                    start_line, offset = lines, off
        out: list[str] = []
        try:
            with open_binary(p) as fh:
                if offset:
                    fh.seek(offset)
                for no, raw in enumerate(fh, start=start_line + 1):
                    if no in wanted:
                        out.append(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
                    if no >= last:
                        break
        except OSError:
            return out
        if len(out) == limit and last - first + 1 > limit:
            out.insert(limit // 2, f"... ({last - first + 1 - limit} lines) ...")
        return out


class FsEvents:
    """File-system events from ``watchfiles`` (inotify, FSEvents, ...) set ``changed``; when the library or the
    platform cannot watch, ``error`` says why and the caller polls."""

    def __init__(self, paths: list[Path], stop: threading.Event, note: Callable[[str], None]) -> None:
        self.changed = threading.Event()
        self.error: str | None = None
        dirs = sorted({str(p if p.is_dir() else p.parent) for p in paths if p.exists() or p.parent.exists()})
        self._stop = stop
        self._note = note
        self._thread = threading.Thread(target=self._run, args=(dirs,), name="watch-events", daemon=True)
        self._thread.start()

    def _run(self, dirs: list[str]) -> None:
        try:
            import watchfiles

            for _ in watchfiles.watch(*dirs, stop_event=self._stop, debounce=50, step=20, rust_timeout=1000,
                                      yield_on_timeout=False, raise_interrupt=False, ignore_permission_denied=True):
                self.changed.set()
        except (ImportError, OSError, RuntimeError, ValueError) as exc:  # no library, no inotify watches left
            self.error = f"{type(exc).__name__}: {exc}"
            if not self._stop.is_set():
                self._note(f"file events unavailable ({self.error}); polling instead")


def proc_cpu() -> float:
    """CPU seconds this process has used (every thread)."""
    t = os.times()
    return t.user + t.system

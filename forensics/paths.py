"""Names derived from file names, shared by ingest (runs, instance labels, file ids) and the replay code (a
server named by its log file's stem, ``{stem}`` in mappings; a log a manifest names, by its file id), so that
they always agree; and the default store location."""

from __future__ import annotations

import functools
import hashlib
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


def file_id_of(path: Path) -> str:
    """A file's id in the store (its parts' names start with it): a digest of its resolved path."""
    return _file_id(os.getcwd(), str(path))


@functools.lru_cache(maxsize=1 << 16)
def _file_id(cwd: str, path: str) -> str:
    return hashlib.sha1(str(resolved(Path(path))).encode()).hexdigest()[:16]


def resolved(path: Path) -> Path:
    """``path.resolve()``, kept per working folder: an ingest of thousands of files asks it several times a file,
    and each time costs a system call per folder of the path."""
    return _resolved(os.getcwd(), str(path))


@functools.lru_cache(maxsize=1 << 16)
def _resolved(cwd: str, path: str) -> Path:
    full = Path(cwd) / path
    if full.name in ("", ".", "..") or full.parent == full:
        return full.resolve()
    # the folder resolved once for all its files (a system call per folder of the path), then the file itself
    inside = _resolved(cwd, str(full.parent)) / full.name
    return inside.resolve() if inside.is_symlink() else inside


def default_store_path() -> Path:
    """$FORENSICS_STORE, else ./forensics-store (here, not in store.py, so the CLI starts without DuckDB)."""
    return Path(os.environ.get("FORENSICS_STORE") or DEFAULT_STORE)


Walked = tuple[Path, tuple[str, ...], os.stat_result, bool]


def walk_files(top: Path) -> list[Walked]:
    """The files below ``top`` in the order of ``sorted(top.rglob("*"))``, each with its path's parts below
    ``top``, its stat and whether it is a link: one ``scandir`` a folder, whose entries keep their stat (an unchanged re-ingest of
    thousands of run folders stats nothing twice).  Like ``rglob``, a linked folder is not entered, a linked
    file is followed, and a folder that cannot be listed is passed over."""
    out: list[Walked] = []
    _walk(str(top), (), out)
    return out


def _walk(folder: str, rel: tuple[str, ...], out: list[Walked]) -> None:
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except (PermissionError, FileNotFoundError, NotADirectoryError):
        return
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                _walk(e.path, (*rel, e.name), out)
            elif e.is_file():
                out.append((Path(e.path), (*rel, e.name), e.stat(), e.is_symlink()))
        except OSError:
            continue

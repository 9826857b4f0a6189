"""An unchanged re-ingest of many run folders tells them unchanged from the folders' listings: no file is opened,
the store is not written; a file that changed among them is still read, and the files of its run with it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from click.testing import CliRunner

from forensics.cli import cli
from forensics.ingest import ingest
from forensics.paths import walk_files
from forensics.store import MANIFEST

HEALTHY = Path(__file__).resolve().parent.parent / "fixtures" / "server-runs" / "b11312-healthy"
KEPT = ("attempts.jsonl", "main.log", "manifest.json")


def _runs(top: Path, n: int) -> list[Path]:
    """``n`` run folders, each a copy of one fixture run's log and records."""
    folders = []
    for k in range(n):
        folder = top / f"run-{k}"
        folder.mkdir(parents=True)
        for name in KEPT:
            shutil.copy2(HEALTHY / name, folder / name)
        folders.append(folder)
    return folders


def _scramble(path: Path) -> None:
    """The same size and times, other bytes: a file read now reads as something else."""
    st = path.stat()
    path.write_bytes(path.read_bytes()[::-1])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _statuses(stderr: str, runs: list[Path]) -> list[list[str]]:
    """``-v``'s per-file lines: status and path."""
    return [line.split()[:2] for line in stderr.splitlines()
            if len(line.split()) > 1 and line.split()[1].startswith(tuple(str(f) + os.sep for f in runs))]


def test_unchanged_reingest_opens_no_file(tmp_path: Path) -> None:
    runs = _runs(tmp_path / "runs", 3)
    store = tmp_path / "store"
    args = ["ingest", "-v", str(tmp_path / "runs"), "--store", str(store)]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    assert _statuses(first.stderr, runs) == [["ingested", str(folder / name)] for folder in runs for name in KEPT]
    manifest = (store / MANIFEST).read_bytes()
    for folder in runs:
        for name in KEPT:
            _scramble(folder / name)
            if os.geteuid() != 0:  # root reads any file: for it the scrambled bytes alone must stay unread
                (folder / name).chmod(0)
    try:
        res = CliRunner().invoke(cli, args)
    finally:
        for folder in runs:
            for name in KEPT:
                (folder / name).chmod(0o644)
    assert res.exit_code == 0, res.output
    assert _statuses(res.stderr, runs) == [["unchanged", str(folder / name)] for folder in runs for name in KEPT]
    assert (store / MANIFEST).read_bytes() == manifest  # nothing written


def test_a_changed_file_among_unchanged_runs_is_read_with_its_run(tmp_path: Path) -> None:
    runs = _runs(tmp_path / "runs", 3)
    store = tmp_path / "store"
    ingest(store, [tmp_path / "runs"])
    grown = runs[1] / "main.log"
    lines = grown.read_text().splitlines(keepends=True)
    with grown.open("a") as fh:
        fh.write(lines[-1])
    res = ingest(store, [tmp_path / "runs"])
    status = {Path(f.path): f.status for f in res.files}
    assert status.pop(grown) == "appended"
    assert status == {folder / name: "unchanged" for folder in runs for name in KEPT if folder / name != grown}


def test_walk_files_lists_what_sorted_rglob_lists(tmp_path: Path) -> None:
    top = tmp_path / "top"
    for rel in ("b/x.log", "a.log", "a/z/y.log", "a/.hidden/h.log", ".dot", "a-b/c.log", "B/u.log"):
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(rel)
    (top / "linked-dir").symlink_to(top / "a", target_is_directory=True)  # not entered, as rglob does not
    (top / "a" / "linked.log").symlink_to(top / "b" / "x.log")  # followed
    (top / "broken.log").symlink_to(top / "missing")  # not a file
    walked = walk_files(top)
    assert [f for f, *_ in walked] == [f for f in sorted(top.rglob("*")) if f.is_file()]
    assert [rel for _, rel, *_ in walked] == [f.relative_to(top).parts for f, *_ in walked]
    assert [(st.st_size, link) for _, _, st, link in walked] == [(f.stat().st_size, f.is_symlink())
                                                                 for f, *_ in walked]

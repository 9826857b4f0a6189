"""A run folder moved (archived, renamed) after it was ingested is read again from its new place: its rows are
replaced, never doubled, and the join still matches every attempt."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from forensics.cli import cli
from forensics.generate import deadslot, generate
from forensics.store import Store


def counts(store: Path) -> tuple[int, int, list[str]]:
    s = Store(store)
    return s.table("requests").height, s.table("attempts").height, sorted(s.table("matches")["match"].to_list())


def ingest(folder: Path, store: Path) -> str:
    res = CliRunner().invoke(cli, ["ingest", str(folder), "--store", str(store)])
    assert res.exit_code == 0, res.output
    return res.stderr


def test_a_moved_folder_is_read_again_not_twice(tmp_path: Path) -> None:
    g = generate(deadslot(), tmp_path / "gen", seed=3)  # two servers' logs, attempts and manifest
    first = tmp_path / "runs" / "run-deadslot"
    shutil.copytree(g.logs[0].parent, first)
    n_files = len(list(first.iterdir()))
    store = tmp_path / "store"
    ingest(tmp_path / "runs", store)
    before = counts(store)
    assert before[0] > 0 and before[1] > 0 and before[2].count("matched") > 0

    archive = tmp_path / "archive"
    archive.mkdir()
    shutil.move(tmp_path / "runs", archive / "runs")
    err = ingest(archive / "runs", store)
    assert f"warning: {n_files} files were moved since read (e.g. {first}/" in err
    assert counts(store) == before
    assert all(p.startswith(str(archive)) for p in Store(store).table("files")["path"].to_list())

    # the same content in another run is another run's file, not a move
    shutil.copytree(archive / "runs" / "run-deadslot", tmp_path / "other" / "run-again")
    shutil.rmtree(archive)
    assert "moved since read" not in ingest(tmp_path / "other", store)
    assert Store(store).table("requests").height == 2 * before[0]

"""`forensics demo` (the README's first command) finds what its scenario put there and writes the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from forensics.cli import cli


def test_demo_finds_the_dead_slot_and_the_runaways(demo: tuple[Path, Any]) -> None:
    out, res = demo
    sections = res.stdout.split("# ")
    dead = next(s for s in sections if s.startswith("dead slots"))
    assert [ln.split()[:3] for ln in dead.splitlines()[3:] if ln.strip()] == [["run-np6", "main-np6", "2"]]
    runaways = next(s for s in sections if s.startswith("runaways"))
    assert {ln.split()[0] for ln in runaways.splitlines()[3:] if ln.strip()} == {"run-np4", "run-np6"}
    assert res.stderr.splitlines()[-1] == f"demo: report on run-np6 written to {out / 'report.html'}"
    assert (out / "report.html").stat().st_size > 100_000  # charts and their library inlined


def test_demo_never_deletes_a_folder_it_did_not_make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keep = tmp_path / "notes.txt"
    keep.write_text("mine")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli, ["demo", "--out", "."])
    assert res.exit_code == 2
    assert res.stderr == "forensics: error: . is not empty and was not made by `forensics demo` " \
                         "(pass --out with a new or empty folder)\n"
    assert keep.read_text() == "mine"
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    res = CliRunner().invoke(cli, ["demo", "--out", str(a_file)])
    assert res.exit_code == 2 and a_file.read_text() == "x"


def test_demo_replaces_the_folder_an_earlier_demo_made(tmp_path: Path) -> None:
    from forensics.demo import MARKER, prepare_out

    out = tmp_path / "demo"
    prepare_out(out)
    (out / "logs").mkdir()
    (out / "logs" / "old.log").write_text("old")
    prepare_out(out)
    assert sorted(p.name for p in out.iterdir()) == [MARKER]

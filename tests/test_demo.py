"""`forensics demo` (the README's first command) finds what its scenario put there and writes the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from forensics.cli import cli


def test_demo_shows_a_real_dead_slot_first(demo: tuple[Path, Any]) -> None:
    """The real run (fixtures/server-runs/b11312-deadslot, its README's truth: slot 2 of `main` went bad from
    UNH/analyze and stayed bad; UNH, PG, ABBV, ADBE lost) comes before the generated scenario, from its own store."""
    out, res = demo
    head, generated = res.stdout.split("# the generated scenario\n", 1)
    lines = head.splitlines()
    assert lines[0] == f"# a real run: b11312-deadslot (its store: {out / 'real-store'})"
    assert lines[1].startswith("b11312-deadslot: Slot 2 of `main` died at 01:00:49 on UNH/analyze and never "
                               "recovered: 8 requests ran to the context (255–328 tokens vs 64–79 normal), 4 items lost (UNH, "
                               "PG, ABBV, ADBE).")
    assert lines[3] == "# b11312-deadslot: dead slots"
    assert lines[6].split()[:3] == ["b11312-deadslot", "main", "2"] and len(lines) == 8
    assert generated.startswith("\n# verdict\n")
    assert (out / "real" / "b11312-deadslot" / "main.log").read_bytes() == \
        (Path(__file__).resolve().parents[1] / "fixtures" / "server-runs" / "b11312-deadslot" / "main.log").read_bytes()
    assert "demo: ingested a real llama-server run (b11312-deadslot: llama.cpp b11312, 4 slots, 48 requests) into " \
           f"{out / 'real-store'}" in res.stderr


def test_demo_finds_the_dead_slot_and_the_runaways(demo: tuple[Path, Any]) -> None:
    out, res = demo
    sections = res.stdout.split("# the generated scenario\n", 1)[1].split("# ")
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


def test_without_the_real_run_the_demo_says_so(tmp_path: Path) -> None:
    from forensics.demo import add_real_run, prepare_out

    said: list[str] = []
    prepare_out(tmp_path / "demo")
    assert add_real_run(tmp_path / "demo", source=tmp_path / "absent", echo=said.append) is None
    assert said == [f"demo: no real run at {tmp_path / 'absent'} (it ships with the source tree, in fixtures/): "
                    "generated data only"]

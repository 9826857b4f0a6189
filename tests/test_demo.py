"""`forensics demo` (the README's first command) finds what its scenario put there and writes the report."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from forensics.cli import cli


def test_demo_finds_the_dead_slot_and_the_runaways(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    res = CliRunner().invoke(cli, ["demo", "--out", str(out)])
    assert res.exit_code == 0, res.output
    sections = res.stdout.split("# ")
    dead = next(s for s in sections if s.startswith("dead slots"))
    assert [ln.split()[:3] for ln in dead.splitlines()[3:] if ln.strip()] == [["run-np6", "main-np6", "2"]]
    runaways = next(s for s in sections if s.startswith("runaways"))
    assert {ln.split()[0] for ln in runaways.splitlines()[3:] if ln.strip()} == {"run-np4", "run-np6"}
    assert res.stderr.splitlines()[-1] == f"demo: report on run-np6 written to {out / 'report.html'}"
    assert (out / "report.html").stat().st_size > 100_000  # charts and their library inlined

"""What one invocation loads: help is built from click and light modules only, the data libraries load when a
command runs, and the formats are read from the files once per content of them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from forensics.cli import cli
from parsers import spec
from tests.conftest import ROOT

DATA_LIBRARIES = ("polars", "duckdb", "pyarrow", "altair")
# `generate --help` lists the generator's scenarios and eras, and the generator package imports polars.
HELP_NEEDS_POLARS = {"generate"}

_PROBE = """
import json, sys
from forensics.cli import main
seen = {}
for args in json.loads(sys.argv[1]):
    try:
        main(args)
    except SystemExit:
        pass
    seen[" ".join(args)] = [m for m in json.loads(sys.argv[2]) if m in sys.modules]
sys.stderr.write("@@" + json.dumps(seen))
"""


def _loaded_after(invocations: list[list[str]]) -> dict[str, list[str]]:
    """The data libraries in ``sys.modules`` after each invocation, run in turn in one fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(invocations), json.dumps(DATA_LIBRARIES)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, list[str]] = json.loads(proc.stderr.rpartition("@@")[2])
    return result


def test_help_imports_no_data_library() -> None:
    assert _loaded_after([["--help"]]) == {"--help": []}


def test_a_commands_help_imports_no_data_library() -> None:
    names = sorted(set(cli.list_commands(click.Context(cli))) - HELP_NEEDS_POLARS)
    assert {"ingest", "deadslots", "runaways", "verdict", "runs", "report"} <= set(names)
    seen = _loaded_after([[name, "--help"] for name in names])
    assert seen == {f"{name} --help": [] for name in names}


def test_a_command_that_runs_loads_what_it_needs(tmp_path: Path) -> None:
    log = ROOT / "fixtures" / "logs" / "era5-default-b10587.log"
    seen = _loaded_after([["ingest", str(log), "--store", str(tmp_path / "s")]])
    assert {"polars", "pyarrow"} <= set(seen[f"ingest {log} --store {tmp_path / 's'}"])


def test_the_cached_formats_are_the_formats_the_files_declare() -> None:
    path = spec._cache_path()
    assert path is not None
    spec.load_formats()  # writes the cache when it is not there yet
    cached = spec._read_cache(path)
    fresh = {f.name: f for f in (spec.load_format(p) for p in sorted(spec.FORMATS_DIR.glob("*.toml"))
                                 if p.name not in spec.DATA_FILES)}
    assert cached == fresh
    assert list(cached) == list(fresh)


def test_a_cut_or_foreign_cache_file_is_read_again(tmp_path: Path) -> None:
    bad = tmp_path / "formats-x.pickle"
    for content in (b"", b"\x80\x05not a pickle", b"\x80\x05N."):  # empty, cut, a pickle of something else
        bad.write_bytes(content)
        assert spec._read_cache(bad) is None
    assert spec._read_cache(tmp_path / "absent.pickle") is None


def test_the_cache_key_follows_the_format_files_and_the_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import polars as pl
    import regex

    versions = spec._engine_versions()
    assert pl.__version__ in versions and regex.__version__ in versions
    copy = tmp_path / "formats"
    copy.mkdir()
    for p in spec.FORMATS_DIR.glob("*.toml"):
        (copy / p.name).write_bytes(p.read_bytes())
    monkeypatch.setattr(spec, "FORMATS_DIR", copy)
    first = spec._cache_path()
    assert first is not None and first.parent == copy / "__pycache__" and spec._cache_path() == first
    edited = next(iter(sorted(copy.glob("*.toml"))))
    edited.write_text(edited.read_text() + "\n# an edit\n")
    assert spec._cache_path() != first

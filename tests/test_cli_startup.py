"""What one invocation loads: help is built from click and light modules only, the data libraries load when a
command runs, the formats are read from the files once per content of them, and a short log's lines are split
without pyarrow into the same strings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forensics.cli import cli
from forensics.lazy import is_loaded, lazy_import
from parsers import reader, spec
from tests.conftest import ROOT

DATA_LIBRARIES = ("polars", "duckdb", "pyarrow", "altair")
# `generate --help` lists the generator's scenarios and eras, and the generator package imports polars.
HELP_NEEDS_POLARS = {"generate"}

_PROBE = """
import json, sys
from forensics.cli import main
from forensics.lazy import is_loaded
seen = {}
for args in json.loads(sys.argv[1]):
    try:
        main(args)
    except SystemExit:
        pass
    seen[" ".join(args)] = [m for m in json.loads(sys.argv[2]) if is_loaded(m)]
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
    spec.load_formats()  # the formats cache as after a first run (the very first one reads the TOML with polars)
    assert {"ingest", "deadslots", "runaways", "verdict", "runs", "report"} <= set(names)
    seen = _loaded_after([[name, "--help"] for name in names])
    assert seen == {f"{name} --help": [] for name in names}


def test_a_command_that_runs_loads_what_it_needs(tmp_path: Path) -> None:
    log = ROOT / "fixtures" / "logs" / "era5-default-b10587.log"
    store = str(tmp_path / "s")
    seen = _loaded_after([["ingest", str(log), "--store", store], ["deadslots", "--store", store]])
    # a short log is read and written by polars alone, then the analysis of its run (the findings' SQL) loads
    # DuckDB; a finding command reads what the analysis stored, through DuckDB
    assert seen == {f"ingest {log} --store {store}": ["polars", "duckdb"],
                    f"deadslots --store {store}": ["polars", "duckdb"]}


def test_a_lazy_module_runs_on_its_first_attribute_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """forensics.lazy (importlib.util.LazyLoader): the module is found at once and run when first read, once; a
    module that is not installed is an error at once, not on first use."""
    (tmp_path / "lazy_probe_mod.py").write_text("import sys\nsys.lazy_probe_runs = getattr(sys, 'lazy_probe_runs', 0) + 1\n"
                                                "ANSWER = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_probe_mod", raising=False)
    monkeypatch.setattr(sys, "lazy_probe_runs", 0, raising=False)
    mod = lazy_import("lazy_probe_mod")
    assert (sys.lazy_probe_runs, is_loaded("lazy_probe_mod"), "lazy_probe_mod" in sys.modules) == (0, False, True)  # type: ignore[attr-defined]
    assert mod.ANSWER == 42 and mod.ANSWER == 42
    assert (sys.lazy_probe_runs, is_loaded("lazy_probe_mod")) == (1, True)  # type: ignore[attr-defined]
    assert lazy_import("lazy_probe_mod") is mod
    with pytest.raises(ModuleNotFoundError, match="No module named 'lazy_probe_missing'"):
        lazy_import("lazy_probe_missing")
    monkeypatch.delitem(sys.modules, "lazy_probe_mod")


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
    assert first is not None and first.parent == spec.cache_dir() and spec._cache_path() == first
    edited = next(iter(sorted(copy.glob("*.toml"))))
    edited.write_text(edited.read_text() + "\n# an edit\n")
    assert spec._cache_path() != first


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40) | st.text(max_size=30).map(str.encode), max_size=30),
       st.sampled_from([b"\n", b"\r\n"]))
def test_a_small_block_is_split_into_the_lines_a_large_one_gives(pieces: list[bytes], newline: bytes) -> None:
    block = b"".join(p.replace(b"\n", b" ") + newline for p in pieces)
    if not block:
        return
    import numpy as np

    views = reader._to_series(block, np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10))
    assert reader._to_series_replacing(block).to_list() == views.to_list()
    assert len(block) > reader.SMALL_BLOCK or reader.lines_of(block).to_list() == views.to_list()


def test_a_large_block_still_reads_through_string_views() -> None:
    line = "slot update_slots: id  0 | task 1 | prompt done, n_tokens = 12, \u00e9\r\n".encode()
    block = line * (reader.SMALL_BLOCK // len(line) + 2)
    lines = reader.lines_of(block)
    assert lines.len() == block.count(b"\n") and lines[0] == line.decode()[:-2]
    assert lines.to_list() == reader._to_series_replacing(block).to_list()

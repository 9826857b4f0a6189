"""The package as a user runs it: a ``parsers/`` folder of the user's own is never imported in place of ours, and
the formats cache goes to the user's cache folder (or nowhere), never into the installed package.

The wheel itself (built, installed into a clean virtualenv, run from outside the checkout, uninstalled without a
trace) is checked by ``tools/wheel_check.py``, which CI runs (``.ci/run``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

LOG = ROOT / "fixtures" / "logs" / "era5-default-b10587.log"


def _user_parsers(folder: Path, *, regular: bool) -> None:
    """A user's own ``parsers/`` folder: each module says on stderr that it ran."""
    (folder / "parsers").mkdir(parents=True)
    for name in ("errors", "spec", "reader", "engine", "assemble", *(("__init__",) if regular else ())):
        (folder / "parsers" / f"{name}.py").write_text(f"import sys\nsys.stderr.write('user parsers/{name}.py ran\\n')\n")


@pytest.mark.parametrize("regular", [False, True], ids=["a-folder", "a-package"])
def test_a_parsers_folder_in_the_working_directory_is_not_ours(tmp_path: Path, regular: bool) -> None:
    _user_parsers(tmp_path, regular=regular)
    for args in (["--version"], ["ingest", str(LOG), "--store", str(tmp_path / "s")], ["runaways", "--store",
                                                                                      str(tmp_path / "s")]):
        # `python -m` puts the working directory first on sys.path, where the user's folder is
        proc = subprocess.run([sys.executable, "-m", "forensics", *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr
        assert "user parsers" not in proc.stderr, (args, proc.stderr)
    probe = "import forensics.ingest, parsers, parsers.errors; print(parsers.__file__, parsers.errors.__file__)"
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(ROOT / "parsers" / "__init__.py"), str(ROOT / "parsers" / "errors.py")]


def test_another_parsers_imported_first_is_refused_in_one_line(tmp_path: Path) -> None:
    _user_parsers(tmp_path, regular=True)
    proc = subprocess.run([sys.executable, "-c", "import parsers, forensics"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        f"ImportError: forensics needs its own `parsers` package ({ROOT / 'parsers'}), but another one is already "
        f"imported ({tmp_path / 'parsers'}): import forensics first, or rename yours")


def test_parsers_is_a_regular_package_that_imports_nothing() -> None:
    code = "import sys, parsers; print(parsers.__file__, sorted(m for m in sys.modules if m.startswith(('parsers', 'forensics'))))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split(" ", 1) == [str(ROOT / "parsers" / "__init__.py"), "['parsers']\n"]


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("FORENSICS_CACHE_DIR", "XDG_CACHE_HOME")}
    return {**env, "HOME": str(tmp_path / "home"), **extra}


def test_the_formats_cache_goes_to_the_users_cache_folder(tmp_path: Path) -> None:
    package = _tree(ROOT / "parsers")
    env = _clean_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    args = [sys.executable, "-m", "forensics", "ingest", str(LOG), "--store", str(tmp_path / "s")]
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    cached = list((tmp_path / "xdg" / "llama-forensics").glob("formats-*.pickle"))
    assert len(cached) == 1
    assert _tree(ROOT / "parsers") == package  # nothing written into the package
    assert not (tmp_path / "home").exists()
    # the next process reads it: the same file, not another
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "xdg" / "llama-forensics").glob("formats-*")) == cached


@pytest.mark.parametrize("where", ["empty", "a-file"])
def test_no_cache_is_written_where_none_may_be(tmp_path: Path, where: str) -> None:
    blocked = tmp_path / "blocked"
    if where == "a-file":
        blocked.write_text("a file where the cache folder would go\n")
    env = _clean_env(tmp_path, FORENSICS_CACHE_DIR="" if where == "empty" else str(blocked / "cache"))
    before = _tree(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "forensics", "ingest", str(LOG), "--store", str(tmp_path / "s")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert [p for p in _tree(tmp_path) if not p.startswith("s")] == before


def test_the_cache_folder_follows_the_platforms_rule(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from parsers import spec

    monkeypatch.delenv("FORENSICS_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert spec.cache_dir() == tmp_path / "xdg" / "llama-forensics"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # invalid by the XDG rule: ignored
    assert spec.cache_dir() == tmp_path / "home" / ".cache" / "llama-forensics"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert spec.cache_dir() == tmp_path / "home" / ".cache" / "llama-forensics"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert spec.cache_dir() == tmp_path / "home" / "Library" / "Caches" / "llama-forensics"
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    assert spec.cache_dir() == tmp_path / "local" / "llama-forensics" / "Cache"
    monkeypatch.delenv("LOCALAPPDATA")
    assert spec.cache_dir() is None
    monkeypatch.setenv("FORENSICS_CACHE_DIR", str(tmp_path / "mine"))
    assert spec.cache_dir() == tmp_path / "mine"
    monkeypatch.setenv("FORENSICS_CACHE_DIR", "")
    assert spec.cache_dir() is None and spec._cache_path() is None


def test_the_cache_folder_keeps_the_newest_files_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    from parsers import spec

    folder = tmp_path / "cache"
    folder.mkdir()
    for i in range(spec.CACHE_KEEP + 3):
        old = folder / f"formats-old{i:02d}.pickle"
        old.write_bytes(b"")
        os.utime(old, (1_000_000 + i, 1_000_000 + i))
    (folder / "notes.txt").write_text("not ours to delete\n")
    spec._write_cache(folder / "formats-new.pickle", spec.load_formats())
    kept = sorted(p.name for p in folder.iterdir())
    assert kept == ["formats-new.pickle", *(f"formats-old{i:02d}.pickle" for i in range(4, spec.CACHE_KEEP + 3)),
                    "notes.txt"]
    assert spec._read_cache(folder / "formats-new.pickle") == spec.load_formats()

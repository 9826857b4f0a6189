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

"""The layers of docs/architecture.md hold, and every module imports on its own (no circles).

import-linter enforces the layers: the contracts in pyproject.toml (``[tool.importlinter]``), run by ``make lint``
and by the first test here.  The rest checks what a contract cannot say: that every module is placed in a layer
(a new module is not silently let through), and where the package ``__init__`` modules that sit below some of
their own modules stand."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from tests.conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PROJECT = ("forensics", "parsers")
CONTRACTS: list[dict] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
    "tool"]["importlinter"]["contracts"]


def _layers() -> list[tuple[str, ...]]:
    """The layers contract's layers, bottom first, each as its module names."""
    (contract,) = [c for c in CONTRACTS if c["type"] == "layers"]
    return [tuple(name.strip() for name in layer.replace("|", ":").split(":")) for layer in reversed(contract["layers"])]


LAYERS = _layers()

# A layer of the contract holds a package with everything under it, so these packages, whose own __init__ sits
# below some of their modules, are listed module by module there; each __init__ stands with the module named here.
PACKAGE_INITS = {
    "forensics": "forensics.store",  # open_store, the public entry point of the store
    "forensics.replay": "forensics.replay.intake",  # replay.tables below it is analysis
    "forensics.planning": "forensics.planning.costmodel",  # planning.charts and planning.section are outputs
    "parsers": "parsers.errors",  # imports nothing: each parser module is imported by its own name
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(p): p for top in PROJECT for p in sorted((ROOT / top).rglob("*.py"))}


def placed(module: str) -> int | None:
    """The index (bottom first) of the layer that names ``module`` or a package above it; None when none does:
    there is no fallback, a module nobody placed is in no layer."""
    module = PACKAGE_INITS.get(module, module)
    for index, names in enumerate(LAYERS):
        if any(module == name or module.startswith(name + ".") for name in names):
            return index
    return None


def layer_of(module: str) -> int:
    index = placed(module)
    if index is None:
        raise AssertionError(f"{module} is in no layer: add it to [tool.importlinter] and docs/architecture.md")
    return index


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd), "COLUMNS": "300"}
    # without the editable install's finder, so the project imported is the one under ``cwd`` alone (the finder
    # would otherwise add the installed tree's packages beside it)
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
            "sys.path_hooks[:] = [h for h in sys.path_hooks if 'editable' not in repr(h).lower()]; "
            "sys.path[:] = [p for p in sys.path if '__editable__' not in p]; "
            "from importlinter.cli import lint_imports_command as c; c()")
    return subprocess.run([sys.executable, "-c", code,
                           "--no-cache", "--no-logo"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_import_linter_keeps_every_contract() -> None:
    proc = _lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in proc.stdout


def test_every_module_is_in_a_layer() -> None:
    assert len(MODULES) > 80
    unplaced = sorted(m for m in MODULES if placed(m) is None)
    assert not unplaced, f"in no layer: {unplaced}; add each to [tool.importlinter] and docs/architecture.md"
    assert placed("forensics.not_a_module") is None  # the package forensics places nothing by itself
    assert placed("forensics.replay.not_a_module") is None
    assert placed("parsers.not_a_module") is None


def test_the_layers_are_in_the_documented_order() -> None:
    order = ["parsers.errors", "parsers.spec", "parsers.engine", "parsers.assemble", "forensics.store",
             "forensics.ingest", "forensics.findings", "forensics.report", "forensics.cli"]
    assert layer_of("forensics.errors") == layer_of("forensics.store")  # the rest of the hierarchy
    assert [layer_of(m) for m in order] == list(range(len(order)))
    assert layer_of("forensics.replay.tables") > layer_of("forensics.replay") > layer_of("forensics")
    assert layer_of("forensics.planning.charts") > layer_of("forensics.planning")


def test_package_inits_stand_in_their_layer() -> None:
    """What the contract cannot see: a package __init__ that is in no layer of its own."""
    graph = grimp.build_graph(*PROJECT)
    wrong = []
    for init in PACKAGE_INITS:
        below = {m for m in graph.find_modules_directly_imported_by(init) if m in MODULES}
        above = {m for m in graph.find_modules_that_directly_import(init) if m in MODULES}
        wrong += [f"{init} imports {m}" for m in below if layer_of(m) > layer_of(init)]
        wrong += [f"{m} imports {init}" for m in above if layer_of(m) < layer_of(init)]
    assert not wrong, "a layer imports one above it (see docs/architecture.md):\n" + "\n".join(sorted(wrong))
    assert "forensics.paths" in graph.find_modules_directly_imported_by("forensics")  # the graph is the real one


def test_the_contracts_catch_upward_imports_anywhere(tmp_path: Path) -> None:
    for top in PROJECT:
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    plant = {
        "parsers/spec.py": "def _planted():\n    import forensics.cli\n",  # inside a function
        "forensics/replay/join.py": "def _planted():\n    from . import tables\n",  # relative, intake -> analysis
        "forensics/verdict.py": "def _planted():\n    import click\n",
        "forensics/commands/check.py": "from forensics import cli\n",
    }
    for path, source in plant.items():
        with (tmp_path / path).open("a", encoding="utf-8") as f:
            f.write("\n\n" + source)
    proc = _lint_imports(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for broken in ("parsers.spec -> forensics.cli", "forensics.replay.join -> forensics.replay.tables",
                   "forensics.verdict -> click", "forensics.commands.check -> forensics.cli"):
        assert broken in proc.stdout, broken
    assert f"Contracts: 0 kept, {len(CONTRACTS)} broken." in proc.stdout


# Imports each module named on the command line in turn, with every module of the project dropped from
# sys.modules first: each import is the first of the project in that interpreter (a circle shows as in a fresh
# `python -c "import X"`), while the libraries (polars, duckdb, altair) load once.  Prints one line per failure.
ALONE = """
import importlib, sys
tops = sys.argv[1].split(",")
for name in sys.argv[2:]:
    for loaded in [m for m in sys.modules if m.split(".")[0] in tops]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except BaseException as exc:
        print(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
"""


def imported_alone(modules: list[str], *, cwd: Path = ROOT, tops: tuple[str, ...] = PROJECT,
                   processes: int = 2) -> list[str]:
    """The failures of importing each module on its own, in ``processes`` interpreters side by side."""
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    chunks = [modules[i::processes] for i in range(processes)]
    procs = [subprocess.Popen([sys.executable, "-c", ALONE, ",".join(tops), *chunk], cwd=cwd, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for chunk in chunks if chunk]
    failures = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        failures += out.splitlines()
    return failures


def test_every_module_imports_on_its_own() -> None:
    """No circles: ``python -c "import X"`` works for every X (about 6 CPU-seconds for all, not 40 for one
    interpreter each)."""
    assert imported_alone(sorted(MODULES)) == []


def test_the_import_check_sees_a_circle_whatever_came_before(tmp_path: Path) -> None:
    pkg = tmp_path / "circle"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circle import b\nX = 1\n")
    (pkg / "b.py").write_text("from circle.a import X\n")
    # b alone works (a finds b half-made in sys.modules); a alone fails, even right after b loaded both
    assert imported_alone(["circle.b", "circle.a"], cwd=tmp_path, tops=("circle",), processes=1) == [
        "circle.a: ImportError: cannot import name 'X' from partially initialized module 'circle.a' "
        "(most likely due to a circular import) (" + str(pkg / "a.py") + ")"]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("parsers.")))
def test_the_parsers_load_nothing_of_forensics(module: str) -> None:
    code = (f"import sys, {module}; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'forensics'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_parsers_errors_are_the_projects_errors() -> None:
    import forensics.errors
    import parsers.errors

    for name in ("ExitCode", "ForensicsError", "FormatDefinitionError", "InputError", "InternalError", "BUG_HINT"):
        assert getattr(forensics.errors, name) is getattr(parsers.errors, name), name
    assert issubclass(forensics.errors.UnknownFormatError, parsers.errors.InputError)
    err = parsers.errors.InputError("cannot open: No such file", path="a.log", line=3, hint="check the path")
    assert str(err) == "a.log:3: cannot open: No such file (check the path)"
    assert err.exit_code == 2
    bug = forensics.errors.InternalError(ValueError("bad\nsecond line"))
    assert bug.one_line() == f"internal error: ValueError: bad ({forensics.errors.BUG_HINT})"
    assert forensics.errors.InternalError(KeyError()).message == "internal error: KeyError"
    assert parsers.errors.InternalError("3 parsed + 1 skipped != 5 lines").message == (
        "internal error: 3 parsed + 1 skipped != 5 lines")
    assert bug.exit_code == 3

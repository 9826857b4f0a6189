"""The layers of docs/architecture.md hold: no module imports a layer above its own, and the core never imports
click or altair.  Every import is read with ``ast``, at the top of a module and inside its functions."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

# Bottom to top; a module may import its own layer and the layers below.  A name covers the module and, for a
# package, everything under it, unless a longer name places a submodule elsewhere.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("errors", ("forensics.errors",)),
    ("formats and lines", ("parsers.spec", "parsers.reader")),
    ("engine", ("parsers.engine",)),
    ("assemble", ("parsers.assemble", "parsers")),
    ("store", ("forensics", "forensics.store", "forensics.schema", "forensics.paths", "forensics.vocab",
               "forensics.sql", "forensics.compact", "forensics.check", "forensics.fleet", "forensics.spark")),
    ("intake", ("forensics.ingest", "forensics.duplicates", "forensics.replay", "forensics.generate")),
    ("analysis", ("forensics.findings", "forensics.repetition", "forensics.metrics", "forensics.verdict",
                  "forensics.compare", "forensics.evidence", "forensics.runs", "forensics.replay.tables",
                  "forensics.session", "forensics.thresholds", "forensics.registry", "forensics.sentences", "forensics.sweep",
                  "forensics.planning")),
    ("outputs", ("forensics.charts", "forensics.report", "forensics.render", "forensics.demo", "forensics.docs",
                 "forensics.watch", "forensics.otel", "forensics.planning.charts", "forensics.planning.section")),
    ("interface", ("forensics.cli", "forensics.commands", "forensics.__main__")),
]

# Imports that break the rule today, each to be removed by moving code; the test fails when one disappears, so
# this list only shrinks.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()

# Only these may import the CLI framework and the chart library (and its renderer).
UI_LIBRARIES = ("click", "altair", "vl_convert")
UI_MODULES = ("forensics.cli", "forensics.commands", "forensics.charts", "forensics.report", "forensics.planning.charts")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(p): p for top in ("forensics", "parsers")
                            for p in sorted((ROOT / top).rglob("*.py"))}


def _covers(name: str, module: str) -> bool:
    return module == name or module.startswith(name + ".")


def layer_of(module: str) -> int:
    """The layer of the longest name that covers ``module``."""
    best = max(((len(name), index) for index, (_, names) in enumerate(LAYERS)
                for name in names if _covers(name, module)), default=None)
    assert best is not None, f"{module} is in no layer: add it to LAYERS and to docs/architecture.md"
    return best[1]


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_in(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module ``source`` imports anywhere (top level, functions, branches); ``from pkg import sub`` names
    ``pkg.sub`` when that is a module of the project."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source_module = _absolute(module, is_package, node)
            for alias in node.names:
                sub = f"{source_module}.{alias.name}"
                found.add(sub if sub in MODULES else source_module)
    return found


def imports_of(module: str) -> set[str]:
    path = MODULES[module]
    return imports_in(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")


def _project_imports(module: str) -> set[str]:
    return {name for name in imports_of(module) if name.split(".")[0] in ("forensics", "parsers")}


def upward_imports() -> set[tuple[str, str]]:
    return {(module, target) for module in MODULES for target in _project_imports(module)
            if layer_of(target) > layer_of(module)}


def test_every_module_has_a_layer() -> None:
    assert len(MODULES) > 50
    for module in MODULES:
        layer_of(module)


def test_no_module_imports_a_layer_above_its_own() -> None:
    found = upward_imports()
    new = sorted(f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
                 for m, t in found - KNOWN_VIOLATIONS)
    assert not new, "a layer imports one above it (see docs/architecture.md):\n" + "\n".join(new)
    assert found >= KNOWN_VIOLATIONS, f"fixed, remove from KNOWN_VIOLATIONS: {sorted(KNOWN_VIOLATIONS - found)}"


def test_the_core_never_imports_click_or_altair() -> None:
    for module in MODULES:
        if any(_covers(name, module) for name in UI_MODULES):
            continue
        used = {name.split(".")[0] for name in imports_of(module)} & set(UI_LIBRARIES)
        assert not used, f"{module} imports {sorted(used)}: only {', '.join(UI_MODULES)} may"


def test_the_check_sees_imports_inside_functions_and_relative_ones() -> None:
    source = "import json\n\ndef f():\n    from forensics import charts\n    from ..store import Store\n"
    assert imports_in(source, "forensics.replay.tables") == {"json", "forensics.charts", "forensics.store"}
    assert imports_in("from . import join\n", "forensics.replay", is_package=True) == {"forensics.replay.join"}
    assert "forensics.replay.identity" in imports_of("forensics.runs")  # imported inside a function there
    assert layer_of("forensics.replay.tables") > layer_of("forensics.replay.join") > layer_of("forensics.store")
    assert layer_of("parsers.assemble") > layer_of("parsers.engine") > layer_of("parsers.spec")

"""The options every command shares (the store, the output format, the gate) and how a command opens its store.

The command modules import this module, never ``forensics.cli``: ``cli`` imports every command module, so a
command module that imported it back would close a circle (``python -c "import forensics.commands.findings"``
would fail on a partially initialised module).

``--store`` is taken before the command too (``forensics --store S ingest ...``): the group keeps it, and a
command's own ``--store``, when given, wins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import click

from forensics.paths import default_store_path

T = TypeVar("T")


def _group_store(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """A command's --store, else the one given before the command (``forensics --store S COMMAND``)."""
    if value is not None:
        return value
    root = ctx.find_root()
    return (root.obj or {}).get("store") if isinstance(root.obj, dict) else None


def store_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--store", "store_path", type=click.Path(path_type=Path), default=None, callback=_group_store,
        help="Store directory (default: the --store given before the command, else $FORENSICS_STORE, else "
             "./forensics-store).",
    )(fn)


def format_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True,
        help="Output format (JSON: an array of objects keyed by column name).",
    )(fn)


def fail_on_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--fail-on", type=click.Choice(["any", "never"]), default="never", show_default=True,
        help="Exit 1 when something is found (any), for smoke tests and CI.",
    )(fn)


def typed_options(cls: type[T], opts: dict[str, Any]) -> T:
    """A command's options as its typed dataclass: click passes them as keyword arguments (so a command
    with many options keeps a short signature); options shared by several commands (the finding
    thresholds) go into the dataclass's ``thresholds`` field when it has one."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    known = {k: v for k, v in opts.items() if k in names}
    if "thresholds" in names:
        known["thresholds"] = {k: v for k, v in opts.items() if k not in names}
    return cls(**known)


def resolve_store(path: Path | None) -> Path:
    return path if path is not None else default_store_path()


def open_store(path: Path | None) -> Any:
    """The store at ``--store`` (else $FORENSICS_STORE, else ./forensics-store); a missing one is an error
    that says to ingest first."""
    from forensics.store import Store

    return Store(resolve_store(path))

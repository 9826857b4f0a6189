"""The options every command shares (the store, the engine, the output format, the gate) and how a command opens
its store.

The command modules import this module, never ``forensics.cli``: ``cli`` imports every command module, so a
command module that imported it back would close a circle (``python -c "import forensics.commands.findings"``
would fail on a partially initialised module).

``--store`` is taken before the command too (``forensics --store S ingest ...``): the group keeps it, and a
command's own ``--store``, when given, wins.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import click

from forensics.paths import default_store_path

T = TypeVar("T")


def _remember(key: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        ctx.meta[f"forensics.{key}"] = value
        source = ctx.get_parameter_source(param.name or "")
        ctx.meta[f"forensics.{key}_given"] = source is click.core.ParameterSource.COMMANDLINE
        return value
    return callback


def _stores(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> Path | None:
    """Every ``--store`` is kept for ``open_store``; the command sees the first (or None), as before.  None given
    to the command: the ones given before it (``forensics --store S COMMAND``)."""
    if not value:
        root = ctx.find_root()
        value = tuple((root.obj or {}).get("stores") or ()) if isinstance(root.obj, dict) else ()
    ctx.meta["forensics.stores"] = list(value)
    return Path(value[0]) if value else None


def store_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--store`` (repeatable: several hosts' stores read as one), ``--engine`` and ``--spark-master``."""
    fn = click.option(
        "--spark-master", default=None, envvar="FORENSICS_SPARK_MASTER", expose_value=False,
        callback=_remember("spark_master"), help="Spark master URL for --engine spark (default: local[*]).")(fn)
    fn = click.option(
        "--engine", type=click.Choice(["duckdb", "spark"]), default="duckdb", show_default=True,
        envvar="FORENSICS_ENGINE", expose_value=False, callback=_remember("engine"),
        help="Where the queries run: DuckDB in this process, or Spark ($FORENSICS_ENGINE).")(fn)
    return click.option(
        "--store", "store_path", multiple=True, callback=_stores,
        help="Store directory (default: the --store given before the command, else $FORENSICS_STORE, else "
             "./forensics-store); repeat it, or give a pattern, to read several hosts' stores as one (HOST=DIR "
             "names the host).",
    )(fn)


class LazyChoice(click.Choice):
    """A choice whose values are worked out when its own command needs them (its help, its value), not when the
    command is built: the format names, the generator's scenarios and wrappers come from modules that
    `forensics --help` need not load."""

    def __init__(self, load: Callable[[], Sequence[str]], case_sensitive: bool = True) -> None:
        self._load = load
        self.case_sensitive = case_sensitive

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]  # click's is a plain attribute; this one loads late
        # asked anew each time: the format names depend on the user's formats folders (--formats)
        return tuple(self._load())


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


def _meta() -> dict[str, Any]:
    ctx = click.get_current_context(silent=True)
    return ctx.meta if ctx is not None else {}


def _reading() -> tuple[list[str], str, str | None]:
    """The ``--store`` values, ``--engine`` and ``--spark-master`` of the command being run."""
    meta = _meta()
    engine = meta.get("forensics.engine") or os.environ.get("FORENSICS_ENGINE") or "duckdb"
    return list(meta.get("forensics.stores") or []), engine, meta.get("forensics.spark_master")


def resolve_store(path: Path | None) -> Path:
    """The one store a writing command (ingest, watch) writes to."""
    from forensics.errors import StoreError
    from forensics.fleet import READ_ONLY

    specs, engine, _ = _reading()
    if len(specs) > 1:
        raise StoreError("this command writes to one store, and several were given", hint=READ_ONLY)
    if engine != "duckdb" and _meta().get("forensics.engine_given"):  # $FORENSICS_ENGINE is for the readers
        raise StoreError(f"this command does not run on --engine {engine}: it reads files and writes one store",
                         hint="drop --engine (or FORENSICS_ENGINE) for it; the commands that read the store take it")
    from forensics.store import refuse_a_file

    store = path if path is not None else default_store_path()
    refuse_a_file(store)  # watch writes its state under the store before it opens it
    return store


def open_store(path: Path | None, *, analysed: bool = True) -> Any:
    """The store at ``--store`` (else $FORENSICS_STORE, else ./forensics-store), or the fleet of stores that
    several ``--store`` (or a pattern) name, read by ``--engine``; a missing one is an error that says to
    ingest first.  ``analysed``: derive first what the store's runs lack (``forensics.analyse.ensure``)."""
    from forensics.fleet import open_fleet

    specs, engine, master = _reading()
    if not specs or Path(specs[0]) != path:  # called with a path of its own
        specs = [str(path if path is not None else default_store_path())]
    store = open_fleet(specs)
    if analysed:  # check and compact work on the store as it is
        _analysed(store)
    if engine == "spark":
        from forensics.spark import use_spark

        use_spark(store, master)
    return store


def _analysed(store: Any) -> None:
    """Derive the analysis of any run of ``store`` that lacks it (a store of an older version, an ingest that
    stopped before its analysis), saying so on stderr when it takes a while."""
    from forensics import analyse

    analyse.ensure(store, progress=lambda line: click.echo(line, err=True))

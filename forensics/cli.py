"""The ``forensics`` command: a thin shell over the library.

Each command parses options, calls one library function and renders its result.  Errors become one
line on stderr and an exit code here, in one place (``ForensicsGroup.invoke``): the library's own
errors (``ForensicsError``) exit 2, anything unexpected is a bug and exits 3 (``--debug`` shows its
traceback).

Exit codes: 0 ok; 1 findings when a ``--fail-on`` gate trips or a smoke budget fails; 2 usage or input
error; 3 internal error.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import click

from forensics.errors import ExitCode, ForensicsError, InternalError, bug_boundary
from forensics.paths import default_store_path

T = TypeVar("T")

# Modules under forensics/commands that add commands: each has ``register(cli: click.Group)``.
COMMAND_MODULES = ("core", "verdict", "replay", "findings", "throughput", "compare", "generate", "check", "compact",
                   "demo", "watch", "mapping", "export", "planning")


def _remember(key: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        ctx.meta[f"forensics.{key}"] = value
        source = ctx.get_parameter_source(param.name or "")
        ctx.meta[f"forensics.{key}_given"] = source is click.core.ParameterSource.COMMANDLINE
        return value
    return callback


def _stores(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> Path | None:
    """Every ``--store`` is kept for ``open_store``; the command sees the first (or None), as before."""
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
        help="Store directory (default: $FORENSICS_STORE, else ./forensics-store); repeat it, or give a pattern, "
             "to read several hosts' stores as one (HOST=DIR names the host).",
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
    return path if path is not None else default_store_path()


def open_store(path: Path | None) -> Any:
    """The store at ``--store`` (else $FORENSICS_STORE, else ./forensics-store), or the fleet of stores that
    several ``--store`` (or a pattern) name, read by ``--engine``; a missing one is an error that says to
    ingest first."""
    from forensics.fleet import open_fleet

    specs, engine, master = _reading()
    if not specs or Path(specs[0]) != path:  # called with a path of its own
        specs = [str(path if path is not None else default_store_path())]
    store = open_fleet(specs)
    if engine == "spark":
        from forensics.spark import use_spark

        use_spark(store, master)
    return store


class ForensicsGroup(click.Group):
    """Turns errors into one line on stderr and their exit code, for every command: the library's own
    errors exit 2, anything else is a bug and exits 3 (``bug_boundary``)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with bug_boundary(passthrough=(click.exceptions.Exit, click.ClickException, click.exceptions.Abort,
                                           BrokenPipeError)):
                return super().invoke(ctx)
        except BrokenPipeError:  # the reader stopped reading (`| head`): not an error of ours
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(0)
        except ForensicsError as exc:
            if isinstance(exc, InternalError) and ((ctx.obj or {}).get("debug") or os.environ.get("FORENSICS_DEBUG")):
                traceback.print_exception(exc.__cause__ or exc)
            click.echo(f"forensics: error: {exc.one_line()}", err=True)
            ctx.exit(int(exc.exit_code))


@click.group(cls=ForensicsGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="llama-forensics")
@click.option("--debug", is_flag=True, help="Show the Python traceback of an internal error (also FORENSICS_DEBUG=1).")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Forensics for llama-server logs and batch replay runs.

    \b
    forensics ingest logs/            read logs and replay records into the store
    forensics verdict                 what went wrong in each run, and what to change
    forensics summary                 what the store holds
    forensics deadslots run-42        slots that went bad and stayed bad
    forensics runaways run-42         outputs that ran away
    forensics missing run-42          items missing from a run, and why
    forensics throughput              throughput vs concurrency across runs

    Exit codes: 0 ok; 1 findings when --fail-on is given, or a smoke budget failed; 2 usage or input error;
    3 internal error (a bug: --debug shows the traceback).
    """
    ctx.obj = {"debug": debug}
    if debug:
        os.environ["FORENSICS_DEBUG"] = "1"  # the library prints the traceback of a bug it recovers from


for _name in COMMAND_MODULES:
    importlib.import_module(f"forensics.commands.{_name}").register(cli)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the CLI and map errors to documented exit codes."""
    try:
        rv = cli.main(args=argv, prog_name="forensics", standalone_mode=False)
    except ForensicsError as exc:
        click.echo(f"forensics: error: {exc.one_line()}", err=True)
        sys.exit(int(exc.exit_code))
    except click.exceptions.Abort:
        click.echo("forensics: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(int(ExitCode.USAGE))
    except KeyboardInterrupt:
        click.echo("forensics: interrupted; the store is as it was before this command", err=True)
        sys.exit(130)
    sys.exit(int(rv) if isinstance(rv, int) else 0)

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
from typing import Any

import click

from forensics.commands.options import (  # noqa: F401  (the names commands used to find here)
    fail_on_option,
    format_option,
    open_store,
    resolve_store,
    store_option,
    typed_options,
)
from forensics.errors import ExitCode, ForensicsError, InternalError, bug_boundary

FORMATS_ENV = "FORENSICS_FORMATS"  # parsers.spec.FORMATS_ENV: the parsers load only when a command reads a log

# Modules under forensics/commands that add commands: each has ``register(cli: click.Group)``.
COMMAND_MODULES = ("core", "verdict", "replay", "findings", "throughput", "compare", "generate", "check", "compact",
                   "demo", "watch", "mapping", "export", "planning", "incidents", "mcp")


class ForensicsGroup(click.Group):
    """The one error path of the command line, for every command and for the console entry point (``main``): the
    library's own errors are one line on stderr with their exit code (2), a usage error or any other
    ``ClickException`` one line with exit 2 (click's own default, 1, would read as "findings"), an interrupt exits
    130, anything else is a bug and exits 3 (``bug_boundary``).  Every code is an ``ExitCode``."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:  # the caller handles the exceptions (click's contract)
            return super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[call-overload]  # click's overloads cannot match forwarded *args
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[call-overload]  # as above
        except click.UsageError as exc:
            click.echo(usage_line(exc), err=True)
            sys.exit(int(ExitCode.USAGE))
        except click.ClickException as exc:
            click.echo(f"forensics: error: {' '.join(exc.format_message().split())}", err=True)
            sys.exit(int(ExitCode.USAGE))
        except ForensicsError as exc:  # raised before a command runs (``invoke`` handles the rest)
            click.echo(f"forensics: error: {exc.one_line()}", err=True)
            sys.exit(int(exc.exit_code))
        except (click.exceptions.Abort, KeyboardInterrupt):  # click turns Ctrl-C into Abort
            click.echo("forensics: interrupted (the store stays consistent: the next writer finishes or discards a "
                       "commit that was cut off)", err=True)
            sys.exit(int(ExitCode.INTERRUPTED))
        sys.exit(int(rv) if isinstance(rv, int) and not isinstance(rv, bool) else int(ExitCode.OK))

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


def usage_line(exc: click.UsageError) -> str:
    """``forensics: error: <click's message on one line> (see `forensics CMD --help`)``."""
    text = " ".join(exc.format_message().split())
    cmd = exc.ctx.command_path.replace("cli", "forensics", 1) if exc.ctx is not None else "forensics"
    if not cmd.startswith("forensics"):
        cmd = "forensics " + cmd
    group = exc.ctx.command if exc.ctx is not None else None
    if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())) and isinstance(group, click.Group):
        text = f"{cmd} needs a command: {', '.join(sorted(group.commands))}"  # click's message is the whole help
    return f"forensics: error: {text} (see `{cmd} --help`)"


@click.group(cls=ForensicsGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="llama-forensics")
@click.option("--debug", is_flag=True, help="Show the Python traceback of an internal error (also FORENSICS_DEBUG=1).")
@click.option("--store", "stores", multiple=True,
              help="Store directory for the command (repeatable; the command's own --store wins; default: "
                   "$FORENSICS_STORE, else ./forensics-store).")
@click.option("--formats", "formats", multiple=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False, resolve_path=True),
              help="A folder of your own format files (a fork's lines) read beside the built-in ones; repeatable "
                   "(default: $FORENSICS_FORMATS, folders separated by the path separator).")
@click.pass_context
def cli(ctx: click.Context, debug: bool, stores: tuple[str, ...], formats: tuple[str, ...]) -> None:
    """Forensics for llama-server logs and batch replay runs.

    \b
    forensics ingest logs/            read logs and replay records into the store
    forensics verdict                 what went wrong in each run, and what to change
    forensics summary                 what the store holds
    forensics deadslots run-42        slots that went bad and stayed bad
    forensics runaways run-42         outputs that ran away
    forensics missing run-42          items missing from a run, and why
    forensics incidents --precursors  every incident across runs, and what their onsets had in common
    forensics throughput              throughput vs concurrency across runs

    Exit codes: 0 ok; 1 findings when --fail-on is given, or a smoke budget failed; 2 usage or input error;
    3 internal error (a bug: --debug shows the traceback); 130 interrupted (Ctrl-C).
    """
    ctx.obj = {"debug": debug, "stores": list(stores)}
    if formats:  # the parsers read the folders from the environment (so does any process started from here)
        before = os.environ.get(FORMATS_ENV)
        os.environ[FORMATS_ENV] = os.pathsep.join(formats)
        ctx.call_on_close(lambda: _restore(FORMATS_ENV, before))
    if debug:
        os.environ["FORENSICS_DEBUG"] = "1"  # the library prints the traceback of a bug it recovers from


def _restore(name: str, value: str | None) -> None:
    """Put back an environment variable as it was before a command (several commands may run in one process)."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


for _name in COMMAND_MODULES:
    importlib.import_module(f"forensics.commands.{_name}").register(cli)


def main(argv: list[str] | None = None) -> None:
    """Console entry point (``forensics``, ``python -m forensics``): the group's one error path maps every outcome
    to an ``ExitCode``."""
    cli.main(args=argv, prog_name="forensics")

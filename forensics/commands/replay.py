"""Commands ``runs`` and ``missing``: thin shells over forensics.replay."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from forensics.commands import options as cli_mod


@click.command(epilog="""\b
Examples:
  forensics runs                          every run: np, items expected / done / missing, wall time, end
  forensics runs run-42 run-43            those two runs (a run's alias works too)
  forensics runs --format csv > runs.csv
""")
@click.argument("names", nargs=-1)
@cli_mod.format_option
@cli_mod.store_option
def runs(names: tuple[str, ...], fmt: str, store_path: Path | None) -> None:
    """List the runs (all of them when none is named): np, items expected / done / missing, attempts,
    requests, wall time, how each ended."""
    from forensics import runs as runs_mod
    from forensics.render import render
    from forensics.replay import tables as replay_tables  # loaded when a replay command runs

    store = cli_mod.open_store(store_path)
    asked = runs_mod.resolve(store, names, need="records", command="runs").runs if names else None
    render(replay_tables.runs_table(store, asked), fmt, sys.stdout)


@click.command(epilog="""\b
Examples:
  forensics missing run-42                every item x stage of run-42 that did not finish, and why
  forensics missing run-42 --fail-on any  exit 1 when an item went missing
""")
@click.argument("run", required=False)
@cli_mod.fail_on_option
@cli_mod.format_option
@cli_mod.store_option
@click.pass_context
def missing(ctx: click.Context, run: str | None, fail_on: str, fmt: str, store_path: Path | None) -> None:
    """List every missing item x stage of RUN (optional when the store holds one run) and why: never
    attempted, HTTP error, timeout or cancelled, parse error, with evidence from the server log."""
    from forensics import runs as runs_mod
    from forensics.errors import ExitCode
    from forensics.render import render
    from forensics.replay import tables as replay_tables

    store = cli_mod.open_store(store_path)
    asked = runs_mod.resolve(store, run, one=True, need="records", command="missing")
    for note in asked.notes:
        click.echo(f"note: {note}", err=True)
    df = replay_tables.missing(store, asked.runs[0])
    render(df, fmt, sys.stdout)
    if fail_on == "any" and df.height:
        ctx.exit(int(ExitCode.FINDINGS))


def register(cli: click.Group) -> None:
    for command in (runs, missing):
        cli.add_command(command)

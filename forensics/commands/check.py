"""``forensics check``: verify the store and say how to repair it."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from forensics.commands import options as cli_mod


@click.command(epilog="""\b
Examples:
  forensics check                          every part present, readable, counted right
  forensics check --store runs/store --format json
""")
@cli_mod.format_option
@cli_mod.store_option
@click.pass_context
def check(ctx: click.Context, fmt: str, store_path: Path | None) -> None:
    """Verify the store (parts present, schemas, counts agree) and say how to repair it; exit 1 when a
    problem is found."""
    from forensics.check import check_store  # pyarrow.parquet: loaded only for this command
    from forensics.errors import ExitCode
    from forensics.render import render

    df = check_store(cli_mod.open_store(store_path, analysed=False))
    render(df, fmt, sys.stdout)
    if (df["status"] == "problem").any():
        ctx.exit(int(ExitCode.FINDINGS))


def register(cli: click.Group) -> None:
    cli.add_command(check)

"""``forensics check``."""

from __future__ import annotations

import sys
from pathlib import Path

import click


def register(cli: click.Group) -> None:
    from forensics import cli as cli_mod

    @cli.command()
    @cli_mod.format_option
    @cli_mod.store_option
    def check(fmt: str, store_path: Path | None) -> None:
        """Verify the store (parts present, schemas, counts agree) and say how to repair it.

        Exit 1 when a problem is found.
        """
        from forensics.check import check_store  # pyarrow.parquet: loaded only for this command
        from forensics.render import render
        from forensics.store import Store

        df = check_store(Store(cli_mod.resolve_store(store_path)))
        render(df, fmt, sys.stdout)
        if (df["status"] == "problem").any():
            sys.exit(1)

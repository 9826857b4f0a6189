"""Commands ``runs`` and ``missing``: thin shells over forensics.replay."""

from __future__ import annotations

import sys
from pathlib import Path

import click


def register(cli: click.Group) -> None:
    from forensics import cli as cli_mod

    @cli.command()
    @cli_mod.format_option
    @cli_mod.store_option
    def runs(fmt: str, store_path: Path | None) -> None:
        """List replay runs: np, items expected / done / missing, attempts, requests, wall time, end."""
        from forensics import replay  # loaded when a replay command runs, not at every start
        from forensics.render import render
        from forensics.store import Store

        store = Store(cli_mod.resolve_store(store_path))
        render(replay.runs_table(store), fmt, sys.stdout)

    @cli.command()
    @click.argument("run")
    @cli_mod.format_option
    @cli_mod.store_option
    def missing(run: str, fmt: str, store_path: Path | None) -> None:
        """List every missing item x stage of RUN and why (never attempted, HTTP error, timeout or
        cancelled, parse error), with evidence from the server log."""
        from forensics import replay
        from forensics.render import render
        from forensics.store import Store

        store = Store(cli_mod.resolve_store(store_path))
        asked = replay.check_run(store, run, need="records", command="missing")
        for note in asked.notes:
            click.echo(f"note: {note}", err=True)
        render(replay.missing(store, asked.run or run), fmt, sys.stdout)

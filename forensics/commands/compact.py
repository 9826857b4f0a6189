"""``forensics compact``: pack a store's many small part files into a few large ones."""

from __future__ import annotations

from pathlib import Path

import click

from forensics.commands import options as cli_mod


@click.command(epilog="""\b
Examples:
  forensics compact                        pack the default store's part files
  forensics compact --store runs/store     a store of thousands of runs answers in about a second after this
""")
@cli_mod.store_option
def compact(store_path: Path | None) -> None:
    """Pack the store's small part files (one per table, log and run) into a few sorted files, so that
    queries over thousands of runs open a handful of files; rows and answers do not change.  An ingest does
    this by itself once the store holds more than 2000 part files."""
    from forensics.compact import compact as compact_store

    store = cli_mod.open_store(store_path, analysed=False)
    done = compact_store(store, on_wait=lambda: click.echo(
        f"forensics: waiting for another ingest into {store.root} to finish...", err=True))
    click.echo(done.line(), err=True)


def register(cli: click.Group) -> None:
    cli.add_command(compact)

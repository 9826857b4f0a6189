"""``forensics incidents [RUN...]``: every dead slot, runaway, crash, KV-cache stall and failover across runs, one row
each; ``--precursors``: what the onsets of each kind had in common (``forensics.incidents``)."""

from __future__ import annotations

import sys
from typing import Any

import click

from forensics.commands import options as cli_mod

EXAMPLES = """
\b
Examples:
  forensics incidents                          every incident of every run, in order of onset
  forensics incidents run-41 run-42 --format csv   the incidents of two runs, as CSV
  forensics incidents --precursors             what set each kind's onsets apart from the normal requests
  forensics incidents --fail-on any            exit 1 when any run had an incident (a CI gate)
"""


@click.command(epilog=EXAMPLES)
@click.argument("runs", nargs=-1)
@click.option("--precursors", is_flag=True,
              help="Instead of the incidents: per kind, the features its onsets (the first abnormal request and the "
                   "--before requests before it on its slot) had more often than the normal requests of the same "
                   "runs, ranked, with counts.")
@click.option("--before", type=click.IntRange(0, 20), default=2, show_default=True,
              help="With --precursors: requests before the first abnormal one on its slot that belong to its onset.")
@click.option("--min-incidents", type=click.IntRange(1), default=3, show_default=True,
              help="With --precursors: fewer incidents of a kind than this tell nothing (a sentence says so).")
@cli_mod.fail_on_option
@cli_mod.format_option
@cli_mod.store_option
@click.pass_context
def incidents(ctx: click.Context, runs: tuple[str, ...], precursors: bool, fmt: str, **opts: Any) -> None:
    """Every dead slot, runaway, crash, KV-cache stall and failover of RUN... (every run when none is named), one
    row each: its run, instance, slot, onset, first abnormal request, what it cost (requests, items, seconds,
    tokens) and whether the slot or server recovered; read from the stored analysis.  stdout: the rows (with
    --precursors, the ranked features); stderr: what they add up to, in words."""
    from forensics import incidents as inc
    from forensics import runs as runs_mod
    from forensics.commands.findings import asked, gate
    from forensics.render import render

    store, fail_on = cli_mod.open_store(opts["store_path"]), str(opts["fail_on"])
    names = asked(store, runs, "requests", "incidents")
    if precursors:
        res = inc.precursors(store, names, before=int(opts["before"]),
                             min_incidents=int(opts["min_incidents"]))
        table = res.table.drop("sentence") if fmt == "table" else res.table
        render(table.filter(table["feature"].is_not_null()) if fmt == "table" else table, fmt, sys.stdout)
        for sentence in res.sentences:
            click.echo(sentence, err=True)
        gate(ctx, fail_on, res.found())
        return
    rows = inc.incidents(store, names)
    render(inc.listing(rows), fmt, sys.stdout)
    click.echo(inc.summary(rows, len(names if names is not None else runs_mod.resolve(store, None).runs)), err=True)
    gate(ctx, fail_on, rows.height)


def register(cli: click.Group) -> None:
    cli.add_command(incidents)

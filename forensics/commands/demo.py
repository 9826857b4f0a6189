"""``forensics demo``: build a realistic scenario, ingest it into a fresh store, print the verdict and
findings, write the report."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command(epilog="""\b
Examples:
  forensics demo                       logs, store and report in ./demo-out
  forensics demo --out /tmp/demo       somewhere else (a new or empty folder, or an earlier demo's)
""")
@click.option("--out", type=click.Path(path_type=Path), default=Path("demo-out"), show_default=True,
              help="Folder for the generated logs, the store and the report (a folder an earlier demo made is "
                   "replaced; any other folder must be empty).")
@click.option("--seed", type=int, default=7, show_default=True, help="Random seed of the scenario.")
def demo(out: Path, seed: int) -> None:
    """First a real llama-server run with a dead slot (fixtures/server-runs/b11312-deadslot, into OUT/real-store),
    then a generated scenario (runs at np 1..8, a dead slot, runaways, missing items) into OUT/store: the verdicts
    and findings on stdout, the report in OUT/report.html."""
    from forensics import demo as demo_mod  # the generator, findings and report load only when asked for
    from forensics.render import render

    result = demo_mod.run_demo(out, seed=seed, echo=lambda m: click.echo(m, err=True))
    if result.real is not None:
        real = result.real
        click.echo(f"# a real run: {real.name} (its store: {real.store})")
        for paragraph in real.verdict:
            click.echo(paragraph)
        click.echo("")
        click.echo(f"# {real.name}: dead slots")
        render(real.dead_slots, "table", sys.stdout)
        click.echo("")
        click.echo("# the generated scenario")
        click.echo("")
    click.echo("# verdict")
    for paragraph in result.verdict:
        click.echo(paragraph)
    click.echo("")
    for title, df in result.sections:
        click.echo(f"# {title}")
        render(df, "table", sys.stdout)
        click.echo("")
    for line in result.notes:
        click.echo(line, err=True)


def register(cli: click.Group) -> None:
    cli.add_command(demo)

"""``forensics compare RUN_A RUN_B``: what changed between two runs, as a table and, with -o, a chart."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from forensics.commands import options as cli_mod

EXAMPLES = """
\b
Examples:
  forensics compare run-np4 run-np6              metrics and findings side by side, what changed
  forensics compare run-41 run-42 -o diff.html   the same, and a chart of latency and throughput
"""


@click.command(epilog=EXAMPLES)
@click.argument("run_a")
@click.argument("run_b")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="Also draw the comparison: .html (offline), .png, .svg or .json (the spec).")
@cli_mod.format_option
@cli_mod.store_option
def compare(run_a: str, run_b: str, out: Path | None, fmt: str, store_path: Path | None) -> None:
    """What changed from RUN_A to RUN_B: np, throughput, latency percentiles, findings and missing items.
    stdout: one row per metric (the two runs, the change, which is better); stderr: the changes in words."""
    from forensics.compare import compare as compute
    from forensics.render import render

    cmp = compute(cli_mod.open_store(store_path), run_a, run_b)
    render(cmp.table, fmt, sys.stdout)
    if cmp.items.height and fmt == "table":
        sys.stdout.write("\n# items missing\n")
        render(cmp.items, fmt, sys.stdout)
    for sentence in cmp.sentences:
        click.echo(sentence, err=True)
    if out is not None:
        from forensics import charts

        path = charts.save(charts.compare_chart(cmp), out, title=f"forensics compare {run_a} {run_b}")
        click.echo(f"compare: chart written to {path}", err=True)


def register(cli: click.Group) -> None:
    cli.add_command(compare)

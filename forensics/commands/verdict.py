"""``forensics verdict``: what went wrong in each run, and what to change, in a few sentences."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from forensics.commands import options as cli_mod
from forensics.errors import ExitCode

EXAMPLES = """
\b
Examples:
  forensics verdict                       every run in the store, one paragraph each
  forensics verdict run-42 --fail-on any  exit 1 when run-42 is not healthy (a CI gate)
  forensics verdict --format json         the same facts as fields, with their evidence lines
"""


@click.command(epilog=EXAMPLES)
@click.argument("runs", nargs=-1)
@cli_mod.fail_on_option
@click.option("--evidence/--no-evidence", default=True, show_default=True,
              help="Show the log lines each sentence rests on (path:first-last).")
@cli_mod.format_option
@cli_mod.store_option
@click.pass_context
def verdict(ctx: click.Context, runs: tuple[str, ...], fail_on: str, evidence: bool, fmt: str,
            store_path: Path | None) -> None:
    """What went wrong in each run (all runs when none is named) and what to change, written from the
    findings: dead slots, crashes, runaways, prompts over the context, missing items, the cap that would
    have helped. A healthy run gets one line."""
    from forensics.render import render
    from forensics.verdict import verdict as compute

    verdicts = compute(cli_mod.open_store(store_path), list(runs) or None)
    if fmt == "json":
        sys.stdout.write(json.dumps([v.as_dict() for v in verdicts], indent=2, ensure_ascii=False, default=str) + "\n")
    elif fmt == "csv":
        import polars as pl

        rows = [{"run": v.run, "healthy": v.healthy, "kind": f.kind, "sentence": f.sentence,
                 "evidence": ", ".join(f.evidence)} for v in verdicts for f in v.facts]
        render(pl.DataFrame(rows, schema={"run": pl.String, "healthy": pl.Boolean, "kind": pl.String,
                                          "sentence": pl.String, "evidence": pl.String}), "csv", sys.stdout)
    else:
        for v in verdicts:
            click.echo(v.paragraph(evidence=evidence))
    if fail_on == "any" and any(not v.healthy for v in verdicts):
        ctx.exit(int(ExitCode.FINDINGS))


def register(cli: click.Group) -> None:
    cli.add_command(verdict)

"""``forensics mapping init SAMPLE``: propose a mapping for a harness forensics has never seen."""

from __future__ import annotations

from pathlib import Path

import click

from forensics.errors import InputError


@click.group(epilog="""\b
Examples:
  forensics mapping init results.jsonl                 propose a mapping for a harness's record file
""")
def mapping() -> None:
    """Write mappings for other harnesses' record files (see docs/replay.md, Mapping files)."""


@mapping.command(epilog="""\b
Examples:
  forensics mapping init results.jsonl                 the proposal on stdout, the check on stderr
  forensics mapping init run-7/requests.csv -o bench.toml
  forensics ingest run-7/ --mapping bench.toml         then read the run with it
""")
@click.argument("sample", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Write the proposed mapping to this file (default: stdout).")
def init(sample: Path, output: Path | None) -> None:
    """Propose a mapping from SAMPLE, one record file of the harness: fields matched by name, unit and shape,
    the ones it cannot place listed as comments; then check the proposal on SAMPLE and say what it read."""
    from forensics.replay.mapping_init import propose

    proposal = propose(sample)
    if output is not None:
        output.write_text(proposal.text, encoding="utf-8")
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(proposal.text, nl=False)
    placed = ", ".join(f"{k} <- {v}" for k, v in proposal.placed.items())
    if proposal.problems or not proposal.attempts:
        raise InputError(f"the proposal did not read {sample} cleanly: "
                         + ("; ".join(proposal.problems) or "no records"),
                         hint="edit the fields it placed (" + (placed or "none") + ")")
    click.echo(f"checked on {sample}: {proposal.attempts} attempts read; placed {placed}", err=True)


def register(cli: click.Group) -> None:
    cli.add_command(mapping)

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
@click.option("--pick", "picks", multiple=True, metavar="FIELD=CHOICE",
              help="Where two readings of a field are plausible, take this one (the proposal says which to pick "
                   "from, e.g. --pick item=ticker).")
def init(sample: Path, output: Path | None, picks: tuple[str, ...]) -> None:
    """Propose a mapping from SAMPLE, one record file of the harness (or an event stream): fields matched by
    name, unit and shape, the outcome from every field that says a request failed, the ones it cannot place
    listed as comments. Beside it: what it guessed, what it could not decide, and what the proposal gives on
    SAMPLE (attempts, ok, failures by outcome, items missing)."""
    from forensics.replay.mapping_init import propose

    chosen = {}
    for pick in picks:
        name, sep, value = pick.partition("=")
        if not sep or not name or not value:
            raise click.UsageError(f"--pick {pick!r}: write FIELD=CHOICE, e.g. --pick item=ticker")
        chosen[name.strip()] = value.strip()
    proposal = propose(sample, chosen)
    if output is not None:
        output.write_text(proposal.text, encoding="utf-8")
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(proposal.text, nl=False)
    if proposal.problems or not proposal.attempts:
        placed = ", ".join(f"{k} <- {v}" for k, v in proposal.placed.items())
        raise InputError(f"the proposal did not read {sample} cleanly: "
                         + ("; ".join(proposal.problems) or "no records"),
                         hint="edit the fields it placed (" + (placed or "none") + ")")
    for line in proposal.report(sample):
        click.echo(line, err=True)


def register(cli: click.Group) -> None:
    cli.add_command(mapping)

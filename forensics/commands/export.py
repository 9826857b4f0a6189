"""``forensics export otel``: the requests of runs as OpenTelemetry traces, to a file or a collector."""

from __future__ import annotations

from pathlib import Path

import click

from forensics.commands import options as cli_mod

EXAMPLES = """
\b
Examples:
  forensics export otel run-42 -o traces.json              OTLP JSON lines, one request per trace
  forensics export otel --endpoint http://localhost:4318   every run, to an OTLP/HTTP collector (Tempo, Jaeger)
"""


@click.group(epilog=EXAMPLES)
def export() -> None:
    """Export the store's requests to other tools."""


@export.command(epilog=EXAMPLES)
@click.argument("runs", nargs=-1)
@click.option("-o", "--out", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write OTLP JSON (one ExportTraceServiceRequest per line) to this file.")
@click.option("--endpoint", default=None, help="Send OTLP/HTTP to this collector (http://host:4318).")
@cli_mod.store_option
def otel(runs: tuple[str, ...], out: Path | None, endpoint: str | None, store_path: Path | None) -> None:
    """Every server request of RUNS (all runs when none is named) as a span following the OpenTelemetry GenAI
    conventions, with prompt processing and generation as child spans and the findings (dead slot, runaway,
    failover) as events with their evidence lines.  stdout: nothing; stderr: one line saying what was sent."""
    from forensics.otel import export as export_spans

    done = export_spans(cli_mod.open_store(store_path), list(runs), out=out, endpoint=endpoint)
    clocks = ", ".join(sorted(set(done.clocks.values())))
    click.echo(f"export: {done.requests} requests of {len(done.clocks)} run(s) as {done.spans} spans with "
               f"{done.events} finding events ({clocks} times) -> {out if out is not None else endpoint}", err=True)


def register(cli: click.Group) -> None:
    cli.add_command(export)

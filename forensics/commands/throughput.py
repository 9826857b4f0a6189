"""Commands ``throughput``, ``smoke``, ``chart`` and ``report``: thin shells over forensics.metrics,
forensics.charts and forensics.report."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from forensics.commands import options as cli_mod
from forensics.vocab import CHART_KINDS, SOURCES

source_option = click.option(
    "--source", type=click.Choice(SOURCES), default="auto", show_default=True,
    help="Requests from the server logs, the replay records, or records when the run has them.")


@click.command(epilog="""\b
Examples:
  forensics throughput                    one row per run: throughput, latency percentiles, concurrency
  forensics throughput --by np            throughput and latency against np, the fit and the knee
  forensics throughput --by ctx_size      grouped by a key of the runs' config
""")
@click.argument("runs", nargs=-1)
@click.option("--by", default=None,
              help="Compare runs by this field: np, a column of the table, or a key of the runs' config "
                   "(prints the table against it, the fit and the knee).")
@source_option
@cli_mod.format_option
@cli_mod.store_option
def throughput(runs: tuple[str, ...], by: str | None, source: str, fmt: str, store_path: Path | None) -> None:
    """Throughput, latency and concurrency per run (all runs when none is named); with --by, across runs
    against concurrency."""
    from forensics import metrics
    from forensics.render import render

    store = cli_mod.open_store(store_path)
    if by is None:
        m = metrics.throughput(store, list(runs), source=source)
        render(m, fmt, sys.stdout)
        estimated = m.filter(m["estimated"])["run"].to_list()
        if estimated:
            click.echo(f"note: runs {', '.join(estimated)} have no timestamps: wall_s, rates, "
                       "effective_concurrency and peak_busy_slots are estimates from request order", err=True)
        from forensics.replay.clock import clock_notes

        for note in clock_notes(m):
            click.echo(f"note: {note}", err=True)
        return
    _fit(store, list(runs), by, source, fmt)


def _fit(store: object, runs: list[str], by: str, source: str, fmt: str) -> None:
    """One fit per setup of the comparable healthy runs (``sweep.throughput_fits``): the tables on stdout (a setup
    column first); each setup's runs, those left out and why, its fit and its knee on stderr."""
    from forensics.render import render
    from forensics.sweep import fit_table, throughput_fits

    fits = throughput_fits(store, runs, by=by, source=source)  # type: ignore[arg-type]
    for res in fits:
        for line in res.group.lines():
            click.echo(f"note: {line}", err=True)
    table = fit_table(fits)
    if table.height == 0:
        click.echo("note: no healthy run to fit", err=True)
        return
    render(table, fmt, sys.stdout)
    for res in fits:
        sc = res.scaling
        if sc is None:
            continue
        head = f"{res.group.label}: " if len(fits) > 1 else ""
        for note in sc.notes:
            click.echo(f"note: {head}{note}", err=True)
        if sc.fit is not None:
            click.echo(f"fit: {head}latency_p50_s = {sc.fit.a:.3f} + {sc.fit.b:.3f} x {by} "
                       f"(b: seconds one more concurrent request adds; {sc.fit.n} runs"
                       + (f", r2 {sc.fit.r2:.2f}" if sc.fit.r2 is not None else "") + ")", err=True)
        click.echo(f"{head}{sc.sentence}", err=True)


@click.command(epilog="""\b
Examples:
  forensics smoke run-np4 run-np6 --max-run 20m --max-request 90s    which np fits the budget
  forensics smoke --max-p95 30s                                       every run against a p95 budget
""")
@click.argument("runs", nargs=-1)
@click.option("--max-run", default=None, help='Budget for the whole run ("20m", "1h", "900s", seconds).')
@click.option("--max-request", default=None, help='Budget for the longest request ("90s", "1500ms").')
@click.option("--max-p95", default=None, help="Budget for the p95 request latency.")
@source_option
@cli_mod.format_option
@cli_mod.store_option
@click.pass_context
def smoke(ctx: click.Context, runs: tuple[str, ...], source: str, fmt: str, store_path: Path | None,
          **budgets: str | None) -> None:
    """Pass or fail each candidate run (all runs when none is named) against time budgets, side by side;
    exit 1 when any fails."""
    from forensics import metrics
    from forensics.errors import ExitCode
    from forensics.render import render

    m = metrics.throughput(cli_mod.open_store(store_path), list(runs), source=source)
    # --max-run, --max-request, --max-p95: durations as written, in seconds for the library
    res = metrics.smoke(m, **{f"{name}_s": metrics.parse_duration(v) if v else None for name, v in budgets.items()})
    render(res.table, fmt, sys.stdout)
    failed = res.table.filter(res.table["verdict"] == "FAIL")["run"].to_list()
    click.echo("smoke: " + (f"FAIL ({', '.join(failed)})" if failed else "PASS"), err=True)
    if not res.passed:
        ctx.exit(int(ExitCode.FINDINGS))


@click.command(epilog="""\b
Examples:
  forensics chart timeline run-42 -o timeline.html     one lane per slot, bars coloured by finding
  forensics chart throughput -o tput.png               throughput against np across runs, as an image
""")
@click.argument("kind", type=click.Choice(CHART_KINDS))
@click.argument("runs", nargs=-1)
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), required=True,
              help="File to write: .html (interactive, offline), .png, .svg or .json (the spec).")
@click.option("--by", default="np", show_default=True, help="x axis of throughput and latency charts.")
@source_option
@cli_mod.store_option
def chart(kind: str, runs: tuple[str, ...], out: Path, by: str, source: str, store_path: Path | None) -> None:
    """Draw a chart KIND for RUNS (all runs when none is named) and save it; the extension picks the format."""
    from forensics import charts

    c = charts.build(cli_mod.open_store(store_path), kind, list(runs), by=by, source=source)
    path = charts.save(c, out, title=f"forensics {kind}")
    click.echo(f"chart: {kind} written to {path}", err=True)


@click.command(epilog="""\b
Examples:
  forensics report run-42 -o run-42.html        one run: verdict, timeline, findings, throughput
  forensics report run-np1 run-np2 run-np4      a sweep: the throughput section compares these runs
""")
@click.argument("runs", nargs=-1)
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=Path("report.html"),
              show_default=True, help="HTML file to write (one self-contained file, works offline).")
@cli_mod.store_option
def report(runs: tuple[str, ...], out: Path, store_path: Path | None) -> None:
    """Write one self-contained HTML report for RUNS (optional when the store holds one run): the verdict,
    the timeline, the findings and the throughput, readable offline."""
    from forensics import report as report_mod

    res = report_mod.write_report(cli_mod.open_store(store_path), list(runs), out)
    for note in res.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"report: written to {res.path}", err=True)


def register(cli: click.Group) -> None:
    for command in (throughput, smoke, chart, report):
        cli.add_command(command)

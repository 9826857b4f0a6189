"""Commands ``throughput``, ``smoke``, ``chart`` and ``report``: thin shells over forensics.metrics,
forensics.charts and forensics.report."""

from __future__ import annotations

import sys
from pathlib import Path

import click


def register(cli: click.Group) -> None:
    from forensics import cli as cli_mod
    from forensics import metrics
    from forensics.render import render
    from forensics.store import Store

    source_option = click.option(
        "--source", type=click.Choice(list(metrics.SOURCES)), default="auto", show_default=True,
        help="Requests from the server logs, the replay records, or records when the run has them.")

    @cli.command()
    @click.argument("runs", nargs=-1)
    @click.option("--by", default=None,
                  help="Compare runs by this field: np, a column of the table, or a key of the runs' config "
                       "(prints the table against it, the fit and the knee).")
    @source_option
    @cli_mod.format_option
    @cli_mod.store_option
    def throughput(runs: tuple[str, ...], by: str | None, source: str, fmt: str, store_path: Path | None) -> None:
        """Throughput, latency and concurrency per run; with --by, across runs against concurrency.

        \b
        forensics throughput                    one row per run
        forensics throughput --by np            throughput and latency vs np, fit, knee
        forensics throughput --by ctx_size      grouped by a key of the runs' config
        """
        store = Store(cli_mod.resolve_store(store_path))
        m = metrics.throughput(store, list(runs), source=source)
        if by is None:
            render(m, fmt, sys.stdout)
            estimated = m.filter(m["estimated"])["run"].to_list()
            if estimated:
                click.echo(f"note: runs {', '.join(estimated)} have no timestamps: wall_s, rates, "
                           "effective_concurrency and peak_busy_slots are estimates from request order", err=True)
            return
        sc = metrics.scaling(m, by=by, store=store)
        render(sc.table, fmt, sys.stdout)
        for note in sc.notes:
            click.echo(f"note: {note}", err=True)
        if sc.fit is not None:
            click.echo(f"fit: latency_p50_s = {sc.fit.a:.3f} + {sc.fit.b:.3f} x {by} "
                       f"(b: seconds one more concurrent request adds; {sc.fit.n} runs"
                       + (f", r2 {sc.fit.r2:.2f}" if sc.fit.r2 is not None else "") + ")", err=True)
        click.echo(sc.sentence, err=True)
        if sc.model_sentence:
            click.echo(sc.model_sentence, err=True)

    @cli.command()
    @click.argument("runs", nargs=-1, required=True)
    @click.option("--max-run", default=None, help='Budget for the whole run ("20m", "1h", "900s", seconds).')
    @click.option("--max-request", default=None, help='Budget for the longest request ("90s", "1500ms").')
    @click.option("--max-p95", default=None, help="Budget for the p95 request latency.")
    @source_option
    @cli_mod.format_option
    @cli_mod.store_option
    def smoke(runs: tuple[str, ...], max_run: str | None, max_request: str | None, max_p95: str | None,
              source: str, fmt: str, store_path: Path | None) -> None:
        """Pass or fail each candidate RUN against time budgets, side by side; exit 1 when any fails."""
        store = Store(cli_mod.resolve_store(store_path))
        m = metrics.throughput(store, list(runs), source=source)
        res = metrics.smoke(
            m, max_run_s=metrics.parse_duration(max_run) if max_run else None,
            max_request_s=metrics.parse_duration(max_request) if max_request else None,
            max_p95_s=metrics.parse_duration(max_p95) if max_p95 else None)
        render(res.table, fmt, sys.stdout)
        failed = res.table.filter(res.table["verdict"] == "FAIL")["run"].to_list()
        click.echo("smoke: " + (f"FAIL ({', '.join(failed)})" if failed else "PASS"), err=True)
        if not res.passed:
            sys.exit(1)

    @cli.command()
    @click.argument("kind", type=click.Choice(["throughput", "latency", "timeline", "tokens", "busy"]))
    @click.argument("runs", nargs=-1)
    @click.option("-o", "--output", "out", type=click.Path(path_type=Path), required=True,
                  help="File to write: .html (interactive, offline), .png, .svg or .json (the spec).")
    @click.option("--by", default="np", show_default=True, help="x axis of throughput and latency charts.")
    @source_option
    @cli_mod.store_option
    def chart(kind: str, runs: tuple[str, ...], out: Path, by: str, source: str, store_path: Path | None) -> None:
        """Draw a chart KIND for RUNS (all runs when none) and save it; the extension picks the format."""
        from forensics import charts

        store = Store(cli_mod.resolve_store(store_path))
        c = charts.build(store, kind, list(runs), by=by, source=source)
        path = charts.save(c, out, title=f"forensics {kind}")
        click.echo(f"chart: {kind} written to {path}", err=True)

    @cli.command(epilog="""\b
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

        store = Store(cli_mod.resolve_store(store_path))
        res = report_mod.write_report(store, list(runs), out)
        for note in res.notes:
            click.echo(f"note: {note}", err=True)
        click.echo(f"report: written to {res.path}", err=True)

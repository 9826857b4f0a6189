"""Commands ``whatif`` and ``recommend``: thin shells over forensics.planning."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from forensics.commands import options as cli_mod

WHATIF_EXAMPLES = """
\b
Examples:
  forensics whatif run-np4 --np 8                 run-np4's own requests on 8 slots: run time, latencies, bands
  forensics whatif run-np4 --cap 1024             the same run with an output cap: what it cuts, the time saved
  forensics whatif run-np4 --cap 1024 --cuts      the outputs the cap cuts, one row each (runaway or normal)
  forensics whatif run-np4 --errors               the leave-one-np-out errors the bands come from
  forensics whatif run-a run-b --np 8             several runs (of one setup or several): one row per run and figure
"""


@click.command(epilog=WHATIF_EXAMPLES)
@click.argument("runs", nargs=-1, required=True, metavar="RUN...")
@click.option("--np", "np_", type=click.IntRange(min=1), default=None,
              help="Parallel slots to predict at (default: the run's own).")
@click.option("--cap", type=click.IntRange(min=1), default=None, help="Output cap (max_tokens / n_predict) to apply.")
@click.option("--instance", default=None, help="The instance whose requests are replayed (default: the busiest).")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="The harness's concurrency (default: follows --np when the run's harness matched its np).")
@click.option("--cuts", "show", flag_value="cuts", help="Print the outputs the cap cuts instead of the figures.")
@click.option("--errors", "show", flag_value="errors", help="Print the leave-one-np-out folds the bands come from.")
@click.option("--busy", "show", flag_value="busy", help="Print the predicted busy slots over time.")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="Also draw the predicted busy slots: .html (offline), .png, .svg or .json.")
@cli_mod.format_option
@cli_mod.store_option
def whatif(runs: tuple[str, ...], **opts: Any) -> None:
    """Replay each RUN's own workload (its requests, their order, dependencies and concurrency) through a cost
    model fitted on the store's healthy runs of its setup, at another np and/or with an output cap.  stdout: each
    figure predicted with its error band (and what was measured at that np); with several runs, one row per run
    and figure (runs of several setups: each through its own setup's model); stderr: the answer in words."""
    from forensics import planning
    from forensics.render import render

    a = cli_mod.typed_options(WhatIfArgs, opts)
    store = cli_mod.open_store(a.store_path)
    if len(runs) == 1:
        found = [planning.whatif(store, runs[0], np_=a.np_, cap=a.cap, concurrency=a.concurrency,
                                 instance=a.instance)]
    else:
        found = planning.whatif_all(store, list(runs), np_=a.np_, cap=a.cap, concurrency=a.concurrency,
                                    instance=a.instance)
    frames = [{"cuts": r.cuts, "errors": r.folds, "busy": r.busy}.get(a.show or "", r.table) for r in found]
    if len(found) == 1:
        render(frames[0], a.fmt, sys.stdout)
    else:
        import polars as pl

        render(pl.concat([f.select(pl.lit(r.run).alias("run"), pl.all()) for r, f in zip(found, frames, strict=True)],
                         how="diagonal_relaxed"), a.fmt, sys.stdout)
    for res in found:
        tag = f"{res.run}: " if len(found) > 1 else ""
        for note in res.notes:
            click.echo(f"note: {tag}{note}", err=True)
        for sentence in res.sentences:
            click.echo(sentence, err=True)
    if a.out is not None:
        from forensics.planning import charts

        path = charts.save(charts.busy_charts(found), a.out, title="forensics whatif " + " ".join(r.run for r in found))
        click.echo(f"whatif: chart written to {path}", err=True)


@dataclass(frozen=True)
class WhatIfArgs:
    np_: int | None
    cap: int | None
    instance: str | None
    concurrency: int | None
    show: str | None
    out: Path | None
    fmt: str
    store_path: Path | None


RECOMMEND_EXAMPLES = """
\b
Examples:
  forensics recommend --max-run 5m --max-request 90s                   the np that meets both, from every run
  forensics recommend sweep-np1 sweep-np2 sweep-np8 --max-run 5m --max-request 90s --max-p95 60s
  forensics recommend --max-run 5m --max-request 90s --cap auto -o np.html   with the recommended cap, and a chart
"""


@click.command(epilog=RECOMMEND_EXAMPLES)
@click.argument("runs", nargs=-1)
@click.option("--max-run", default=None, help='Budget for the whole run ("5m", "1h", "900s", seconds).')
@click.option("--max-request", default=None, help='Budget for the longest request ("90s", "1500ms").')
@click.option("--max-p95", default=None, help="Budget for the p95 request latency.")
@click.option("--np-range", default=None,
              help='Candidate np: "1-16", "1,2,4,8", "2-8,16" (default: 1, 2, 4, 8, 16 and every np measured).')
@click.option("--cap", default="none", show_default=True,
              help="Output cap to predict with: auto (the cap finding's), none, or a number of tokens.")
@click.option("--instance", default=None, help="The instance whose requests are replayed (default: the busiest).")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="Also draw predicted vs measured run time and latency against np: .html, .png, .svg or .json.")
@cli_mod.format_option
@cli_mod.store_option
@click.pass_context
def recommend(ctx: click.Context, runs: tuple[str, ...], **opts: Any) -> None:
    """The np with the highest throughput that meets every budget, for the sweep of RUNS (all runs when none is
    named), measured where a healthy run was, predicted with its error band elsewhere; runs of several setups get
    one answer per setup (a `setup` column and one sentence each); exit 1 when no np meets them (for some setup)."""
    from forensics import metrics, planning
    from forensics.errors import ExitCode
    from forensics.render import render

    a = cli_mod.typed_options(RecommendArgs, opts)
    budgets = planning.Budgets(*(metrics.parse_duration(v) if v else None
                                 for v in (a.max_run, a.max_request, a.max_p95)))
    recs = planning.recommend_all(cli_mod.open_store(a.store_path), list(runs), budgets,
                                  np_range=planning.parse_np_range(a.np_range) if a.np_range else None, cap=a.cap,
                                  instance=a.instance)
    render(planning.recommendations_table(recs), a.fmt, sys.stdout)
    for line in planning.recommendations_words(recs):
        click.echo(line, err=True)
    if a.out is not None:
        from forensics.planning import charts

        path = charts.save(charts.recommend_charts(recs), a.out, title="forensics recommend")
        click.echo(f"recommend: chart written to {path}", err=True)
    if any(r.np is None and r.error is None for r in recs):
        ctx.exit(int(ExitCode.FINDINGS))


@dataclass(frozen=True)
class RecommendArgs:
    max_run: str | None
    max_request: str | None
    max_p95: str | None
    np_range: str | None
    cap: str
    instance: str | None
    out: Path | None
    fmt: str
    store_path: Path | None


def register(cli: click.Group) -> None:
    for command in (whatif, recommend):
        cli.add_command(command)

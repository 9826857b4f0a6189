"""Finding commands: runaways, deadslots, cap, errors (thin shells over forensics.findings).

Each takes RUN... (every run when none is named; a run's alias works too) and ``--fail-on any`` to exit 1
when it finds something, for smoke tests and CI."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from forensics import cli as cli_mod
from forensics import findings as F

THRESHOLDS = F.Thresholds()


@dataclass(frozen=True)
class CapArgs:
    """``forensics cap``'s output options; ``thresholds``: the runaway options as given."""

    fail_on: str
    fmt: str
    store_path: Path | None
    thresholds: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DeadSlotsArgs(CapArgs):
    """``forensics deadslots``: what to list and how."""

    include_recovered: bool = False
    explain: bool = False


def runaway_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    d = THRESHOLDS
    for opt in reversed([
        click.option("--factor", type=float, default=None,
                     help=f"Runaway: tokens > FACTOR x the group's normal quantile [default: {d.factor}]."),
        click.option("--quantile", type=float, default=None,
                     help=f"Quantile of normal generated tokens used as the baseline [default: {d.quantile}]."),
        click.option("--min-tokens", type=int, default=None,
                     help=f"Runaway: at least this many generated tokens [default: {d.min_tokens}]."),
        click.option("--min-group", type=int, default=None,
                     help=f"Smaller stage/instance groups use the whole run's baseline [default: {d.min_group}]."),
        click.option("--ctx-slack", type=int, default=None,
                     help=f"Reached the context: n_past_end >= n_ctx_slot - SLACK [default: {d.ctx_slack}]."),
    ]):
        fn = opt(fn)
    return fn


def dead_slot_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    d = THRESHOLDS
    for opt in reversed([
        click.option("--long-factor", type=float, default=None,
                     help=f"Abnormally long: seconds > X x the group's median [default: {d.long_factor}]."),
        click.option("--min-seconds", type=float, default=None,
                     help=f"Abnormally long: and at least this many seconds [default: {d.min_seconds}]."),
        click.option("--slow-factor", type=float, default=None,
                     help=f"Abnormally slow: ms/token > X x the group's median [default: {d.slow_factor}]."),
        click.option("--few-tokens", type=int, default=None,
                     help=f"A handful of tokens: at most this many [default: {d.few_tokens}] ..."),
        click.option("--few-normal", type=float, default=None,
                     help=f"... where the group's median is at least this many [default: {d.few_normal}]."),
    ]):
        fn = opt(fn)
    return fn


def asked(store: Any, runs: tuple[str, ...], need: str, command: str) -> list[str] | None:
    """The runs to read (None: every run), aliases resolved with a note; a named run without the half the
    command reads is an error."""
    from forensics import runs as runs_mod

    if not runs:
        return None
    res = runs_mod.resolve(store, runs, need=need, command=command)
    for note in res.notes:
        click.echo(f"note: {note}", err=True)
    return res.runs


def gate(ctx: click.Context, fail_on: str, found: int) -> None:
    """``--fail-on any``: exit 1 when something was found."""
    from forensics.errors import ExitCode

    if fail_on == "any" and found:
        ctx.exit(int(ExitCode.FINDINGS))


@click.command(epilog="""\b
Examples:
  forensics runaways run-42                  the outputs that ran away in run-42, why, and what followed
  forensics runaways --fail-on any           exit 1 when any run has one (a CI gate)
""")
@click.argument("runs", nargs=-1)
@runaway_options
@cli_mod.fail_on_option
@cli_mod.format_option
@cli_mod.store_option
@click.pass_context
def runaways(ctx: click.Context, runs: tuple[str, ...], fail_on: str, fmt: str, store_path: Path | None,
             **th: float | int | None) -> None:
    """Requests whose output ran away: far more tokens than normal, reached the slot's context, or cut at
    the training-context cap; with why and what followed."""
    from forensics.render import render

    store = cli_mod.open_store(store_path)
    df = F.find_runaways(store, asked(store, runs, "requests", "runaways"), **th)  # type: ignore[arg-type]
    render(df, fmt, sys.stdout)
    gate(ctx, fail_on, df.height)


@click.command(epilog="""\b
Examples:
  forensics deadslots run-42 --explain       each dead slot with the request sequence behind the verdict
  forensics deadslots --fail-on any          exit 1 when a slot died in any run (wire it to a restart)
""")
@click.argument("runs", nargs=-1)
@runaway_options
@dead_slot_options
@click.option("--include-recovered", is_flag=True,
              help="Also list slots that served normally again at the end (recovered = true).")
@click.option("--explain", is_flag=True, help="Show the per-slot request sequence behind each verdict.")
@cli_mod.fail_on_option
@cli_mod.format_option
@cli_mod.store_option
@click.pass_context
def deadslots(ctx: click.Context, runs: tuple[str, ...], **opts: Any) -> None:
    """Slots that went bad: dead from the first of two consecutive abnormal requests (a runaway, an
    abnormally long or slow request, a handful of tokens where normal is hundreds, the same error again)."""
    a = cli_mod.typed_options(DeadSlotsArgs, opts)
    store = cli_mod.open_store(a.store_path)
    rep = F.dead_slot_report(store, asked(store, runs, "requests", "deadslots"),  # type: ignore[arg-type]
                             include_recovered=a.include_recovered, **a.thresholds)
    _render_dead(rep, a.explain, a.fmt)
    gate(ctx, a.fail_on, rep.slots.height)


def _render_dead(rep: Any, explain: bool, fmt: str) -> None:
    from forensics.render import render, to_json

    keys = ["run", "instance", "slot"]
    if explain and fmt == "json":
        out = []
        for row in json.loads(to_json(rep.slots)):
            part = rep.sequence.filter(*[rep.sequence[k] == row[k] for k in keys])
            out.append({**row, "sequence": json.loads(to_json(part))})
        sys.stdout.write(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
        return
    render(rep.slots, fmt, sys.stdout)
    if not explain:
        return
    for row in rep.slots.iter_rows(named=True):
        part = rep.sequence.filter(*[rep.sequence[k] == row[k] for k in keys])
        sys.stdout.write(f"\n# {row['run']} {row['instance']} slot {row['slot']}: dead from seq {row['seq']}\n"
                         if fmt == "table" else "\n")
        render(part, fmt, sys.stdout)


@click.command(epilog="""\b
Examples:
  forensics cap run-42                       the cap to set, and what candidate caps would have done
  forensics cap --margin 0.5 --fail-on any   more headroom; exit 1 when a run had runaways and no cap
""")
@click.argument("runs", nargs=-1)
@click.option("--margin", type=float, default=0.2, show_default=True,
              help="Headroom above the longest normal response before rounding up.")
@runaway_options
@cli_mod.fail_on_option
@cli_mod.format_option
@cli_mod.store_option
@click.pass_context
def cap(ctx: click.Context, runs: tuple[str, ...], margin: float, **opts: Any) -> None:
    """Recommend an output-token cap (max_tokens / n_predict) and show what candidate caps would do; with
    --fail-on any, exit 1 when a run had runaways and no cap in force."""
    from forensics.render import render

    a = cli_mod.typed_options(CapArgs, opts)
    fail_on, fmt, th = a.fail_on, a.fmt, a.thresholds
    store = cli_mod.open_store(a.store_path)
    names = asked(store, runs, "requests", "cap")
    res = F.recommend_cap(store, names, margin=margin, **th)
    for w in res.warnings:
        click.echo(f"warning: {w}", err=True)
    if res.cap is not None:
        click.echo(f"recommended output cap: {res.cap} (longest normal response +{margin:.0%}, rounded up)",
                   err=True)
    render(res.whatif, fmt, sys.stdout)
    if fail_on == "any":
        gate(ctx, fail_on, F.uncapped_runaway_runs(store, names, margin=margin, **th).height)


@click.command(epilog="""\b
Examples:
  forensics errors run-42                    errors and warnings of run-42 grouped by message shape
  forensics errors --fail-on any             exit 1 on any error or crash (warnings do not count)
""")
@click.argument("runs", nargs=-1)
@cli_mod.fail_on_option
@cli_mod.format_option
@cli_mod.store_option
@click.pass_context
def errors(ctx: click.Context, runs: tuple[str, ...], fail_on: str, fmt: str, store_path: Path | None) -> None:
    """Server-side errors, crashes and warnings grouped by message shape (numbers, ids and quoted words
    masked), with where they first and last appeared and the lines to read."""
    from forensics.render import render

    store = cli_mod.open_store(store_path)
    df = F.error_groups(store, asked(store, runs, "log", "errors"))  # type: ignore[arg-type]
    render(df, fmt, sys.stdout)
    gate(ctx, fail_on, F.serious_errors(df).height)


def register(cli: click.Group) -> None:
    for command in (runaways, deadslots, cap, errors):
        cli.add_command(command)

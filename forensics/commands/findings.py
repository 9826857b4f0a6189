"""Finding commands: one per finding of the registry that names a command (runaways, deadslots, cap, errors, ...).

Each takes RUN... (every run when none is named; a run's alias works too), the thresholds its finding declares
as options, ``--format`` and ``--fail-on any`` (exit 1 when the finding's counted rows are not empty, for smoke
tests and CI).  A finding's command is made from its registry entry; deadslots (``--explain``) and cap (the
what-if table) render more than the listing."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import click

from forensics import registry
from forensics.commands import options as cli_mod
from forensics.thresholds import Thresholds

# The commands are built from the registry and the thresholds, both light: the findings themselves (DuckDB,
# polars) load when a command runs, so `forensics --help` does not pay for them.
THRESHOLDS = Thresholds()
KNOBS = {f.name: f for f in fields(Thresholds)}


def threshold_options(names: tuple[str, ...]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The click options of the thresholds ``names`` (their help from ``Thresholds``; unset: the default)."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in reversed(names):
            knob, default = KNOBS[name], getattr(THRESHOLDS, name)
            flag = "--" + name.replace("_", "-")
            text = knob.metadata["help"]
            if isinstance(default, bool):
                fn = click.option(flag, is_flag=True, default=None, help=f"{text}.")(fn)
            else:
                fn = click.option(flag, type=type(default), default=None, help=f"{text} [default: {default}].")(fn)
        return fn
    return wrap


def runaway_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    return threshold_options(registry.RUNAWAY_OPTIONS)(fn)


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


def epilog(f: registry.Finding) -> str:
    width = max((len(cmd) for cmd, _ in f.examples), default=0) + 2
    return "\b\nExamples:\n" + "\n".join(f"  {cmd.ljust(width)} {what}" for cmd, what in f.examples) + "\n"


def listing_command(f: registry.Finding) -> click.Command:
    """The command of finding ``f``: its listing for RUN..., and its gate."""
    def run(ctx: click.Context, runs: tuple[str, ...], fail_on: str, fmt: str, store_path: Path | None,
            **th: Any) -> None:
        from forensics import findings as F
        from forensics.render import render

        store = cli_mod.open_store(store_path)
        with F.Analysis.open(store, asked(store, runs, f.needs, str(f.command))) as session:
            df = F.rows(session, f.name, None, F.thresholds(**th))
        render(df, fmt, sys.stdout)
        gate(ctx, fail_on, f.count_rows(df).height)

    run.__doc__ = f.summary
    fn: Callable[..., Any] = click.pass_context(run)
    for deco in (cli_mod.store_option, cli_mod.format_option, cli_mod.fail_on_option,
                 threshold_options(f.options), click.argument("runs", nargs=-1)):
        fn = deco(fn)
    return click.command(str(f.command), epilog=epilog(f), help=f.summary)(fn)


def deadslots_command(f: registry.Finding) -> click.Command:
    @click.command(str(f.command), epilog=epilog(f), help=f.summary)
    @click.argument("runs", nargs=-1)
    @threshold_options(f.options)
    @click.option("--explain", is_flag=True, help="Show the per-slot request sequence behind each verdict.")
    @cli_mod.fail_on_option
    @cli_mod.format_option
    @cli_mod.store_option
    @click.pass_context
    def deadslots(ctx: click.Context, runs: tuple[str, ...], explain: bool, fail_on: str, fmt: str,
                  **opts: Any) -> None:
        from forensics import findings as F

        store = cli_mod.open_store(opts.pop("store_path"))
        rep = F.dead_slot_report(store, asked(store, runs, f.needs, str(f.command)),
                                 include_recovered=bool(opts.pop("include_recovered", None)), **opts)
        _render_dead(rep, explain, fmt)
        gate(ctx, fail_on, rep.slots.height)

    return deadslots


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


def cap_command(f: registry.Finding) -> click.Command:
    @click.command(str(f.command), epilog=epilog(f),
                   help="Recommend an output-token cap (max_tokens / n_predict) and show what candidate caps would "
                        "do; with --fail-on any, exit 1 when a run had runaways and no cap in force.")
    @click.argument("runs", nargs=-1)
    @threshold_options(f.options)
    @cli_mod.fail_on_option
    @cli_mod.format_option
    @cli_mod.store_option
    @click.pass_context
    def cap(ctx: click.Context, runs: tuple[str, ...], fail_on: str, fmt: str, store_path: Path | None,
            **th: Any) -> None:
        from forensics import findings as F
        from forensics.render import render

        store = cli_mod.open_store(store_path)
        margin = th.pop("margin", None)
        margin = THRESHOLDS.margin if margin is None else margin
        names = asked(store, runs, f.needs, str(f.command))
        with F.Analysis.open(store, names) as session:
            res = F.recommend_cap(session, None, margin=margin, **th)
            gated = f.count_rows(F.caps_by_run(session, None, margin=margin, **th)).height
        for w in res.warnings:
            click.echo(f"warning: {w}", err=True)
        if res.cap is not None:
            click.echo(f"recommended output cap: {res.cap} (longest normal response +{margin:.0%}, rounded up)",
                       err=True)
        render(res.whatif, fmt, sys.stdout)
        gate(ctx, fail_on, gated)

    return cap


# Commands that render more than their finding's listing.
CUSTOM: dict[str, Callable[[registry.Finding], click.Command]] = {"deadslots": deadslots_command, "cap": cap_command}


def register(cli: click.Group) -> None:
    for f in registry.findings():
        if f.command:
            cli.add_command(CUSTOM.get(f.command, listing_command)(f))

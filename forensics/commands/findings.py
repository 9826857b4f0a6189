"""Finding commands: runaways, deadslots, cap, errors (thin shells over forensics.findings)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

FAIL_ON = click.Choice(["any", "never"])


def register(cli: click.Group) -> None:
    from forensics import cli as cli_mod
    from forensics import findings as F
    from forensics.errors import ExitCode
    from forensics.render import render, to_json
    from forensics.store import Store

    def open_store(path: Path | None) -> Store:
        return Store(cli_mod.resolve_store(path))

    def asked(store: Store, run: str | None, need: str, command: str) -> str | None:
        """The run to read: an alias resolved, and a run without a server log said so (exit 2)."""
        from forensics import replay

        check = replay.check_run(store, run, need=need, command=command)
        for note in check.notes:
            click.echo(f"note: {note}", err=True)
        return check.run

    def runaway_options(fn):  # type: ignore[no-untyped-def]
        d = F.Thresholds()
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

    def fail_on_option(fn):  # type: ignore[no-untyped-def]
        return click.option("--fail-on", type=FAIL_ON, default="never", show_default=True,
                            help="Exit 1 when something is found (any), for smoke tests and CI.")(fn)

    @cli.command()
    @click.argument("run", required=False)
    @runaway_options
    @fail_on_option
    @cli_mod.format_option
    @cli_mod.store_option
    @click.pass_context
    def runaways(ctx: click.Context, run: str | None, fail_on: str, fmt: str, store_path: Path | None,
                 **th: float | int | None) -> None:
        """Requests whose output ran away: far more tokens than normal, reached the slot's context, or cut
        at the training-context cap; with why and what followed."""
        store = open_store(store_path)
        df = F.find_runaways(store, asked(store, run, "requests", "runaways"), **th)
        render(df, fmt, sys.stdout)
        if fail_on == "any" and df.height:
            ctx.exit(int(ExitCode.FINDINGS))

    @cli.command()
    @click.argument("run", required=False)
    @runaway_options
    @click.option("--long-factor", type=float, default=None,
                  help=f"Abnormally long: seconds > X x the group's median [default: {F.Thresholds.long_factor}].")
    @click.option("--min-seconds", type=float, default=None,
                  help=f"Abnormally long: and at least this many seconds [default: {F.Thresholds.min_seconds}].")
    @click.option("--slow-factor", type=float, default=None,
                  help=f"Abnormally slow: ms/token > X x the group's median [default: {F.Thresholds.slow_factor}].")
    @click.option("--few-tokens", type=int, default=None,
                  help=f"A handful of tokens: at most this many [default: {F.Thresholds.few_tokens}] ...")
    @click.option("--few-normal", type=float, default=None,
                  help=f"... where the group's median is at least this many [default: {F.Thresholds.few_normal}].")
    @click.option("--include-recovered", is_flag=True,
                  help="Also list slots that served normally again at the end (recovered = true).")
    @click.option("--explain", is_flag=True, help="Show the per-slot request sequence behind each verdict.")
    @fail_on_option
    @cli_mod.format_option
    @cli_mod.store_option
    @click.pass_context
    def deadslots(ctx: click.Context, run: str | None, include_recovered: bool, explain: bool, fail_on: str,
                  fmt: str, store_path: Path | None, **th: float | int | None) -> None:
        """Slots that went bad: dead from the first of two consecutive abnormal requests (a runaway, an
        abnormally long or slow request, a handful of tokens where normal is hundreds, the same error again)."""
        store = open_store(store_path)
        rep = F.dead_slot_report(store, asked(store, run, "requests", "deadslots"), include_recovered=include_recovered,
                                 **th)
        if explain and fmt == "json":
            keys = ["run", "instance", "slot"]
            out = []
            for row in json.loads(to_json(rep.slots)):
                part = rep.sequence.filter(*[rep.sequence[k] == row[k] for k in keys])
                out.append({**row, "sequence": json.loads(to_json(part))})
            sys.stdout.write(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
        else:
            render(rep.slots, fmt, sys.stdout)
            if explain:
                for row in rep.slots.iter_rows(named=True):
                    part = rep.sequence.filter((rep.sequence["run"] == row["run"])
                                               & (rep.sequence["instance"] == row["instance"])
                                               & (rep.sequence["slot"] == row["slot"]))
                    if fmt == "table":
                        sys.stdout.write(f"\n# {row['run']} {row['instance']} slot {row['slot']}: "
                                         f"dead from seq {row['seq']}\n")
                    else:
                        sys.stdout.write("\n")
                    render(part, fmt, sys.stdout)
        if fail_on == "any" and rep.slots.height:
            ctx.exit(int(ExitCode.FINDINGS))

    @cli.command()
    @click.argument("runs", nargs=-1)
    @click.option("--margin", type=float, default=0.2, show_default=True,
                  help="Headroom above the longest normal response before rounding up.")
    @runaway_options
    @cli_mod.format_option
    @cli_mod.store_option
    def cap(runs: tuple[str, ...], margin: float, fmt: str, store_path: Path | None,
            **th: float | int | None) -> None:
        """Recommend an output-token cap (max_tokens / n_predict) and show what candidate caps would do."""
        res = F.recommend_cap(open_store(store_path), list(runs), margin=margin, **th)
        for w in res.warnings:
            click.echo(f"warning: {w}", err=True)
        if res.cap is not None:
            click.echo(f"recommended output cap: {res.cap} (longest normal response +{margin:.0%}, rounded up)",
                       err=True)
        render(res.whatif, fmt, sys.stdout)

    @cli.command()
    @click.argument("run", required=False)
    @cli_mod.format_option
    @cli_mod.store_option
    def errors(run: str | None, fmt: str, store_path: Path | None) -> None:
        """Server-side errors and warnings grouped by message shape (numbers, ids and quoted words masked)."""
        store = open_store(store_path)
        render(F.error_groups(store, asked(store, run, "log", "errors")), fmt, sys.stdout)

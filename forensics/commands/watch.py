"""``forensics watch``: a thin shell over ``forensics.watch.watch``."""

from __future__ import annotations

import json
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from forensics.commands import options as cli_mod


def _duration(text: str) -> float:
    from forensics.metrics import parse_duration

    return parse_duration(text)


@dataclass(frozen=True)
class WatchArgs:
    """The command line of ``forensics watch``, as click parsed it."""

    paths: tuple[str, ...]
    run: str | None
    on_dead_slot: str | None
    on_runaway: str | None
    on_crash: str | None
    on_any: str | None
    webhooks: tuple[str, ...]
    servers: tuple[str, ...]
    poll_s: str
    cpu_budget: float
    timeout: str
    retries: int
    backlog: bool
    no_events: bool
    once: bool
    tz: str
    mapping: str | None
    store_path: Path | None


def _options(a: WatchArgs) -> Any:
    """The library's ``WatchOptions`` for a command line: one hook per --on-* and --webhook."""
    from forensics import watch as W

    hooks = [W.Hook(name, frozenset({kind}) if kind else None, command=cmd)
             for name, kind, cmd in (("on-dead-slot", "dead_slot", a.on_dead_slot), ("on-runaway", "runaway", a.on_runaway),
                                     ("on-crash", "crash", a.on_crash), ("on-any", None, a.on_any)) if cmd]
    hooks += [W.Hook(f"webhook-{i + 1}" if len(a.webhooks) > 1 else "webhook", None, url=u)
              for i, u in enumerate(a.webhooks)]
    return W.WatchOptions(
        paths=[Path(p) for p in a.paths], store=cli_mod.resolve_store(a.store_path), run=a.run, hooks=hooks,
        servers=list(a.servers), poll_s=_duration(a.poll_s), cpu_budget=a.cpu_budget,
        retry=W.RetryPolicy(attempts=a.retries, timeout_s=_duration(a.timeout)), backlog=a.backlog,
        events=not a.no_events, tz=a.tz, mapping=a.mapping, once=a.once)


@click.command(epilog="""\b
Examples:
  forensics watch /var/log/llama/main.log --on-dead-slot 'systemctl restart llama-main'
  forensics watch runs/ --webhook https://hooks.example.com/llama --server http://127.0.0.1:8080
""")
@click.argument("paths", nargs=-1, required=True)  # plain text: the library says what is wrong with a path
@click.option("--run", default=None, help="Run name for these files (default: the folder each file sits in).")
@click.option("--on-dead-slot", "on_dead_slot", metavar="CMD", help="Shell command run for each dead-slot alert.")
@click.option("--on-runaway", "on_runaway", metavar="CMD", help="Shell command run for each runaway alert.")
@click.option("--on-crash", "on_crash", metavar="CMD", help="Shell command run for each crash alert.")
@click.option("--on-any", "on_any", metavar="CMD", help="Shell command run for every alert.")
@click.option("--webhook", "webhooks", multiple=True, metavar="URL", help="POST each alert's JSON to URL.")
@click.option("--server", "servers", multiple=True, metavar="URL",
              help="Poll llama-server's /slots and /metrics at URL (e.g. http://127.0.0.1:8080).")
@click.option("--poll", "poll_s", default="1s", show_default=True,
              help="Check files without events, poll servers and time running requests this often.")
@click.option("--cpu-budget", default=0.05, show_default=True, type=click.FloatRange(0.001, 1.0),
              help="Share of one core watch may use on average; a busy log is then ingested in larger steps.")
@click.option("--timeout", "timeout", default="30s", show_default=True, help="Stop a hook that runs longer.")
@click.option("--retries", default=3, show_default=True, type=click.IntRange(1, 100),
              help="Attempts per alert and hook (waiting 1 s, 2 s, 4 s, ... between them).")
@click.option("--backlog", is_flag=True,
              help="Also raise the findings already in the logs the first time watch reads them.")
@click.option("--no-events", is_flag=True, help="Poll the files instead of using file-system events.")
@click.option("--once", is_flag=True, help="One pass over what is there now, deliver, and stop.")
@click.option("--tz", default="UTC", show_default=True, help="Time zone of log times written without one.")
@click.option("--mapping", default=None, help="TOML mapping for another harness's records (see ingest).")
@cli_mod.store_option
def watch(**opts: Any) -> None:
    """Follow growing logs and replay records; raise each new finding once (runaway, dead slot, crash; each
    suspected or confirmed) as a JSON line on stdout, to the --on-* commands (JSON on stdin, FORENSICS_*
    variables) and to --webhook.  Ctrl-C stops it with the store consistent."""
    from forensics import watch as W

    opts_ = _options(WatchArgs(**opts))
    stop = threading.Event()
    _on_signals(stop)
    summary = W.watch(opts_, on_alert=_print_alert, note=lambda t: click.echo(f"watch: {t}", err=True), stop=stop)
    click.echo(f"watch: stopped: {summary.raised} alert(s) raised, {summary.delivered} delivered, "
               f"{summary.failed} failed, {summary.pending} pending for the next watch", err=True)


def register(cli: click.Group) -> None:
    cli.add_command(watch)


def _print_alert(alert: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(alert, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def _on_signals(stop: threading.Event) -> None:
    """The first SIGINT/SIGTERM finishes the cycle under way (its commit included) and stops; a second one
    interrupts at once (the store's journal keeps it consistent)."""
    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        click.echo("watch: stopping after the cycle under way (interrupt again to stop at once)", err=True)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)

"""Core commands: ingest, sql, summary."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click


def register(cli: click.Group) -> None:
    # Only what the options need here: the parser, the store and polars load when a command runs,
    # so that every other command starts fast.
    from forensics import cli as cli_mod
    from parsers.spec import ALIASES, format_names

    @cli.command()
    @click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
    @click.option("--run", default=None, help="Run name for these files (default: the folder the file sits in).")
    @click.option("--format", "fmt", type=click.Choice(sorted([*format_names(), *ALIASES])), default=None,
                  help="Read with one format's line kinds only (default: every format; the one most lines "
                       "belong to is reported).")
    @click.option("--started-at", default=None, help="Wall-clock start of the server (ISO 8601) for elapsed-time logs.")
    @click.option("--mapping", default=None,
                  help="TOML mapping for another harness's records: a file, or a shipped one (vllm-bench, "
                       "guidellm, aiperf, llmperf, sglang).")
    @click.option("--keep-going", is_flag=True, help="Load the other files when one cannot be read (exit 0).")
    @click.option("--tz", default="UTC", show_default=True,
                  help="Time zone of log times written without one (syslog/journald prefixes), e.g. Europe/Berlin.")
    @cli_mod.store_option
    def ingest(paths: tuple[Path, ...], run: str | None, fmt: str | None, started_at: str | None,
               mapping: str | None, keep_going: bool, tz: str, store_path: Path | None) -> None:
        """Read llama-server logs and replay records (files or folders; .gz and .zst too) into the store."""
        from forensics import ingest as ingest_mod

        store_dir = cli_mod.resolve_store(store_path)
        t0 = time.monotonic()
        bar = _Progress(t0)
        failed: ingest_mod.FilesNotRead | None = None
        try:
            result = ingest_mod.ingest(
                store_dir, list(paths), run=run, fmt=fmt,
                started_at=ingest_mod.parse_time(started_at) if started_at else None,
                keep_going=keep_going, mapping=mapping, tz=tz, progress=bar.update,
                on_wait=lambda: click.echo(f"forensics: waiting for another ingest into {store_dir} to finish...",
                                           err=True),
            )
        except ingest_mod.FilesNotRead as exc:  # the other files are in: report them, then exit 2
            failed, result = exc, exc.result
        bar.close()
        for f in result.files:
            line = f"{f.status:<9} {f.path}  {f.kind}"
            if f.status not in {"unchanged", "error", "duplicate"} and not f.kind.startswith("records"):
                line += (f"  lines={f.lines} parsed={f.parsed} skipped={f.skipped} unparsed={f.unparsed} "
                         f"requests={f.requests}")
            if f.message:
                line += f"  {f.message}"
            click.echo(line, err=True)
        for w in result.warnings:
            click.echo(f"warning: {w}", err=True)
        shown = {f.message for f in result.files if f.status == "error"}
        for e in result.errors:
            if e not in shown:
                click.echo(f"error: {e}", err=True)
        t = result.totals
        click.echo(f"total: files={len(result.files)} lines={t['lines']} parsed={t['parsed']} "
                   f"skipped={t['skipped']} unparsed={t['unparsed']} requests={t['requests']} "
                   f"({time.monotonic() - t0:.1f}s) -> {store_dir}", err=True)
        if result.unknown_shapes:
            click.echo("most common unknown line shapes:", err=True)
            for shape, n in result.unknown_shapes:
                click.echo(f"  {n:>7}  {shape}", err=True)
        if failed is not None:
            raise failed

    @cli.command()
    @click.argument("query")
    @cli_mod.format_option
    @cli_mod.store_option
    def sql(query: str, fmt: str, store_path: Path | None) -> None:
        """Run a SQL QUERY (DuckDB) over the store's tables."""
        import duckdb

        from forensics.render import render
        from forensics.store import Store, fetch_pl

        store = Store(cli_mod.resolve_store(store_path))
        con = store.connect()
        try:
            df = fetch_pl(con, query)
        except duckdb.Error as exc:
            from forensics.errors import QueryError

            raise QueryError(str(exc).splitlines()[0], hint="check the SQL; tables: files, instances, events, "
                             "requests, unparsed, runs, attempts, items") from exc
        finally:
            con.close()
        render(df, fmt, sys.stdout)

    @cli.command()
    @cli_mod.format_option
    @cli_mod.store_option
    def summary(fmt: str, store_path: Path | None) -> None:
        """The verdict on each run first, then what the store holds: files, instances, and requests per run."""
        import json

        import polars as pl

        from forensics import ingest as ingest_mod
        from forensics.render import render, to_json
        from forensics.store import Store
        from forensics.verdict import verdict

        store = Store(cli_mod.resolve_store(store_path))
        verdicts = verdict(store)
        parts = ingest_mod.summary(store)
        if fmt == "json":
            body = [f'"verdict": {json.dumps([v.as_dict() for v in verdicts], ensure_ascii=False, default=str)}']
            body += [f'"{k}": {to_json(v)}' for k, v in parts.items()]
            sys.stdout.write("{" + ",".join(body) + "}\n")
            return
        if fmt == "table":
            click.echo("# verdict")
            for v in verdicts:
                click.echo(v.paragraph())
            click.echo("")
        else:
            render(pl.DataFrame({"run": [v.run for v in verdicts], "healthy": [v.healthy for v in verdicts],
                                 "verdict": [v.paragraph(evidence=False) for v in verdicts]}), fmt, sys.stdout)
        for name, df in parts.items():
            if fmt == "table":
                click.echo(f"# {name}")
            render(df, fmt, sys.stdout)
            if fmt == "table":
                click.echo("")


class _Progress:
    """A progress bar on stderr, shown only for ingests longer than a second."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.bar = None

    def update(self, done: int, total: int) -> None:
        if self.bar is None:
            if time.monotonic() - self.t0 < 1.0 or not total:
                return
            from rich.progress import BarColumn, Progress, TextColumn, TransferSpeedColumn

            self.bar = Progress(TextColumn("ingest"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                                TransferSpeedColumn(), transient=True,
                                console=__import__("rich.console").console.Console(stderr=True))
            self.bar.start()
            self.task = self.bar.add_task("ingest", total=total)
        self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()

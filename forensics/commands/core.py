"""Core commands: ingest, sql, summary."""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import click

from forensics import schema
from forensics.commands import options as cli_mod


def _format_choices() -> list[str]:
    from parsers.spec import ALIASES, format_names  # the format files are read when `ingest` needs them

    return sorted([*format_names(), *ALIASES])


@dataclass(frozen=True)
class IngestArgs:
    """``forensics ingest``'s options, as click parsed them."""

    run: str | None
    fmt: str | None
    started_at: str | None
    mapping: str | None
    keep_going: bool
    tz: str
    exclude: tuple[str, ...]
    verbose: bool
    store_path: Path | None


@click.command(epilog="""\b
Examples:
  forensics ingest logs/                         every log and record file under logs/, one run per folder
  forensics ingest run-42/ --mapping guidellm    a folder with a peer tool's results beside the server log
  forensics ingest server.log --run run-42 -v    one file, named run, a line per file read
""")
@click.argument("paths", nargs=-1, required=True)  # plain text: the library says what is wrong with a path
@click.option("--run", default=None, help="Run name for these files (default: the folder the file sits in).")
@click.option("--format", "fmt", type=cli_mod.LazyChoice(_format_choices), default=None,
              help="Read with one format's line kinds only (default: every format; the one most lines "
                   "belong to is reported).")
@click.option("--started-at", default=None, help="Wall-clock start of the server (ISO 8601) for elapsed-time logs.")
@click.option("--mapping", default=None,
              help="TOML mapping for another harness's records: a file, or a shipped one (vllm-bench, "
                   "guidellm, aiperf, llmperf, sglang).")
@click.option("--keep-going", is_flag=True, help="Load the other files when one cannot be read (exit 0).")
@click.option("--exclude", multiple=True, metavar="GLOB",
              help="Leave out files whose name (or path below a folder given) matches GLOB; repeatable.")
@click.option("--tz", default="UTC", show_default=True,
              help="Time zone of log times written without one (syslog/journald prefixes), e.g. Europe/Berlin.")
@click.option("-v", "--verbose", is_flag=True, help="One line per file read (files with something to say are "
                                                    "always listed).")
@cli_mod.store_option
def ingest(paths: tuple[str, ...], **opts: Any) -> None:
    """Read llama-server logs and replay records (files or folders; .gz and .zst too) into the store: one
    progress bar while it reads, then one summary line."""
    from forensics import analyse
    from forensics import ingest as ingest_mod

    a = cli_mod.typed_options(IngestArgs, opts)
    started_at, verbose = a.started_at, a.verbose
    store_dir = cli_mod.resolve_store(a.store_path)
    t0 = time.monotonic()
    bar = _Progress(t0)
    failed: ingest_mod.FilesNotRead | None = None
    try:
        options = ingest_mod.IngestOptions(
            run=a.run, fmt=a.fmt, started_at=ingest_mod.parse_time(started_at) if started_at else None,
            keep_going=a.keep_going, mapping=a.mapping, tz=a.tz, exclude=tuple(a.exclude))
        result = analyse.ingest_and_analyse(
            store_dir, [Path(p) for p in paths], options, progress=bar.update,
            on_wait=lambda: click.echo(f"forensics: waiting for another ingest into {store_dir} to finish...",
                                       err=True), note=lambda line: click.echo(line, err=True))
    except ingest_mod.FilesNotRead as exc:  # the other files are in: report them, then exit 2
        failed, result = exc, exc.result
    bar.close()
    _report_ingest(result, verbose, store_dir, time.monotonic() - t0)
    if failed is not None:
        raise failed


def _file_line(f: Any) -> str:
    line = f"{f.status:<9} {f.path}  {f.kind}"
    if f.status not in {"unchanged", "error", "duplicate", "skipped"} and not f.kind.startswith(("records", "server:")):
        line += (f"  lines={f.lines} parsed={f.parsed} skipped={f.skipped} unparsed={f.unparsed} "
                 f"requests={f.requests}")
    return line + (f"  {f.message}" if f.message else "")


def _report_ingest(result: Any, verbose: bool, store_dir: Path, seconds: float) -> None:
    """Per-file lines (with -v, else only files with a message), warnings, errors, one summary line."""
    for f in result.files:
        if verbose or (f.message and f.status != "skipped"):
            click.echo(_file_line(f), err=True)
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    shown = {f.message for f in result.files if f.status == "error"}
    for e in result.errors:
        if e not in shown:
            click.echo(f"error: {e}", err=True)
    t = result.totals
    by_status: dict[str, int] = {}
    for f in result.files:
        by_status[f.status] = by_status.get(f.status, 0) + 1
    statuses = ", ".join(f"{n} {s}" for s, n in sorted(by_status.items()))
    click.echo(f"total: files={len(result.files)} ({statuses}) lines={t['lines']} parsed={t['parsed']} "
               f"skipped={t['skipped']} unparsed={t['unparsed']} requests={t['requests']} ({seconds:.1f}s) "
               f"-> {store_dir}", err=True)
    if result.compacted:
        click.echo(result.compacted, err=True)
    if result.general_requests:
        click.echo(f"note: {result.general_requests} requests were read by the general rule from lines no format knows "
                   "(a slot or task id with token counts or timings): check them with "
                   "`forensics sql \"select * from requests where read_by = 'general'\"`", err=True)
    if result.unknown_shapes and verbose:
        click.echo("most common unknown line shapes:", err=True)
        for shape, n in result.unknown_shapes:
            click.echo(f"  {n:>7}  {shape}", err=True)
    elif result.unknown_shapes:
        click.echo(f"note: {t['unparsed']} lines were not understood: -v lists their most common shapes", err=True)


class _Progress:
    """One progress bar on stderr for the whole ingest (bytes read, percent, time left, files, requests), shown only
    for ingests longer than ``after_s`` and only on a terminal: click's bar (no second terminal library)."""

    def __init__(self, t0: float, file: TextIO | None = None, after_s: float = 1.0) -> None:
        self.t0, self.after_s = t0, after_s
        self.file = file if file is not None else sys.stderr
        self.bar: Any = None
        self.shown = contextlib.ExitStack()

    def update(self, at: Any) -> None:
        if self.bar is None:
            if time.monotonic() - self.t0 < self.after_s or not at.bytes_total or not self.file.isatty():
                return
            bar = click.progressbar(length=at.bytes_total, label="ingest", file=self.file, show_percent=True,
                                    item_show_func=_at)
            bar.current_item = at  # shown from the first drawing on
            self.bar = self.shown.enter_context(bar)
        self.bar.update(at.bytes_done - self.bar.pos, at)

    def close(self) -> None:
        self.shown.close()


def _at(at: Any) -> str | None:
    if at is None:
        return None
    return (f"{at.bytes_done / 2**20:.1f}/{at.bytes_total / 2**20:.1f} MiB  files {at.files_done}/{at.files_total}  "
            f"requests {at.requests:,}")


SQL_HELP = (f"Run a SQL QUERY (DuckDB) over the store's tables ({', '.join(schema.TABLES)}) and the analysis' "
            f"tables ({', '.join(schema.DERIVED)}, and finding_<name> for each finding); docs/tables.md has their "
            "columns.")


@click.command(help=SQL_HELP, short_help="Run a SQL QUERY (DuckDB) over the store's tables.", epilog="""\b
Examples:
  forensics sql "select slot, count(*) n, sum(gen_tokens) from requests group by slot"
  forensics sql "select * from unparsed limit 20" --format csv
""")
@click.argument("query")
@cli_mod.format_option
@cli_mod.store_option
def sql(query: str, fmt: str, store_path: Path | None) -> None:
    # the help names the tables from forensics.schema (SQL_HELP): one list, never a second one to keep
    from forensics.render import render
    from forensics.sql import run_sql

    render(run_sql(cli_mod.open_store(store_path), query), fmt, sys.stdout)


@click.command(epilog="""\b
Examples:
  forensics summary                       the verdict, then files, instances and requests per run
  forensics summary --format json         the same as one JSON object
""")
@cli_mod.format_option
@cli_mod.store_option
def summary(fmt: str, store_path: Path | None) -> None:
    """The verdict on each run first, then what the store holds: files, instances, and requests per run."""
    import json

    import polars as pl

    from forensics.overview import summary as overview
    from forensics.render import render, to_json
    from forensics.verdict import verdict

    store = cli_mod.open_store(store_path)
    verdicts = verdict(store)
    parts = overview(store)
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


def register(cli: click.Group) -> None:
    for command in (ingest, sql, summary):
        cli.add_command(command)

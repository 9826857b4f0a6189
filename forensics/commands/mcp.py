"""``forensics mcp``: serve a store to an AI assistant over the Model Context Protocol (stdio), read-only."""

from __future__ import annotations

from pathlib import Path

import click

EXAMPLES = """
\b
Examples:
  forensics mcp --store runs/store               serve the store on stdin/stdout (an MCP client starts it)
  forensics mcp --store a --store b              two hosts' stores read as one
  forensics mcp --sql-rows 200 --sql-seconds 5   tighter limits for the sql tool
"""


@click.command(epilog=EXAMPLES)
@click.option("--store", "stores", multiple=True,
              help="Store directory to serve, read-only (repeatable; default: the --store given before the "
                   "command, else $FORENSICS_STORE, else ./forensics-store).")
@click.option("--sql-rows", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Most rows the sql tool returns.")
@click.option("--sql-seconds", type=click.FloatRange(min=0.1), default=20.0, show_default=True,
              help="Seconds after which the sql tool's query is stopped.")
@click.pass_context
def mcp(ctx: click.Context, stores: tuple[str, ...], sql_rows: int, sql_seconds: float) -> None:
    """Serve the store to an AI assistant (Claude Desktop, an IDE, any MCP client) over the Model Context
    Protocol on stdin/stdout: runs, the verdict with its evidence lines, every finding, missing, throughput,
    whatif, recommend, compare and read-only SQL, each returning the rows its command prints with --format json.
    Nothing is written and no file outside the store is read.  Needs the mcp extra: pip install
    'llama-forensics[mcp]'.  See docs/mcp.md for client configuration."""
    from forensics import mcp_server
    from forensics.paths import default_store_path
    from forensics.readonly import SqlLimits

    given = list(stores) or list((ctx.find_root().obj or {}).get("stores") or [])
    paths = [Path(s) for s in given] or [default_store_path()]
    mcp_server.require_sdk()
    store = mcp_server.open_store(paths)
    click.echo(f"forensics mcp: serving {', '.join(str(p) for p in paths)} read-only on stdio", err=True)
    mcp_server.serve(store, SqlLimits(max_rows=sql_rows, timeout_s=sql_seconds))


def register(cli: click.Group) -> None:
    cli.add_command(mcp)

"""``forensics mcp``: the store's questions (``forensics.assistant``) served to an AI assistant over the Model Context
Protocol, with the official ``mcp`` SDK (the ``[mcp]`` extra).

``server(store)`` is the SDK's low-level ``Server`` with two handlers: the tool list (``assistant.tools``) and a
call, which runs the tool's library call in a worker thread and answers its texts (the rows as JSON first); an
error of ours comes back as a tool error (``is_error``) with its one line, so the assistant can correct itself.
``serve(store)`` runs it over stdin/stdout; everything else the process says goes to stderr.

Library only: no click, no altair.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from forensics import assistant
from forensics.errors import ForensicsError, InputError
from forensics.readonly import ReadOnlyStore, SqlLimits

INSTRUCTIONS = (
    "llama-forensics over one store of llama-server logs and batch replay runs. Start with `runs` and `verdict` "
    "(what went wrong in each run and what to change, with the log lines it rests on); each finding_<name> lists "
    "its rows; `sql` answers anything else with one SELECT. Every answer is JSON rows first, then notes.")


def require_sdk() -> Any:
    """The ``mcp`` package, or an InputError that says how to install it."""
    try:
        import mcp
    except ImportError as exc:
        raise InputError("the MCP server needs the mcp package",
                         hint="pip install 'llama-forensics[mcp]'") from exc
    return mcp


def open_store(paths: list[Path]) -> Any:
    """The store (several: read as one fleet) at ``paths``, read-only."""
    if len(paths) == 1:
        return ReadOnlyStore(paths[0])
    from forensics.fleet import Fleet, host_label

    return Fleet([(host_label(p), ReadOnlyStore(p)) for p in paths])


def server(store: Any, limits: SqlLimits | None = None) -> Any:
    """The SDK's ``Server`` answering ``assistant.tools`` over ``store``."""
    require_sdk()
    import anyio
    import mcp_types as types
    from mcp.server import Server

    from forensics import __version__

    by_name = {t.name: t for t in assistant.tools(limits)}

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[
            types.Tool(name=t.name, description=f"{t.description} (the rows of `{t.mirrors} --format json`)",
                       input_schema=t.schema, annotations=types.ToolAnnotations(read_only_hint=True,
                                                                               destructive_hint=False,
                                                                               idempotent_hint=True,
                                                                               open_world_hint=False))
            for t in by_name.values()])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = by_name.get(params.name)
        if tool is None:
            return _error(f"no tool {params.name!r}; tools: {', '.join(by_name)}")
        try:
            texts = await anyio.to_thread.run_sync(assistant.call, store, tool, params.arguments)
        except ForensicsError as exc:
            return _error(exc.one_line())
        return types.CallToolResult(content=[types.TextContent(type="text", text=t) for t in texts])

    return Server("llama-forensics", version=__version__, instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=call_tool)


def _error(text: str) -> Any:
    import mcp_types as types

    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def serve(store: Any, limits: SqlLimits | None = None) -> None:
    """Serve ``store`` over stdin/stdout until the client closes them."""
    require_sdk()
    import anyio
    from mcp.server.stdio import stdio_server

    srv = server(store, limits)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await srv.run(read, write, srv.create_initialization_options())

    anyio.run(main)

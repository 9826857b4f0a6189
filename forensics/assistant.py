"""The questions an AI assistant may ask a store (``forensics mcp``): each a tool with a JSON-schema input, answered by
the same library call as the command it mirrors, and returning the same rows that command prints with
``--format json`` (``forensics.render.to_json``).

The tools: ``runs``, ``verdict``, one ``finding_<name>`` per finding of the registry (``forensics.registry``: made
from it, with the thresholds its command takes), ``missing``, ``throughput``, ``whatif``, ``recommend``, ``compare``
and ``sql``.  Each answer is a list of texts: the rows (JSON) first, then what the command says on stderr (notes,
sentences), when it says anything.

Every tool reads one store opened read-only (``forensics.readonly``): nothing is written, no path is taken from
the caller, and the SQL tool runs one SELECT with external access off under a row and a time limit.

Library only: no click, no altair, no MCP SDK (``forensics.mcp_server`` serves these tools).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from forensics import registry
from forensics.errors import QueryError
from forensics.readonly import SqlLimits
from forensics.thresholds import Thresholds

Answer = list[str]  # the rows as JSON, then lines of words
Handler = Callable[[Any, dict[str, Any]], Answer]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    schema: dict[str, Any]  # JSON schema of its arguments
    handler: Handler
    mirrors: str  # the command whose rows it returns


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False, default=str)


def _rows(df: Any) -> str:
    from forensics.render import to_json

    return to_json(df)


def _schema(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


RUNS = {"type": "array", "items": {"type": "string"},
        "description": "run names (a run's alias works too); none or empty: every run"}
RUN = {"type": "string", "description": "a run name (optional when the store holds one run)"}
BUDGET = {"type": "string", "description": 'a duration: "20m", "90s", "1500ms" or seconds'}


def _runs(args: dict[str, Any]) -> list[str]:
    return [str(r) for r in args.get("runs") or []]


# ---------------------------------------------------------------------------------------- the tools
def runs_tool(store: Any, args: dict[str, Any]) -> Answer:
    from forensics import runs as runs_mod
    from forensics.replay import tables as replay_tables

    names = _runs(args)
    asked = runs_mod.resolve(store, names, need="records", command="runs").runs if names else None
    return [_rows(replay_tables.runs_table(store, asked))]


def verdict_tool(store: Any, args: dict[str, Any]) -> Answer:
    from forensics.verdict import verdict

    verdicts = verdict(store, _runs(args) or None)
    return [_json([v.as_dict() for v in verdicts]), *[v.paragraph() for v in verdicts]]


def _notes(res: Any) -> list[str]:
    return [f"note: {n}" for n in res.notes] if res.notes else []


def finding_handler(f: registry.Finding) -> Handler:
    """The handler of finding ``f``'s tool: what its command prints (deadslots: its slots, with ``explain`` the
    sequence of each as `--explain --format json`; cap: the what-if table and the cap)."""
    def handle(store: Any, args: dict[str, Any]) -> Answer:
        from forensics import findings as F
        from forensics import runs as runs_mod

        names = _runs(args)
        th = {k: v for k, v in args.items() if k in f.options and v is not None}
        res = runs_mod.resolve(store, names, need=f.needs, command=str(f.command or f.name)) if names else None
        asked, notes = (res.runs if res else None), ([f"note: {n}" for n in res.notes] if res else [])
        if f.name == "dead_slot":
            rep = F.dead_slot_report(store, asked, include_recovered=bool(th.pop("include_recovered", False)), **th)
            return [_dead_json(rep, bool(args.get("explain"))), *notes]
        if f.name == "cap":
            margin = th.pop("margin", Thresholds().margin)
            cap = F.recommend_cap(store, asked, margin=margin, **th)
            words = [f"warning: {w}" for w in cap.warnings]
            if cap.cap is not None:
                words.append(f"recommended output cap: {cap.cap} (longest normal response +{margin:.0%}, rounded up)")
            return [_rows(cap.whatif), *notes, *words]
        return [_rows(F.rows(store, f.name, asked, F.thresholds(**th))), *notes]
    return handle


def _dead_json(rep: Any, explain: bool) -> str:
    if not explain:
        return _rows(rep.slots)
    keys = ["run", "instance", "slot"]
    out = []
    for row in json.loads(_rows(rep.slots)):
        part = rep.sequence.filter(*[rep.sequence[k] == row[k] for k in keys])
        out.append({**row, "sequence": json.loads(_rows(part))})
    return json.dumps(out, indent=2, ensure_ascii=False)


def missing_tool(store: Any, args: dict[str, Any]) -> Answer:
    from forensics import runs as runs_mod
    from forensics.replay import tables as replay_tables

    asked = runs_mod.resolve(store, args.get("run"), one=True, need="records", command="missing")
    return [_rows(replay_tables.missing(store, asked.runs[0])), *_notes(asked)]


def throughput_tool(store: Any, args: dict[str, Any]) -> Answer:
    from forensics import metrics

    source, by = args.get("source") or "auto", args.get("by")
    if by is None:
        m = metrics.throughput(store, _runs(args), source=source)
        from forensics.replay.clock import clock_notes

        return [_rows(m), *[f"note: {n}" for n in clock_notes(m)]]
    from forensics.sweep import fit_table, throughput_fits

    fits = throughput_fits(store, _runs(args), by=by, source=source)
    words = [f"note: {line}" for res in fits for line in res.group.lines()]
    words += [res.scaling.sentence for res in fits if res.scaling is not None]
    return [_rows(fit_table(fits)), *words]


def whatif_tool(store: Any, args: dict[str, Any]) -> Answer:
    import polars as pl

    from forensics import planning

    names = _runs(args)
    if not names:
        raise QueryError("whatif needs at least one run", hint="pass runs: [\"run-42\"]")
    opts = {"np_": args.get("np"), "cap": args.get("cap"), "concurrency": args.get("concurrency"),
            "instance": args.get("instance")}
    found = [planning.whatif(store, names[0], **opts)] if len(names) == 1 else planning.whatif_all(store, names, **opts)
    show = args.get("show") or ""
    frames = [{"cuts": r.cuts, "errors": r.folds, "busy": r.busy}.get(show, r.table) for r in found]
    if len(found) == 1:
        table = frames[0]
    else:
        table = pl.concat([f.select(pl.lit(r.run).alias("run"), pl.all()) for r, f in zip(found, frames, strict=True)],
                          how="diagonal_relaxed")
    words = [f"note: {n}" for r in found for n in r.notes] + [s for r in found for s in r.sentences]
    return [_rows(table), *words]


def recommend_tool(store: Any, args: dict[str, Any]) -> Answer:
    from forensics import metrics, planning

    budgets = planning.Budgets(*(metrics.parse_duration(args[k]) if args.get(k) else None
                                 for k in ("max_run", "max_request", "max_p95")))
    np_range = planning.parse_np_range(args["np_range"]) if args.get("np_range") else None
    recs = planning.recommend_all(store, _runs(args), budgets, np_range=np_range, cap=str(args.get("cap") or "none"),
                                  instance=args.get("instance"))
    return [_rows(planning.recommendations_table(recs)), *planning.recommendations_words(recs)]


def compare_tool(store: Any, args: dict[str, Any]) -> Answer:
    from forensics.compare import compare

    cmp = compare(store, str(args["run_a"]), str(args["run_b"]))
    return [_rows(cmp.table), *(["items missing: " + _rows(cmp.items)] if cmp.items.height else []), *cmp.sentences]


def sql_tool(limits: SqlLimits) -> Handler:
    def handle(store: Any, args: dict[str, Any]) -> Answer:
        from forensics.sql import run_sql_limited

        got = run_sql_limited(store, str(args["query"]), limits)
        more = [f"note: only the first {limits.max_rows} rows are shown; narrow the query"] if got.truncated else []
        return [_rows(got.rows), *more]
    return handle


# ---------------------------------------------------------------------------------------- the list
def _threshold_props(names: tuple[str, ...]) -> dict[str, Any]:
    knobs = {k.name: k for k in fields(Thresholds)}
    defaults = Thresholds()
    out: dict[str, Any] = {}
    for name in names:
        default = getattr(defaults, name)
        kind = "boolean" if isinstance(default, bool) else "integer" if isinstance(default, int) else "number"
        out[name] = {"type": kind, "description": f"{knobs[name].metadata['help']} (default {default})"}
    return out


def finding_tools() -> list[Tool]:
    """One tool per finding of the registry, with the thresholds its command takes."""
    out = []
    for f in registry.findings():
        props: dict[str, Any] = {"runs": RUNS, **_threshold_props(f.options)}
        if f.name == "dead_slot":
            props["explain"] = {"type": "boolean", "description": "each dead slot with its request sequence"}
        out.append(Tool(f"finding_{f.name}", f"{f.title}: {f.summary}", _schema(props), finding_handler(f),
                        f"forensics {f.command}" if f.command else f"the {f.name} rows of the report"))
    return out


def tools(limits: SqlLimits | None = None) -> list[Tool]:
    """Every tool, in the order a client lists them."""
    limits = limits or SqlLimits()
    return [
        Tool("runs", "List the runs: np, items expected / done / missing, attempts, requests, wall time, how each "
             "ended.", _schema({"runs": RUNS}), runs_tool, "forensics runs"),
        Tool("verdict", "What went wrong in each run and what to change: the verdict's facts as JSON (kind, sentence, "
             "evidence lines path:first-last, severity, numbers), then each run's paragraph.",
             _schema({"runs": RUNS}), verdict_tool, "forensics verdict"),
        *finding_tools(),
        Tool("missing", "Every missing item x stage of a run and why, with evidence from the server log.",
             _schema({"run": RUN}), missing_tool, "forensics missing"),
        Tool("throughput", "Throughput, latency and concurrency per run; with `by` (np, or a config key), the table "
             "against it, the fit and the knee.", _schema({
                 "runs": RUNS, "by": {"type": "string", "description": "np, a column, or a key of the runs' config"},
                 "source": {"type": "string", "enum": ["auto", "server", "records"]}}),
             throughput_tool, "forensics throughput"),
        Tool("whatif", "Replay runs' own workload at another np and/or with an output cap: each figure predicted "
             "with its error band.", _schema({
                 "runs": RUNS, "np": {"type": "integer", "minimum": 1}, "cap": {"type": "integer", "minimum": 1},
                 "instance": {"type": "string"}, "concurrency": {"type": "integer", "minimum": 1},
                 "show": {"type": "string", "enum": ["cuts", "errors", "busy"]}}, ("runs",)),
             whatif_tool, "forensics whatif"),
        Tool("recommend", "The np with the highest throughput that meets every budget, measured or predicted.",
             _schema({"runs": RUNS, "max_run": BUDGET, "max_request": BUDGET, "max_p95": BUDGET,
                      "np_range": {"type": "string", "description": 'candidate np: "1-16", "1,2,4,8"'},
                      "cap": {"type": "string", "description": "auto, none, or a number of tokens"},
                      "instance": {"type": "string"}}), recommend_tool, "forensics recommend"),
        Tool("compare", "What changed from run_a to run_b: np, throughput, latency percentiles, findings, missing "
             "items.", _schema({"run_a": {"type": "string"}, "run_b": {"type": "string"}}, ("run_a", "run_b")),
             compare_tool, "forensics compare"),
        Tool("sql", f"One read-only SELECT (DuckDB) over the store's tables and its analysis (requests, events, "
             f"attempts, request_facts, verdict_facts, finding_<name>, ...): at most {limits.max_rows} rows, "
             f"{limits.timeout_s:g} s; no file outside the store.",
             _schema({"query": {"type": "string", "description": "a SELECT statement"}}, ("query",)),
             sql_tool(limits), "forensics sql"),
    ]


def call(store: Any, tool: Tool, args: dict[str, Any] | None) -> Answer:
    """``tool``'s answer for ``args``; an argument it does not take is an error that names the ones it does."""
    args = dict(args or {})
    known = set(tool.schema["properties"])
    extra = sorted(set(args) - known)
    if extra:
        raise QueryError(f"{tool.name} takes no argument {extra[0]!r}",
                         hint=f"its arguments: {', '.join(sorted(known)) or 'none'}")
    missing = [k for k in tool.schema["required"] if args.get(k) in (None, "", [])]
    if missing:
        raise QueryError(f"{tool.name} needs {missing[0]!r}")
    return tool.handler(store, args)

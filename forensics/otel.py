"""Requests as OpenTelemetry traces: ``forensics export otel RUN...``.

Each server request of a run becomes a span named after the OpenTelemetry GenAI semantic conventions
(``text_completion MODEL``, or ``chat MODEL`` for a chat endpoint), kind SERVER, with two children: ``prompt
processing`` and ``generation``.  Its attributes (``SPAN_ATTRIBUTES``) are the conventions' names where they have
one, ``llama_server.*`` for the server's own (slot, task, instance, log lines) and ``replay.*`` for the item,
stage and attempt when the join matched a replay attempt to the request.  Findings become span events with
their evidence lines: ``llama_server.dead_slot`` on the request a slot died from, ``llama_server.abnormal`` on
each abnormal request of a dead slot, ``llama_server.runaway`` and ``llama_server.failover``.  Spans go to
an OTLP/HTTP collector or to an OTLP JSON file, through opentelemetry-sdk and its OTLP exporter.

Clocks: a request's wall-clock times when the log has them; else its elapsed times placed after the run
manifest's start (the run's first request at the manifest's start); else the run is refused with one line.
Every span of a request is one trace; ids are derived from the run, instance and request, so exporting the
same runs again gives the same ids.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from forensics.errors import InputError, NotFoundError, QueryError
from forensics.sql import load_query
from forensics.store import Store, fetch_pl

SERVICE = "llama-server"
INSTALL_HINT = "pip install 'llama-forensics[otel]'"
SPAN_ATTRIBUTES = {  # attribute: what it holds
    "gen_ai.operation.name": "text_completion, or chat for a chat endpoint",
    "gen_ai.provider.name": "llama.cpp",
    "gen_ai.request.model": "the instance's model (a GGUF path's file name, without .gguf)",
    "llama_server.model_path": "the model as the log names it",
    "gen_ai.request.max_tokens": "the output cap in force (n_predict), when there was one",
    "gen_ai.usage.input_tokens": "prompt tokens",
    "gen_ai.usage.output_tokens": "generated tokens",
    "gen_ai.response.finish_reasons": "the stop reason (stop, length, cancelled, error, ...)",
    "gen_ai.server.time_to_first_token": "seconds of prompt processing before the first output token",
    "gen_ai.server.time_per_output_token": "seconds per generated token after the first",
    "gen_ai.server.request.duration": "seconds, prompt and generation",
    "server.address": "the instance's listen address", "server.port": "its port",
    "llama_server.instance": "instance", "llama_server.slot": "slot", "llama_server.task": "task id",
    "llama_server.seq": "the request's place on its slot", "llama_server.run": "run",
    "llama_server.log": "file:first-last lines of the request", "llama_server.cached_tokens": "prompt tokens reused",
    "replay.item": "item (when joined)", "replay.stage": "stage", "replay.attempt": "attempt",
    "http.response.status_code": "HTTP status when logged", "error.type": "why it failed, when it did",
}
FINISH = {"eos": "stop", "word": "stop", "limit": "length", "context": "length"}


@dataclass
class Exported:
    """What an export sent: spans (requests), events (findings) and how each run's clock was set."""

    requests: int = 0
    spans: int = 0
    events: int = 0
    clocks: dict[str, str] = field(default_factory=dict)  # run -> wall-clock | manifest start


def _require_sdk() -> None:
    try:
        import opentelemetry.exporter.otlp.proto.http
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise InputError("export otel needs opentelemetry-sdk and its OTLP exporter, which are not installed",
                         hint=INSTALL_HINT) from None


# ---------------------------------------------------------------------------------------------- rows
def _replay_con(store: Store) -> Any:
    from forensics.replay.tables import _connect

    return _connect(store, also=("instances",))


def request_rows(store: Store, runs: list[str]) -> pl.DataFrame:
    """otel_spans.sql's rows for ``runs``, with ``start_ns``/``end_ns`` on the wall clock and ``clock``."""
    con = _replay_con(store)
    try:
        df = fetch_pl(con, load_query("otel_spans").text, {"runs": runs})
    finally:
        con.close()
    return placed(df)


def placed(df: pl.DataFrame) -> pl.DataFrame:
    """Each request's start and end in Unix nanoseconds: its own wall-clock times, else its elapsed offset
    from the run's first request added to the run manifest's start; ``clock`` says which.  A run with neither
    raises InputError (one line)."""
    ns = pl.Int64
    wall_start = pl.col("t_start").dt.epoch("ns")
    wall_end = pl.col("t_end").dt.epoch("ns")
    anchor = pl.col("run_started_at").dt.epoch("ns")
    rel_start = anchor + ((pl.col("elapsed_start_s") - pl.col("elapsed0")) * 1e9).round().cast(ns)
    rel_end = anchor + ((pl.col("elapsed_end_s") - pl.col("elapsed0")) * 1e9).round().cast(ns)
    total = (pl.col("total_ms") * 1e6).round().cast(ns)
    out = df.with_columns(
        pl.when(pl.col("t_start").is_not_null()).then(pl.lit("wall-clock"))
        .when(anchor.is_not_null() & pl.col("elapsed_start_s").is_not_null()).then(pl.lit("manifest start"))
        .alias("clock"),
        pl.coalesce(wall_start, rel_start).alias("start_ns"))
    out = out.with_columns(pl.coalesce(pl.when(pl.col("t_start").is_not_null()).then(wall_end).otherwise(rel_end),
                                       pl.col("start_ns") + total, pl.col("start_ns")).alias("end_ns"))
    bad = out.filter(pl.col("clock").is_null())["run"].unique(maintain_order=True).to_list()
    if bad:
        raise InputError(f"run {bad[0]} has no clock to place its requests on: its log has no wall-clock times and "
                         "no run manifest gives its start",
                         hint="ingest its log with --started-at TIME, or with the run's manifest beside it")
    return out


def _finding_rows(store: Store, runs: list[str]) -> dict[str, pl.DataFrame]:
    """The findings that become span events, from their own rules (findings.py and failovers.sql)."""
    from forensics import findings

    report = findings.dead_slot_report(store, runs)
    dead = report.slots.join(report.sequence, on=["run", "instance", "slot"], how="inner", suffix="_seq")
    con = _replay_con(store)
    try:
        failovers = fetch_pl(con, load_query("failovers").text, {"runs": runs})
    finally:
        con.close()
    return {"dead": dead, "runaways": findings.find_runaways(store, runs), "failovers": failovers}


# ---------------------------------------------------------------------------------------------- spans
def _id(nbytes: int, *parts: object) -> int:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:nbytes], "big") or 1


def _id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class Ids(IdGenerator):
        """The SDK's id generator, answering the ids chosen for the next span (deterministic, see the module)."""

        def __init__(self) -> None:
            self.trace = 1
            self.span = 1

        def generate_trace_id(self) -> int:
            return self.trace

        def generate_span_id(self) -> int:
            return self.span

        def is_trace_id_random(self) -> bool:
            return False  # derived from the request: samplers must not read randomness into it

    return Ids()


def _attributes(r: dict[str, Any]) -> dict[str, Any]:
    http_path = r["http_path"] or ""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat" if "chat" in http_path else "text_completion",
        "gen_ai.provider.name": "llama.cpp",
        "gen_ai.request.model": model_name(r["model"]), "llama_server.model_path": r["model"],
        "gen_ai.usage.input_tokens": r["prompt_tokens"], "gen_ai.usage.output_tokens": r["gen_tokens"],
        "gen_ai.server.request.duration": None if r["total_ms"] is None else r["total_ms"] / 1000.0,
        "gen_ai.server.time_to_first_token": None if r["prompt_ms"] is None else r["prompt_ms"] / 1000.0,
        "gen_ai.server.time_per_output_token": _tpot_s(r),
        "gen_ai.request.max_tokens": r["n_predict"] if (r["n_predict"] or 0) > 0 else None,
        "server.address": r["host"], "server.port": r["port"],
        "http.response.status_code": r["http_status"],
        "llama_server.run": r["run"], "llama_server.instance": r["instance"], "llama_server.slot": r["slot"],
        "llama_server.task": r["task"], "llama_server.seq": r["seq"], "llama_server.cached_tokens": r["cached_tokens"],
        "llama_server.log": _lines(r["path"], r["line_first"], r["line_last"]),
        "replay.item": r["item"], "replay.stage": r["stage"], "replay.attempt": r["attempt"],
    }
    if r["stop_reason"] is not None:
        attrs["gen_ai.response.finish_reasons"] = [FINISH.get(r["stop_reason"], r["stop_reason"])]
    failed = _failure(r)
    if failed:
        attrs["error.type"] = failed
    return {k: v for k, v in attrs.items() if v is not None}


def model_name(model: str | None) -> str | None:
    """The model as a span names it: a GGUF path's file name without ``.gguf`` (``/models/Qwen3-8B.gguf`` is
    ``Qwen3-8B``); a name as it is."""
    if not model:
        return None
    name = model.replace("\\", "/").rsplit("/", 1)[-1]
    return name[:-5] if name.lower().endswith(".gguf") else name


def _tpot_s(r: dict[str, Any]) -> float | None:
    if r["gen_ms"] is None or (r["gen_tokens"] or 0) < 2:
        return None
    return float(r["gen_ms"]) / (r["gen_tokens"] - 1) / 1000.0


def _failure(r: dict[str, Any]) -> str | None:
    if r["error"]:
        return str(r["error"])[:200]
    if (r["http_status"] or 0) >= 400:
        return str(r["http_status"])
    return "error" if r["stop_reason"] == "error" else None


def _lines(path: object, first: object, last: object) -> str:
    name = Path(str(path)).name if path else "?"
    return f"{name}:{first}-{last}" if first != last else f"{name}:{first}"


def _events(found: dict[str, pl.DataFrame]) -> dict[tuple[Any, ...], list[tuple[str, dict[str, Any]]]]:
    """(run, instance, slot, seq) -> the finding events of that request."""
    out: dict[tuple[Any, ...], list[tuple[str, dict[str, Any]]]] = {}
    for d in found["dead"].iter_rows(named=True):
        key = (d["run"], d["instance"], d["slot"], d["seq_seq"])
        if d["seq_seq"] == d["seq"]:
            out.setdefault(key, []).append(("llama_server.dead_slot", {
                "llama_server.slot": d["slot"], "llama_server.dead_from": d["dead_from"], "why": d["why"],
                "requests_affected": d["requests_affected"]}))
        if d["abnormal"] and d["seq_seq"] >= d["seq"]:
            out.setdefault(key, []).append(("llama_server.abnormal", {"why": d["why_seq"]}))
    for w in found["runaways"].iter_rows(named=True):
        out.setdefault((w["run"], w["instance"], w["slot"], w["seq"]), []).append(("llama_server.runaway", {
            "why": w["why"], "normal_tokens": w["normal_tokens"], "followed_by": w["followed_by"]}))
    for f in found["failovers"].iter_rows(named=True):
        if f["instance"] is not None:
            out.setdefault((f["run"], f["instance"], f["slot"], f["seq"]), []).append(("llama_server.failover", {
                "from_server": f["from_server"], "from_outcome": f["from_outcome"], "from_error": f["from_error"],
                "from_evidence": f["from_lines"]}))
    return {k: [(n, {a: v for a, v in attrs.items() if v is not None}) for n, attrs in evs] for k, evs in out.items()}


def _spans(rows: pl.DataFrame, events: dict[tuple[Any, ...], list[tuple[str, dict[str, Any]]]]) -> list[Any]:
    """The finished SDK spans of every request (a span, its two children, its events)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    sink = InMemorySpanExporter()
    ids = _id_generator()
    for (run, instance), part in rows.group_by(["run", "instance"], maintain_order=True):
        host, _, _ = str(run).rpartition(":")
        resource = Resource.create({"service.name": SERVICE, "service.instance.id": str(instance),
                                    "llama_server.run": str(run), **({"host.name": host} if host else {})})
        provider = TracerProvider(resource=resource, id_generator=ids)
        provider.add_span_processor(SimpleSpanProcessor(sink))
        tracer = provider.get_tracer("llama-forensics")
        for r in part.iter_rows(named=True):
            _request_span(tracer, ids, r, events.get((r["run"], r["instance"], r["slot"], r["seq"]), []))
        provider.force_flush()  # not shutdown: that would stop the shared sink
    return list(sink.get_finished_spans())


def _request_span(tracer: Any, ids: Any, r: dict[str, Any], events: list[tuple[str, dict[str, Any]]]) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    key = (r["run"], r["instance"], r["path"], r["slot"], r["seq"], r["line_first"])
    ids.trace, ids.span = _id(16, *key), _id(8, *key, "request")
    start, end = int(r["start_ns"]), max(int(r["end_ns"]), int(r["start_ns"]))
    name = f"{'chat' if 'chat' in (r['http_path'] or '') else 'text_completion'} {model_name(r['model']) or 'unknown'}"
    span = tracer.start_span(name, kind=SpanKind.SERVER, start_time=start, attributes=_attributes(r))
    ctx = trace.set_span_in_context(span)
    prompt_end = start + round((r["prompt_ms"] or 0.0) * 1e6)
    gen_end = min(end, prompt_end + round((r["gen_ms"] or 0.0) * 1e6)) if r["gen_ms"] is not None else end
    for child, (a, b), attrs in (
            ("prompt processing", (start, min(prompt_end, end)), {"gen_ai.usage.input_tokens": r["prompt_tokens"]}),
            ("generation", (min(prompt_end, end), gen_end), {"gen_ai.usage.output_tokens": r["gen_tokens"]})):
        ids.span = _id(8, *key, child)
        sub = tracer.start_span(child, context=ctx, kind=SpanKind.INTERNAL, start_time=a,
                                attributes={k: v for k, v in attrs.items() if v is not None})
        sub.end(end_time=b)
    own_lines = _lines(r["path"], r["line_first"], r["line_last"])
    for ev_name, attrs in events:  # each finding cites the request's own lines (a failover also the failed one's)
        span.add_event(ev_name, attributes={**attrs, "evidence": own_lines}, timestamp=end)
    failed = _failure(r)
    if failed:
        span.set_status(Status(StatusCode.ERROR, failed))
    span.end(end_time=end)


# ---------------------------------------------------------------------------------------------- output
def otlp_json(spans: Sequence[Any]) -> dict[str, Any]:
    """``spans`` as one OTLP/JSON ExportTraceServiceRequest (ids in hex, as OTLP/JSON wants them)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    data = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for rs in data.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in sp:
                        sp[k] = base64.b64decode(sp[k]).hex()
    return data


def _batches(spans: list[Any], size: int = 1000) -> Iterator[list[Any]]:
    for i in range(0, len(spans), size):
        yield spans[i:i + size]


def _write_file(spans: list[Any], out: Path) -> None:
    """OTLP JSON lines (the OpenTelemetry file format): one ExportTraceServiceRequest per line."""
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            for batch in _batches(spans):
                fh.write(json.dumps(otlp_json(batch), separators=(",", ":")) + "\n")
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"cannot write {out}: {exc.strerror or exc}", hint="pass -o with a writable path") from exc


def _send(spans: list[Any], endpoint: str) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    url = endpoint.rstrip("/")
    exporter = OTLPSpanExporter(endpoint=url if url.endswith("/v1/traces") else url + "/v1/traces", timeout=30)
    try:
        for batch in _batches(spans, 512):
            if exporter.export(batch) is not SpanExportResult.SUCCESS:
                raise InputError(f"the collector at {endpoint} did not accept the spans",
                                 hint="check --endpoint (an OTLP/HTTP receiver, e.g. http://localhost:4318)")
    finally:
        exporter.shutdown()


def export(store: Store, runs: list[str], *, out: Path | None = None, endpoint: str | None = None) -> Exported:
    """Export the requests of ``runs`` (every run when empty) as spans to ``out`` (OTLP JSON) or ``endpoint``
    (OTLP/HTTP)."""
    from forensics import runs as runs_mod

    if (out is None) == (endpoint is None):
        raise QueryError("say where the spans go: -o FILE or --endpoint URL (one of them)")
    _require_sdk()
    names = runs_mod.resolve(store, runs).runs
    rows = request_rows(store, names)
    if rows.height == 0:
        raise NotFoundError("no server request in " + ", ".join(names or ["the store"]),
                            hint="export otel reads the requests of llama-server logs")
    spans = _spans(rows, _events(_finding_rows(store, names)))
    if out is not None:
        _write_file(spans, out)
    else:
        _send(spans, str(endpoint))
    clocks = dict(rows.group_by("run", maintain_order=True).agg(pl.col("clock").first()).iter_rows())
    return Exported(requests=rows.height, spans=len(spans), events=sum(len(s.events) for s in spans), clocks=clocks)


def nanos(ts: datetime) -> int:
    """A timestamp as Unix nanoseconds (how OTLP writes times)."""
    return int(ts.timestamp()) * 1_000_000_000 + ts.microsecond * 1000

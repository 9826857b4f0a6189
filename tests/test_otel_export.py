"""``forensics export otel``: every request of a run is a span with the right times, tokens and ids.

The real run folder (fixtures/server-runs/real-2026: a real llama-server's log, 48 requests, elapsed times, launched
at 2026-11-29T15:26:07.924Z per its README) goes to a real OTLP/HTTP receiver on 127.0.0.1, and each span is
checked against the requests table.  A generated run with a dead slot and a failover is written to an OTLP JSON
file and read back field by field.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.generate import generate
from forensics.generate.fleet import fleet_scenarios
from forensics.store import Store

ROOT = Path(__file__).resolve().parents[1]
REAL_RUN = ROOT / "fixtures" / "server-runs" / "real-2026"
LAUNCHED = "2026-11-29T15:26:07.924Z"
SERVER, INTERNAL = 2, 1  # OTLP span kinds


class _Receiver(BaseHTTPRequestHandler):
    got: list[Any]

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        type(self).got.append((self.path, req))
        out = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:  # quiet
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[Any]]]:
    handler = type("Receiver", (_Receiver,), {"got": []})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", handler.got
    finally:
        server.shutdown()
        server.server_close()


def _ingest(args: list[str]) -> None:
    res = CliRunner().invoke(cli, ["ingest", *args])
    assert res.exit_code == 0, res.output


def _attrs(kv: Any) -> dict[str, Any]:
    out = {}
    for a in kv:
        v = a.value
        out[a.key] = getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") != "array_value" else \
            [getattr(x, x.WhichOneof("value")) for x in v.array_value.values]
    return out


def _ns(col: str) -> pl.Expr:
    return pl.col(col).dt.epoch("ns")


def test_real_run_to_an_otlp_receiver(tmp_path: Path, receiver: tuple[str, list[Any]]) -> None:
    url, got = receiver
    store_dir = tmp_path / "s"
    _ingest([str(REAL_RUN), "--store", str(store_dir), "--started-at", LAUNCHED])
    res = CliRunner().invoke(cli, ["export", "otel", "--store", str(store_dir), "--endpoint", url])
    assert res.exit_code == 0, res.output
    assert res.stdout == ""
    assert res.stderr == (f"export: 48 requests of 1 run(s) as 144 spans with 0 finding events (wall-clock times) "
                          f"-> {url}\n")
    assert {path for path, _ in got} == {"/v1/traces"}
    spans = [(_attrs(rs.resource.attributes), sp) for _, req in got for rs in req.resource_spans
             for ss in rs.scope_spans for sp in ss.spans]
    assert len(spans) == 144
    requests = Store(store_dir).table("requests").with_columns(_ns("t_start").alias("s"), _ns("t_end").alias("e"))
    assert requests.height == 48
    by_key = {(r["slot"], r["seq"]): r for r in requests.iter_rows(named=True)}
    servers = [(res_, sp) for res_, sp in spans if sp.kind == SERVER]
    assert len(servers) == 48
    children: dict[bytes, list[Any]] = {}
    for _, sp in spans:
        if sp.kind == INTERNAL:
            children.setdefault(sp.parent_span_id, []).append(sp)
    for resource, sp in servers:
        a = _attrs(sp.attributes)
        r = by_key.pop((a["llama_server.slot"], a["llama_server.seq"]))
        assert resource["service.name"] == "llama-server" and resource["service.instance.id"] == r["instance"]
        assert sp.name == "text_completion tiny-llama-spm"  # models/tiny-llama-spm.gguf, as the log names it
        assert a["gen_ai.request.model"] == "tiny-llama-spm"
        assert a["llama_server.model_path"] == "models/tiny-llama-spm.gguf"
        assert (a["server.address"], a["server.port"]) == ("127.0.0.1", 18102)
        assert (sp.start_time_unix_nano, sp.end_time_unix_nano) == (r["s"], r["e"])
        assert a["llama_server.task"] == r["task"] and a["llama_server.instance"] == r["instance"]
        assert a["gen_ai.usage.input_tokens"] == r["prompt_tokens"]
        assert a["gen_ai.usage.output_tokens"] == r["gen_tokens"]
        assert a["gen_ai.server.time_to_first_token"] == pytest.approx(r["prompt_ms"] / 1000)
        assert a["gen_ai.server.time_per_output_token"] == pytest.approx(r["gen_ms"] / (r["gen_tokens"] - 1) / 1000)
        assert a["gen_ai.response.finish_reasons"] == [{"limit": "length", "eos": "stop"}[r["stop_reason"]]]
        assert a["llama_server.log"] == f"server.log:{r['line_first']}-{r['line_last']}"
        kids = sorted(children[sp.span_id], key=lambda s: s.start_time_unix_nano)
        assert [k.name for k in kids] == ["prompt processing", "generation"]
        assert all(k.trace_id == sp.trace_id for k in kids)
        assert kids[0].start_time_unix_nano == sp.start_time_unix_nano
        assert kids[0].end_time_unix_nano == kids[1].start_time_unix_nano <= kids[1].end_time_unix_nano
        assert kids[1].end_time_unix_nano <= sp.end_time_unix_nano
    assert not by_key  # every request was a span
    assert sum(_attrs(sp.attributes)["gen_ai.usage.output_tokens"] for _, sp in servers) == 2584  # the README's


def test_a_run_without_a_clock_is_refused_in_one_line(tmp_path: Path) -> None:
    store_dir = tmp_path / "s"
    _ingest([str(REAL_RUN), "--store", str(store_dir)])  # elapsed times, no --started-at, no manifest
    res = CliRunner().invoke(cli, ["export", "otel", "--store", str(store_dir), "-o", str(tmp_path / "t.json")])
    assert res.exit_code == 2
    assert res.stderr == ("forensics: error: run real-2026 has no clock to place its requests on: its log has no "
                          "wall-clock times and no run manifest gives its start (ingest its log with --started-at "
                          "TIME, or with the run's manifest beside it)\n")
    assert not (tmp_path / "t.json").exists()


@pytest.fixture(scope="module")
def host_a(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpu-a of the generated fleet: run-1 has a dead slot and retries that fail over to the backup."""
    root = tmp_path_factory.mktemp("otel")
    generate(fleet_scenarios()["gpu-a"], root)
    res = CliRunner().invoke(cli, ["ingest", str(root / "logs"), "--store", str(root / "s")])
    assert res.exit_code == 0, res.output
    return root / "s"


def _file_spans(path: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            res = {a["key"]: next(iter(a["value"].values())) for a in rs["resource"]["attributes"]}
            out.extend((res, sp) for ss in rs["scopeSpans"] for sp in ss["spans"])
    return out


def _value(v: dict[str, Any]) -> Any:
    kind, val = next(iter(v.items()))
    if kind == "intValue":
        return int(val)
    if kind == "arrayValue":
        return [_value(x) for x in val["values"]]
    return val


def test_otlp_json_file_reads_back_field_by_field(host_a: Path, tmp_path: Path) -> None:
    out = tmp_path / "traces.json"
    res = CliRunner().invoke(cli, ["export", "otel", "run-1", "--store", str(host_a), "-o", str(out)])
    assert res.exit_code == 0, res.output
    spans = _file_spans(out)
    req = Store(host_a).table("requests").filter(pl.col("run") == "run-1")
    assert len(spans) == 3 * req.height
    top = [(res_, sp) for res_, sp in spans if sp["kind"] == SERVER]
    assert {sp["traceId"] for _, sp in top}.__len__() == req.height  # one trace per request
    for res_, sp in spans:
        assert len(sp["traceId"]) == 32 and len(sp["spanId"]) == 16 and int(sp["traceId"], 16)
        assert res_["service.name"] == "llama-server" and res_["llama_server.run"] == "run-1"
        assert int(sp["startTimeUnixNano"]) <= int(sp["endTimeUnixNano"])
    rows = {(r["instance"], r["slot"], r["seq"]): r for r in
            req.with_columns(_ns("t_start").alias("s"), _ns("t_end").alias("e")).iter_rows(named=True)}
    events: dict[str, list[dict[str, Any]]] = {}
    for res_, sp in top:
        a = {x["key"]: _value(x["value"]) for x in sp["attributes"]}
        r = rows[(res_["service.instance.id"], a["llama_server.slot"], a["llama_server.seq"])]
        assert (int(sp["startTimeUnixNano"]), int(sp["endTimeUnixNano"])) == (r["s"], r["e"])
        assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.provider.name"] == "llama.cpp"
        assert sp["name"] == "text_completion Qwen3-30B-A3B-Q4_K_M"
        assert a["llama_server.model_path"] == "/models/Qwen3-30B-A3B-Q4_K_M.gguf"
        assert a.get("gen_ai.usage.output_tokens") == r["gen_tokens"]
        assert a["server.address"] == "127.0.0.1" and a["server.port"] in (8080, 8081)
        assert "replay.item" in a and a["replay.stage"] in ("extract", "score")  # the join matched every request
        if r["error"] or r["stop_reason"] == "cancelled":
            assert sp["status"].get("code", 0) in (0, 2)
        for ev in sp.get("events", []):
            ev_attrs = {x["key"]: _value(x["value"]) for x in ev["attributes"]}
            assert ev_attrs["evidence"] == a["llama_server.log"]
            assert ev["timeUnixNano"] == sp["endTimeUnixNano"]
            events.setdefault(ev["name"], []).append({**ev_attrs, "slot": a["llama_server.slot"],
                                                      "instance": res_["service.instance.id"]})
    [dead] = events["llama_server.dead_slot"]
    assert (dead["instance"], dead["slot"]) == ("main", 1) and dead["requests_affected"] == 4
    assert len(events["llama_server.abnormal"]) == 4
    assert all(e["instance"] == "main" and e["slot"] == 1 for e in events["llama_server.abnormal"])
    assert events["llama_server.failover"]
    for f in events["llama_server.failover"]:
        assert f["instance"] == "backup" and f["from_server"] == "main" and f["from_outcome"] == "timeout"
        assert f["from_evidence"].startswith("main.log:")
    again = tmp_path / "again.json"
    assert CliRunner().invoke(cli, ["export", "otel", "run-1", "--store", str(host_a), "-o", str(again)]).exit_code == 0
    assert again.read_bytes() == out.read_bytes()  # same runs, same ids and bytes


def test_export_needs_one_destination(host_a: Path) -> None:
    res = CliRunner().invoke(cli, ["export", "otel", "--store", str(host_a)])
    assert res.exit_code == 2
    assert res.stderr == "forensics: error: say where the spans go: -o FILE or --endpoint URL (one of them)\n"

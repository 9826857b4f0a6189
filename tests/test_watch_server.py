"""`watch --server URL`: llama-server's /slots and /metrics, as every generation of them is shaped, served by a
small HTTP server on 127.0.0.1; a quiet log's running request is caught by its n_decoded."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from forensics.watch import WatchOptions, watch
from forensics.watch.server import SlotView, parse_metrics, parse_slots, poll
from tests import watch_log as L
from tests.conftest import ROOT

PAYLOADS = ROOT / "fixtures" / "watch" / "server"


class Fake:
    """What the fake server answers: {path: (status, body bytes)}; changeable while it runs."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, bytes]] = {}
        self.hits: list[str] = []


@pytest.fixture
def server() -> Iterator[tuple[str, Fake]]:
    fake = Fake()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fake.hits.append(self.path)
            status, body = fake.routes.get(self.path, (404, b"Not Found"))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", fake
    finally:
        httpd.shutdown()
        httpd.server_close()


def payload(name: str) -> bytes:
    return (PAYLOADS / name).read_bytes()


@pytest.mark.parametrize("name", ["slots-b2809.json", "slots-b4747.json", "slots-b10587.json"])
def test_every_slots_shape_gives_task_processing_and_tokens_so_far(name: str) -> None:
    slots = parse_slots(json.loads(payload(name)))
    assert slots[0] == SlotView(slot=0, task=5000, processing=True, n_decoded=900, n_ctx=2048,
                                n_prompt=200 if name == "slots-b10587.json" else None)
    assert slots[1].slot == 1 and slots[1].processing is False


def test_metrics_text_of_both_generations() -> None:
    old = parse_metrics(payload("metrics-b4747.txt").decode())
    new = parse_metrics(payload("metrics-b10587.txt").decode())
    assert old["llamacpp:requests_processing"] == 1.0 and old["llamacpp:kv_cache_tokens"] == 1104.0
    # a counter without _total in its name keeps the name the server gave it (the parser would add _total)
    assert old["llamacpp:n_busy_slots_per_decode"] == 1.8 and "llamacpp:n_busy_slots_per_decode_total" not in old
    assert new["llamacpp:tokens_predicted_total"] == 3484.0 and "llamacpp:kv_cache_tokens" not in new
    assert new["llamacpp:n_tokens_max"] == 1100.0
    assert parse_metrics('llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 7\n') == {
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}': 7.0}
    assert parse_metrics('x{b="q\\"",a="1"} 2\n') == {'x{a="1",b="q\\""}': 2.0}
    with pytest.raises(ValueError, match="line 2 is not a Prometheus sample: 'not metrics'"):
        parse_metrics("llamacpp:x 1\nnot metrics\n")


def test_poll_reads_both_endpoints_and_says_which_is_missing(server: tuple[str, Fake]) -> None:
    url, fake = server
    fake.routes["/slots"] = (200, payload("slots-b10587.json"))
    view = poll(url)
    assert view.slots is not None and view.slots[0].n_decoded == 900
    assert view.metrics is None and view.errors == {"metrics": "HTTP 404"}
    assert view.port == int(url.rsplit(":", 1)[1])
    fake.routes["/metrics"] = (200, payload("metrics-b10587.txt"))
    assert poll(url).metrics == parse_metrics(payload("metrics-b10587.txt").decode())


def _log(tmp: Path, port: int, *tail: list[str]) -> Path:
    """The real server's history with the test server's port in its listen line, then ``tail``."""
    log = tmp / "logs" / "live" / "server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    lines = [line.replace("18102", str(port)) for line in L.banner()] + L.normal_requests()
    log.write_text("".join(lines + [x for t in tail for x in t]), encoding="utf-8")
    return log


class Running:
    def __init__(self, opts: WatchOptions) -> None:
        self.alerts: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: watch(opts, on_alert=self.alerts.append,
                                                            note=self.notes.append, stop=self.stop))
        self.thread.start()

    def wait(self, pred: Any, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not pred():
            assert self.thread.is_alive(), self.notes
            time.sleep(0.1)
        assert pred(), (self.alerts, self.notes)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)


@pytest.mark.parametrize("shape", ["slots-b2809.json", "slots-b4747.json", "slots-b10587.json"])
def test_a_quiet_running_request_is_suspected_from_slots(tmp_path: Path, server: tuple[str, Fake], shape: str) -> None:
    url, fake = server
    fake.routes["/slots"] = (200, payload(shape))
    fake.routes["/metrics"] = (200, payload("metrics-b10587.txt"))
    log = _log(tmp_path, int(url.rsplit(":", 1)[1]))
    w = Running(WatchOptions(paths=[tmp_path / "logs"], store=tmp_path / "store", servers=[url], poll_s=0.2,
                             cpu_budget=1.0))
    try:
        w.wait(lambda: any(n.startswith("following") for n in w.notes))
        with log.open("a") as fh:  # the request starts; the log says nothing more (no progress lines)
            fh.write("".join(L.start(0, 5000, 40.0)))
        w.wait(lambda: len(w.alerts) >= 1)
    finally:
        w.close()
    a = w.alerts[0]
    assert (a["kind"], a["status"], a["slot"], a["task"]) == ("runaway", "suspected", 0, 5000)
    assert a["so_far"]["tokens_so_far"] == 900 and a["so_far"]["source"] == "server"
    assert a["server_metrics"][url]["llamacpp:requests_processing"] == 1.0
    assert len(w.alerts) == 1
    assert {"/slots", "/metrics"} <= set(fake.hits)


def test_the_server_saying_a_slot_is_idle_overrules_a_log_that_lags(tmp_path: Path, server: tuple[str, Fake]) -> None:
    url, fake = server
    idle = json.loads(payload("slots-b10587.json"))
    idle[0] = {"id": 0, "n_ctx": 2048, "speculative": False, "is_processing": False}
    fake.routes["/slots"] = (200, json.dumps(idle).encode())
    log = _log(tmp_path, int(url.rsplit(":", 1)[1]))
    w = Running(WatchOptions(paths=[tmp_path / "logs"], store=tmp_path / "store", servers=[url], poll_s=0.2,
                             cpu_budget=1.0))
    try:
        w.wait(lambda: any(n.startswith("following") for n in w.notes))
        with log.open("a") as fh:  # the log shows 300 tokens so far, but the server says the slot is idle
            fh.write("".join(L.start(0, 5000, 40.0) + L.progress(0, 5000, 44.0, 300)))
        w.wait(lambda: len([h for h in fake.hits if h == "/slots"]) >= 8)
    finally:
        w.close()
    # not running, so not suspected; its 300 tokens so far make it a runaway of the log as it stands
    assert [(a["kind"], a["status"], a["task"]) for a in w.alerts] == [("runaway", "confirmed", 5000)]
    assert any("/metrics: HTTP 404 (start llama-server with --metrics)" in n for n in w.notes)


def test_a_server_no_followed_log_belongs_to_is_named(tmp_path: Path, server: tuple[str, Fake]) -> None:
    url, fake = server
    fake.routes["/slots"] = (200, payload("slots-b4747.json"))
    _log(tmp_path, 9)  # listens on port 9, not the server's
    w = Running(WatchOptions(paths=[tmp_path / "logs"], store=tmp_path / "store", servers=[url], poll_s=0.2,
                             cpu_budget=1.0))
    try:
        w.wait(lambda: any("no followed log listens on its port" in n for n in w.notes))
    finally:
        w.close()
    assert w.alerts == []

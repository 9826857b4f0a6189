"""A live look at a running llama-server: its ``/slots`` (per slot: task, processing or not, tokens generated so
far) and ``/metrics`` (Prometheus text).  Every payload shape of the builds that serve them is read:

* 2024 (b2181+): ``id``, ``id_task``, ``state`` (0 idle, 1 processing), ``next_token`` an object with ``n_decoded``;
* late 2024-2025 (b3898+): ``is_processing`` instead of ``state``;
* 2026: ``next_token`` a list of such objects, plus ``n_prompt_tokens``.

A server that does not expose an endpoint (``/slots`` is off in b3898-b6336 unless ``--slots``, ``/metrics`` needs
``--metrics``) is simply read without it.  Library only: no click.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from forensics.replay import sidefiles


@dataclass(frozen=True)
class SlotView:
    slot: int
    task: int | None
    processing: bool
    n_decoded: int | None  # tokens generated so far by the slot's current (or last) task
    n_ctx: int | None
    n_prompt: int | None


@dataclass
class ServerView:
    url: str
    host: str
    port: int | None
    at: float = field(default_factory=time.time)
    slots: list[SlotView] | None = None  # None: not exposed or unreachable
    metrics: dict[str, float] | None = None
    errors: dict[str, str] = field(default_factory=dict)  # endpoint -> why it could not be read


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def parse_slots(payload: Any) -> list[SlotView]:
    """The slots of a ``/slots`` answer, whatever the build (see the module docstring)."""
    if not isinstance(payload, list):
        raise ValueError("expected a JSON array of slots")
    out = []
    for i, obj in enumerate(payload):
        if not isinstance(obj, dict):
            continue
        nxt = obj.get("next_token")
        if isinstance(nxt, list):
            nxt = nxt[0] if nxt and isinstance(nxt[0], dict) else {}
        nxt = nxt if isinstance(nxt, dict) else {}
        processing = bool(obj["is_processing"]) if "is_processing" in obj else _int(obj.get("state")) == 1
        task = _int(obj.get("id_task", obj.get("task_id")))
        slot = _int(obj.get("id"))
        out.append(SlotView(slot=slot if slot is not None else i,
                            task=None if task is None or task < 0 else task, processing=processing,
                            n_decoded=_int(nxt.get("n_decoded")), n_ctx=_int(obj.get("n_ctx")),
                            n_prompt=_int(obj.get("n_prompt_tokens"))))
    return out


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition (read as a run folder's dump is, ``replay.sidefiles.parse_metrics``): each
    sample's value by its name, with its labels in the name (``name{position="0"}``, keys sorted).  A text the
    parser refuses raises ValueError naming the line (``poll`` keeps it as the endpoint's error)."""
    out: dict[str, float] = {}
    for s in sidefiles.parse_metrics(text):
        labels = ",".join(f'{k}="{_escaped(v)}"' for k, v in json.loads(s["labels"]).items()) if s["labels"] else ""
        out[f"{s['name']}{{{labels}}}" if labels else s["name"]] = s["value"]
    return out


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _get(url: str, timeout_s: float) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"User-Agent": "llama-forensics-watch"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""


def poll(url: str, timeout_s: float = 2.0) -> ServerView:
    """Read ``/slots`` and ``/metrics`` of the server at ``url`` (errors are kept, never raised)."""
    base = url.rstrip("/")
    parts = urllib.parse.urlsplit(base)
    view = ServerView(url=base, host=parts.hostname or "", port=parts.port)
    for endpoint in ("slots", "metrics"):
        try:
            status, body = _get(f"{base}/{endpoint}", timeout_s)
            if status != 200:
                view.errors[endpoint] = f"HTTP {status}"
            elif endpoint == "slots":
                view.slots = parse_slots(json.loads(body))
            else:
                view.metrics = parse_metrics(body.decode("utf-8", errors="replace"))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            view.errors[endpoint] = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
    return view

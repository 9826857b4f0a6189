"""The real run folders in fixtures/server-runs: real llama-server logs of several builds, with the harness's
records and the truth (`labels.json`, written by the harness from what it did; never a manifest) where they have
them.  Each folder is ingested once per test session into a store of its own.

``REAL_RUNS_ROOT`` (an environment variable) points the same tests at another folder of run folders with the same
layout (``<build>/<scenario>/``), e.g. a recording not yet copied into fixtures/.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex

from tests.conftest import ROOT

FIXTURES = ROOT / "fixtures" / "server-runs"

# Folders recorded before labels.json existed: their README states the truth in words.
README_TRUTH: dict[str, dict[str, Any]] = {
    # "A client sent 48 requests ... All succeeded." (2026 build, fixtures/server-runs/real-2026/README.md)
    "real-2026": {"n_requests": 48, "outcomes": {"ok": 48}},
    # "A client sent 48 requests ... all succeeded." (b4747, fixtures/server-runs/real-b4747/README.md)
    "real-b4747": {"n_requests": 48, "outcomes": {"ok": 48}, "server_exit": {"server": -6},
                   "stop_signal": "SIGINT"},
}


# What labels.json does not hold but the folder's README states: HTTP errors of the folders recorded before
# labels.json named them ("The server rejected each with HTTP 400"; "answered HTTP 500 `context shift is
# disabled` ... (12 HTTP 500s)").
HTTP_FROM_README: dict[tuple[str, str], dict[int, int]] = {
    ("b11312", "overlong"): {400: 2},
    ("b4747", "runaway-nocs"): {500: 12},
}

# The README's words for prompts the server cut to fit (`input truncated`), which labels.json does not count
# ("their extract quoting the whole runaway is silently cut by the server ('input truncated')": one per runaway).
PROMPTS_CUT_FROM_README: dict[tuple[str, str], int] = {
    ("b3605", "truncated"): 2,
    ("b4579", "nots-runaway-ctxshift"): 4,
}

# An HTTP 400 whose error says the prompt did not fit: the server refused it for its length.
REFUSED = regex.compile(r"exceeds the available context size|prompt is too long|is larger than the max context")

ItemStage = tuple[str, str]


@dataclass(frozen=True)
class DeadSlot:
    """A slot that went bad and stayed bad: its number, the item x stage it went bad on (None: not said) and the
    items it lost (its items from that one on that are missing at some stage)."""

    slot: int
    first_bad: ItemStage | None
    items_lost: frozenset[str]
    items_after: frozenset[str]  # its items from the one it went bad on


@dataclass(frozen=True)
class Crash:
    """A server that died: its exit code, and when: ``run`` (it died while the run went on) or ``shutdown`` (it
    exited badly, or was killed, when the harness stopped it)."""

    server: str
    code: int
    phase: str


@dataclass(frozen=True)
class Truth:
    """One reading of both label formats (the b11312/b4747/b3605 folders' ``uncapped_requests``, the 2026-12
    folders' ``planted``/``uncapped_stopped_by``/...) and of the READMEs where the labels are silent: the same
    assertions hold on every folder.

    * ``runaways_may``: every item x stage sent without an output cap (a runaway may be any of them, never
      another); ``runaways_must``: those that ran to the context or past it (not ended by their own EOS) and are
      not the dead slot's, whose requests the dead-slot finding tells; ``runaway_attempts``: how many attempts
      of those (a retried one runs away each time);
    * ``client_s``: (item, stage, attempt) -> seconds the client waited, for the uncapped attempts;
    * ``dead_slot``; ``prompts``: how -> count (``rejected``: refused with HTTP 400 for its length; ``filled``:
      padded by the harness to fill the slot (``fullprompt``); ``truncated``: cut to fit, from the README);
    * ``missing``, ``timeouts``, ``failovers``, ``crashes``, ``http``: HTTP errors by status.
    """

    n_requests: int | None = None
    outcomes: dict[str, int] = field(default_factory=dict)
    runaways_may: frozenset[ItemStage] = frozenset()
    runaways_must: frozenset[ItemStage] = frozenset()
    runaway_attempts: int = 0
    client_s: dict[tuple[str, str, int], float] = field(default_factory=dict)
    dead_slot: DeadSlot | None = None
    prompts: dict[str, int] = field(default_factory=dict)
    missing: frozenset[ItemStage] = frozenset()
    timeouts: int = 0
    failovers: int = 0
    crashes: tuple[Crash, ...] = ()
    http: dict[int, int] = field(default_factory=dict)
    stop_signal: str | None = None

    @property
    def run_crashes(self) -> list[Crash]:
        return [c for c in self.crashes if c.phase == "run"]


def _pair(d: dict[str, Any]) -> ItemStage:
    return (str(d.get("item") or d.get("ticker")), str(d["stage"]))


def _dead_slot(t: dict[str, Any], missing: frozenset[ItemStage]) -> DeadSlot | None:
    ds = t.get("dead_slot")
    if not ds:
        return None
    items = list(ds.get("items_on_it") or [])
    first = ds.get("first_bad_request")
    idx = ds.get("from_worker_item_index")
    if first:
        bad: ItemStage | None = _pair(first)
    elif idx is not None and idx < len(items):
        bad = (items[idx], "analyze")  # the old labels: its first bad item, whose first stage is analyze
    else:
        bad = None
    after = items[items.index(bad[0]):] if bad and bad[0] in items else items
    return DeadSlot(int(ds["slot"]), bad, frozenset(it for it, _ in missing if it in after), frozenset(after))


def _crashes(t: dict[str, Any]) -> tuple[Crash, ...]:
    out = []
    stops = t.get("server_stop") or {}
    for server, code in (t.get("server_exit") or {}).items():
        if code in (0, None):
            continue
        died_before = str(stops.get(server, "")).startswith("already exited")
        if code == -2 and not died_before:
            continue  # SIGINT ended it as the harness stopped it: a normal stop
        out.append(Crash(server, int(code), "run" if died_before else "shutdown"))
    return tuple(out)


def normalise(t: dict[str, Any], build: str, scenario: str) -> Truth:
    """The truth of a folder from its labels (either format) and what its README says that they do not."""
    missing = frozenset(_pair(m) for m in t.get("missing") or [])
    dead = _dead_slot(t, missing)
    if "planted" in t or "uncapped_stopped_by" in t:  # the 2026-12 labels
        uncapped = [p for p in t.get("planted") or [] if p.get("n_predict") is None
                    and p.get("kind") in ("uncapped", "dead-slot")]
        stopped = t.get("uncapped_stopped_by") or []
        may = frozenset(_pair(p) for p in uncapped) | frozenset(_pair(u) for u in stopped)
        ran_on = [u for u in stopped if not str(u.get("stopped_by", "")).startswith("server: stop_type eos")]
        if dead:
            ran_on = [u for u in ran_on if u["ticker"] not in dead.items_after]
        must = frozenset(_pair(u) for u in ran_on)
        client_s = {(u["ticker"], u["stage"], int(u.get("attempt") or 1)): float(u["client_duration_s"])
                    for u in stopped if u.get("client_duration_s") is not None}
        http = dict(Counter(int(h["http_status"]) for h in t.get("http_errors") or [] if h.get("http_status")))
        refused = sum(1 for h in t.get("http_errors") or [] if h.get("http_status") == 400
                      and REFUSED.search(str(h.get("error") or "")))
        filled = sum(1 for p in t.get("planted") or [] if p.get("kind") == "fullprompt")
        prompts = {k: n for k, n in (("rejected", refused), ("filled", filled)) if n}
        attempts = len(ran_on)
    else:  # the older labels: every uncapped item x stage ran away, each attempt of it
        may = must = frozenset(_pair(u) for u in t.get("uncapped_requests") or [])
        if dead:
            must = frozenset(p for p in must if p[0] not in dead.items_after)
        client_s, http = {}, dict(HTTP_FROM_README.get((build, scenario), {}))
        prompts = {"rejected": http[400]} if http.get(400) else {}
        attempts = len(must)
    cut = PROMPTS_CUT_FROM_README.get((build, scenario))
    if cut:
        prompts["truncated"] = cut
    return Truth(n_requests=t.get("n_requests"), outcomes=dict(t.get("outcomes") or {}), runaways_may=may,
                 runaways_must=must, runaway_attempts=attempts, client_s=client_s, dead_slot=dead, prompts=prompts,
                 missing=missing, timeouts=len(t.get("timeouts") or []), failovers=len(t.get("failovers") or []),
                 crashes=_crashes(t), http=http, stop_signal=t.get("stop_signal"))


@dataclass
class RunFolder:
    path: Path
    build: str
    scenario: str
    truth: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.build}/{self.scenario}" if self.build else self.scenario

    @property
    def facts(self) -> Truth:
        """The truth, one reading of both label formats (``normalise``)."""
        return normalise(self.truth, self.build, self.scenario)

    @property
    def records(self) -> bool:
        """The harness's records are in the folder (attempts.jsonl or client_requests.jsonl)."""
        return any((self.path / n).is_file() for n in ("attempts.jsonl", "client_requests.jsonl"))

    @property
    def kv_warnings(self) -> int:
        """How many "failed to find free space in the KV cache" lines the README says the log holds (0: none said)."""
        readme = self.path / "README.md"
        if not readme.is_file():
            return 0
        got = regex.findall(r"([\d,]+) `[^`]*failed to find free space in the KV cache", readme.read_text("utf-8"))
        return max((int(n.replace(",", "")) for n in got), default=0)

    @property
    def healthy(self) -> bool:
        """Nothing went wrong, by the truth: every request ok, no runaway, dead slot, timeout, prompt over the
        context, HTTP error, crash or missing item."""
        f = self.facts
        return (set(f.outcomes) <= {"ok"} and not f.runaways_may and not f.prompts and not f.dead_slot
                and not f.timeouts and not f.failovers and not f.missing and not f.http and not f.run_crashes
                and not self.truth.get("kv_stall"))


def _has_log(p: Path) -> bool:
    return any(f.suffix == ".log" or f.name.endswith(".log.gz") for f in p.iterdir() if f.is_file())


def folders(root: Path | None = None) -> list[RunFolder]:
    """Every real run folder under ``root`` (default: REAL_RUNS_ROOT, else fixtures/server-runs): a folder with a
    server log, either directly under it or one level down (``<build>/<scenario>``)."""
    root = Path(os.environ.get("REAL_RUNS_ROOT") or FIXTURES) if root is None else root
    out = []
    for p in sorted(q for q in root.rglob("*") if q.is_dir()):
        if not _has_log(p):
            continue
        rel = p.relative_to(root).parts
        labels = p / "labels.json"
        truth = json.loads(labels.read_text(encoding="utf-8")) if labels.is_file() else README_TRUTH.get(p.name, {})
        # <build>/<scenario>/ as recorded, or <build>-<scenario>/ as fixtures/ keeps them; labels.json says which
        build = str(truth.get("build") or (rel[0] if len(rel) > 1 else ""))
        scenario = rel[-1]  # the folder's name (a re-recorded scenario may keep its old label in labels.json)
        if len(rel) == 1 and build and scenario.startswith(f"{build}-"):
            scenario = scenario[len(build) + 1:]
        out.append(RunFolder(p, build, scenario, truth))
    return out

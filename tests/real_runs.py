"""The real run folders in fixtures/server-runs: real llama-server logs of several builds, with the harness's
records and the truth (`labels.json`, written by the harness from what it did; never a manifest) where they have
them.  Each folder is ingested once per test session into a store of its own.

``REAL_RUNS_ROOT`` (an environment variable) points the same tests at another folder of run folders with the same
layout (``<build>/<scenario>/``), e.g. a recording not yet copied into fixtures/.
"""

from __future__ import annotations

import json
import os
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


# What labels.json does not hold but the folder's README states: prompts the server cut or refused, by how,
# and how many ("the analyze prompts of TSLA and HD ... it cut each prompt to fit"; "2 prompts rejected with HTTP
# 400").
PROMPTS_FROM_README: dict[tuple[str, str], tuple[str, int]] = {
    ("b3605", "truncated"): ("truncated", 2),
    ("b11312", "overlong"): ("rejected", 2),
}


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
    def kv_warnings(self) -> int:
        """How many "failed to find free space in the KV cache" lines the README says the log holds (0: none said)."""
        readme = self.path / "README.md"
        if not readme.is_file():
            return 0
        got = regex.findall(r"([\d,]+) `[^`]*failed to find free space in the KV cache", readme.read_text("utf-8"))
        return max((int(n.replace(",", "")) for n in got), default=0)

    @property
    def prompts(self) -> tuple[str, int] | None:
        """(how, how many) of the prompts over the slot's context, when the README says there were some."""
        return PROMPTS_FROM_README.get((self.build, self.scenario))

    @property
    def healthy(self) -> bool:
        """Nothing went wrong, by the truth: every request ok, no runaway, dead slot, timeout or missing item."""
        t = self.truth
        return (set((t.get("outcomes") or {}).keys()) <= {"ok"} and not t.get("uncapped_requests") and not self.prompts
                and not t.get("dead_slot") and not t.get("timeouts") and not t.get("failovers")
                and not t.get("missing") and not t.get("kv_stall"))


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

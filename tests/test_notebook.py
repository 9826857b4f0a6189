"""The notebook walks the findings of the user's store through the public API, and falls back to the demo
data when there is no store; it runs top to bottom with the project's kernel."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "explore.ipynb"


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: Path) -> str:
    # the kernel imports this checkout's package whatever the state of the editable install
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("FORENSICS_STORE", str(store))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream") + "".join(
        o.get("data", {}).get("text/plain", "") for o in outputs if o.get("output_type") != "stream")


def _walks_the_findings(text: str) -> None:
    assert "run-np6: Slot 2 of `main-np6` died at 10:50:19 on NVDA/score and never recovered" in text
    # the dead slot's first abnormal request, in the server's own lines: 3.9 tokens/s, then its release
    assert "run-np6 main-np6 slot 2: dead from task 207 (115.4 s, 449 tokens, long,slow)" in text
    assert "main-np6.log:493  2.15.271.610 I slot      release: id  2 | task 207 | stop processing" in text
    assert "n_gen =    100, tg =   3.90 t/s" in text
    assert "left out run-np8: The run did not complete (killed: killed by a watchdog after 70 s)." in text
    assert "left out run-np4: 2 outputs ran far longer than normal" in text  # runaways: not throughput
    # one knee, between two measured np (the fitted model's, np 4, is a run left out)
    assert ("fitted latency = 3.92 s + 1.59 s × np: the knee is between np 3 and 5: from 3 to 5 each extra slot "
            "added 8 % throughput and 14 % latency") in text
    assert "│ dead slot ┆ 4   │" in text and "│ runaway   ┆ 2   │" in text
    assert "Items missing only in run-np6: CRM." in text
    # incidents across runs, and the precursors: too few dead slots; the runaways share nothing the others lack
    assert "8 incidents in 2 of the 8 runs: 1 dead slot, 4 runaways, 3 failovers; 3 recovered." in text
    assert "1 dead slot: too few to tell what sets their onsets apart (at least 3 are needed)." in text
    assert "4 runaways: nothing the store knows sets their onsets apart; the closest: " in text
    # what if: the run's own budget (requests under 120 s), the recommended np and cap, the run replayed there
    # the fastest np that meets the budget, measured on a healthy run (np 8 is one step past the data, slower)
    assert "Recommended np 7 with output cap 1024 (measured on run-np7: request latency 26 s against 2m00s)" in text
    assert "run-np6 at np 7 (it ran at np 6) with output cap 1024: run time " in text
    assert "Cap 1024 cuts 2 runaway(s) (CRM/extract), 0 normal response(s)" in text


def test_the_notebook_walks_the_users_store(demo: tuple[Path, Any], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    text = _run(tmp_path, monkeypatch, demo[0] / "store")
    assert f"store: {demo[0] / 'store'}" in text
    _walks_the_findings(text)


def test_without_a_store_the_notebook_explores_the_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = _run(tmp_path, monkeypatch, tmp_path / "nothing-here")
    assert f"no store at {tmp_path / 'nothing-here'}" in text and "exploring the demo data instead" in text
    assert "8 runs: run-np1, run-np2, run-np3, run-np4, run-np5, run-np6, run-np7, run-np8" in text
    _walks_the_findings(text)

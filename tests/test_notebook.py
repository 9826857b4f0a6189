"""The exploration notebook runs top to bottom with the project's kernel."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "explore.ipynb"


def test_explore_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the kernel imports this checkout's package whatever the state of the editable install
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=60, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    # np 1, 2, 4 at 10, 12, 16 s per request: latency = 8 + 2 x np exactly
    assert "latency = 8.00 s + 2.00 s x np" in text
    # throughput 900/30, 1800/36, 3600 + 2700 more tokens over 48 s: 30, 50, 131.25 tok/s
    # gains per slot 0.667, (131.25 / 50 - 1) / 2 = 0.81: no knee
    assert "no knee yet" in text

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch a real store: FORENSICS_STORE points into the test's tmp dir."""
    monkeypatch.setenv("FORENSICS_STORE", str(tmp_path / "default-store"))
    monkeypatch.setenv("TZ", "UTC")
    os.environ.pop("NO_COLOR", None)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"

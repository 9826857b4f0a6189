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


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """``forensics demo`` run once for the session: (its folder, the CliRunner result).  Tests read its store
    and report and must not change them."""
    from click.testing import CliRunner

    from forensics.cli import cli

    out = tmp_path_factory.mktemp("demo") / "demo"
    res = CliRunner().invoke(cli, ["demo", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out, res

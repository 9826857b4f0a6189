"""The store's format version is a contract: checked when a store is opened, an older store brought up to date by
the ordered migrations (in memory for readers, written back once by a writer under the lock), a store or a
commit written by a newer version refused with one line (exit 2) and left as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import forensics.store as store_mod
from forensics.cli import cli
from forensics.errors import StoreError
from forensics.store import FORMAT_VERSION, MANIFEST, MIGRATIONS, Migration, Store, migrated
from tests.conftest import ROOT

LOG = ROOT / "fixtures" / "logs" / "era5-default-b10587.log"
OTHER = ROOT / "fixtures" / "logs" / "era4-bare-b4747.log"
READS = (["runs"], ["runaways"], ["summary", "--format", "json"], ["sql", "select count(*) n from requests"])


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def _ingested(store: Path) -> None:
    res = _invoke("ingest", str(LOG), "--store", str(store))
    assert res.exit_code == 0, res.output


def _manifest(store: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((store / MANIFEST).read_text(encoding="utf-8"))
    return data


def _write_manifest(store: Path, data: dict[str, Any]) -> None:
    """As the store writes it (forensics.store.Store._write_json)."""
    (store / MANIFEST).write_text(json.dumps(data, indent=1, sort_keys=True, default=str), encoding="utf-8")


def _files(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


def _outputs(store: Path) -> list[tuple[int, str]]:
    out = []
    for args in READS:
        res = CliRunner().invoke(cli, [*args, "--store", str(store)])
        out.append((res.exit_code, res.stdout))
    return out


def test_the_version_follows_the_migrations() -> None:
    assert FORMAT_VERSION == MIGRATIONS[-1].to == 2
    assert [m.to for m in MIGRATIONS] == list(range(2, FORMAT_VERSION + 1))  # one step per version, in order


def test_a_new_store_is_written_at_the_current_version(tmp_path: Path) -> None:
    _ingested(tmp_path / "s")
    assert _manifest(tmp_path / "s")["version"] == FORMAT_VERSION
    assert "upgraded_from" not in _manifest(tmp_path / "s")


def test_a_store_of_a_newer_version_is_refused_in_one_line(tmp_path: Path) -> None:
    store = tmp_path / "s"
    _ingested(store)
    data = _manifest(store)
    _write_manifest(store, {**data, "version": 999})
    before = _files(store)
    expected = (f"forensics: error: the store at {store} was written by a newer llama-forensics (store format 999; "
                f"this one reads up to {FORMAT_VERSION}) (upgrade llama-forensics (pip install -U llama-forensics) "
                "to read it)\n")
    for args in (*READS, ["ingest", str(OTHER)], ["compact"], ["check"], ["report", "-o", str(tmp_path / "r.html")]):
        res = CliRunner().invoke(cli, [*args, "--store", str(store)])
        assert (res.exit_code, res.stdout, res.stderr) == (2, "", expected), args
    assert _files(store) == before  # nothing written, nothing recovered, nothing derived
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("version", [None, 0, -1, "2", True, 1.5])
def test_a_manifest_without_a_valid_version_is_refused(tmp_path: Path, version: object) -> None:
    store = tmp_path / "s"
    _ingested(store)
    data = _manifest(store)
    data.pop("version")
    _write_manifest(store, data if version is None else {**data, "version": version})
    res = _invoke("runs", "--store", str(store))
    assert res.exit_code == 2
    assert res.stderr == (f"forensics: error: {store / MANIFEST} has no valid store format version ({version!r}) "
                          "(run `forensics check` to see how to repair the store)\n")


def test_a_version_1_store_reads_the_same_and_a_writer_brings_it_up_to_date(tmp_path: Path) -> None:
    store = tmp_path / "s"
    _ingested(store)
    current = _outputs(store)
    data = _manifest(store)
    _write_manifest(store, {**data, "version": 1})
    written = (store / MANIFEST).read_bytes()
    assert Store(store).manifest["version"] == FORMAT_VERSION  # read as the current version
    assert _outputs(store) == current
    assert (store / MANIFEST).read_bytes() == written  # readers never write
    res = _invoke("ingest", str(OTHER), "--store", str(store))
    assert res.exit_code == 0, res.output
    after = _manifest(store)
    assert after["version"] == FORMAT_VERSION and "upgraded_from" not in after


def test_a_version_1_store_from_before_the_analysis_is_derived_on_first_use(tmp_path: Path) -> None:
    """What a store of version 1 written before the analysis existed holds: the ingest's tables, no `derived`
    entry and no `_derived` folder.  The first command derives the analysis (a writer: the manifest is written
    at the current version) and answers as on a store of today."""
    store = tmp_path / "s"
    _ingested(store)
    current = _outputs(store)
    data = _manifest(store)
    data.pop("derived")
    shutil.rmtree(store / "_derived")
    _write_manifest(store, {**data, "version": 1})
    assert _outputs(store) == current
    after = _manifest(store)
    assert after["version"] == FORMAT_VERSION and "derived" in after and "upgraded_from" not in after


def test_a_writer_that_commits_nothing_still_keeps_the_upgrade(tmp_path: Path) -> None:
    store = tmp_path / "s"
    _ingested(store)
    _write_manifest(store, {**_manifest(store), "version": 1})
    with Store(store).lock():
        pass
    assert _manifest(store)["version"] == FORMAT_VERSION


def test_the_migrations_run_in_order_from_the_stores_version(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    """A future change of the store is one entry: each step after the store's version runs, in order."""
    seen: list[int] = []

    def step(to: int) -> Migration:
        def apply(m: dict[str, Any]) -> dict[str, Any]:
            seen.append(to)
            return {**m, "meta": {**m.get("meta", {}), "steps": [*m.get("meta", {}).get("steps", []), to]}}
        return Migration(to, f"step {to}", apply)

    monkeypatch.setattr(store_mod, "MIGRATIONS", (step(2), step(3), step(4)))
    monkeypatch.setattr(store_mod, "FORMAT_VERSION", 4)
    for start, steps in ((1, [2, 3, 4]), (2, [3, 4]), (3, [4]), (4, [])):
        seen.clear()
        out = migrated({"version": start, "meta": {}}, tmp_path)
        assert seen == steps and out["meta"].get("steps", []) == steps
        assert out["version"] == 4 and out.get("upgraded_from") == (start if steps else None)
    with pytest.raises(StoreError, match=r"store format 5; this one reads up to 4"):
        migrated({"version": 5}, tmp_path)


def test_a_commit_journal_of_a_newer_version_is_left_alone(tmp_path: Path) -> None:
    store = tmp_path / "s"
    _ingested(store)
    journal = {"txn": "future", "renames": [], "deletes": [], "complete": True,
               "manifest": {**_manifest(store), "version": 999}}
    (store / ".txn").mkdir(exist_ok=True)
    (store / ".txn" / "future.json").write_text(json.dumps(journal), encoding="utf-8")
    before = _files(store)
    res = _invoke("ingest", str(OTHER), "--store", str(store))
    assert res.exit_code == 2
    assert "written by a newer llama-forensics (store format 999" in res.stderr
    assert _files(store) == before  # the journal is kept for the version that wrote it

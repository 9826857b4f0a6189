"""Store.run_names (runs read from the manifest's part paths) against what DuckDB reads from the parts."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from forensics import runs, schema
from forensics.store import Store


def _store(root: Path, names: list[str]) -> Store:
    store = Store(root, create=True)
    row = {c.name: pl.Series(c.name, [None], dtype=c.dtype) for c in schema.TABLES["runs"] if c.name != "run"}
    with store.lock():
        txn = store.transaction()
        for name in names:
            txn.write("runs", pl.DataFrame(row), run=name, name="part")
        txn.commit()
    return store


def _from_views(store: Store) -> list[object]:
    con = store.connect(tables=list(runs.RUN_TABLES))
    try:
        return [r[0] for r in con.execute("SELECT DISTINCT run FROM runs ORDER BY run").fetchall()]
    finally:
        con.close()


@pytest.mark.parametrize("names", [
    ["bench-0001", "bench-0000"],
    ["a b", "x%41y", "é", "../../x", "a+b", "'; drop table runs; --", "1.5x"],
])
def test_run_names_match_the_views(tmp_path: Path, names: list[str]) -> None:
    store = _store(tmp_path / "store", names)
    assert store.run_names(list(runs.RUN_TABLES)) == _from_views(store) == sorted(names)


@pytest.mark.parametrize("names", [["1", "2"], ["2024-01-01"], [""], ["true"], ["NULL", "x"]])
def test_names_duckdb_may_type_fall_back_to_the_views(tmp_path: Path, names: list[str]) -> None:
    store = _store(tmp_path / "store", names)
    assert store.run_names(list(runs.RUN_TABLES)) is None
    con = store.connect(tables=list(runs.RUN_TABLES))
    try:
        assert runs.all_runs(store) == runs.all_runs(con)
    finally:
        con.close()


def test_known_runs_of_an_empty_store(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", create=True)
    assert store.run_names(list(runs.RUN_TABLES)) == []

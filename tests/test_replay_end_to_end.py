"""Replay records and server logs end to end: the join against the generator's ground truth.

The same multi-stage run with retries (a dead slot on main, timeouts retried on the backup instance) is
written as a log without timestamps (era 4), with elapsed timestamps (era 5) and with journald absolute
times; after ingest every matched attempt must point at the request that really served it, and every
server request of the run has an absolute time but where nothing places it.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from forensics.generate import deadslot, generate
from forensics.ingest import ingest
from forensics.store import Store


@pytest.mark.parametrize(("fmt", "wrapper"), [("era4", None), ("era5", None), ("era5", "journald")])
def test_join_matches_ground_truth(tmp_path: Path, fmt: str, wrapper: str | None) -> None:
    gen = generate(deadslot(), tmp_path / "gen", fmt=fmt, wrapper=wrapper, seed=5)
    ingest(tmp_path / "store", [tmp_path / "gen" / "logs"])
    s = Store(tmp_path / "store")
    truth = gen.truth.filter(pl.col("item").is_not_null()).select(
        "run", "instance", "slot", "task", "item", "stage", "attempt")
    matches = s.table("matches")
    got = matches.filter(pl.col("match") == "matched").select("run", "instance", "slot", "task", "item", "stage",
                                                              "attempt")
    # every matched attempt points at the request that served it
    wrong = got.join(truth, on=["run", "item", "stage", "attempt"], how="left", suffix="_truth").filter(
        (pl.col("instance") != pl.col("instance_truth")) | (pl.col("slot") != pl.col("slot_truth"))
        | (pl.col("task") != pl.col("task_truth")))
    assert wrong.height == 0, wrong.rows()
    # and almost all attempts that reached a slot are matched (the rest are ambiguous, never wrong)
    assert got.height >= 0.9 * truth.height, (got.height, truth.height)
    assert matches.filter(pl.col("match") == "ambiguous").height + got.height >= truth.height
    # the main and the backup instance are both there, kept apart by their log files
    assert set(got["instance"]) == {"main", "backup"}
    # after the join every server request of the run has an absolute time; on a log without time the dead slot's
    # two cancelled requests (slot 1, seq 3 and 4), whose length the log does not give, are tied to their timed-out
    # attempts by the order of the tasks, and take their times from them
    req = s.table("requests").filter(pl.col("run") == "run-deadslot")
    assert req.height == gen.requests
    untimed = req.filter(pl.col("t_start").is_null() | pl.col("t_end").is_null())
    if fmt == "era4" and wrapper is None:
        assert untimed.height == 0
        assert set(req["clock"]) <= {"attempt", "order"}
        assert req.filter((pl.col("slot") == 1) & pl.col("seq").is_in([3, 4]))["clock"].to_list() == ["attempt"] * 2
    else:
        assert untimed.height == 0
        assert set(req["clock"]) == ({"log"} if wrapper == "journald" else {"anchored"})
    assert req.filter(pl.col("t_end") <= pl.col("t_start")).height == 0
    if wrapper == "journald" or fmt == "era5":  # anchored by the log's own clock: exact to the microsecond
        exact = req.join(gen.truth.select("instance", "slot", "task", pl.col("t_start").alias("t_truth")),
                         on=["instance", "slot", "task"])
        t_truth = exact["t_truth"].str.to_datetime(time_zone="UTC") if exact["t_truth"].dtype == pl.String \
            else exact["t_truth"]
        diff = (exact["t_start"] - t_truth).dt.total_microseconds().abs()
        assert diff.max() <= 1_000_000 if wrapper == "journald" else diff.max() <= 1, diff.max()

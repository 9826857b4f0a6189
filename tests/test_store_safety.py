"""Crash safety (a crash at every step of a commit), the writer lock, `forensics check`, names that try to escape."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from filelock import FileLock

import forensics.store as store_mod
from forensics.cli import cli
from forensics.errors import StoreError
from forensics.ingest import IngestOptions, ingest
from forensics.store import Store, escape_partition
from forensics.watch.state import WatchState

BLOCK = """\
{t0} I slot launch_slot_: id  {slot} | task {task} | processing task, is_child = 0
{t1} I slot print_timing: id  {slot} | task {task} | prompt eval time =     228.40 ms /   812 tokens (    0.28 ms per token,  3555.17 tokens per second)
{t1} I slot print_timing: id  {slot} | task {task} |        eval time =    7811.20 ms /   178 tokens (   44.13 ms per token,    22.66 tokens per second)
{t1} I slot print_timing: id  {slot} | task {task} |       total time =    8039.60 ms /   990 tokens
{t1} I slot      release: id  {slot} | task {task} | stop processing: n_tokens = 989, truncated = 0
"""


def write_log(path: Path, n: int, first_task: int = 0) -> None:
    parts = []
    for i in range(n):
        m, s = divmod(i, 60)
        parts.append(BLOCK.format(t0=f"{m}.{s:02d}.000.000", t1=f"{m}.{s:02d}.500.000", slot=i % 4,
                                  task=first_task + i * 3))
    path.write_text("".join(parts))


def snapshot(store_dir: Path) -> tuple[int, int]:
    if not (store_dir / "_manifest.json").exists():
        return (0, 0)
    s = Store(store_dir)
    return (s.table("requests").height, s.table("events").height)


class Crash(BaseException):
    """Stops an ingest at one step of its commit, as a kill would: nothing after it runs."""


def _crash_at(k: int) -> Callable[[str], None]:
    """A hook that crashes at the k-th step (step names repeat: an ingest commits more than once)."""
    seen = [0]

    def hook(step: str) -> None:
        seen[0] += 1
        if seen[0] == k + 1:
            raise Crash(step)
    return hook


def _commit_steps(store_dir: Path, logs: Path) -> list[str]:
    """Every step the commit of ``ingest(store_dir, [logs])`` goes through, in order (on a copy)."""
    seen: list[str] = []
    copy = store_dir.parent / "steps-copy"
    shutil.copytree(store_dir, copy)
    store_mod.FAULT = seen.append
    try:
        ingest(copy, [logs])
    finally:
        store_mod.FAULT = None
    shutil.rmtree(copy)
    return seen


def test_a_crash_at_any_step_of_a_commit_leaves_the_store_before_or_after(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.log", 30)
    write_log(logs / "b.log", 40, first_task=1)  # another server's log (the same lines would be a duplicate)
    store_dir = tmp_path / "store"
    ingest(store_dir, [logs / "a.log"])
    before = snapshot(store_dir)
    assert before == (30, 150)
    write_log(logs / "a.log", 35)  # grown: the commit also drops the parts it replaces
    after = (75, 375)
    steps = _commit_steps(store_dir, logs)
    assert steps[:2] == ["journal:before", "journal:after"] and "manifest:before" in steps
    assert any(s.startswith("rename:") for s in steps) and any(s.startswith("delete:") for s in steps)
    pristine = tmp_path / "pristine"
    shutil.copytree(store_dir, pristine)
    outcomes = []
    for k, point in enumerate(steps):
        shutil.rmtree(store_dir)
        shutil.copytree(pristine, store_dir)
        store_mod.FAULT = _crash_at(k)
        try:
            with pytest.raises(Crash):
                ingest(store_dir, [logs])
        finally:
            store_mod.FAULT = None
        # a reader sees the store as it was before or after, and changes nothing
        listing = sorted(str(p) for p in store_dir.rglob("*"))
        state = snapshot(store_dir)
        assert state in (before, after), point
        assert sorted(str(p) for p in store_dir.rglob("*")) == listing, point
        outcomes.append(state)
        # the next writer finishes or discards the interrupted commit, and its own ingest completes
        ingest(store_dir, [logs])
        assert snapshot(store_dir) == after, point
        res = CliRunner().invoke(cli, ["check", "--store", str(store_dir)])
        assert res.exit_code == 0, (point, res.output)
    # readers see the new state from the moment the manifest is replaced, never earlier
    flip = steps.index("manifest:after")
    assert outcomes == [before] * flip + [after] * (len(steps) - flip)


def test_sigkill_in_the_middle_of_a_commit(tmp_path: Path) -> None:
    """The same as above with a real kill -9 of a separate process, at the manifest write."""
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.log", 30)
    store_dir = tmp_path / "store"
    code = ("import os, sys; import forensics.store as s; "
            "s.FAULT = lambda p: os.kill(os.getpid(), 9) if p == 'manifest:before' else None; "
            "from pathlib import Path; from forensics.ingest import ingest; ingest(Path(sys.argv[1]), [Path(sys.argv[2])])")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", code, str(store_dir), str(logs)], env=env, check=False)
    assert proc.returncode == -signal.SIGKILL
    assert list((store_dir / ".txn").glob("*.json"))  # the journal is there: the commit point was passed
    assert snapshot(store_dir) == (0, 0)  # a reader sees the store before the commit and leaves it
    ingest(store_dir, [logs])  # the next writer rolls the commit forward
    assert snapshot(store_dir) == (30, 150)
    assert not list((store_dir / ".txn").glob("*.json"))


def test_opening_the_store_during_an_ingest_does_not_touch_its_staged_parts(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.log", 30)
    store_dir = tmp_path / "store"
    Store(store_dir, create=True)
    opened: list[tuple[int, int]] = []

    def reader_opens(step: str) -> None:
        if step == "journal:before" and not opened:  # every part is staged under its temporary name now
            staged = list(store_dir.rglob("*.tmp-*"))
            assert staged
            opened.append(snapshot(store_dir))  # summary, sql, a notebook cell...
            CliRunner().invoke(cli, ["check", "--store", str(store_dir)])
            assert all(p.exists() for p in staged)

    store_mod.FAULT = reader_opens
    try:
        ingest(store_dir, [logs])
    finally:
        store_mod.FAULT = None
    assert opened == [(0, 0)]
    assert snapshot(store_dir) == (30, 150)


def test_second_ingest_waits_for_the_lock(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.log", 10)
    store_dir = tmp_path / "store"
    Store(store_dir, create=True)
    held = FileLock(store_dir / ".lock")  # the lock a first ingest holds, as another process would
    held.acquire()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "forensics", "ingest", "--store", str(store_dir), str(logs)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the second ingest says it waits (however long a busy machine takes to start it), and does wait
    assert proc.stderr is not None
    said = proc.stderr.readline()
    assert "waiting for another ingest" in said
    time.sleep(1)
    assert proc.poll() is None  # still waiting
    held.release()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert snapshot(store_dir) == (10, 50)


def test_a_held_lock_refuses_a_writer_that_does_not_wait_and_frees_on_release(tmp_path: Path) -> None:
    """The store's writer lock and watch's lock (filelock): a second holder is refused in one line while the first
    holds it, and gets it once the first lets go."""
    store = Store(tmp_path / "store", create=True)
    watch = WatchState(tmp_path / "store")
    with store.lock(), watch.exclusive():
        with pytest.raises(StoreError, match="another ingest is writing to") as busy, \
                Store(tmp_path / "store").lock(wait=False):
            pass
        assert busy.value.hint == "wait for it to finish, then run again"
        with pytest.raises(StoreError, match="another `forensics watch` is following into"), \
                WatchState(tmp_path / "store").exclusive():
            pass
    with Store(tmp_path / "store").lock(wait=False), WatchState(tmp_path / "store").exclusive():
        pass


def test_check_reports_a_missing_part(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.log", 10)
    store_dir = tmp_path / "store"
    ingest(store_dir, [logs])
    part = Store(store_dir).parts("requests")[0]
    (store_dir / part).unlink()
    res = CliRunner().invoke(cli, ["check", "--store", str(store_dir), "--format", "csv"])
    assert res.exit_code == 1
    assert f"problem,requests: {part} is listed but missing" in res.output


@pytest.mark.parametrize("name", ["../../x", "/etc/passwd", "a\x00b", "..", ".hidden", "'; drop table requests; --"])
def test_run_names_never_escape_the_store(tmp_path: Path, name: str) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.log", 3)
    store_dir = tmp_path / "store"
    ingest(store_dir, [logs], IngestOptions(run=name))
    escaped = escape_partition(name)
    assert "/" not in escaped and escaped not in {".", ".."} and not escaped.startswith(".")
    for p in store_dir.rglob("*"):
        assert p.resolve().is_relative_to(store_dir.resolve())
    s = Store(store_dir)
    assert s.table("requests")["run"].unique().to_list() == [name.replace("\x00", "")]
    res = CliRunner().invoke(cli, ["sql", "--store", str(store_dir), "select count(*) as n from requests"])
    assert res.output.splitlines()[-1].strip() == "3"


def test_a_damaged_part_is_an_error_not_an_empty_table(tmp_path: Path) -> None:
    """Records already in the store are read before new ones of the same run are added: a part that cannot be
    read must stop the ingest (nothing removed), not read as "no records" whose parts are then replaced."""
    runs = Path(__file__).resolve().parent.parent / "fixtures" / "replay" / "multistage"
    store_dir = tmp_path / "store"
    ingest(store_dir, [runs / "attempts.jsonl"], IngestOptions(run="m"))
    part = Store(store_dir).parts("attempts")[0]
    (store_dir / part).write_bytes(b"PAR1 not really parquet")
    parts_before = sorted(p.name for p in store_dir.rglob("*.parquet"))
    res = CliRunner().invoke(cli, ["ingest", str(runs / "manifest.json"), "--run", "m", "--store", str(store_dir)])
    assert res.exit_code == 2
    assert "cannot read the attempts table" in res.stderr and "forensics check" in res.stderr
    assert sorted(p.name for p in store_dir.rglob("*.parquet")) == parts_before
    res = CliRunner().invoke(cli, ["check", "--store", str(store_dir), "--format", "csv"])
    assert res.exit_code == 1
    assert f"problem,attempts: {part}:" in res.stdout and "problem,cannot read the attempts table" in res.stdout


def test_parts_written_before_a_column_was_added_read_it_as_null(tmp_path: Path) -> None:
    """A store from an older version (its runs parts lack the columns added since) still reads: the new
    columns are NULL of their type, the old ones keep their values."""
    import polars as pl

    from forensics import schema
    from forensics.store import Store

    store = Store(tmp_path / "store", create=True)
    txn = store.transaction()
    old = schema.conform(pl.DataFrame({"run": ["r1"], "model": ["m"]}), "runs").drop("alias", "summary_ok")
    txn.write("runs", old, run="r1", name="old")
    txn.commit()
    con = store.connect(tables=["runs"])
    try:
        got = con.execute("SELECT run, model, alias, summary_ok FROM runs").fetchall()
        types = dict(con.execute("SELECT column_name, column_type FROM (DESCRIBE runs)").fetchall())
    finally:
        con.close()
    assert got == [("r1", "m", None, None)]
    assert (types["alias"], types["summary_ok"]) == ("VARCHAR", "BIGINT")
    assert list(types) == [c.name for c in schema.TABLES["runs"]]

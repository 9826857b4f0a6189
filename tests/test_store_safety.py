"""Crash safety (SIGKILL at random points), the writer lock, `forensics check`, names that try to escape."""

from __future__ import annotations

import fcntl
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.ingest import ingest
from forensics.store import Store, escape_partition

BLOCK = """\
{t0} I slot launch_slot_: id  {slot} | task {task} | processing task, is_child = 0
{t1} I slot print_timing: id  {slot} | task {task} | prompt eval time =     228.40 ms /   812 tokens (    0.28 ms per token,  3555.17 tokens per second)
{t1} I slot print_timing: id  {slot} | task {task} |        eval time =    7811.20 ms /   178 tokens (   44.13 ms per token,    22.66 tokens per second)
{t1} I slot print_timing: id  {slot} | task {task} |       total time =    8039.60 ms /   990 tokens
{t1} I slot      release: id  {slot} | task {task} | stop processing: n_tokens = 989, truncated = 0
"""


def write_log(path: Path, n: int) -> None:
    parts = []
    for i in range(n):
        m, s = divmod(i, 60)
        parts.append(BLOCK.format(t0=f"{m}.{s:02d}.000.000", t1=f"{m}.{s:02d}.500.000", slot=i % 4, task=i * 3))
    path.write_text("".join(parts))


def snapshot(store_dir: Path) -> tuple[int, int]:
    if not (store_dir / "_manifest.json").exists():
        return (0, 0)
    s = Store(store_dir)
    return (s.table("requests").height, s.table("events").height)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_sigkill_leaves_store_before_or_after(tmp_path: Path, seed: int) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.log", 20000)
    write_log(logs / "b.log", 20000)
    store_dir = tmp_path / "store"
    ingest(store_dir, [logs / "a.log"])
    before = snapshot(store_dir)
    assert before == (20000, 100000)
    rng = random.Random(seed)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "forensics", "ingest", "--store", str(store_dir), str(logs)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(rng.uniform(0.3, 2.5))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = snapshot(store_dir)  # opening the store rolls an interrupted commit forward or discards it
    assert state in (before, (40000, 200000))
    ingest(store_dir, [logs])
    assert snapshot(store_dir) == (40000, 200000)
    res = CliRunner().invoke(cli, ["check", "--store", str(store_dir)])
    assert res.exit_code == 0, res.output


def test_second_ingest_waits_for_the_lock(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.log", 10)
    store_dir = tmp_path / "store"
    Store(store_dir, create=True)
    fh = (store_dir / ".lock").open("a+")
    fcntl.flock(fh, fcntl.LOCK_EX)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "forensics", "ingest", "--store", str(store_dir), str(logs)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    assert proc.poll() is None  # still waiting
    fcntl.flock(fh, fcntl.LOCK_UN)
    fh.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert "waiting for another ingest" in err
    assert snapshot(store_dir) == (10, 50)


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
    ingest(store_dir, [logs], run=name)
    escaped = escape_partition(name)
    assert "/" not in escaped and escaped not in {".", ".."} and not escaped.startswith(".")
    for p in store_dir.rglob("*"):
        assert p.resolve().is_relative_to(store_dir.resolve())
    s = Store(store_dir)
    assert s.table("requests")["run"].unique().to_list() == [name.replace("\x00", "")]
    res = CliRunner().invoke(cli, ["sql", "--store", str(store_dir), "select count(*) as n from requests"])
    assert res.output.splitlines()[-1].strip() == "3"

"""What one replay run's join may look at: the server instances its attempts may have reached, and the runs
whose joins must be worked out together.

Resolution is scoped to the run.  An attempt reaches an instance of its own run (the store partition its
records and logs were read into), or an instance of a log file its run's manifest names (``servers[].log_file``,
resolved beside the manifest: a long-running server whose log sits in another folder).  Never an instance of
another run by its name, its file name or its port: those repeat in every run folder (``main.log``, port
8080), and matching on them made one run's answer depend on what else was in the store.

Which instance, by the attempt's ``server``:

* a server the manifest lists: the instances of the log it names; else, among the run's own instances, the log
  of that file name, else the port;
* a server the manifest does not list: the run's own instance of that name (instance id or log-file stem); none,
  and the manifest lists servers: nothing (``no_instance``); none, and no servers listed: the run's instances;
* no server at all: any instance of the manifest's servers, else any instance of the run; the slot, tokens and
  time decide which (a run with one server needs no ``server`` field).

Runs share a log when the join gave its requests to several runs (its request parts sit in several
partitions) or when a run's manifest names a log read into another run: such runs are one *component*, joined
together, since they compete for the same requests.  ``component`` finds it from the store's manifest (part
names start with the log's file id) and the manifests' servers, without reading any request.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from forensics import schema
from forensics.paths import file_id_of, file_stem
from forensics.store import run_of_part

InstKey = tuple[str, str]  # (store run partition, instance id)
JOIN_TABLES = ("requests", "instances", "runs", "attempts")  # what the join reads; a change to any re-joins
# the rules a stored join was worked out by (meta join_version): a store joined by other rules is joined again
# whole at its next ingest.  2: runs scoped to their own logs, requests.clock, matches.server
JOIN_VERSION = 2


def resolved(p: str | None) -> str | None:
    if not p:
        return None
    try:
        return str(Path(p).resolve())
    except OSError:
        return p


@dataclass
class Instances:
    """The instances the join may reach, indexed by run partition and by resolved log path."""

    by_run: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    by_path: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    rows: dict[InstKey, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, inst: pl.DataFrame) -> Instances:
        out = cls()
        for r in inst.iter_rows(named=True):
            r = {**r, "resolved": resolved(r["path"])}
            out.by_run.setdefault(r["run"], []).append(r)
            for p in {r["path"], r["resolved"]} - {None}:
                out.by_path.setdefault(p, []).append(r)
            out.rows.setdefault((r["run"], r["instance"]), r)
        return out


def manifest_servers(runs: pl.DataFrame) -> dict[str, dict[str, dict[str, Any]]]:
    """Each run's manifest servers by name (a run listed twice: its last row)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run, servers in runs.select("run", "servers").iter_rows() if runs.height else []:
        try:
            lst = json.loads(servers) if servers else []
        except json.JSONDecodeError:
            lst = []
        out[run] = {s["name"]: s for s in lst if isinstance(s, dict) and s.get("name")}
    return out


def server_instances(run: str, s: dict[str, Any], inst: Instances) -> list[dict[str, Any]]:
    """A manifest server's instances: those of the log file it names, wherever that log was read; else, among
    the run's own instances, the log of that file name, else the one on its port."""
    log_path = s.get("log_path")
    hits = (inst.by_path.get(log_path, []) or inst.by_path.get(resolved(log_path) or "", [])) if log_path else []
    own = inst.by_run.get(run, [])
    if not hits and s.get("log_file"):
        base = Path(s["log_file"]).name
        hits = [r for r in own if r["path"] and Path(r["path"]).name == base]
    if not hits and s.get("port") is not None:
        hits = [r for r in own if r["port"] == s["port"]]
    return hits


def instances_for(run: str, server: str | None, servers: dict[str, dict[str, Any]],
                  inst: Instances) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """The instances an attempt of ``run`` naming ``server`` may have reached, each with the manifest server
    that names it (None: found without the manifest); see the module docstring."""
    own = inst.by_run.get(run, [])
    if server is not None and server in servers:
        s = servers[server]
        return [(r, s) for r in server_instances(run, s, inst)]
    if server:
        hits = [r for r in own if r["instance"] == server or (r["path"] and file_stem(Path(r["path"]).name) == server)]
        if hits or servers:
            return [(r, None) for r in hits]
        return [(r, None) for r in own]
    seen: set[InstKey] = set()
    out: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for s in servers.values():
        for r in server_instances(run, s, inst):
            if (r["run"], r["instance"]) not in seen:
                seen.add((r["run"], r["instance"]))
                out.append((r, s))
    return out or [(r, None) for r in own]


@dataclass
class Reach:
    """Which instances each (run, server) of the attempts may reach: ``pairs`` (run, server, krun, kinst,
    sname: the manifest's name for that instance, else its id), and the manifest's launch time per instance
    (the first server that names one wins)."""

    pairs: pl.DataFrame
    launched: dict[InstKey, float]


def _launch_s(s: dict[str, Any] | None) -> float | None:
    if not s or not s.get("launched_at"):
        return None
    return datetime.fromisoformat(str(s["launched_at"]).replace("Z", "+00:00")).timestamp()


def reach(pairs: Iterable[tuple[str, str | None]], inst: Instances,
          servers_by_run: dict[str, dict[str, dict[str, Any]]]) -> Reach:
    """``instances_for`` once per (run, server) of the attempts."""
    rows: list[tuple[str, str | None, str, str, str]] = []
    launched: dict[InstKey, float] = {}
    for run, server in pairs:
        for r, s in instances_for(run, server, servers_by_run.get(run, {}), inst):
            key = (r["run"], r["instance"])
            rows.append((run, server, key[0], key[1], s["name"] if s else r["instance"]))
            t = _launch_s(s)
            if t is not None:
                launched.setdefault(key, t)
    df = pl.DataFrame(rows, schema={"run": pl.String, "server": pl.String, "krun": pl.String, "kinst": pl.String,
                                    "sname": pl.String}, orient="row")
    return Reach(df, launched)


# ---------------------------------------------------------------------------------------------- components
def _fid(rel: str) -> str:
    """The file id a part's name starts with (``<fid>-req-...``): the log it was read from."""
    return rel.rsplit("/", 1)[-1].split("-", 1)[0]


def store_runs(store: Any) -> set[str]:
    """Every run with rows the join reads."""
    return {r for t in JOIN_TABLES for rel in store.parts(t) if (r := run_of_part(rel)) is not None}


def _log_id(path: Any) -> str:
    return file_id_of(Path(str(path)))


def component(store: Any, touched: set[str]) -> set[str]:
    """``touched`` and every run that shares a server log with one of them, transitively (the module
    docstring); only runs with rows the join reads."""
    runs_of_fid: dict[str, set[str]] = {}
    fids_of_run: dict[str, set[str]] = {}
    for table in ("requests", "instances"):
        for rel in store.parts(table):
            run = run_of_part(rel)
            if run is not None:
                runs_of_fid.setdefault(_fid(rel), set()).add(run)
                fids_of_run.setdefault(run, set()).add(_fid(rel))
    for run, servers in _named_logs(store):
        for s in servers:
            fid = _log_id(s)
            if fid in runs_of_fid:  # the log this manifest names was read (into some run)
                runs_of_fid[fid].add(run)
                fids_of_run.setdefault(run, set()).add(fid)
    out, todo = set(touched), list(touched)
    while todo:
        for fid in fids_of_run.get(todo.pop(), ()):
            for other in runs_of_fid.get(fid, ()):
                if other not in out:
                    out.add(other)
                    todo.append(other)
    return out & store_runs(store)


def _named_logs(store: Any) -> list[tuple[str, list[str]]]:
    """Each run's manifest's servers' log paths (runs whose manifest names none are left out)."""
    if not store.parts("runs"):
        return []
    from forensics.store import fetch_pl

    con = store.connect(tables=["runs"])
    try:
        df = fetch_pl(con, "SELECT run, servers FROM runs WHERE servers LIKE '%log_path%'")
    finally:
        con.close()
    out = []
    for run, servers in df.iter_rows():
        try:
            lst = json.loads(servers)
        except json.JSONDecodeError:
            continue
        paths = [str(s["log_path"]) for s in lst if isinstance(s, dict) and s.get("log_path")]
        if paths:
            out.append((run, paths))
    return out


def read_component(store: Any, runs: set[str]) -> tuple[dict[str, pl.DataFrame], dict[str, str]]:
    """The join's input tables for the runs ``runs`` (their partitions' parts only, own files or packed), each
    request under the run its log was read into, and the file id of each log path among their requests and
    instances (from the part names, as the ingest wrote them)."""
    frames: dict[str, pl.DataFrame] = {}
    fids: dict[str, str] = {}
    for table in JOIN_TABLES:
        df = _read_parts(store, table, [rel for rel in store.parts(table) if run_of_part(rel) in runs])
        if table in ("requests", "instances") and df.height:
            ids = df.select("path", pl.col("_part").str.extract(r"([^/]*)$").str.split("-").list.first().alias("f"))
            fids.update(dict(ids.unique("path").drop_nulls().iter_rows()))
        frames[table] = schema.conform(df, table) if df.height else schema.empty(table)
    # a request the join gave to a replay run is stored under that run: its instance is the log's, where it was read
    home = frames["instances"].select("path", pl.col("run").alias("_home")).unique("path")
    frames["requests"] = frames["requests"].join(home, on="path", how="left", nulls_equal=False) \
        .with_columns(pl.coalesce("_home", "run").alias("run")).drop("_home")
    return in_order(frames), fids


def in_order(frames: dict[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
    """The join's inputs in one order whatever parts hold them (ties between equal candidates go to the first):
    requests by log and line, attempts by run, records file and line."""
    out = dict(frames)
    out["requests"] = frames["requests"].sort("run", "path", "line_first", "instance", "slot", "seq", nulls_last=True,
                                              maintain_order=True)
    out["attempts"] = frames["attempts"].sort("run", "source", "source_line", nulls_last=True, maintain_order=True)
    return out


def _read_parts(store: Any, table: str, rels: list[str]) -> pl.DataFrame:
    """The rows of the parts ``rels`` with their ``run`` and ``_part``."""
    packed = store.packed(table)
    frames = []
    by_pack: dict[str, list[str]] = {}
    for rel in rels:
        if rel in packed:
            by_pack.setdefault(packed[rel], []).append(rel)
        else:
            frames.append(pl.read_parquet(store.root / rel).with_columns(
                pl.lit(run_of_part(rel), pl.String).alias("run"), pl.lit(rel).alias("_part")))
    for pack, mine in by_pack.items():
        frames.append(pl.scan_parquet(store.root / pack).filter(pl.col("_part").is_in(mine)).collect())
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


def stored_log_paths(runs: pl.DataFrame, fids: dict[str, str]) -> pl.DataFrame:
    """``runs`` with each manifest server's ``log_path`` replaced by the path the store read that log as (the
    same file id), so that the join finds it whatever folder the store's paths are relative to."""
    path_of = {fid: path for path, fid in fids.items()}

    def fix(servers: str | None) -> str | None:
        try:
            lst = json.loads(servers) if servers else None
        except json.JSONDecodeError:
            return servers
        if not isinstance(lst, list):
            return servers
        for s in lst:
            if isinstance(s, dict) and s.get("log_path") and _log_id(s["log_path"]) in path_of:
                s["log_path"] = path_of[_log_id(s["log_path"])]
        return json.dumps(lst)

    if not runs.height or not path_of:
        return runs
    return runs.with_columns(pl.col("servers").map_elements(fix, return_dtype=pl.String))

"""Run identity: the records and the server log of one run are one run.

A log's run is its folder (or ``--run``); a harness's records carry their own ``run_id``.  When the two
differ, the records are tied to the log's run and keep their own id as the run's ``alias``:

- with ``--run NAME`` every file of the ingest is run NAME;
- records whose run id is no log's run, sitting in the same folder as a log (one harness run per
  folder: several record runs beside one log stay apart, and the join splits the log among them by
  time), belong to that log's run.

``check_run`` is what the commands ask first: a run asked for by its alias is found under its name, and a
run that has records but no server log (or the reverse) is said to be so instead of answering with an
empty table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from forensics.errors import InternalError, NotFoundError
from forensics.replay.records import RawRecord


def tie_runs(raws: Iterable[RawRecord], folder_run: dict[str, str], log_runs: set[str],
             forced: str | None) -> list[str]:
    """Fill and tie the run ids of ``raws`` in place (``folder_run``: records file -> its folder's run;
    ``log_runs``: runs that have a server log).  Returns one note per tie."""
    raws = [r for r in raws if isinstance(r.obj, dict) and r.kind in ("manifest", "attempt")]
    for r in raws:
        if not r.obj.get("run_id"):
            r.obj = {**r.obj, "run_id": forced or folder_run[r.path]}
    target: dict[tuple[str, str], str] = {}  # (folder run, record run) -> run
    notes: list[str] = []
    if forced:
        target = {(folder_run[r.path], r.obj["run_id"]): forced for r in raws}
    else:
        by_folder: dict[str, set[str]] = {}
        for r in raws:
            by_folder.setdefault(folder_run[r.path], set()).add(str(r.obj["run_id"]))
        for folder, ids in sorted(by_folder.items()):
            loose = sorted(i for i in ids if i not in log_runs and i != folder)
            if folder not in log_runs or not loose:
                continue
            if len(loose) == 1:
                target[(folder, loose[0])] = folder
            else:
                notes.append(f"records of runs {', '.join(loose)} sit beside the server log of run {folder!r}: kept "
                             "apart (the join splits the log among them by time)")
    tied: dict[tuple[str, str], int] = {}
    for r in raws:
        key = (folder_run[r.path], str(r.obj["run_id"]))
        run = target.get(key)
        if run is not None and run != key[1]:
            r.alias = key[1]
            r.obj = {**r.obj, "run_id": run}
            tied[(key[1], run)] = tied.get((key[1], run), 0) + 1
    why = "--run" if forced else "the server log in the same folder"
    notes.extend(f"records of run {alias!r} are run {run!r} ({why}); {alias!r} is kept as its alias"
                 for alias, run in sorted(tied))
    return notes


@dataclass
class RunCheck:
    """The run a command should read, and what to tell the user on stderr first."""

    run: str | None
    notes: list[str] = field(default_factory=list)


NEEDS = {
    "requests": "server requests",
    "log": "server log",
    "records": "replay records",
}


def check_run(store: Any, run: str | None, *, need: str, command: str) -> RunCheck:
    """Resolve ``run`` for ``command`` (an alias becomes its run) and make sure it has what the command
    reads (``need``: ``requests``, ``log`` or ``records``).

    Raises NotFoundError when the run exists but only with the other half: records without a server log,
    or server requests without records."""
    if run is None:
        return RunCheck(None)
    have = _what_runs_have(store)
    out = RunCheck(run)
    if run not in have["requests"] | have["log"] | have["records"]:
        targets = sorted(have["alias"].get(run, set()))
        if len(targets) == 1:
            out.run = targets[0]
            out.notes.append(f"run {run!r} is stored as {targets[0]!r} (its records were tied to that run)")
        else:
            return out  # unknown: the command names the known runs
    if out.run is None:  # set above from a run the caller named, or from its one alias
        raise InternalError(f"run {run!r} resolved to no run")
    if need in ("requests", "log") and out.run not in have[need] and out.run in have["records"]:
        raise NotFoundError(f"run {out.run!r} has replay records but no {NEEDS[need]}: {command} reads the server "
                            "log", hint="ingest the run's llama-server log with its records (same folder, or "
                                        f"--run {out.run})")
    if need == "records" and out.run not in have["records"] and out.run in have["requests"] | have["log"]:
        raise NotFoundError(f"run {out.run!r} has server requests but no replay records: {command} reads the "
                            "harness's records", hint="ingest the run's records with its log (same folder, or "
                                                      f"--run {out.run})")
    return out


def _what_runs_have(store: Any) -> dict[str, Any]:
    from forensics.store import fetch_pl

    con = store.connect(tables=["requests", "instances", "runs", "attempts"])
    try:
        req, log, rec = (_runs_of(store, con, tables) for tables in (["requests"], ["instances"], ["runs", "attempts"]))
        aliases = fetch_pl(con, "SELECT DISTINCT alias, run FROM (SELECT alias, run FROM runs UNION ALL "
                                "SELECT alias, run FROM attempts) WHERE alias IS NOT NULL")
    finally:
        con.close()
    by_alias: dict[str, set[str]] = {}
    for alias, run in aliases.iter_rows():
        by_alias.setdefault(alias, set()).add(run)
    return {"requests": req, "log": log | req, "records": rec, "alias": by_alias}


def _runs_of(store: Any, con: Any, tables: list[str]) -> set[str]:
    """Runs with rows in ``tables``: from the store's part paths (no file opened), else from the views."""
    names = store.run_names(tables)
    if names is not None:
        return set(names)
    union = " UNION ".join(f"SELECT DISTINCT run FROM {t}" for t in tables)
    return {r[0] for r in con.execute(union).fetchall() if r[0] is not None}

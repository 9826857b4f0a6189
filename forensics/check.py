"""``forensics check``: verify a store and say how to repair it.

Checks that the manifest is readable, that every part it lists exists and has its table's columns,
that no stray part files lie beside them, and that the counts agree: each file's line accounting sums,
its unparsed rows match ``files.lines_unparsed``, and each instance's request count matches ``requests``.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
import pyarrow.parquet as pq

from forensics import schema
from forensics.store import Store, fetch_pl


@dataclass
class Problem:
    check: str
    detail: str
    repair: str


def check_store(store: Store) -> pl.DataFrame:
    """One row per check: check, status (ok | problem), detail, repair."""
    rows: list[dict[str, str]] = []

    def ok(check: str, detail: str) -> None:
        rows.append({"check": check, "status": "ok", "detail": detail, "repair": ""})

    def bad(check: str, detail: str, repair: str) -> None:
        rows.append({"check": check, "status": "problem", "detail": detail, "repair": repair})

    notes = store.recover()
    for n in notes:
        bad("interrupted commit", n, "nothing to do: it was completed or discarded just now")
    listed: set[str] = set()
    missing = 0
    for table, parts in store.manifest["parts"].items():
        for rel in parts:
            listed.add(rel)
            path = store.root / rel
            if not path.exists():
                missing += 1
                bad("part present", f"{table}: {rel} is listed but missing",
                    "re-ingest the source files (`forensics ingest PATH`), or delete the store and ingest again")
                continue
            if table in schema.TABLES:
                try:
                    names = set(pq.read_schema(path).names)
                except Exception as exc:  # unreadable parquet
                    bad("part readable", f"{table}: {rel}: {exc}", "delete the store and ingest again")
                    continue
                need = {c.name for c in schema.TABLES[table]} - {"run"}
                lacking = sorted(need - names)
                if lacking and table != "events":
                    bad("part schema", f"{table}: {rel} lacks {', '.join(lacking)}",
                        "this store was written by another version: delete it and ingest again")
    if not missing:
        ok("parts present", f"{len(listed)} parts listed, all present")
    strays = [p for p in store.root.glob("*/run=*/*") if str(p.relative_to(store.root)) not in listed]
    if strays:
        bad("stray files", f"{len(strays)} part files not in the manifest (e.g. {strays[0].relative_to(store.root)})",
            "they are ignored; delete them to save space")
    else:
        ok("stray files", "none")
    con = store.connect(existing_only=True)
    try:
        acc = fetch_pl(con, "SELECT path, lines_total, lines_parsed, lines_skipped, lines_unparsed FROM files "
                            "WHERE lines_parsed + lines_skipped + lines_unparsed <> lines_total")
        if acc.height:
            bad("line accounting", f"{acc.height} files do not sum (e.g. {acc['path'][0]})",
                "re-ingest those files after deleting the store")
        else:
            ok("line accounting", "parsed + skipped + unparsed = total for every file")
        un = fetch_pl(con, "SELECT f.path, f.lines_unparsed, count(u.line_no) AS rows FROM files f "
                           "LEFT JOIN unparsed u ON u.path = f.path AND u.run = f.run "
                           "GROUP BY f.path, f.lines_unparsed HAVING count(u.line_no) <> f.lines_unparsed")
        if un.height:
            bad("unparsed rows", f"{un.height} files' unparsed rows differ from files.lines_unparsed "
                                 f"(e.g. {un['path'][0]})", "re-ingest those files")
        else:
            ok("unparsed rows", "every unparsed line is kept")
        rq = fetch_pl(con, "SELECT i.run, i.instance, i.requests, count(r.task) AS n FROM instances i "
                           "LEFT JOIN requests r ON r.run = i.run AND r.instance = i.instance AND r.path = i.path "
                           "GROUP BY i.run, i.instance, i.requests HAVING count(r.task) <> i.requests")
        if rq.height:
            bad("request counts", f"{rq.height} instances' request counts differ (e.g. {rq['instance'][0]})",
                "re-ingest the instance's log")
        else:
            ok("request counts", "instances.requests matches the requests table")
    finally:
        con.close()
    return pl.DataFrame(rows, schema={"check": pl.String, "status": pl.String, "detail": pl.String,
                                      "repair": pl.String})

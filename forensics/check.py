"""``forensics check``: verify a store and say how to repair it.

Checks that the manifest is readable, that every file it lists (own parts and packs) exists and reads as Parquet,
that no stray part files lie beside them, and that the counts agree: each file's line accounting sums,
its unparsed rows match ``files.lines_unparsed``, and each instance's request count matches ``requests``.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from forensics import schema
from forensics.errors import StoreError
from forensics.store import PACKS_DIR, Store, fetch_pl

# (check, SQL listing the offenders (first column names one), problem, repair, the text when there is none)
COUNT_CHECKS: list[tuple[str, str, str, str, str]] = [
    ("line accounting",
     "SELECT path FROM files WHERE lines_parsed + lines_skipped + lines_unparsed <> lines_total",
     "{n} files do not sum (e.g. {example})", "re-ingest those files after deleting the store",
     "parsed + skipped + unparsed = total for every file"),
    ("unparsed rows",
     "SELECT f.path FROM files f LEFT JOIN unparsed u ON u.path = f.path AND u.run = f.run "
     "GROUP BY f.path, f.lines_unparsed HAVING count(u.line_no) <> f.lines_unparsed",
     "{n} files' unparsed rows differ from files.lines_unparsed (e.g. {example})", "re-ingest those files",
     "every unparsed line is kept"),
    ("request counts",
     "SELECT i.instance FROM instances i "
     "LEFT JOIN requests r ON r.run = i.run AND r.instance = i.instance AND r.path = i.path "
     "GROUP BY i.run, i.instance, i.requests HAVING count(r.task) <> i.requests",
     "{n} instances' request counts differ (e.g. {example})", "re-ingest the instance's log",
     "instances.requests matches the requests table"),
]


def _stored_files(store: Store) -> dict[str, str]:
    """Every file the manifest names -> its table: the parts kept in their own file, and the packs."""
    files: dict[str, str] = {}
    for table, parts in store.manifest["parts"].items():
        packed = store.packed(table) if table in schema.TABLES else {}
        files.update({rel: table for rel in parts if rel not in packed})
        files.update({pk["path"]: table for pk in store.packs(table)})
    return files


def _check_files(store: Store, ok: Callable[[str, str], None], bad: Callable[[str, str, str], None]) -> None:
    """Every listed file is present and readable Parquet; nothing unlisted lies beside them."""
    files = _stored_files(store)
    missing = 0
    for rel, table in files.items():
        path = store.root / rel
        if not path.exists():
            missing += 1
            bad("part present", f"{table}: {rel} is listed but missing",
                "re-ingest the source files (`forensics ingest PATH`), or delete the store and ingest again")
            continue
        if table in schema.TABLES:
            try:
                names = set(pq.read_schema(path).names)
            except (OSError, pa.ArrowException) as exc:  # unreadable parquet
                bad("part readable", f"{table}: {rel}: {exc}", "delete the store and ingest again")
                continue
            if f"/{PACKS_DIR}/" in rel and not {"_part", "run"} <= names:
                bad("part schema", f"{table}: {rel} is a pack without _part and run columns",
                    "delete the store and ingest again")
    for key, value in store.manifest.get("meta", {}).items():
        if isinstance(value, dict) and set(value) == {"detached"} and not (store.root / value["detached"]).exists():
            missing += 1
            bad("meta present", f"the store's {key} record {value['detached']} is listed but missing",
                "delete the store and ingest again")
    if not missing:
        ok("parts present", f"{len(files)} files listed, all present")
    strays = [p for p in [*store.root.glob("*/run=*/*"), *store.root.glob(f"*/{PACKS_DIR}/*")]
              if str(p.relative_to(store.root)) not in files]
    if strays:
        bad("stray files", f"{len(strays)} part files not in the manifest (e.g. {strays[0].relative_to(store.root)})",
            "they are ignored; delete them to save space")
    else:
        ok("stray files", "none")


def check_store(store: Store) -> pl.DataFrame:
    """One row per check: check, status (ok | problem), detail, repair."""
    rows: list[dict[str, str]] = []

    def ok(check: str, detail: str) -> None:
        rows.append({"check": check, "status": "ok", "detail": detail, "repair": ""})

    def bad(check: str, detail: str, repair: str) -> None:
        rows.append({"check": check, "status": "problem", "detail": detail, "repair": repair})

    try:
        with store.lock(wait=False):  # recovery deletes staged parts: only ever under the writers' lock
            notes = store.recovered
    except StoreError:
        notes = []
        bad("writer", "an ingest is writing to the store now; interrupted commits were not looked at",
            "run `forensics check` again when it has finished")
    for n in notes:
        bad("interrupted commit", n, "nothing to do: it was completed or discarded just now")
    _check_files(store, ok, bad)
    try:
        con = store.connect(existing_only=True)
    except StoreError as exc:  # a damaged part (listed above): the counts cannot be read
        bad("counts", exc.message, "delete the store and ingest again")
    else:
        try:
            for name, sql, problem, repair, fine in COUNT_CHECKS:
                found = fetch_pl(con, sql)
                if found.height:
                    bad(name, problem.format(n=found.height, example=found.row(0)[0]), repair)
                else:
                    ok(name, fine)
        finally:
            con.close()
    return pl.DataFrame(rows, schema={"check": pl.String, "status": pl.String, "detail": pl.String,
                                      "repair": pl.String})

"""What a store holds, per run: its files (counted: ``forensics sql "select * from files"`` lists them), its server
instances under the one name every output gives them, and
its requests counted as the findings count them (``request_facts``: the same tokens, failures and names).

Library only: no click, no altair.
"""

from __future__ import annotations

import polars as pl

from forensics import derived
from forensics import runs as runs_mod
from forensics.session import VERSION, Analysis
from forensics.store import Store, fetch_pl

REQUESTS_SQL = """
SELECT run, count(*) AS requests, count(DISTINCT instance) AS instances,
       count(DISTINCT instance || '/' || CAST(slot AS VARCHAR)) AS slots,
       CAST(sum(prompt_tokens) AS BIGINT) AS prompt_tokens, CAST(sum(gen_tokens) AS BIGINT) AS gen_tokens,
       count(*) FILTER (WHERE truncated) AS truncated
FROM {source} GROUP BY run ORDER BY run
"""


def summary(store: Store) -> dict[str, pl.DataFrame]:
    """files (per run), instances (named) and requests per run (``request_facts``, as stored, else worked out), with the
    failed finding's count of each run."""
    names = runs_mod.all_runs(store)
    source = "request_facts" if not derived.state(store).needs(names, VERSION) and names else "fx_requests"
    with Analysis.open(store, names) as s:
        s.prepare(names, requests=source == "fx_requests")  # the stored facts need no base table (nor its scoring)
        s.bind(["files"])
        files = fetch_pl(s.con, "SELECT run, count(*) AS files, string_agg(DISTINCT format, ',' ORDER BY format) "
                                "AS formats, sum(lines_total) AS lines_total, sum(lines_parsed) AS lines_parsed, "
                                "sum(lines_skipped) AS lines_skipped, sum(lines_unparsed) AS lines_unparsed "
                                "FROM files GROUP BY run ORDER BY run")
        inst = fetch_pl(s.con, "SELECT run, instance, build, model, n_slots, n_ctx_slot, host, port, time_basis, "
                               "requests FROM fx_instances ORDER BY run, instance")
        if source == "request_facts":
            s.bind(["request_facts"])
        reqs = fetch_pl(s.con, REQUESTS_SQL.format(source=source))
        failed = s.rows("failed").group_by("run").len("failed")  # the failed finding's count, as the verdict's
    reqs = reqs.join(failed, on="run", how="left").with_columns(pl.col("failed").fill_null(0).cast(pl.Int64))
    reqs = reqs.select("run", "requests", "instances", "slots", "prompt_tokens", "gen_tokens", "failed", "truncated")
    return {"files": files, "instances": inst, "requests": reqs}

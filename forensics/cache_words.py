"""The verdict's sentence about the prompt cache (``prompt_cache.sql``): told for an instance whose recomputed
prompt tokens pass the ``cache_waste`` threshold (the query's ``costly``), with the fix for its commonest cause.  A
note: time lost to the cache does not make a run unhealthy, and a healthy run's verdict keeps its notes.

Library only: no click, no altair.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from forensics.sentences import NOTE, Fact, RunContext, count, plural, seconds

if TYPE_CHECKING:
    import polars as pl

CAUSES = (("not_reused", "not reused"), ("after_shift", "after a context shift"), ("slot_switches", "slot switch"))


def prompt_cache(rows: pl.DataFrame, ctx: RunContext) -> list[Fact]:
    """``Note: the server's prompt cache served 50% of the prompt tokens (2 cold starts); 5 later requests reused less
    than half of what their slot held for them (5 not reused): 2,253 prompt tokens (15% of all, 2.2 s) were computed
    again: send cache_prompt: true ...``: one sentence per costly instance."""
    out = []
    for row in rows.iter_rows(named=True):
        if not row["costly"]:
            continue
        who = ctx.server(row["instance"])
        whose = "the server's" if who == "The server" else f"{who}'s"
        causes = ", ".join(f"{row[col]} {words}" for col, words in CAUSES if row[col])
        took = f", {seconds(row['recomputed_s'])}" if row["recomputed_s"] else ""
        sentence = (f"Note: {whose} prompt cache served {row['reused']:.0%} of the prompt tokens "
                    f"({plural(row['cold_starts'], 'cold start')}); {plural(row['misses'], 'later request')} reused "
                    f"less than half of what their slot held for them ({causes}): "
                    f"{count(row['recomputed_tokens'])} prompt tokens ({row['recomputed_share']:.0%} of all{took}) "
                    f"were computed again: {row['fix']}.")
        evidence = [f"{row['path']}:{part}" for part in (row["lines"] or "").split(", ") if part]
        out.append(Fact("prompt_cache", sentence, evidence,
                        {"instance": ctx.name(row["instance"]), "reused": row["reused"],
                         "misses": row["misses"], "recomputed_tokens": row["recomputed_tokens"],
                         "recomputed_s": row["recomputed_s"], "fix": row["fix"]}, NOTE))
    return out

"""Incidents across runs: every dead slot, runaway, crash, KV-cache stall and failover, and what their onsets had in
common.

``incidents`` lists them, one row per incident (``incidents.sql``), from the findings' rows the store's analysis
holds: nothing is worked out again, so the listing agrees with every other output and a store of thousands of runs
answers from a scan of small tables.

``precursors`` compares, per kind of incident, the onsets (each incident's first abnormal request, with the
``before`` requests before it on the same slot) against the normal requests of the same runs, on what the store
knows (``precursors.sql``): the output cap, the prompt's share of the slot's context, the cache, the stage, how busy
the server was, how long it had been up, and what the requests before it on the slot did; and the runs' build,
context shift and slots against the runs without such an incident.  Features are ranked by how much more often the
onsets had them than the normal requests did (``separation``: the onsets' share minus the normal share), each
with its counts.  Fewer than ``MIN_INCIDENTS`` incidents of a kind tell nothing: the kind gets a sentence saying
so, and no feature.

Library only: no click, no altair.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import polars as pl

from forensics.session import Analysis, analysis

if TYPE_CHECKING:
    from forensics.store import Store

MIN_INCIDENTS = 3  # fewer incidents of a kind than this: too few to tell what sets their onsets apart
SEPARATES = 0.5  # a feature the onsets have this much more often (share minus share) sets them apart
BEFORE = 2  # requests before the first abnormal one on its slot that belong to its onset
FILL_SHARE, FULL_SHARE = 0.75, 0.9  # a prompt that fills the context; a slot left full at release
EARLY_S, LATE_S = 60.0, 3600.0  # a server just started; a server up an hour or more

# kind -> (one, several, adjective of its onsets)
KINDS = {"dead_slot": ("dead slot", "dead slots", "dead-slot"), "runaway": ("runaway", "runaways", "runaway"),
         "crash": ("crash", "crashes", "crash"), "kv_stall": ("KV-cache stall", "KV-cache stalls", "KV-stall"),
         "failover": ("failover", "failovers", "failover")}
FINDINGS = ("dead_slot_sequence", "runaway", "crash", "kv_stall", "failover", "missing")

# feature -> (what an onset had, the verb of the normal requests that had it)
FEATURES = {
    "no_cap": ("the request carried no output cap", "did"),
    "prompt_fills": (f"the request's prompt filled {FILL_SHARE:.0%} or more of the slot's context", "did"),
    "cache_hit": ("part of the request's prompt came from the slot's cache", "did"),
    "cache_cold": ("none of the request's prompt came from the slot's cache", "did"),
    "all_busy": ("every slot of its server was busy when the request started", "did"),
    "early": (f"its server had started less than {EARLY_S:.0f} s before", "did"),
    "late": (f"its server had been up {LATE_S / 3600:.0f} h or more", "had"),
    "prev_filled": (f"a request before it on the slot left the context {FULL_SHARE:.0%} full", "had one"),
    "prev_shift": ("a request before it on the slot shifted the context", "had one"),
    "prev_failed": ("a request before it on the slot failed", "had one"),
    "prev_no_cap": ("a request before it on the slot carried no output cap", "had one"),
    "prev_long": (f"a request before it on the slot had a prompt filling {FILL_SHARE:.0%} of the context", "had one"),
}
PRECURSOR_SCHEMA = {"kind": pl.String, "incidents": pl.Int64, "rank": pl.Int64, "feature": pl.String,
                    "onsets_with": pl.Int64, "onsets": pl.Int64, "normal_with": pl.Int64, "normal": pl.Int64,
                    "compared_with": pl.String, "separation": pl.Float64, "sentence": pl.String}


def _bind(session: Analysis, runs: list[str]) -> None:
    """fx_<finding> for the incident findings, fx_requests, fx_run_facts and fx_instance_facts over ``runs``: the
    store's analysis where it holds them (a session computes what it lacks, the same way)."""
    for name in FINDINGS:
        session.register(f"fx_{name}", session.rows(name, runs=runs))
    session.prepare(runs)
    if session.stored is not None and session.stored.has("run_facts", runs):
        from forensics.store import fetch_pl

        session.bind(["run_facts", "instance_facts"])
        for table in ("run_facts", "instance_facts"):
            session.register(f"fx_{table}", fetch_pl(session.con, f"SELECT * FROM {table} WHERE run IN "
                                                                  "(SELECT unnest($runs))", {"runs": runs}))
    else:  # not derived yet (a live session, a store another process holds): the same rules, worked out here
        session.register("fx_run_facts", session.query("run_setup", runs=runs))
        session.con.execute("CREATE OR REPLACE TEMP VIEW fx_instance_facts AS SELECT * FROM fx_instances")


def incidents(source: Store | Analysis, runs: str | list[str] | None = None) -> pl.DataFrame:
    """Every incident of ``runs`` (default: every run), one row each, in order of onset (``incidents.sql``)."""
    with analysis(source, runs) as s:
        names = s.narrowed(runs)
        _bind(s, names)
        return s.query("incidents", runs=names)


def listing(df: pl.DataFrame) -> pl.DataFrame:
    """The incidents as the command lists them: the onset as wall-clock text, the columns no row fills left out."""
    from forensics.timefmt import wall_expr

    out = df.with_columns(wall_expr(pl.col("onset")).alias("onset")).drop("path")
    keep = ("run", "kind", "instance", "recovered")
    return out.drop([c for c in out.columns if c not in keep and out[c].null_count() == out.height])


def summary(df: pl.DataFrame, runs: int) -> str:
    """The incidents in one sentence: how many of each kind, in how many runs, how many recovered."""
    in_runs = f"the {runs} runs" if runs != 1 else "the run"
    if df.height == 0:
        return f"No incidents in {in_runs}."
    counts = df.group_by("kind").len()
    order = {k: i for i, k in enumerate(KINDS)}
    parts = [f"{n} {KINDS.get(k, (k, k))[0 if n == 1 else 1]}" for k, n in
             sorted(counts.iter_rows(), key=lambda kn: order.get(kn[0], len(order)))]
    hit = df["run"].n_unique()
    recovered = int(df["recovered"].fill_null(False).sum())
    where = in_runs if runs == 1 else f"{hit} of {in_runs}"
    return (f"{df.height} incident{'s' if df.height != 1 else ''} in {where}: {', '.join(parts)}; "
            f"{recovered} recovered.")


@dataclass
class Precursors:
    """What set each kind's onsets apart: ``table`` its ranked features (one row per kind and feature; a kind with
    too few incidents, or none that separates, has a row with its sentence and no feature), ``sentences`` one per
    kind of incident found (or one saying there is none)."""

    table: pl.DataFrame
    sentences: list[str]
    runs: int
    by_kind: dict[str, str] = field(default_factory=dict)  # each kind's sentence

    def found(self) -> int:
        return int(self.table.filter(pl.col("separation") >= SEPARATES).height)


def precursors(source: Store | Analysis, runs: str | list[str] | None = None, *, before: int = BEFORE,
               min_incidents: int = MIN_INCIDENTS) -> Precursors:
    """The features that set each kind's onsets apart from the normal requests (see the module's docstring)."""
    with analysis(source, runs) as s:
        names = s.narrowed(runs)
        _bind(s, names)
        inc = s.query("incidents", runs=names)
        s.register("fx_onsets", inc.filter(pl.col("task").is_not_null()).select("run", "kind", "instance", "slot",
                                                                                 "task"))
        s.register("fx_bad", _bad(s))
        params = {"runs": names, "before": before, "fill_share": FILL_SHARE, "full_share": FULL_SHARE,
                  "early_s": EARLY_S, "late_s": LATE_S}
        from forensics.sql import load_query
        from forensics.store import fetch_pl

        reqs = fetch_pl(s.con, load_query("precursors").text, params)
        run_facts = fetch_pl(s.con, "SELECT run, build, context_shift, np FROM fx_run_facts")
    return rank(inc, reqs, run_facts, min_incidents=min_incidents, runs=len(names))


def seen_so_far(store: Store) -> dict[str, str]:
    """Each kind's precursor sentence over every run of ``store`` so far (what watch adds to a new incident's alert):
    its first feature, or that there are too few incidents, or that nothing sets them apart."""
    got = precursors(store)
    return got.by_kind


def _bad(s: Analysis) -> pl.DataFrame:
    """The requests that are part of an incident: a dead slot's abnormal requests from its onset, every runaway."""
    from forensics.store import fetch_pl

    return fetch_pl(s.con, "SELECT run, instance, slot, task FROM fx_dead_slot_sequence WHERE abnormal "
                           "AND dead_seq IS NOT NULL AND seq >= dead_seq UNION SELECT run, instance, slot, task "
                           "FROM fx_runaway")


def request_features(reqs: pl.DataFrame) -> pl.DataFrame:
    """``reqs`` (precursors.sql) long: run, kind, feature, has (a stage is a feature of its own per value)."""
    flags = [c for c in FEATURES if c in reqs.columns]
    long = reqs.select("run", "kind", "instance", "slot", "task", *flags).with_row_index("req").unpivot(
        index=["req", "run", "kind"], on=flags, variable_name="feature", value_name="has")
    staged = reqs.with_row_index("req").filter(pl.col("stage").is_not_null()).select("req", "run", "kind", "stage")
    values = staged.select(pl.col("stage").unique().alias("value"))
    others = staged.join(values, how="cross").select(
        "req", "run", "kind", ("stage=" + pl.col("value")).alias("feature"), (pl.col("stage") == pl.col("value"))
        .alias("has"))
    return pl.concat([long.with_columns(pl.col("has").fill_null(False)), others.select(long.columns)])


def run_features(run_facts: pl.DataFrame) -> pl.DataFrame:
    """Each run's build, context shift and slots, long: run, feature, has."""
    rf = run_facts.select(
        "run", pl.concat_str(pl.lit("build="), pl.col("build").cast(pl.String)).alias("build"),
        pl.when(pl.col("context_shift")).then(pl.lit("context_shift=on")).otherwise(pl.lit("context_shift=off"))
        .alias("shift"), pl.concat_str(pl.lit("np="), pl.col("np").cast(pl.String)).alias("np"))
    long = rf.unpivot(index="run", value_name="feature").drop_nulls("feature").select("run", "feature")
    return long.join(long.select("feature").unique(), how="cross", suffix="_all").select(
        "run", pl.col("feature_all").alias("feature"), (pl.col("feature") == pl.col("feature_all")).alias("has")) \
        .group_by("run", "feature").agg(pl.col("has").any())


def rank(inc: pl.DataFrame, reqs: pl.DataFrame, run_facts: pl.DataFrame, *, min_incidents: int = MIN_INCIDENTS,
         runs: int = 0) -> Precursors:
    """Rank each kind's features (see the module's docstring); ``inc`` the incidents, ``reqs`` precursors.sql's rows,
    ``run_facts`` each run's build, context shift and np."""
    counts = inc.group_by("kind").len().sort("kind")
    if counts.height == 0:
        sentence = f"No incidents in {'the run' if runs == 1 else f'the {runs} runs'}: nothing to compare."
        return Precursors(pl.DataFrame(schema=PRECURSOR_SCHEMA), [sentence], runs)
    feats = request_features(reqs) if reqs.height else pl.DataFrame(
        schema={"req": pl.UInt32, "run": pl.String, "kind": pl.String, "feature": pl.String, "has": pl.Boolean})
    onset = feats.filter(pl.col("kind").is_not_null()).group_by("kind", "feature").agg(
        pl.col("has").sum().alias("onsets_with"), pl.col("req").n_unique().alias("onsets"))
    kind_runs = inc.select("kind", "run").unique()
    normal = feats.filter(pl.col("kind").is_null()).drop("kind").join(kind_runs, on="run").group_by(
        "kind", "feature").agg(pl.col("has").sum().alias("normal_with"), pl.col("req").n_unique().alias("normal"))
    by_request = onset.join(normal, on=["kind", "feature"], how="left").with_columns(
        pl.lit("normal requests").alias("compared_with"))
    by_run = _by_run(inc, run_facts, min_incidents)
    table = pl.concat([by_request.select(by_run.columns).cast(by_run.schema), by_run]).with_columns(
        pl.col("normal_with").fill_null(0), pl.col("normal").fill_null(0))
    table = table.with_columns(
        pl.when(pl.col("normal") > 0).then(pl.col("onsets_with") / pl.col("onsets")
                                           - pl.col("normal_with") / pl.col("normal")).alias("separation"))
    table = table.filter((pl.col("onsets_with") > 0) & (pl.col("separation") > 0)).join(
        counts.rename({"len": "incidents"}), on="kind").filter(pl.col("incidents") >= min_incidents)
    # ties: the feature measured on more requests (or runs), then on more onsets, then by name
    table = table.sort(["kind", "separation", "normal", "onsets_with", "feature"],
                       descending=[False, True, True, True, False]) \
        .with_columns(pl.int_range(1, pl.len() + 1).over("kind").cast(pl.Int64).alias("rank"))
    table = _with_sentences(table)
    sentences = _kind_sentences(counts, table, min_incidents)
    heads = pl.DataFrame({"kind": list(sentences), "sentence": list(sentences.values())})
    empty = heads.join(table.select("kind").unique(), on="kind", how="anti").join(
        counts.rename({"len": "incidents"}), on="kind")
    out = pl.concat([table, empty], how="diagonal_relaxed").select(list(PRECURSOR_SCHEMA)).cast(
        PRECURSOR_SCHEMA)  # type: ignore[arg-type]
    return Precursors(out.sort(["kind", "rank"], nulls_last=True), list(sentences.values()), runs, sentences)


def _by_run(inc: pl.DataFrame, run_facts: pl.DataFrame, min_incidents: int) -> pl.DataFrame:
    """Run-level features, counted in runs: the runs with an incident of the kind against the runs of the selection
    without one (a kind seen in fewer than ``min_incidents`` runs tells nothing of its runs: no row)."""
    rfeat = run_features(run_facts)
    hit = inc.select("kind", "run").unique()
    enough = hit.group_by("kind").len().filter(pl.col("len") >= min_incidents).select("kind")
    hit = hit.join(enough, on="kind")
    onset = hit.join(rfeat, on="run").group_by("kind", "feature").agg(
        pl.col("has").sum().alias("onsets_with"), pl.col("run").n_unique().alias("onsets"))
    without = enough.join(rfeat, how="cross").join(hit, on=["kind", "run"], how="anti")
    normal = without.group_by("kind", "feature").agg(pl.col("has").sum().alias("normal_with"),
                                                     pl.col("run").n_unique().alias("normal"))
    cols = ["kind", "feature", "onsets_with", "onsets", "normal_with", "normal", "compared_with"]
    return onset.join(normal, on=["kind", "feature"], how="left").with_columns(
        pl.lit("runs without one").alias("compared_with")).select(cols).cast(
        {"onsets_with": pl.Int64, "onsets": pl.Int64, "normal_with": pl.Int64, "normal": pl.Int64})


def describe(feature: str) -> tuple[str, str]:
    """What an onset with ``feature`` had, and the verb of the others that had it."""
    if feature in FEATURES:
        return FEATURES[feature]
    name, _, value = feature.partition("=")
    if name == "stage":
        return f"the request was at stage {value}", "were"
    if name == "build":
        return f"it was on build {value}", "were"
    if name == "np":
        return f"it had {value} parallel slots", "did"
    return f"it had context shift {value}", "did"


def _with_sentences(table: pl.DataFrame) -> pl.DataFrame:
    """``table`` with each feature's sentence ("In 4 of 4 dead-slot onsets ...; 0 of 301 normal requests did.")."""
    names = table["feature"].unique().to_list()
    words = pl.DataFrame({"feature": names, "what": [describe(f)[0] for f in names],
                          "verb": [describe(f)[1] for f in names]}, schema={"feature": pl.String, "what": pl.String,
                                                                            "verb": pl.String})
    adj = pl.col("kind").replace_strict({k: v[2] for k, v in KINDS.items()}, default=pl.col("kind"))
    one = pl.col("kind").replace_strict({k: v[0] for k, v in KINDS.items()}, default=pl.col("kind"))
    by_run = pl.col("compared_with") == "runs without one"
    return table.join(words, on="feature", how="left").with_columns(
        pl.when(by_run).then(pl.format("In {} of {} runs with a {} {}; {} of {} runs without one {}.",
                                       pl.col("onsets_with"), pl.col("onsets"), one, pl.col("what"),
                                       pl.col("normal_with"), pl.col("normal"), pl.col("verb")))
        .otherwise(pl.format("In {} of {} {} onsets {}; {} of {} normal requests {}.", pl.col("onsets_with"),
                             pl.col("onsets"), adj, pl.col("what"), pl.col("normal_with"), pl.col("normal"),
                             pl.col("verb")))
        .alias("sentence")).drop("what", "verb")


def _kind_sentences(counts: pl.DataFrame, table: pl.DataFrame, min_incidents: int) -> dict[str, str]:
    """One sentence per kind: its first feature when it sets the onsets apart, else why nothing does."""
    out = {}
    firsts = {r["kind"]: r for r in table.filter(pl.col("rank") == 1).iter_rows(named=True)}
    for kind, n in counts.iter_rows():
        one, many, _ = KINDS.get(kind, (kind, kind, kind))
        noun = one if n == 1 else many
        top = firsts.get(kind)
        if n < min_incidents:
            out[kind] = (f"{n} {noun}: too few to tell what sets their onsets apart "
                         f"(at least {min_incidents} are needed).")
        elif top is None:
            out[kind] = f"{n} {noun}: nothing the store knows sets their onsets apart from the normal requests."
        elif top["separation"] < SEPARATES:
            out[kind] = (f"{n} {noun}: nothing the store knows sets their onsets apart; the closest: "
                         f"{top['sentence'][0].lower()}{top['sentence'][1:]}")
        else:
            out[kind] = f"{n} {noun}. {top['sentence']}"
    return out

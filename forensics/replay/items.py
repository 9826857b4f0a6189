"""The items of a run: one row per item x stage the run was expected to do, with its final outcome.

Which items a stage applies to:

- the items the manifest lists for it (``stage_items``; ``every_item_every_stage`` lists every item for
  every stage);
- else the items that were sent to it at least once (a probe stage sent for one ticker does not make every
  other ticker missing in it);
- an item whose last stage reached did not end ok is expected in every later stage (in the manifest's order
  of stages, else the order the run reached them) whose items the manifest does not list: a pipeline sends an
  item on only when its stage succeeded (a harness skips the later stages of an item that failed one);
- an item of the manifest's universe that was sent to no stage at all is expected in the run's first stage
  whose items the manifest does not list (so a run that died before reaching it still shows it missing).

Final outcome: ``ok`` when any attempt succeeded, else the outcome of the last attempt, else
``never_attempted``.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from forensics import schema

KEYS = ["run", "item", "stage"]


def build_items(runs: pl.DataFrame, attempts: pl.DataFrame) -> pl.DataFrame:
    """One row per expected item x stage of each run (see the module docstring)."""
    tried = attempts.group_by(KEYS).agg(
        pl.len().cast(pl.Int64).alias("attempts"),
        (pl.col("outcome") == "ok").any().alias("_any_ok"),
        pl.col("outcome").sort_by("attempt").last().alias("_last"),
    ) if attempts.height else None
    pairs = [_listed(runs), attempts.select(KEYS), _after_failure(runs, attempts)]
    universe = pl.concat(pairs).unique()
    universe = pl.concat([universe, _unsent(runs, attempts, universe)]).unique()
    if not universe.height:
        return schema.empty("items")
    if tried is None:
        out = universe.with_columns(pl.lit(0, pl.Int64).alias("attempts"), pl.lit("never_attempted").alias("outcome"))
    else:
        out = universe.join(tried, on=KEYS, how="left").with_columns(
            pl.col("attempts").fill_null(0),
            pl.when(pl.col("_any_ok")).then(pl.lit("ok"))
            .otherwise(pl.col("_last").fill_null("never_attempted")).alias("outcome"))
    out = out.with_columns((pl.col("outcome") == "ok").alias("done")).sort(KEYS)
    return schema.conform(out, "items")


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={k: pl.String for k in KEYS})


def _json(text: Any) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (TypeError, json.JSONDecodeError):
        return None


def _listed(runs: pl.DataFrame) -> pl.DataFrame:
    """(run, item, stage) the manifests list (one row per run; a manifest's lists are short)."""
    rows: list[dict[str, Any]] = []
    for run, stage_items in runs.select("run", "stage_items").iter_rows() if runs.height else []:
        for stage, items in (_json(stage_items) or {}).items():
            rows.extend({"run": run, "item": str(i), "stage": str(stage)} for i in items or [])
    return _frame(rows)


def _after_failure(runs: pl.DataFrame, attempts: pl.DataFrame) -> pl.DataFrame:
    """The later stages of an item whose last stage reached did not end ok: a pipeline sends an item on only
    when its stage succeeded, so they are expected of it and missing (not for a stage whose items the manifest
    lists)."""
    order = _stage_order(runs, attempts)
    if not order.height:
        return _frame([])
    reached = attempts.group_by(KEYS).agg((pl.col("outcome") == "ok").any().alias("_ok")).join(
        order, on=["run", "stage"])
    last = reached.sort("_pos").group_by(["run", "item"]).agg(pl.col("_pos").last(), pl.col("_ok").last())
    stopped = last.filter(~pl.col("_ok")).rename({"_pos": "_last"}).drop("_ok")
    later = stopped.join(order.filter(~pl.col("_listed")), on="run").filter(pl.col("_pos") > pl.col("_last"))
    return later.select(KEYS)


def _stage_order(runs: pl.DataFrame, attempts: pl.DataFrame) -> pl.DataFrame:
    """(run, stage, position, whether the manifest lists its items) of each run that has attempts: the
    manifest's order of stages, then the stages its attempts reached that it does not name, in the order they
    were reached (one loop per run: runs are few)."""
    if not attempts.height:
        return pl.DataFrame(schema={"run": pl.String, "stage": pl.String, "_pos": pl.Int64, "_listed": pl.Boolean})
    said = {r["run"]: r for r in runs.select("run", "stages", "stage_items").iter_rows(named=True)} \
        if runs.height else {}
    reached = attempts.sort("started_at", "attempt", nulls_last=True, maintain_order=True) \
        .group_by("run", maintain_order=True).agg(pl.col("stage").unique(maintain_order=True))
    rows: list[dict[str, Any]] = []
    for run, stages in reached.iter_rows():
        manifest = said.get(run) or {}
        listed = set(_json(manifest.get("stage_items")) or {})
        order = list(dict.fromkeys([str(s) for s in _json(manifest.get("stages")) or []] + list(stages)))
        rows.extend({"run": run, "stage": s, "_pos": i, "_listed": s in listed} for i, s in enumerate(order))
    return pl.DataFrame(rows, schema={"run": pl.String, "stage": pl.String, "_pos": pl.Int64, "_listed": pl.Boolean})


def _unsent(runs: pl.DataFrame, attempts: pl.DataFrame, universe: pl.DataFrame) -> pl.DataFrame:
    """Items of a manifest's universe that no stage has, expected in the run's first stage."""
    rows: list[dict[str, Any]] = []
    for r in runs.select("run", "items", "stages", "stage_items").iter_rows(named=True) if runs.height else []:
        items = _json(r["items"]) or []
        have = set(universe.filter(pl.col("run") == r["run"])["item"].to_list())
        lost = [str(i) for i in items if str(i) not in have]
        stage = _first_open_stage(r["run"], _json(r["stages"]) or [], set(_json(r["stage_items"]) or {}), attempts)
        if lost and stage is not None:
            rows.extend({"run": r["run"], "item": i, "stage": stage} for i in lost)
    return _frame(rows)


def _first_open_stage(run: str, stages: list[Any], listed: set[str], attempts: pl.DataFrame) -> str | None:
    """The first stage whose items the manifest does not list (in its order, else the order the run's
    attempts reached them); "" for a run that names no stage; None when the manifest lists every stage's."""
    order = [str(s) for s in stages]
    if not order and attempts.height:
        mine = attempts.filter(pl.col("run") == run).sort("started_at", "attempt", nulls_last=True)
        order = list(dict.fromkeys(mine["stage"].to_list()))
    if not order:
        return ""
    return next((s for s in order if s not in listed), None)

"""Planning: which np and which output cap, predicted from the runs a store already holds.

Public API (the CLI's ``whatif`` and ``recommend``, the report's "What if" section and the notebook call these)::

    from forensics import planning
    res = planning.whatif(store, "run-42", np_=8, cap=1024)    # res.table, res.cuts, res.busy, res.sentences
    rec = planning.recommend(store, ["sweep-np1", "sweep-np2", "sweep-np8"],
                             planning.Budgets(run=300, request=90), cap="auto")   # rec.table, rec.np, rec.sentence
    p = planning.planner(store, ["run-42"])                      # p.model (the fitted costs), p.folds (the errors)
    recs = planning.recommend_all(store, None, planning.Budgets(run=300))   # one answer per setup of the store
    planning.whatif_with(p, "run-42", np_=4)                     # more predictions from the same planner

The modules, bottom up: ``workload`` (a run's requests, dependencies and harness), ``costmodel`` (the fit),
``simulate`` (the discrete-event replay), ``predict`` (pool, figures, leave-one-np-out bands), ``what_if`` and
``recommendation``; ``charts`` and ``section`` draw them (the outputs layer).  No click here; altair only in ``charts``.
"""

from __future__ import annotations

from forensics.planning.costmodel import CostModel, NotEnoughData, fit
from forensics.planning.predict import FIGURES, Planner, planner, planners
from forensics.planning.recommendation import (
           Budgets,
           Recommendation,
           parse_np_range,
           recommend,
           recommend_all,
           recommend_with,
           recommendations_table,
           recommendations_words,
           run_budgets,
)
from forensics.planning.simulate import Simulated
from forensics.planning.what_if import WhatIf, whatif, whatif_all, whatif_with
from forensics.planning.workload import Harness, Workload, read_workload

__all__ = ["FIGURES", "Budgets", "CostModel", "Harness", "NotEnoughData", "Planner", "Recommendation", "Simulated",
           "WhatIf", "Workload", "fit", "parse_np_range", "planner", "planners", "read_workload", "recommend", "recommend_all",
           "recommend_with", "recommendations_table", "recommendations_words", "run_budgets", "whatif", "whatif_all",
           "whatif_with"]

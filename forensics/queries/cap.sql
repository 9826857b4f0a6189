-- cap: the requests an output-token cap is chosen from, with what a cap would do to each.
--
-- One row per request of the chosen runs that has gen_tokens: its stage (via matches; null when
-- unknown), whether it is a runaway (in fx_runaway) or normal (clean and not a runaway), its
-- generation time per token (to estimate seconds saved by a lower cap), its prompt size, the slot's
-- context and the cap in force on it (`own_cap`: the log's n_predict, else the cap the harness sent; null = none).  findings.py groups these rows alike
-- (findings.cap_facts; the analysis stores the groups as cap_facts) and computes the recommended cap and the
-- what-if table from the groups (only the columns it reads, to keep a million rows cheap to hand over).  The request's keys and item name the outputs
-- a cap would cut (findings.cap_cuts).
-- Parameters: none.  Relations: fx_requests (the requests of the chosen runs), fx_runaway.
SELECT r.run, r.instance, r.slot, r.task, r.item, r.stage, r.gen_tokens, r.prompt_tokens, r.ctx_slot,
       r.n_predict, r.cap AS own_cap,
       x.task IS NOT NULL AS runaway,
       (r.clean AND x.task IS NULL) AS normal,
       coalesce(r.gen_ms / nullif(r.gen_tokens, 0),
                r.seconds * 1000.0 / nullif(r.gen_tokens, 0)) AS ms_per_token
FROM fx_requests r
LEFT JOIN (SELECT DISTINCT run, instance, slot, task FROM fx_runaway) x
       ON x.run = r.run AND x.instance = r.instance AND x.slot = r.slot AND x.task = r.task
WHERE r.gen_tokens IS NOT NULL
ORDER BY r.run, r.instance, r.slot, r.seq

-- findings_base: the request rows every finding reads (temporary table fx_requests, built once per session).
--
-- One row per request of the chosen runs ($runs) in the store's `requests` view, with its item and stage
-- from `fx_matches` (the matches table when it has rows, else an empty relation: stage is then null), the
-- request columns the findings read, and derived columns:
--   gen_tokens the generated tokens the log gives; when it gives none (a request the server ended with an
--              error, or that the client cancelled, prints no timings), n_past at release - the prompt: what
--              the output added to the slot's context before it stopped; after a context shift (which
--              discards tokens) at least the slot's context - the prompt (gen_logged: as logged)
--   seconds    total_ms / 1000, else t_end - t_start, else elapsed_end_s - elapsed_start_s
--   tpot_ms    gen_ms / gen_tokens (per generated token; null below 2 tokens)
--   ctx_slot   slot context: the request's n_ctx_slot, else the instance's n_ctx_slot, else n_ctx / n_slots
--   start_key  a sortable start: epoch(t_start), else elapsed_start_s (null when neither is logged)
--   bgroup     baseline group: 'stage:<stage>' when the stage is known, else 'instance:<instance>'
--   err_shape  the error text with digits masked (to compare errors)
--   prompt_truncated  the prompt was cut to fit: `input truncated`, or `truncated` at release while the slot's
--              context was not full (no context shift, no stop at the training context): b3600-era builds cut it
--              without a line at default verbosity
--   prompt_rejected  its error says the prompt did not fit the context (every build's wording)
--   ctx_error  its error says generation hit the end of the context ("context shift is disabled": HTTP 500 of
--              b3812-b5408 with --no-context-shift, the output filled the context; not the prompt)
--   ctx_full   it reached the slot's context by the server's own word: a context shift, stop reason `context`,
--              "context shift is disabled", or `truncated` at release unless the prompt was truncated (b3600-b6722
--              also set `truncated` for a prompt cut to fit, whatever the output did); the findings add
--              n_past at release within $ctx_slack of the context
--   clean      a request that ended by itself or at its cap, without error: the baselines use these
-- Parameters: $runs VARCHAR[].  Relations: fx_live_requests (the requests, with the running ones' progress in
-- live mode), instances, fx_matches, fx_events.
CREATE OR REPLACE TEMP TABLE fx_requests AS
WITH inst AS (
    SELECT run, instance, any_value(n_ctx_slot) AS i_ctx_slot, any_value(n_ctx) AS i_ctx,
           any_value(n_slots) AS i_slots
    FROM instances GROUP BY run, instance
),
m AS (
    SELECT run, instance, slot, task, any_value(item) AS item, any_value(stage) AS stage
    FROM fx_matches GROUP BY run, instance, slot, task
),
train_cap AS (  -- requests the server stopped at the model's training context (truncated = 1, not the prompt)
    SELECT DISTINCT run, instance, task FROM fx_events WHERE kind = 'n_ctx_train_cap' AND task IS NOT NULL
),
r0 AS (
    SELECT r.*, coalesce(r.n_ctx_slot, i.i_ctx_slot, CAST(i.i_ctx / nullif(i.i_slots, 0) AS BIGINT)) AS ctx_slot_,
           i.i_ctx_slot, c.task IS NOT NULL AS train_capped
    FROM fx_live_requests r
    LEFT JOIN inst i USING (run, instance)
    LEFT JOIN train_cap c ON c.run = r.run AND c.instance = r.instance AND c.task = r.task
    WHERE r.run IN (SELECT unnest($runs))
),
r1 AS (
    SELECT *,
           -- the prompt was cut to fit: the server said so (`input truncated`), or the release says `truncated`
           -- while the slot's context was not full (no context shift, no training-context stop): b3600-era
           -- builds truncate silently at default verbosity
           coalesce(prompt_truncated, false)
           OR coalesce(truncated AND NOT coalesce(context_shift, false) AND NOT train_capped
                       AND n_past_end < ctx_slot_ - 2, false) AS p_trunc
    FROM r0
)
SELECT r.run, r.instance, r.path, r.slot, r.task, r.seq, m.item, m.stage,
       r.prompt_tokens,
       coalesce(r.gen_tokens,
                CASE WHEN coalesce(r.context_shift, false)
                     THEN greatest(r.n_past_end, coalesce(r.n_ctx_slot, r.i_ctx_slot)) - r.prompt_tokens
                     WHEN r.n_past_end > r.prompt_tokens THEN r.n_past_end - r.prompt_tokens END) AS gen_tokens,
       r.gen_tokens AS gen_logged, r.gen_ms,
       coalesce(r.total_ms / 1000.0, epoch(r.t_end) - epoch(r.t_start),
                r.elapsed_end_s - r.elapsed_start_s) AS seconds,
       CASE WHEN r.gen_tokens >= 2 AND r.gen_ms IS NOT NULL THEN r.gen_ms / r.gen_tokens END AS tpot_ms,
       r.n_past_end, r.ctx_slot_ AS ctx_slot,
       r.stop_reason, r.truncated, r.context_shift, r.n_predict, r.http_status, r.error,
       r.p_trunc AS prompt_truncated,
       coalesce(regexp_matches(lower(r.error), 'exceeds the available context size|input prompt is too big'
                               || '|is larger than the max context size|prompt is too long'), false) AS prompt_rejected,
       coalesce(regexp_matches(lower(r.error), 'context shift is disabled'), false) AS ctx_error,
       (coalesce(r.context_shift, false)
        OR coalesce(regexp_matches(lower(r.error), 'context shift is disabled'), false)
        OR ((coalesce(r.truncated, false) OR coalesce(r.stop_reason = 'context', false)) AND NOT r.p_trunc)) AS ctx_full,
       r.t_start, r.elapsed_start_s, r.line_first, r.line_last,
       coalesce(epoch(r.t_start), r.elapsed_start_s) AS start_key,
       CASE WHEN m.stage IS NOT NULL THEN 'stage:' || m.stage ELSE 'instance:' || r.instance END AS bgroup,
       regexp_replace(r.error, '[0-9]+', 'N', 'g') AS err_shape,
       (coalesce(r.complete, true) AND r.error IS NULL AND coalesce(r.http_status, 200) < 400
        AND coalesce(r.stop_reason, 'unknown') IN ('eos', 'word', 'limit', 'unknown')
        AND NOT coalesce(r.truncated, false) AND NOT coalesce(r.context_shift, false)
        AND r.gen_tokens IS NOT NULL) AS clean
FROM r1 r
LEFT JOIN m ON m.run = r.run AND m.instance = r.instance AND m.slot = r.slot AND m.task = r.task

-- findings_base: each server request as every finding reads it (temporary table fx_requests, built once per
-- session; stored per run by the analysis as `request_facts`).  The one place a request's facts are decided.
--
-- One row per request of the chosen runs ($runs), its instance under the name every output gives it
-- (`instance`; the store's id in `instance_id`), its item, stage and attempt from `fx_matches` (the join's
-- matches; null when no attempt is tied to it), and:
--   prompt_tokens  the log's; else the prompt its attempt sent (tokens_evaluated), else the prompt another
--              attempt of the same item and stage sent (a retry sends the same prompt): `prompt_source` says which
--   gen_tokens the generated tokens the log gives; when it gives none (a request the server ended with an
--              error, or that the client cancelled, prints no timings), n_past at release - the prompt: what
--              the output added to the slot's context before it stopped; after a context shift (which discards
--              tokens) at least the slot's context - the prompt; else its attempt's tokens_predicted
--              (`gen_logged`: as the log gave it)
--   t_start, t_end  wall-clock start and end: the log's own times, or its elapsed times anchored by the manifest's
--              launch time or the join; null when nothing places it.  `clock` says which (the requests table's
--              own, as the join placed it): log (absolute times on the lines), anchored (elapsed time + a known
--              start), aligned (elapsed time aligned to the attempts' send times), attempt (placed at the attempt
--              it served), order (estimated from the order on its slot), null (nothing places it)
--   seconds    how long it ran: the server's timings (total_ms) when they are above zero; for a request still
--              running when its log ends (killed, hung at shutdown), until its client saw the connection end when
--              that is later; else its end - its start, else the elapsed end - start; never 0 for a request that
--              ran (null: unknown)
--   tpot_ms    gen_ms / gen_tokens (per generated token; null below 2 tokens)
--   ctx_slot   slot context: the request's n_ctx_slot, else the instance's n_ctx_slot, else n_ctx / n_slots
--   cap_sent   the output cap the harness asked for (its attempt's max_tokens; null: none or unknown)
--   cap        the cap in force: the log's n_predict when positive, else cap_sent when positive
--   stop_cause what ended it, one word: client (cancelled: the client gave up), error, n_ctx_train (cut at the
--              model's training context), shutdown (still running when its server's log ends: the server shut
--              down or crashed), context (it filled the slot's context), cap (it reached its cap), eos, word (a
--              stop word), unknown
--   failed     the one test of a failed server request: an error, HTTP >= 400, stop reason error, or cancelled
--   start_key  a sortable start: epoch(t_start), else elapsed_start_s (null when neither is logged)
--   bgroup     baseline group: 'stage:<stage>' when the stage is known, else 'instance:<instance>'
--   err_shape  the error text with digits masked (to compare errors)
--   prompt_truncated  the prompt was cut to fit: `input truncated`, or `truncated` at release while the slot's
--              context was not full (no context shift, no stop at the training context): b3600-era builds cut it
--              without a line at default verbosity
--   prompt_rejected  its error says the prompt did not fit the context (every build's wording), and its prompt is
--              not known to be shorter than the slot's context (b4579 says "Input prompt is too big compared to KV
--              size" to every request of a batch that failed to decode, 4-token prompts included)
--   ctx_error  its error says generation hit the end of the context ("context shift is disabled": HTTP 500 of
--              b3812-b5408 with --no-context-shift, the output filled the context; not the prompt)
--   ctx_full   it reached the slot's context by the server's own word: a context shift, stop reason `context`,
--              "context shift is disabled", or `truncated` at release unless the prompt was truncated (b3600-b6722
--              also set `truncated` for a prompt cut to fit, whatever the output did); the findings add
--              n_past at release within $ctx_slack of the context
--   clean      a request that ended by itself or at its cap, without error: the baselines use these
-- Parameters: $runs VARCHAR[].  Relations: fx_live_requests (the requests, instances named, with the running
-- ones' progress in live mode), fx_instances, fx_matches, fx_events, attempts.
CREATE OR REPLACE TEMP TABLE fx_requests AS
WITH inst AS (
    SELECT run, instance, any_value(n_ctx_slot) AS i_ctx_slot, any_value(n_ctx) AS i_ctx,
           any_value(n_slots) AS i_slots, any_value(time_basis) AS i_basis, max(line_last) AS i_line_last,
           bool_or(coalesce(crashed, false)) AS i_crashed
    FROM fx_instances GROUP BY run, instance
),
m AS (
    SELECT run, instance, slot, task, any_value(item) AS item, any_value(stage) AS stage,
           any_value(attempt) AS attempt
    FROM fx_matches GROUP BY run, instance, slot, task
),
att AS (  -- what the harness sent and got for each attempt tied to a request
    SELECT m.run, m.instance, m.slot, m.task, any_value(a.max_tokens) AS cap_sent,
           any_value(a.tokens_evaluated) AS a_prompt, any_value(a.tokens_predicted) AS a_gen,
           max(a.ended_at) AS a_end
    FROM fx_matches m
    JOIN attempts a ON a.run = m.run AND a.item = m.item AND a.stage = m.stage AND a.attempt = m.attempt
    GROUP BY m.run, m.instance, m.slot, m.task
),
same_prompt AS (  -- the prompt an item x stage sends, from any of its attempts that was answered
    SELECT run, item, stage, max(tokens_evaluated) AS s_prompt
    FROM attempts WHERE run IN (SELECT unnest($runs)) AND tokens_evaluated IS NOT NULL
    GROUP BY run, item, stage
),
train_cap AS (  -- requests the server stopped at the model's training context (truncated = 1, not the prompt)
    SELECT DISTINCT run, instance, task FROM fx_events WHERE kind = 'n_ctx_train_cap' AND task IS NOT NULL
),
cancels AS (
    SELECT DISTINCT run, instance, task FROM fx_events WHERE kind = 'cancel' AND task IS NOT NULL
),
r0 AS (
    SELECT r.*, coalesce(r.n_ctx_slot, i.i_ctx_slot, CAST(i.i_ctx / nullif(i.i_slots, 0) AS BIGINT)) AS ctx_slot_,
           i.i_ctx_slot, i.i_basis, i.i_line_last, i.i_crashed, c.task IS NOT NULL AS train_capped,
           k.task IS NOT NULL AS cancel_line, m.item, m.stage, m.attempt, a.cap_sent, a.a_gen, a.a_end,
           coalesce(r.prompt_tokens, a.a_prompt, s.s_prompt) AS prompt_,
           CASE WHEN r.prompt_tokens IS NOT NULL THEN 'log' WHEN a.a_prompt IS NOT NULL THEN 'attempt'
                WHEN s.s_prompt IS NOT NULL THEN 'retry' END AS prompt_source
    FROM fx_live_requests r
    LEFT JOIN inst i USING (run, instance)
    LEFT JOIN train_cap c ON c.run = r.run AND c.instance = r.instance AND c.task = r.task
    LEFT JOIN cancels k ON k.run = r.run AND k.instance = r.instance AND k.task = r.task
    LEFT JOIN m ON m.run = r.run AND m.instance = r.instance AND m.slot = r.slot AND m.task = r.task
    LEFT JOIN att a ON a.run = r.run AND a.instance = r.instance AND a.slot = r.slot AND a.task = r.task
    LEFT JOIN same_prompt s ON s.run = r.run AND s.item = m.item AND s.stage = m.stage
    WHERE r.run IN (SELECT unnest($runs))
),
r1 AS (
    SELECT *,
           -- the prompt was cut to fit: the server said so (`input truncated`), or the release says `truncated`
           -- while the slot's context was not full (no context shift, no training-context stop): b3600-era
           -- builds truncate silently at default verbosity
           coalesce(prompt_truncated, false)
           OR coalesce(truncated AND NOT coalesce(context_shift, false) AND NOT train_capped
                       AND n_past_end < ctx_slot_ - 2, false) AS p_trunc,
           coalesce(gen_tokens,
                    CASE WHEN coalesce(context_shift, false)
                         THEN greatest(n_past_end, coalesce(n_ctx_slot, i_ctx_slot)) - prompt_
                         WHEN n_past_end > prompt_ THEN n_past_end - prompt_ END,
                    a_gen) AS gen_,
           CASE WHEN coalesce(n_predict, -1) > 0 THEN n_predict WHEN cap_sent > 0 THEN cap_sent END AS cap_,
           (error IS NOT NULL OR coalesce(http_status, 200) >= 400
            OR coalesce(stop_reason IN ('error', 'cancelled'), false)) AS failed_
    FROM r0
),
r2 AS (
    SELECT *,
           (coalesce(context_shift, false) OR coalesce(regexp_matches(lower(error), 'context shift is disabled'), false)
            OR ((coalesce(truncated, false) OR coalesce(stop_reason = 'context', false)) AND NOT p_trunc)) AS ctx_full_
    FROM r1
)
SELECT r.run, r.instance, r.instance_id, r.path, r.slot, r.task, r.seq, r.item, r.stage, r.attempt,
       r.prompt_ AS prompt_tokens, r.prompt_source, r.cached_tokens,
       r.gen_ AS gen_tokens, r.gen_tokens AS gen_logged, r.gen_ms,
       CASE WHEN r.total_ms > 0 THEN r.total_ms / 1000.0
            WHEN NOT coalesce(r.complete, true) AND epoch(r.a_end) > coalesce(epoch(r.t_end), epoch(r.t_start))
                 THEN epoch(r.a_end) - epoch(r.t_start)
            WHEN epoch(r.t_end) > epoch(r.t_start) THEN epoch(r.t_end) - epoch(r.t_start)
            WHEN r.elapsed_end_s > r.elapsed_start_s THEN r.elapsed_end_s - r.elapsed_start_s END AS seconds,
       CASE WHEN r.gen_tokens >= 2 AND r.gen_ms IS NOT NULL THEN r.gen_ms / r.gen_tokens END AS tpot_ms,
       r.n_past_end, r.ctx_slot_ AS ctx_slot,
       r.stop_reason, r.truncated, r.context_shift, r.n_predict, r.cap_sent, r.cap_ AS cap,
       CASE WHEN r.error IS NOT NULL OR coalesce(r.stop_reason = 'error', false) THEN 'error'
            WHEN r.cancel_line OR coalesce(r.stop_reason = 'cancelled', false) THEN 'client'
            WHEN r.train_capped THEN 'n_ctx_train'
            WHEN NOT coalesce(r.complete, true) THEN 'shutdown'
            WHEN r.ctx_full_ OR coalesce(r.n_past_end >= r.ctx_slot_, false) THEN 'context'
            WHEN coalesce(r.stop_reason = 'limit', false) OR coalesce(r.gen_ >= r.cap_, false) THEN 'cap'
            WHEN r.stop_reason IN ('eos', 'word') THEN r.stop_reason
            ELSE 'unknown' END AS stop_cause,
       r.failed_ AS failed,
       r.http_status, r.error, r.complete,
       r.p_trunc AS prompt_truncated,
       coalesce(regexp_matches(lower(r.error), 'exceeds the available context size|input prompt is too big'
                               || '|is larger than the max context size|prompt is too long'), false)
       AND NOT coalesce(r.prompt_ < r.ctx_slot_, false) AS prompt_rejected,
       coalesce(regexp_matches(lower(r.error), 'context shift is disabled'), false) AS ctx_error,
       r.ctx_full_ AS ctx_full,
       r.t_start, r.t_end,
       CASE WHEN r.t_start IS NULL THEN NULL
            WHEN r.clock IS NOT NULL THEN r.clock
            WHEN r.i_basis = 'absolute' THEN 'log'
            ELSE 'anchored' END AS clock,
       r.elapsed_start_s, r.elapsed_end_s, r.line_first, r.line_last,
       coalesce(epoch(r.t_start), r.elapsed_start_s) AS start_key,
       CASE WHEN r.stage IS NOT NULL THEN 'stage:' || r.stage ELSE 'instance:' || r.instance END AS bgroup,
       regexp_replace(r.error, '[0-9]+', 'N', 'g') AS err_shape,
       (coalesce(r.complete, true) AND r.error IS NULL AND coalesce(r.http_status, 200) < 400
        AND coalesce(r.stop_reason, 'unknown') IN ('eos', 'word', 'limit', 'unknown')
        AND NOT coalesce(r.truncated, false) AND NOT coalesce(r.context_shift, false)
        AND r.gen_tokens IS NOT NULL) AS clean
FROM r2 r

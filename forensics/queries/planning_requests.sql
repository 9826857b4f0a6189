-- planning_requests: every request of the chosen runs with what the planning model needs of it.
--
-- One row per request: a replay attempt (the run has records), joined through `matches` to the server request it
-- was served as when the join found one, or a server request (the run has no records).  For each: its instance and
-- slot, item, stage and attempt (records only), the client's send and end times (epoch seconds; records only), the
-- server's start and end on the log's own clock (srv_clock: absolute or elapsed; null for a log without time),
-- prompt tokens with and without the cache, generated tokens, llama.cpp's prompt and generation times, the latency
-- the run's metrics use (client end - send for records, total_ms / 1000 for server logs), whether it failed and its
-- outcome (the client's; for a log: cancelled, failed or ok), the slot's context and the output cap in force.  The
-- server's numbers win over the response's where both exist (the log is the server's own account); the response's
-- fill in for a request the join did not find.
--
-- Parameters: $runs (VARCHAR[]) runs to include.  Relations: requests, attempts, matches.
WITH srv AS (
    SELECT r.run, r.instance, r.slot, r.task, r.seq, r.line_first,
           -- a request the client cancelled has no timings: its prompt is what the slot held less what it generated
           coalesce(r.prompt_tokens, r.n_past_end - r.gen_tokens + 1) AS prompt_tokens,
           r.prompt_eval_tokens, r.cached_tokens, r.gen_tokens, r.prompt_ms, r.gen_ms, r.total_ms, r.n_ctx_slot,
           coalesce(epoch(r.t_start), r.elapsed_start_s) AS srv_start,
           coalesce(epoch(r.t_end), r.elapsed_end_s) AS srv_end,
           CASE WHEN r.t_start IS NOT NULL AND r.t_end IS NOT NULL THEN 'absolute'
                WHEN r.elapsed_start_s IS NOT NULL AND r.elapsed_end_s IS NOT NULL THEN 'elapsed' END AS srv_clock,
           (r.error IS NOT NULL OR coalesce(r.http_status, 200) >= 400
            OR coalesce(r.stop_reason, '') IN ('error', 'cancelled')) AS failed,
           r.n_predict, r.stop_reason
    FROM requests r
    WHERE list_contains($runs, r.run)
),
rec_runs AS (
    SELECT DISTINCT run FROM attempts WHERE list_contains($runs, run) AND started_at IS NOT NULL
),
m AS (
    SELECT run, item, stage, attempt, any_value(instance) AS instance, any_value(slot) AS slot,
           any_value(task) AS task
    FROM matches
    WHERE list_contains($runs, run) AND task IS NOT NULL AND coalesce("match", 'matched') <> 'unmatched'
    GROUP BY run, item, stage, attempt
)
SELECT a.run, 'records' AS source, coalesce(s.instance, a.server) AS instance, coalesce(s.slot, a.id_slot) AS slot,
       s.task, a.item, a.stage, a.attempt,
       epoch(a.started_at) AS send_abs, epoch(a.ended_at) AS end_abs,
       s.srv_start, s.srv_end, s.srv_clock,
       coalesce(s.prompt_tokens, a.tokens_evaluated) AS prompt_tokens,
       coalesce(s.prompt_eval_tokens, a.prompt_n,
                s.prompt_tokens - s.cached_tokens) AS prompt_eval,
       coalesce(s.cached_tokens, a.tokens_evaluated - a.prompt_n) AS cached,
       coalesce(s.gen_tokens, a.predicted_n, a.tokens_predicted) AS gen_tokens,
       coalesce(s.prompt_ms, a.prompt_ms) AS prompt_ms,
       coalesce(s.gen_ms, a.predicted_ms) AS gen_ms,
       epoch(a.ended_at) - epoch(a.started_at) AS latency_s,
       coalesce(a.outcome, 'failed') <> 'ok' AS failed, a.outcome, s.stop_reason, s.n_ctx_slot,
       coalesce(s.n_predict, a.max_tokens) AS n_predict,
       coalesce(a.source_line, 0) AS ord
FROM attempts a
LEFT JOIN m ON m.run = a.run AND m.item = a.item AND m.stage = a.stage AND m.attempt = a.attempt
LEFT JOIN srv s ON s.run = m.run AND s.instance = m.instance AND s.slot = m.slot AND s.task = m.task
WHERE a.run IN (SELECT run FROM rec_runs)
UNION ALL
SELECT s.run, 'server' AS source, s.instance, s.slot, s.task,
       CAST(NULL AS VARCHAR) AS item, CAST(NULL AS VARCHAR) AS stage, CAST(NULL AS BIGINT) AS attempt,
       CAST(NULL AS DOUBLE) AS send_abs, CAST(NULL AS DOUBLE) AS end_abs,
       s.srv_start, s.srv_end, s.srv_clock,
       s.prompt_tokens, coalesce(s.prompt_eval_tokens, s.prompt_tokens - s.cached_tokens) AS prompt_eval,
       s.cached_tokens AS cached, s.gen_tokens, s.prompt_ms, s.gen_ms,
       s.total_ms / 1000.0 AS latency_s, s.failed,
       CASE WHEN s.stop_reason = 'cancelled' THEN 'cancelled' WHEN s.failed THEN 'failed' ELSE 'ok' END AS outcome,
       s.stop_reason, s.n_ctx_slot, s.n_predict, s.line_first AS ord
FROM srv s
WHERE s.run NOT IN (SELECT run FROM rec_runs)
ORDER BY run, source, coalesce(send_abs, srv_start), ord

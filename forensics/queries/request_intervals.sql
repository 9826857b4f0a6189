-- request_intervals: one row per request of the chosen runs, placed on the run's clock.
--
-- Finds, for every request, its start and end in seconds since the run's first request (start_s,
-- end_s), its latency, tokens and per-token latency, and whether it failed.  Two sources:
--   * records (client side, the `attempts` table): used for a run when $source is 'records', or
--     'auto' and the run has attempts with send times or latencies.  Their clock (time_basis):
--       absolute   started_at / ended_at (wall clock);
--       relative   started_rel_s / ended_rel_s: a harness's monotonic clock that nothing anchored
--                  (vLLM's perf_counter start_times without benchmark_start_time_unix);
--       durations  latencies (or only the run's duration in its summary), no send times (llmperf, vLLM
--                  results without start_times): start_s and end_s stay null, and throughput takes the
--                  run's duration (and, for a sample, its counts) from its summary.
--     Latency = end - start, else latency_ms.  Tokens: the server request's (fx_requests: the one
--     count every output shows) when the join tied the attempt to one, else the attempt's own.
--   * server (fx_requests: the request facts every finding reads): otherwise.  Latency = its `seconds`.
-- Clock of a server-log run (time_basis), the best its requests all have:
--   absolute  t_start / t_end (an anchor exists): seconds since the run's first start;
--   elapsed   elapsed_start_s / elapsed_end_s: seconds since each instance's first start
--             (instances are aligned at their first request: no common anchor);
--   order     no time at all: each slot's requests are laid back to back in `seq` order, each
--             lasting its seconds; every slot starts at 0.  Wall time and everything derived from it
--             are then estimates.
-- `failed` is fx_requests.failed (server) or an outcome other than ok (records), as the failed finding counts.
--
-- Parameters: $runs (VARCHAR[]) runs to include; $source ('auto' | 'server' | 'records').
-- Relations: fx_requests, fx_matches, attempts, runs.
WITH rec_runs AS (
    SELECT DISTINCT run FROM attempts
    WHERE (started_at IS NOT NULL OR started_rel_s IS NOT NULL OR latency_ms IS NOT NULL
           OR run IN (SELECT run FROM runs WHERE summary_duration_s IS NOT NULL))
      AND run IN (SELECT unnest($runs)) AND $source <> 'server'
),
srv_raw AS (
    SELECT r.*, r.seconds * 1000.0 AS total_ms,
           epoch(r.t_start) AS abs_start, epoch(r.t_end) AS abs_end
    FROM fx_requests r
    WHERE r.run IN (SELECT unnest($runs))
      AND $source <> 'records'
      AND r.run NOT IN (SELECT run FROM rec_runs)
),
srv_basis AS (
    SELECT run,
           CASE WHEN bool_and(abs_start IS NOT NULL) THEN 'absolute'
                WHEN bool_and(elapsed_start_s IS NOT NULL) THEN 'elapsed'
                ELSE 'order' END AS time_basis
    FROM srv_raw GROUP BY run
),
-- Each clock reads only what it needs: the run's and each instance's first start come from one
-- aggregate per run and instance (the run's first is the least of its instances'), and the back-to-back
-- sums (a sort of every slot) are computed only for runs without any time.  The requests meet these
-- few rows in one join.
clock AS (
    SELECT f.run, f.instance, b.time_basis,
           min(f.inst_abs) OVER (PARTITION BY f.run) AS first_abs, f.first_elapsed
    FROM (SELECT run, instance, min(abs_start) AS inst_abs, min(elapsed_start_s) AS first_elapsed
          FROM srv_raw GROUP BY run, instance) f
    JOIN srv_basis b ON b.run IS NOT DISTINCT FROM f.run
    WHERE b.time_basis <> 'order'
),
srv_timed AS (
    SELECT s.*, c.time_basis,
           CASE c.time_basis
               WHEN 'absolute' THEN abs_start - c.first_abs
               ELSE elapsed_start_s - c.first_elapsed
           END AS start0,
           CASE c.time_basis
               WHEN 'absolute' THEN coalesce(abs_end, abs_start + total_ms / 1000.0) - c.first_abs
               ELSE coalesce(elapsed_end_s, elapsed_start_s + total_ms / 1000.0) - c.first_elapsed
           END AS end0
    FROM srv_raw s
    JOIN clock c ON c.run IS NOT DISTINCT FROM s.run AND c.instance IS NOT DISTINCT FROM s.instance
),
srv_order AS (
    SELECT s.*, b.time_basis,
           coalesce(sum(total_ms) OVER (PARTITION BY s.run, s.instance, s.slot ORDER BY seq, line_first
                                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) / 1000.0 AS start0,
           sum(total_ms) OVER (PARTITION BY s.run, s.instance, s.slot ORDER BY seq, line_first
                               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) / 1000.0 AS end0
    FROM srv_raw s JOIN srv_basis b ON b.run IS NOT DISTINCT FROM s.run
    WHERE b.time_basis = 'order'
),
srv AS (
    SELECT * FROM srv_timed UNION ALL SELECT * FROM srv_order
),
rec_clock AS (
    SELECT run,
           CASE WHEN bool_or(started_at IS NOT NULL) THEN 'absolute'
                WHEN bool_or(started_rel_s IS NOT NULL) THEN 'relative'
                ELSE 'durations' END AS time_basis
    FROM attempts WHERE run IN (SELECT run FROM rec_runs) GROUP BY run
),
tied AS (  -- the server request each attempt reached, when the join tied one: its generated tokens
    SELECT m.run, m.item, m.stage, m.attempt, any_value(r.gen_tokens) AS srv_gen
    FROM fx_matches m JOIN fx_requests r ON r.run = m.run AND r.instance = m.instance AND r.slot = m.slot
                                        AND r.task = m.task
    GROUP BY m.run, m.item, m.stage, m.attempt
),
rec AS (
    SELECT a.*, c.time_basis, t.srv_gen,
           CASE c.time_basis WHEN 'absolute' THEN epoch(a.started_at) WHEN 'relative' THEN a.started_rel_s END
               AS abs_start,
           CASE c.time_basis
               WHEN 'absolute' THEN coalesce(epoch(a.ended_at), epoch(a.started_at) + a.latency_ms / 1000.0)
               WHEN 'relative' THEN coalesce(a.ended_rel_s, a.started_rel_s + a.latency_ms / 1000.0)
           END AS abs_end
    FROM attempts a JOIN rec_clock c USING (run)
    LEFT JOIN tied t ON t.run = a.run AND t.item = a.item AND t.stage = a.stage AND t.attempt = a.attempt
)
SELECT run, 'server' AS source, time_basis, instance, slot, task, seq,
       CAST(NULL AS VARCHAR) AS item, CAST(NULL AS VARCHAR) AS stage,
       prompt_tokens, gen_tokens, gen_ms,
       total_ms / 1000.0 AS latency_s,
       CASE WHEN gen_tokens > 1 AND gen_ms IS NOT NULL THEN gen_ms / (gen_tokens - 1) END AS tpot_ms,
       failed,
       stop_reason, truncated, context_shift, n_predict, error,
       start0 AS start_s, end0 AS end_s, end0 - start0 AS duration_s, line_first
FROM srv
UNION ALL
SELECT run, 'records' AS source, time_basis, server AS instance, id_slot AS slot,
       CAST(NULL AS BIGINT) AS task, attempt AS seq, item, stage,
       coalesce(tokens_evaluated, prompt_n) AS prompt_tokens,
       coalesce(srv_gen, tokens_predicted, predicted_n) AS gen_tokens,
       predicted_ms AS gen_ms,
       coalesce(abs_end - abs_start, latency_ms / 1000.0) AS latency_s,
       CASE WHEN coalesce(predicted_n, tokens_predicted) > 1 AND predicted_ms IS NOT NULL
            THEN predicted_ms / (coalesce(predicted_n, tokens_predicted) - 1) END AS tpot_ms,
       coalesce(outcome, 'failed') <> 'ok' AS failed,
       nullif(stop_type, 'none') AS stop_reason,
       truncated, CAST(NULL AS BOOLEAN) AS context_shift, max_tokens AS n_predict, error,
       abs_start - min(abs_start) OVER (PARTITION BY run) AS start_s,
       abs_end - min(abs_start) OVER (PARTITION BY run) AS end_s,
       coalesce(abs_end - abs_start, latency_ms / 1000.0) AS duration_s, source_line AS line_first
FROM rec
ORDER BY run, instance, slot, start_s, seq

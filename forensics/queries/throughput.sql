-- throughput: per-run throughput, latency and concurrency.
--
-- Reads `request_intervals` (the rows of request_intervals.sql, registered as a relation) and the
-- `runs` and `instances` views.  One row per run:
--   np                    runs.concurrency, else the slots of the servers that served it (n_slots summed over
--                         their log files), else peak_busy_slots
--   wall_s                last request end - first request start, else (records with durations only) the
--                         run's duration as its summary states it
--   gen_tok_per_s         sum of generated tokens / wall_s (aggregate output throughput)
--   req_per_s             successful requests / wall_s
--   latency_*_s           request latency percentiles (linear interpolation, like numpy)
--   tpot_*_ms             time per output token = gen_ms / (gen_tokens - 1), per request
--   effective_concurrency sum of request durations / wall_s (SGLang's "Concurrency")
--   peak_busy_slots       most requests in flight at once (an end at time t comes before a start at t)
-- Parameters: none (the runs are those in request_intervals).
WITH per_run AS (
    SELECT run,
           any_value(source) AS source,
           any_value(time_basis) AS time_basis,
           count(*) AS requests,
           count(*) FILTER (WHERE failed) AS failed,
           CAST(coalesce(sum(gen_tokens), 0) AS BIGINT) AS gen_tokens,
           CAST(coalesce(sum(prompt_tokens), 0) AS BIGINT) AS prompt_tokens,
           max(end_s) - min(start_s) AS wall_s,
           sum(duration_s) AS busy_s,
           avg(latency_s) AS latency_mean_s,
           quantile_cont(latency_s, 0.5) AS latency_p50_s,
           quantile_cont(latency_s, 0.9) AS latency_p90_s,
           quantile_cont(latency_s, 0.95) AS latency_p95_s,
           quantile_cont(latency_s, 0.99) AS latency_p99_s,
           max(latency_s) AS latency_max_s,
           avg(tpot_ms) AS tpot_mean_ms,
           quantile_cont(tpot_ms, 0.5) AS tpot_p50_ms
    FROM request_intervals
    GROUP BY run
),
edges AS (
    SELECT run, start_s AS t, 1 AS d FROM request_intervals WHERE start_s IS NOT NULL AND end_s IS NOT NULL
    UNION ALL
    SELECT run, end_s AS t, -1 AS d FROM request_intervals WHERE start_s IS NOT NULL AND end_s IS NOT NULL
),
-- One running sum over every run's edges in (run, t, d) order: each request adds +1 and -1, so a run's
-- edges sum to 0 and the sum at its first edge starts from 0, as a sum per run would; one sort of all
-- edges instead of one partition per run (a single run is otherwise sorted by one thread).
peak AS (
    SELECT run, max(busy) AS peak_busy_slots
    FROM (SELECT run, sum(d) OVER (ORDER BY run, t, d ROWS UNBOUNDED PRECEDING) AS busy FROM edges)
    GROUP BY run
),
-- a run served by several servers (a main and a backup) has the slots of all of them: the largest start of each
-- log file that served requests, summed over the files
inst AS (
    SELECT run, coalesce(sum(n) FILTER (WHERE served), max(n)) AS n_slots
    FROM (SELECT run, path, max(n_slots) AS n, bool_or(coalesce(requests, 0) > 0) AS served
          FROM instances GROUP BY run, path)
    GROUP BY run
),
man AS (
    SELECT run, any_value(concurrency) AS concurrency,
           any_value(epoch(ended_at) - epoch(started_at)) AS run_s,
           any_value(summary_duration_s) AS summary_s, any_value(summary_requests) AS summary_requests,
           any_value(summary_ok) AS summary_ok, any_value(summary_output_tokens) AS summary_tokens
    FROM runs GROUP BY run
),
-- records with durations only are placed on no clock: the run's duration is its summary's, and when they are
-- a sample of the run (fewer than its summary counts), the summary's counts stand for the rates
walls AS (
    SELECT p.run,
           coalesce(p.wall_s, CASE WHEN p.time_basis = 'durations' THEN m.summary_s END) AS wall_s,
           p.time_basis = 'durations' AND m.summary_requests > p.requests AS sampled,
           m.summary_ok, m.summary_tokens
    FROM per_run p LEFT JOIN man m USING (run)
)
SELECT p.run,
       CAST(coalesce(m.concurrency, i.n_slots, k.peak_busy_slots) AS BIGINT) AS np,
       CASE WHEN m.concurrency IS NOT NULL THEN 'manifest'
            WHEN i.n_slots IS NOT NULL THEN 'n_slots'
            ELSE 'peak_busy' END AS np_source,
       p.source, p.time_basis,
       p.time_basis = 'order' AS estimated,
       p.requests, p.failed,
       w.wall_s, m.run_s,
       p.gen_tokens, p.prompt_tokens,
       CASE WHEN w.sampled AND w.summary_tokens IS NOT NULL THEN w.summary_tokens ELSE p.gen_tokens END
           / nullif(w.wall_s, 0) AS gen_tok_per_s,
       CASE WHEN w.sampled AND w.summary_ok IS NOT NULL THEN w.summary_ok ELSE p.requests - p.failed END
           / nullif(w.wall_s, 0) AS req_per_s,
       p.latency_mean_s, p.latency_p50_s, p.latency_p90_s, p.latency_p95_s, p.latency_p99_s, p.latency_max_s,
       p.tpot_mean_ms, p.tpot_p50_ms,
       CASE WHEN NOT w.sampled THEN p.busy_s / nullif(w.wall_s, 0) END AS effective_concurrency,
       CAST(k.peak_busy_slots AS BIGINT) AS peak_busy_slots
FROM per_run p
JOIN walls w USING (run)
LEFT JOIN peak k USING (run)
LEFT JOIN inst i USING (run)
LEFT JOIN man m USING (run)
ORDER BY np, p.run

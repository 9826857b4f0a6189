-- otel_spans: one row per server request of the chosen runs, with what its OpenTelemetry span carries.
--
-- The request's timings and tokens, its instance's model and listen address, the run manifest's start
-- (run_started_at: the anchor of a run whose log has only elapsed times), the run's first elapsed start
-- (elapsed0: so such a run's requests keep their offsets from it) and, when the join matched a replay
-- attempt to the request, its item, stage and attempt.  forensics/otel.py turns the rows into spans.
-- Parameters: $runs VARCHAR[].  Relations: requests, instances, runs, replay_matches.
WITH inst AS (
    SELECT run, instance, any_value(model) AS model, any_value(host) AS host, any_value(port) AS port,
           any_value(build) AS build
    FROM instances GROUP BY run, instance
),
man AS (
    SELECT run, any_value(started_at) AS run_started_at, any_value(model) AS run_model FROM runs GROUP BY run
),
m AS (
    SELECT run, instance, path, slot, seq, max(item) AS item, max(stage) AS stage, max(attempt) AS attempt
    FROM replay_matches WHERE "match" = 'matched' GROUP BY run, instance, path, slot, seq
),
first_elapsed AS (
    SELECT run, min(elapsed_start_s) AS elapsed0 FROM requests WHERE run IN (SELECT unnest($runs)) GROUP BY run
)
SELECT r.run, r.instance, r.path, r.slot, r.task, r.seq, r.prompt_tokens, r.cached_tokens, r.gen_tokens,
       r.prompt_ms, r.gen_ms, r.total_ms, r.stop_reason, r.truncated, r.n_predict, r.http_status, r.http_path,
       r.error, r.complete, r.t_start, r.t_end, r.elapsed_start_s, r.elapsed_end_s, r.line_first, r.line_last,
       coalesce(i.model, man.run_model) AS model, i.host, i.port, i.build, man.run_started_at, f.elapsed0,
       m.item, m.stage, m.attempt
FROM requests r
LEFT JOIN inst i ON i.run = r.run AND i.instance = r.instance
LEFT JOIN man ON man.run = r.run
LEFT JOIN first_elapsed f ON f.run = r.run
LEFT JOIN m ON m.run = r.run AND m.instance = r.instance AND m.path = r.path
           AND m.slot IS NOT DISTINCT FROM r.slot AND m.seq IS NOT DISTINCT FROM r.seq
WHERE r.run IN (SELECT unnest($runs))
ORDER BY r.run, r.instance, r.slot, r.seq, r.line_first

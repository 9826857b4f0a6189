-- run_setup: what each run measured, the one rule of which runs are comparable (forensics.setups reads it).
--
-- One row per run of $runs.  The setup is everything but the number of slots that changes what a request costs:
--   build, commit  of the servers that served it (the log's build line, else the manifest's config.build)
--   model          the model file's name (lower case, without .gguf), else the manifest's model
--   n_ctx          the server's whole context (-c): the log's, else the manifest's config (ctx, n_ctx, c); not the
--                  slots' context, which a sweep over -np at a fixed -c changes at every step (and which a build
--                  caps at the model's training context)
--   context_shift  a request shifted the context (the server was run with it), else the manifest's config says so
--   host           the manifest's config.host, else the syslog/journald host of its lines (a fleet adds the store)
--   workload       the stages and the output cap the harness sent per stage (each stage's most common max_tokens),
--                  and the manifest's config.sweep when it names one
-- `setup_key` is a digest of all of them (nulls included: an unknown build is its own value), `setup` a short label.
-- `np`: the manifest's concurrency, else the slots of the instances that served it.
-- Parameters: $runs VARCHAR[].  Relations: fx_instances, fx_live_requests, runs, attempts.
WITH served AS (
    SELECT run, max(build) AS build, max("commit") AS commit_,
           min(lower(regexp_replace(regexp_extract(model, '[^/\\]*$'), '\.gguf$', ''))) AS model_file,
           max(n_ctx) AS n_ctx, max(n_ctx_slot) AS n_ctx_slot, max(n_slots) AS n_slots
    FROM fx_instances WHERE coalesce(requests, 0) > 0
    GROUP BY run
),
shift AS (
    SELECT run, bool_or(coalesce(context_shift, false)) AS shifted FROM fx_live_requests GROUP BY run
),
wrap AS (
    SELECT run, min(host_wrapper) AS host_wrapper FROM events
    WHERE run IN (SELECT unnest($runs)) AND host_wrapper IS NOT NULL GROUP BY run
),
stage_caps AS (
    SELECT run, stage, mode(max_tokens) AS cap FROM attempts
    WHERE run IN (SELECT unnest($runs)) AND max_tokens > 0 AND stage IS NOT NULL GROUP BY run, stage
),
caps AS (
    SELECT run, string_agg(stage || '=' || cap, ',' ORDER BY stage) AS caps FROM stage_caps GROUP BY run
),
man AS (
    SELECT run, any_value(model) AS model, any_value(stages) AS stages, any_value(concurrency) AS concurrency,
           any_value(config) AS config
    FROM runs WHERE run IN (SELECT unnest($runs)) GROUP BY run
),
base AS (
    SELECT r.run,
           coalesce(s.build, TRY_CAST(regexp_extract(json_extract_string(m.config, '$.build'), '[0-9]+') AS BIGINT))
               AS build,
           s.commit_ AS "commit",
           coalesce(s.model_file, m.model) AS model,
           coalesce(s.n_ctx, TRY_CAST(json_extract_string(m.config, '$.ctx') AS BIGINT),
                    TRY_CAST(json_extract_string(m.config, '$.n_ctx') AS BIGINT),
                    TRY_CAST(json_extract_string(m.config, '$.c') AS BIGINT)) AS n_ctx,
           s.n_ctx_slot,
           CAST(coalesce(m.concurrency, s.n_slots) AS BIGINT) AS np,
           coalesce(h.shifted, false)
               OR coalesce(TRY_CAST(json_extract_string(m.config, '$.context_shift') AS BOOLEAN), false)
               AS context_shift,
           coalesce(json_extract_string(m.config, '$.host'), w.host_wrapper) AS host,
           m.stages,
           c.caps,
           json_extract_string(m.config, '$.sweep') AS sweep
    FROM (SELECT unnest($runs) AS run) r
    LEFT JOIN served s USING (run)
    LEFT JOIN shift h USING (run)
    LEFT JOIN wrap w USING (run)
    LEFT JOIN caps c USING (run)
    LEFT JOIN man m USING (run)
)
SELECT *,
       substr(md5(concat_ws('|', coalesce(host, '?'), coalesce(CAST(build AS VARCHAR), '?'), coalesce("commit", '?'),
                     coalesce(model, '?'), coalesce(CAST(n_ctx AS VARCHAR), '?'), CAST(context_shift AS VARCHAR),
                     coalesce(stages, '?'), coalesce(caps, '?'), coalesce(sweep, '?'))), 1, 12) AS setup_key,
       coalesce(nullif(concat_ws(' · ', 'b' || CAST(build AS VARCHAR), model, '-c ' || CAST(n_ctx AS VARCHAR),
                                 CASE WHEN context_shift THEN 'context shift' END, host,
                                 CASE WHEN caps IS NOT NULL THEN 'caps ' || caps END,
                                 CASE WHEN sweep IS NOT NULL THEN 'sweep ' || sweep END), ''),
                'no build, model or workload logged') AS setup
FROM base
ORDER BY run

-- Replay runs: one row per run with the run id its records carried when they were tied to it (alias),
-- its concurrency (np), items expected / done / missing (an item is done when every stage of it finished
-- ok), attempts, server requests attributed to the run by the join, wall time (manifest start..end, else
-- first send..last end) and how the run ended.  A run read from a benchmark's summary alone (no
-- per-request rows) takes its counts and duration from the summary; `from` says which.
-- Parameters: $runs VARCHAR[] (the runs to list).
-- Relations: runs, attempts, items (store views); replay_requests (the join's requests, registered by
-- forensics.replay.tables).
WITH ids AS (
    SELECT run FROM runs UNION SELECT run FROM attempts UNION SELECT run FROM items
),
it AS (
    SELECT run, item, bool_and(done) AS done FROM items GROUP BY run, item
),
agg_items AS (
    SELECT run, count(*) AS expected, count(*) FILTER (WHERE done) AS done FROM it GROUP BY run
),
agg_att AS (
    SELECT run, count(*) AS attempts, min(started_at) AS t0, max(coalesce(ended_at, started_at)) AS t1
    FROM attempts GROUP BY run
),
agg_req AS (
    SELECT replay_run AS run, count(*) AS requests FROM replay_requests WHERE replay_run IS NOT NULL GROUP BY 1
),
aliases AS (
    SELECT run, string_agg(DISTINCT alias, ', ' ORDER BY alias) AS alias
    FROM (SELECT run, alias FROM runs UNION ALL SELECT run, alias FROM attempts)
    WHERE alias IS NOT NULL GROUP BY run
),
listed AS (
    SELECT
        i.run,
        al.alias,
        m.concurrency AS np,
        aa.attempts IS NULL AND m.summary_requests IS NOT NULL AS summary_only,
        coalesce(ai.expected, m.summary_requests, 0) AS items_expected,
        coalesce(ai.done, m.summary_ok, 0) AS items_done,
        coalesce(ai.expected - ai.done, m.summary_requests - m.summary_ok, m.summary_failed, 0) AS items_missing,
        coalesce(aa.attempts, 0) AS attempts,
        coalesce(rq.requests, 0) AS requests,
        coalesce(round(date_diff('millisecond', coalesce(m.started_at, aa.t0), coalesce(m.ended_at, aa.t1)) / 1000.0, 3),
                 round(m.summary_duration_s, 3)) AS wall_s,
        coalesce(m.ended_how, 'unknown')
            || CASE WHEN m.ended_detail IS NOT NULL AND m.ended_detail <> coalesce(m.ended_how, '')
                    THEN ' (' || m.ended_detail || ')' ELSE '' END AS ended
    FROM ids i
    LEFT JOIN runs m ON m.run = i.run
    LEFT JOIN agg_items ai ON ai.run = i.run
    LEFT JOIN agg_att aa ON aa.run = i.run
    LEFT JOIN agg_req rq ON rq.run = i.run
    LEFT JOIN aliases al ON al.run = i.run
    WHERE i.run IS NOT NULL AND i.run IN (SELECT unnest($runs))
)
SELECT run, alias, np, items_expected, items_done, items_missing, attempts, requests, wall_s, ended,
       CASE WHEN summary_only THEN 'summary' ELSE 'records' END AS "from"
FROM listed
ORDER BY run

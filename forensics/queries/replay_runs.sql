-- Replay runs: one row per run with its concurrency (np), items expected / done / missing (an item is
-- done when every stage of it finished ok), attempts, server requests attributed to the run by the join,
-- wall time (manifest start..end, else first send..last end) and how the run ended.
-- Parameters: none.
-- Relations: runs, attempts, items (store views); replay_requests (the join's requests, registered by
-- forensics.replay.report).
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
)
SELECT
    i.run,
    m.concurrency AS np,
    coalesce(ai.expected, 0) AS items_expected,
    coalesce(ai.done, 0) AS items_done,
    coalesce(ai.expected, 0) - coalesce(ai.done, 0) AS items_missing,
    coalesce(aa.attempts, 0) AS attempts,
    coalesce(rq.requests, 0) AS requests,
    round(date_diff('millisecond', coalesce(m.started_at, aa.t0), coalesce(m.ended_at, aa.t1)) / 1000.0, 3) AS wall_s,
    coalesce(m.ended_how, 'unknown')
        || CASE WHEN m.ended_detail IS NOT NULL AND m.ended_detail <> coalesce(m.ended_how, '')
                THEN ' (' || m.ended_detail || ')' ELSE '' END AS ended
FROM ids i
LEFT JOIN runs m ON m.run = i.run
LEFT JOIN agg_items ai ON ai.run = i.run
LEFT JOIN agg_att aa ON aa.run = i.run
LEFT JOIN agg_req rq ON rq.run = i.run
WHERE i.run IS NOT NULL
ORDER BY i.run

-- failovers: attempts of a replay run that failed on one server and were sent again to another (the harness
-- failed over), from the harness's own records: one row per failover.
-- `from_server`, `outcome`, `error`, `waited_s`: the attempt that failed (a client timeout, an HTTP error, no
-- response) and how long the client waited for it; `to_server`, `to_outcome`: where the next attempt of the
-- same item and stage went and how it ended.  Per run (the same on each of its rows): `timeouts` the client
-- timeouts of the run, `served` which server finished how many attempts ok ("main 46, backup 2").
-- Parameters: $runs VARCHAR[].  Relations: attempts.
WITH att AS (
    SELECT run, item, stage, attempt, server, outcome, error, http_status, started_at, ended_at, source,
           source_line,
           lead(server) OVER w AS next_server, lead(outcome) OVER w AS next_outcome
    FROM attempts
    WHERE run IN (SELECT unnest($runs))
    WINDOW w AS (PARTITION BY run, item, stage ORDER BY attempt, started_at)
),
served AS (
    SELECT run, string_agg(server || ' ' || n, ', ' ORDER BY n DESC, server) AS served
    FROM (SELECT run, coalesce(server, '?') AS server, count(*) AS n FROM att WHERE outcome = 'ok' GROUP BY ALL)
    GROUP BY run
),
timeouts AS (
    SELECT run, count(*) FILTER (WHERE outcome = 'timeout') AS timeouts FROM att GROUP BY run
)
SELECT a.run, a.item, a.stage, a.attempt, a.server AS from_server, a.outcome, a.error, a.http_status,
       round(epoch(a.ended_at) - epoch(a.started_at), 3) AS waited_s, a.next_server AS to_server,
       a.next_outcome AS to_outcome, t.timeouts, s.served, a.started_at,
       a.source || ':' || a.source_line AS evidence
FROM att a
LEFT JOIN served s USING (run)
LEFT JOIN timeouts t USING (run)
WHERE coalesce(a.outcome, 'failed') <> 'ok' AND a.next_server IS NOT NULL
  AND a.next_server IS DISTINCT FROM a.server AND a.server IS NOT NULL
ORDER BY a.run, a.started_at, a.item, a.stage, a.attempt

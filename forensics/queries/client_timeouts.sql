-- client_timeouts: the client's side of a run, from the harness's own records: every attempt the client gave up on (a
-- timeout) and every failed attempt whose next try went to another server (the harness failed over).  One row
-- per such attempt: `server`, `outcome`, `error`, `waited_s` (how long the client waited for it), and where the
-- next attempt of the same item and stage went (`next_server`, `next_outcome`; `failed_over`: to another
-- server).  Per run (the same on each of its rows): `served`, which server finished how many attempts ok
-- ("main 44, backup 4").
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
)
SELECT a.run, a.item, a.stage, a.attempt, a.server, a.outcome, a.error, a.http_status,
       round(epoch(a.ended_at) - epoch(a.started_at), 3) AS waited_s, a.next_server, a.next_outcome,
       coalesce(a.next_server IS DISTINCT FROM a.server AND a.next_server IS NOT NULL AND a.server IS NOT NULL,
                false) AS failed_over,
       s.served, a.started_at, a.source || ':' || a.source_line AS evidence
FROM att a
LEFT JOIN served s USING (run)
WHERE coalesce(a.outcome, 'failed') <> 'ok'
  AND (a.outcome = 'timeout'
       OR (a.next_server IS NOT NULL AND a.server IS NOT NULL AND a.next_server IS DISTINCT FROM a.server))
ORDER BY a.run, a.started_at, a.item, a.stage, a.attempt

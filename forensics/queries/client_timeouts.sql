-- client_timeouts: the client's side of a run, from the harness's own records: every attempt the client gave up on (a
-- timeout) and every failed attempt whose next try went to another server (the harness failed over).  One row
-- per such attempt: `server`, `outcome`, `error`, `waited_s` (how long the client waited for it), and where the
-- next attempt of the same item and stage went (`next_server`, `next_outcome`; `failed_over`: to another
-- server).  Per run (the same on each of its rows): `served`, which server finished how many attempts ok
-- ("main 44, backup 4").
-- A record that names no server is given the one the join says it reached (matches.server), else "an unknown
-- server" (never a null in a sentence).
-- Parameters: $runs VARCHAR[].  Relations: attempts, matches.
WITH reached AS (  -- the server the join says an attempt reached, for records that do not name one
    SELECT run, item, stage, attempt, any_value(server) AS m_server FROM matches
    WHERE run IN (SELECT unnest($runs)) AND server IS NOT NULL GROUP BY run, item, stage, attempt
),
att0 AS (
    SELECT a.run, a.item, a.stage, a.attempt, coalesce(a.server, r.m_server, 'an unknown server') AS server,
           a.outcome, a.error, a.http_status, a.started_at, a.ended_at, a.source, a.source_line
    FROM attempts a
    LEFT JOIN reached r ON r.run = a.run AND r.item = a.item AND r.stage = a.stage AND r.attempt = a.attempt
    WHERE a.run IN (SELECT unnest($runs))
),
att AS (
    SELECT run, item, stage, attempt, server, outcome, error, http_status, started_at, ended_at, source,
           source_line,
           lead(server) OVER w AS next_server, lead(outcome) OVER w AS next_outcome
    FROM att0
    WINDOW w AS (PARTITION BY run, item, stage ORDER BY attempt, started_at)
),
served AS (
    SELECT run, string_agg(server || ' ' || n, ', ' ORDER BY n DESC, server) AS served
    FROM (SELECT run, server, count(*) AS n FROM att WHERE outcome = 'ok' GROUP BY ALL)
    GROUP BY run
)
SELECT a.run, a.item, a.stage, a.attempt, a.server, a.outcome, a.error, a.http_status,
       round(epoch(a.ended_at) - epoch(a.started_at), 3) AS waited_s, a.next_server, a.next_outcome,
       coalesce(a.next_server IS DISTINCT FROM a.server AND a.next_server <> 'an unknown server'
                AND a.server <> 'an unknown server', false) AS failed_over,
       s.served, a.started_at, a.source || ':' || a.source_line AS evidence
FROM att a
LEFT JOIN served s USING (run)
WHERE coalesce(a.outcome, 'failed') <> 'ok'
  AND (a.outcome = 'timeout'
       OR (a.next_server <> 'an unknown server' AND a.server <> 'an unknown server'
           AND a.next_server IS DISTINCT FROM a.server))
ORDER BY a.run, a.started_at, a.item, a.stage, a.attempt

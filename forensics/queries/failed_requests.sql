-- failed_requests: every request of the chosen runs that failed, the one count of failures every output shows.
--
-- A run with replay records: every attempt that did not finish ok (outcome other than ok: an HTTP error, a
-- timeout, output that did not parse, ...), with the server request it reached when the join tied one (its
-- instance, slot and task).  The harness saw every request it made, so its records count the failures; a server
-- request the client gave up on is that attempt's, tied or not.  A run without records: its failed server
-- requests (fx_requests.failed: an error, HTTP >= 400, stop reason error, cancelled).
-- `source` says which side saw the failure (records, server); `reason` is the outcome of the attempt, else what
-- ended the server request (fx_requests.stop_cause); `before_slot`: the attempt failed and no server request of
-- the run is tied to it (an HTTP error answered before any slot took it, or a request the log does not show).
-- Parameters: $runs VARCHAR[].  Relations: fx_requests, fx_matches, attempts.
WITH att AS (
    SELECT a.run, a.item, a.stage, a.attempt, a.server, a.outcome, a.http_status, a.error,
           a.source || ':' || a.source_line AS a_evidence, a.started_at
    FROM attempts a
    WHERE a.run IN (SELECT unnest($runs)) AND coalesce(a.outcome, 'failed') <> 'ok'
),
tied AS (
    SELECT m.run, m.item, m.stage, m.attempt, any_value(m.instance) AS instance, any_value(m.slot) AS slot,
           any_value(m.task) AS task
    FROM fx_matches m GROUP BY m.run, m.item, m.stage, m.attempt
),
from_records AS (
    SELECT a.run, coalesce(t.instance, a.server) AS instance, t.slot, t.task, r.seq, a.item, a.stage, a.attempt,
           coalesce(a.http_status, r.http_status) AS http_status, coalesce(a.outcome, 'failed') AS reason,
           coalesce(a.error, r.error) AS error, 'records' AS source, t.task IS NULL AS before_slot,
           a.a_evidence AS evidence, coalesce(r.start_key, epoch(a.started_at)) AS at_key
    FROM att a
    LEFT JOIN tied t ON t.run = a.run AND t.item = a.item AND t.stage = a.stage AND t.attempt = a.attempt
    LEFT JOIN fx_requests r ON r.run = t.run AND r.instance = t.instance AND r.slot = t.slot AND r.task = t.task
),
from_server AS (
    SELECT r.run, r.instance, r.slot, r.task, r.seq, r.item, r.stage, r.attempt, r.http_status,
           r.stop_cause AS reason, r.error, 'server' AS source, false AS before_slot,
           r.path || ':' || r.line_first || '-' || r.line_last AS evidence, r.start_key AS at_key
    FROM fx_requests r
    WHERE r.failed AND r.run NOT IN (SELECT DISTINCT run FROM attempts WHERE run IN (SELECT unnest($runs)))
)
SELECT run, instance, slot, task, seq, item, stage, attempt, http_status, reason, error, source, before_slot,
       evidence
FROM (SELECT * FROM from_records UNION ALL SELECT * FROM from_server)
ORDER BY run, at_key NULLS LAST, instance, slot, seq, item, stage, attempt

-- failovers: replay attempts sent to another server after the same item and stage failed on one.
--
-- One row per attempt whose previous attempt (same run, item and stage) did not end ok and went to a
-- different server (the harness's name for it, `attempts.server`): where the retry went (instance, path,
-- slot, seq of the server request the join matched to it, when it did), where it came from
-- (from_server, from_outcome, from_error) and the failed attempt's server request lines (from_lines).
-- Parameters: $runs VARCHAR[].  Relations: attempts, replay_matches, replay_requests.
WITH a AS (
    SELECT t.run, t.item, t.stage, t.attempt, t.server, t.outcome, t.error, t.http_status,
           mt.instance, mt.path, mt.slot, mt.seq
    FROM attempts t
    LEFT JOIN replay_matches mt ON mt.run = t.run AND mt.item = t.item AND mt.stage = t.stage
                               AND mt.attempt = t.attempt AND mt."match" = 'matched'
    WHERE t.run IN (SELECT unnest($runs))
),
prev AS (
    SELECT a.*,
           lag(server) OVER w AS from_server, lag(outcome) OVER w AS from_outcome,
           lag(error) OVER w AS from_error, lag(http_status) OVER w AS from_status,
           lag(instance) OVER w AS from_instance, lag(path) OVER w AS from_path,
           lag(slot) OVER w AS from_slot, lag(seq) OVER w AS from_seq
    FROM a
    WINDOW w AS (PARTITION BY run, item, stage ORDER BY attempt)
)
SELECT p.run, p.item, p.stage, p.attempt, p.server, p.instance, p.path, p.slot, p.seq,
       p.from_server, p.from_outcome, coalesce(p.from_error, 'HTTP ' || p.from_status) AS from_error,
       p.from_instance,
       regexp_extract(rq.path, '[^/]+$') || ':' || rq.line_first || '-' || rq.line_last AS from_lines
FROM prev p
LEFT JOIN replay_requests rq ON rq.run = p.run AND rq.instance = p.from_instance AND rq.path = p.from_path
                            AND rq.slot IS NOT DISTINCT FROM p.from_slot AND rq.seq IS NOT DISTINCT FROM p.from_seq
WHERE p.from_outcome IS NOT NULL AND p.from_outcome <> 'ok' AND p.server IS DISTINCT FROM p.from_server
ORDER BY p.run, p.item, p.stage, p.attempt

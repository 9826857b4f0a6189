-- Missing items of a replay run, and why: every expected item x stage that did not finish ok, with the
-- reason (never_attempted, http_error, timeout, cancelled, parse_error), a detail from the harness's last
-- attempt, and evidence from the server request the join matched to it (slot, task, tokens, stop
-- reason, truncation, whether the server kept generating after the client gave up, log lines), or why the
-- join tied none (the matches' reason: "rejected before a slot" only when no request of the run's servers
-- could be it).  What the log does not tell is said to be unknown (the server's end, its tokens), never 0.
-- Parameters: $run  the run id.
-- Relations: items, attempts, runs (store views); replay_matches, replay_requests (the join's matches and
-- requests with absolute times, registered by forensics.replay.tables); replay_facts (each request's instance
-- name and generated tokens as the analysis decided them: a cancelled request's from its context at release).
WITH miss AS (
    SELECT run, item, stage, attempts FROM items WHERE run = $run AND NOT done
),
att AS (
    SELECT * FROM attempts WHERE run = $run
),
last AS (
    -- the run's attempts are filtered first: DuckDB 2.0 returned other runs' rows when a window ran over a
    -- join on the hive partition column
    SELECT a.* FROM att a JOIN miss m ON a.item = m.item AND a.stage = m.stage
    QUALIFY row_number() OVER (PARTITION BY a.item, a.stage ORDER BY a.attempt DESC) = 1
),
stages_seen AS (
    SELECT i.stage, min(a.started_at) AS first_t
    FROM (SELECT DISTINCT stage FROM items WHERE run = $run) i
    LEFT JOIN attempts a ON a.run = $run AND a.stage = i.stage
    GROUP BY i.stage
),
manifest_stages AS (
    SELECT from_json(stages, '["VARCHAR"]') AS lst FROM runs WHERE run = $run AND stages IS NOT NULL LIMIT 1
),
stage_pos AS (
    SELECT s.stage,
           coalesce(list_position((SELECT lst FROM manifest_stages), s.stage),
                    1000 + row_number() OVER (ORDER BY s.first_t NULLS LAST, s.stage)) AS pos
    FROM stages_seen s
),
blocked AS (
    SELECT m.item, m.stage, arg_min(i.stage, p2.pos) AS blocker
    FROM miss m
    JOIN stage_pos p1 ON p1.stage = m.stage
    JOIN items i ON i.run = m.run AND i.item = m.item AND NOT i.done
    JOIN stage_pos p2 ON p2.stage = i.stage AND p2.pos < p1.pos
    GROUP BY m.item, m.stage
),
ev AS (
    SELECT l.item, l.stage, mt.match, mt.reason AS match_reason, coalesce(f.instance, rq.instance) AS instance,
           rq.slot, rq.task,
           rq.prompt_tokens, coalesce(rq.gen_tokens, f.gen_tokens) AS gen_tokens, rq.stop_reason, rq.truncated,
           rq.error AS server_error,
           rq.http_status AS server_status, rq.t_end,
           regexp_extract(rq.path, '[^/]+$') || ':' || rq.line_first || '-' || rq.line_last AS lines
    FROM last l
    LEFT JOIN replay_matches mt ON mt.run = l.run AND mt.item = l.item AND mt.stage = l.stage
                               AND mt.attempt = l.attempt
    LEFT JOIN replay_requests rq ON mt.match = 'matched' AND rq.instance = mt.instance AND rq.path = mt.path
                                AND rq.slot IS NOT DISTINCT FROM mt.slot AND rq.seq IS NOT DISTINCT FROM mt.seq
    LEFT JOIN replay_facts f ON f.run = rq.run AND f.instance_id = rq.instance AND f.slot = rq.slot
                            AND f.task = rq.task
),
classified AS (
    -- the last attempt's columns by name (not l.*: its item and stage would be there twice)
    SELECT m.item, m.stage, m.attempts, b.blocker, l.outcome, l.http_status, l.error, l.id_slot, l.tokens_predicted,
           l.truncated, l.stop_type, l.server, l.started_at, l.ended_at, e.match, e.match_reason, e.instance, e.slot, e.task,
           e.prompt_tokens, e.gen_tokens, e.stop_reason, e.truncated AS server_truncated, e.server_error,
           e.server_status, e.t_end AS server_end, e.lines,
           CASE WHEN l.item IS NULL THEN 'never_attempted'
                WHEN l.outcome = 'parse_error' THEN 'parse_error'
                WHEN l.outcome IN ('timeout', 'cancelled') THEN l.outcome
                ELSE 'http_error' END AS reason,
           date_diff('millisecond', l.started_at, l.ended_at) / 1000.0 AS client_s,
           date_diff('millisecond', l.ended_at, e.t_end) / 1000.0 AS kept_s,
           coalesce(CAST(e.gen_tokens AS VARCHAR), 'unknown') AS gen_s
    FROM miss m
    LEFT JOIN last l ON l.item = m.item AND l.stage = m.stage
    LEFT JOIN ev e ON e.item = m.item AND e.stage = m.stage
    LEFT JOIN blocked b ON b.item = m.item AND b.stage = m.stage
)
SELECT
    item,
    stage,
    reason,
    CASE reason
        WHEN 'never_attempted' THEN
            CASE WHEN blocker IS NOT NULL THEN 'earlier stage ' || blocker || ' not done'
                 ELSE 'no attempt was made' END
        WHEN 'http_error' THEN
            CASE WHEN http_status IS NULL THEN 'no response' ELSE 'HTTP ' || http_status END
            || coalesce(': ' || error, '') || printf(' (attempts: %d)', attempts)
        WHEN 'parse_error' THEN
            coalesce(error, 'output did not parse') || printf(' (attempts: %d)', attempts)
        ELSE
            CASE WHEN client_s IS NULL THEN 'client gave up' ELSE printf('client gave up after %.1f s', client_s) END
            || coalesce(': ' || error, '') || printf(' (attempts: %d)', attempts)
    END AS detail,
    CASE
        WHEN reason = 'never_attempted' THEN ''
        WHEN instance IS NULL THEN
            CASE WHEN reason = 'parse_error' AND (id_slot IS NOT NULL OR tokens_predicted IS NOT NULL) THEN
                     'response: slot ' || coalesce(CAST(id_slot AS VARCHAR), '?') || ', '
                     || coalesce(CAST(tokens_predicted AS VARCHAR), '?') || ' tokens generated'
                     || CASE WHEN truncated THEN ', truncated' ELSE '' END
                     || coalesce(', stop ' || stop_type, '') || ' (no server request matched)'
                 WHEN match = 'ambiguous' THEN 'server request ambiguous: ' || match_reason
                 WHEN match_reason = 'rejected_before_slot' THEN 'rejected before a slot: no slot request in the log'
                 WHEN match_reason = 'evidence_disagrees' THEN
                     'no server request tied: the requests that could be it disagree on slot, tokens, status or time'
                 WHEN match_reason = 'taken' THEN 'no server request tied: each request that fits served another attempt'
                 WHEN match_reason = 'no_instance' THEN
                     CASE WHEN server IS NULL THEN 'no server log of this run was read'
                          ELSE 'no server log for server ' || server END
                 ELSE 'never reached a slot'
            END
        WHEN reason IN ('timeout', 'cancelled') THEN
            CASE WHEN kept_s > 0 THEN
                     printf('server kept generating: %s slot %d for %.1f s after the client gave up (%s tokens, stop %s)',
                            instance, slot, kept_s, gen_s, coalesce(stop_reason, 'unknown'))
                 WHEN kept_s IS NULL THEN
                     printf('server end unknown: %s slot %d (%s tokens, stop %s)', instance, slot, gen_s,
                            coalesce(stop_reason, 'unknown'))
                 ELSE printf('server stopped with the client: %s slot %d (%s tokens, stop %s)',
                             instance, slot, gen_s, coalesce(stop_reason, 'unknown'))
            END || ' [' || lines || ']'
        WHEN reason = 'parse_error' THEN
            printf('%s slot %d task %d: %s prompt + %s generated tokens, %s, stop %s',
                   instance, slot, coalesce(task, -1), coalesce(CAST(prompt_tokens AS VARCHAR), 'unknown'), gen_s,
                   CASE WHEN server_truncated THEN 'truncated' ELSE 'not truncated' END,
                   coalesce(stop_reason, 'unknown')) || ' [' || lines || ']'
        ELSE
            printf('%s slot %d task %d: ', instance, slot, coalesce(task, -1))
            || coalesce(server_error, 'stop ' || coalesce(stop_reason, 'unknown'))
            || coalesce(printf(' (HTTP %d)', server_status), '') || ' [' || lines || ']'
    END AS evidence
FROM classified
ORDER BY item, stage

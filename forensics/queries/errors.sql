-- errors: every server-side error and warning line of the chosen runs, and one row per crash.
--
-- A line counts when its level is a warning or an error (W, E, WARN, WARNING, ERROR, ERR, FATAL, any case),
-- its role is error (send_error, exceptions, task errors), its kind reports a failure (decode_error, fatal,
-- unauthorized, the KV cache being full), or it is an HTTP line (the server's or a proxy's) with status >= 400.
-- The lines of a crash (role crash or crash_detail: asserts, aborts, backtraces, debugger lines) are not listed
-- one by one: each crashed instance gives one row (the crash finding, crashes.sql, as fx_crash) of kind `crash`,
-- whose message is the first crash line that says why, whose lines run from the first to the last crash line,
-- and whose tasks are the requests the instance had in flight (not complete) when it died; an abort while
-- shutting down with nothing in flight is kind `shutdown_abort`, level W (a note, not a failure).  `message` is
-- the error text, else the generic message, else "<METHOD> <path> HTTP <status>".  An HTTP error of a
-- monitoring endpoint (GET /health, /slots, /metrics, /props, /models) is a warning, whatever its level: /health
-- answers 503 while the model loads and /slots 501 when slot monitoring is off; a client's request that failed
-- stays an error.  `item` comes from matches on the line's task when present.  findings.py masks the messages
-- into shapes and groups them.
-- Parameters: $runs VARCHAR[].  Relations: fx_events, fx_matches, fx_crash.
WITH ev AS (
    SELECT * FROM fx_events
    WHERE run IN (SELECT unnest($runs)) AND coalesce(role, '') NOT IN ('crash', 'crash_detail')
      AND (upper(coalesce(level, '')) IN ('W', 'E', 'WARN', 'WARNING', 'ERROR', 'ERR', 'FATAL')
           OR role = 'error'
           OR kind IN ('decode_error', 'fatal', 'unauthorized', 'rec_decode_error', 'era2_kv_full',
                       'rec_slot_unavailable', 'rec_unauthorized')
           OR (role IN ('http', 'proxy_http') AND status >= 400))
),
m AS (
    SELECT run, instance, task, any_value(item) AS item, any_value(slot) AS m_slot
    FROM fx_matches GROUP BY run, instance, task
),
lines AS (
    SELECT e.run, e.instance, e.kind,
           CASE WHEN e.role IN ('http', 'proxy_http') AND e.method = 'GET'
                 AND regexp_matches(coalesce(e.http_path, ''), '^/(health|slots|metrics|props|v1/models|models)([/?]|$)')
                THEN 'W' ELSE e.level END AS level,
           e.line_no, e.line_no AS line_last, e.path, e.ts, e.elapsed_s,
           coalesce(e.slot, m.m_slot) AS slot, e.task, e.status AS http_status,
           coalesce(e.error, e.msg,
                    CASE WHEN e.role IN ('http', 'proxy_http')
                         THEN coalesce(e.method || ' ', '') || coalesce(e.http_path || ' ', '') || 'HTTP ' || e.status END,
                    e.kind) AS message,
           m.item, CAST(NULL AS VARCHAR) AS tasks
    FROM ev e
    LEFT JOIN m ON m.run = e.run AND m.instance = e.instance AND m.task = e.task AND e.task IS NOT NULL
)
SELECT * FROM lines
UNION ALL
SELECT c.run, c.instance, CASE WHEN c.phase = 'shutdown' THEN 'shutdown_abort' ELSE 'crash' END AS kind,
       CASE WHEN c.phase = 'shutdown' THEN 'W' END AS level, c.line_no, c.line_last, c.path, c.ts, c.elapsed_s,
       NULL AS slot, NULL AS task, NULL AS http_status, c.message, NULL AS item, c.in_flight AS tasks
FROM fx_crash c
ORDER BY run, path, line_no

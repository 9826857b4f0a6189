-- errors: every server-side error and warning line of the chosen runs.
--
-- A line counts when its level is a warning or an error (W, E, WARN, WARNING, ERROR, ERR, FATAL, any
-- case), or its kind is send_error, exception, exception_twice, slot_exception, unauthorized,
-- decode_error or fatal (a llama.cpp/ggml failure line), or it is an http_request line with status >= 400.  `message` is the error text, else
-- the generic message, else "<METHOD> <status>" for HTTP lines.  `item` comes from matches on the
-- line's task when present.  findings.py masks the messages into shapes and groups them.
-- Parameters: $runs VARCHAR[].  Relations: fx_events, fx_matches.
WITH ev AS (
    SELECT * FROM fx_events
    WHERE run IN (SELECT unnest($runs))
      AND (upper(coalesce(level, '')) IN ('W', 'E', 'WARN', 'WARNING', 'ERROR', 'ERR', 'FATAL')
           OR kind IN ('send_error', 'exception', 'exception_twice', 'slot_exception', 'unauthorized',
                       'decode_error', 'fatal')
           OR (kind = 'http_request' AND status >= 400))
),
m AS (
    SELECT run, instance, task, any_value(item) AS item, any_value(slot) AS m_slot
    FROM fx_matches GROUP BY run, instance, task
)
SELECT e.run, e.instance, e.kind, e.level, e.line_no, e.path, e.ts, e.elapsed_s,
       coalesce(e.slot, m.m_slot) AS slot, e.task, e.status AS http_status,
       coalesce(e.error, e.msg,
                CASE WHEN e.kind = 'http_request' THEN coalesce(e.method || ' ', '') || 'HTTP ' || e.status END,
                e.kind) AS message,
       m.item
FROM ev e
LEFT JOIN m ON m.run = e.run AND m.instance = e.instance AND m.task = e.task AND e.task IS NOT NULL
ORDER BY e.run, e.path, e.line_no

-- crashes: one row per crashed instance of the chosen runs, with the phase the server was in when it died.
--
-- The lines of a crash (role crash or crash_detail: asserts, aborts, uncaught exceptions, signals, backtraces)
-- give one row per instance the store marks crashed: `message` is the first crash line that says why, `line_no`
-- .. `line_last` its first and last crash line, `in_flight` the requests the instance had not completed.
-- `phase` is when it died:
--   startup   it had served no request and had none in flight (a model that fails to load, memory at start-up)
--   shutdown  it had nothing in flight and was shutting down: a line such as `cleaning up before exit`,
--             `shutting down` or a received interrupt came before the crash's first line, or the crash is the
--             exit path's own abort (`terminate called without an active exception`: a thread still running
--             when the process exits) after the server had served and gone idle.  b4747 ends every SIGINT so;
--             its `cleaning up before exit` goes to stdout and is lost when the abort comes before the flush.
--             Not a failure of the run
--   serving   otherwise: requests in flight, or a server that had been serving
-- `shutdown_line` / `shutdown_message`: the first shutdown line before the crash, when there is one.
-- Parameters: $runs VARCHAR[].  Relations: fx_events, fx_live_requests, fx_instances.
WITH crash_lines AS (
    SELECT run, instance, path, min(line_no) AS line_no, max(line_no) AS line_last,
           arg_min(ts, line_no) FILTER (WHERE ts IS NOT NULL) AS ts,
           arg_min(elapsed_s, line_no) FILTER (WHERE elapsed_s IS NOT NULL) AS elapsed_s,  -- the first crash line with a time
           coalesce(arg_min(error, line_no) FILTER (WHERE role = 'crash' AND error IS NOT NULL),
                    arg_min(error, line_no) FILTER (WHERE error IS NOT NULL), 'crash') AS message
    FROM fx_events
    WHERE run IN (SELECT unnest($runs)) AND role IN ('crash', 'crash_detail')
    GROUP BY run, instance, path
),
crashed AS (
    SELECT c.* FROM crash_lines c
    SEMI JOIN (SELECT run, instance FROM fx_instances WHERE crashed) i ON i.run = c.run AND i.instance = c.instance
),
reqs AS (
    SELECT r.run, r.instance, count(*) AS served,
           string_agg('slot ' || r.slot || ' task ' || r.task, ', ' ORDER BY r.slot, r.task)
               FILTER (WHERE NOT coalesce(r.complete, true)) AS tasks
    FROM fx_live_requests r SEMI JOIN crashed c ON c.run = r.run AND c.instance = r.instance
    GROUP BY r.run, r.instance
),
shutdown AS (
    SELECT e.run, e.instance, e.path, min(e.line_no) AS line_no,
           arg_min(coalesce(e.msg, e.error), e.line_no) AS message
    FROM fx_events e SEMI JOIN crashed c ON c.run = e.run AND c.instance = e.instance AND c.path = e.path
    WHERE coalesce(e.role, '') NOT IN ('crash', 'crash_detail')
      AND regexp_matches(coalesce(e.msg, e.error, ''),
                         '(?i)cleaning up before exit|shutting down|shutdown (?:requested|initiated|signal)'
                         || '|received (?:sigint|sigterm|signal|second interrupt)|interrupt received|terminating the server')
    GROUP BY e.run, e.instance, e.path
)
SELECT c.run, c.instance, c.path, c.line_no, c.line_last, c.ts, c.elapsed_s, c.message, r.tasks AS in_flight,
       CASE WHEN r.tasks IS NULL AND s.line_no < c.line_no THEN 'shutdown'
            WHEN r.tasks IS NULL AND coalesce(r.served, 0) > 0
                 AND regexp_matches(c.message, '^terminate called without an active exception') THEN 'shutdown'
            WHEN r.tasks IS NULL AND coalesce(r.served, 0) = 0 THEN 'startup'
            ELSE 'serving' END AS phase,
       CASE WHEN s.line_no < c.line_no THEN s.line_no END AS shutdown_line,
       CASE WHEN s.line_no < c.line_no THEN s.message END AS shutdown_message
FROM crashed c
LEFT JOIN reqs r ON r.run = c.run AND r.instance = c.instance
LEFT JOIN shutdown s ON s.run = c.run AND s.instance = c.instance AND s.path = c.path
ORDER BY c.run, c.path, c.line_no

-- kv_stall: server instances whose KV cache ran out of room and kept the server retrying without getting anywhere:
-- one row per stall, a stretch of at least $stall_lines lines saying so ("failed to find free space in the KV
-- cache, retrying with smaller batch size", "KV cache is full", "Context size has been exceeded") with no request
-- released between them.  A few retries that succeed (the batch halved down to 128, then the request goes on)
-- are not a stall; hundreds of them with nothing finishing are, and they would otherwise hide among warnings.
-- `lines` how many, `line_no`..`line_last` the first and the last, `first_*`/`last_*` their time, `requests` the
-- requests the instance had in flight across those lines (their line ranges overlap), `failed` how many of them
-- failed, `message` the first line's text.
-- Parameters: $runs VARCHAR[], $stall_lines BIGINT.  Relations: fx_events, fx_requests.
WITH marks AS (
    SELECT run, instance, path, line_no, ts, elapsed_s, coalesce(error, msg) AS message,
           regexp_matches(coalesce(error, msg, ''),
                          '(?i)failed to find free space in the kv cache|kv cache is full|context size has been exceeded')
               AS hit
    FROM fx_events
    WHERE run IN (SELECT unnest($runs))
      AND (role = 'release'
           OR regexp_matches(coalesce(error, msg, ''),
                             '(?i)failed to find free space in the kv cache|kv cache is full|context size has been exceeded'))
),
hits AS (
    -- an episode: the lines between two releases of any request (the server finished nothing meanwhile)
    SELECT *, sum(CASE WHEN hit THEN 0 ELSE 1 END) OVER (PARTITION BY run, instance, path ORDER BY line_no
                                                         ROWS UNBOUNDED PRECEDING) AS episode
    FROM marks
),
stall AS (
    SELECT run, instance, path, count(*) AS lines, min(line_no) AS line_no, max(line_no) AS line_last,
           arg_min(ts, line_no) AS first_ts, arg_max(ts, line_no) AS last_ts,
           arg_min(elapsed_s, line_no) AS first_elapsed_s, arg_max(elapsed_s, line_no) AS last_elapsed_s,
           arg_min(message, line_no) AS message
    FROM hits WHERE hit GROUP BY run, instance, path, episode
    HAVING count(*) >= $stall_lines
)
SELECT s.run, s.instance, s.path, s.lines, s.line_no, s.line_last, s.first_ts, s.last_ts, s.first_elapsed_s,
       s.last_elapsed_s, count(r.task) AS requests,
       count(r.task) FILTER (WHERE r.error IS NOT NULL OR coalesce(r.http_status, 200) >= 400) AS failed,
       string_agg(DISTINCT CAST(r.slot AS VARCHAR), ',' ORDER BY CAST(r.slot AS VARCHAR)) AS slots, s.message,
       s.path || ':' || s.line_no || '-' || s.line_last AS evidence
FROM stall s
LEFT JOIN fx_requests r ON r.run = s.run AND r.instance = s.instance AND r.path = s.path
                       AND r.line_first <= s.line_last AND r.line_last >= s.line_no
GROUP BY ALL
ORDER BY s.run, s.path, s.line_no

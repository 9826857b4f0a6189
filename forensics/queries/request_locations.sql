-- request_locations: where each server request of the chosen runs is in its log (the verdict's evidence), and its
-- HTTP status: the log's, else the one its attempt got (a build that logs no access lines), which the verdict
-- counts for the HTTP errors each sentence told.
-- Parameters: $runs VARCHAR[].  Relations: fx_live_requests, fx_matches, attempts.
WITH answered AS (
    SELECT m.run, m.instance, m.slot, m.task, max(a.http_status) AS a_http
    FROM fx_matches m
    JOIN attempts a ON a.run = m.run AND a.item = m.item AND a.stage = m.stage AND a.attempt = m.attempt
    GROUP BY m.run, m.instance, m.slot, m.task
)
SELECT r.run, r.instance, r.slot, r.task, r.path, r.line_first, r.line_last,
       coalesce(r.http_status, a.a_http) AS http_status
FROM fx_live_requests r
LEFT JOIN answered a ON a.run = r.run AND a.instance = r.instance AND a.slot = r.slot AND a.task = r.task
WHERE r.run IN (SELECT unnest($runs))

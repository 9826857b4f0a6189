-- failed_requests: the server requests of the chosen runs that failed: an error, HTTP >= 400, or stop reason
-- `error`.  The same test the charts colour a request "failed" by, when no other finding claims it.
-- Parameters: none.  Relations: fx_requests.
SELECT run, instance, slot, task, seq, item, stage, http_status, stop_reason, error,
       path || ':' || line_first || '-' || line_last AS evidence
FROM fx_requests
WHERE error IS NOT NULL OR coalesce(http_status, 200) >= 400 OR coalesce(stop_reason = 'error', false)
ORDER BY run, instance, slot, seq, line_first

-- request_keys: every server request of the chosen runs, by its key (what the request classes are set on).
-- Parameters: none.  Relations: fx_requests.
SELECT run, instance, slot, task FROM fx_requests ORDER BY run, instance, slot, seq, line_first

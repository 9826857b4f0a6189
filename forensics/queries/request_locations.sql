-- request_locations: where each server request of the chosen runs is in its log (the verdict's evidence).
-- Parameters: $runs VARCHAR[].  Relations: fx_live_requests.
SELECT run, instance, slot, task, path, line_first, line_last
FROM fx_live_requests WHERE run IN (SELECT unnest($runs))

-- run_stats: what the verdict says of a run as a whole: its server requests and the slots that served them.
-- Parameters: $runs VARCHAR[].  Relations: fx_live_requests.
SELECT run, count(*) AS requests, count(DISTINCT coalesce(instance, '?') || '/' || coalesce(CAST(slot AS VARCHAR), '?')) AS slots
FROM fx_live_requests WHERE run IN (SELECT unnest($runs))
GROUP BY run ORDER BY run

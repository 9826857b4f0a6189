-- run_ends: the runs whose harness says they did not complete (the manifest's ended_how: killed, crashed, ...).
-- Parameters: $runs VARCHAR[].  Relations: runs.
SELECT run, any_value(ended_how) AS ended_how, any_value(ended_detail) AS ended_detail
FROM runs
WHERE run IN (SELECT unnest($runs))
GROUP BY run
HAVING coalesce(any_value(ended_how), 'completed') NOT IN ('completed', 'unknown')
ORDER BY run

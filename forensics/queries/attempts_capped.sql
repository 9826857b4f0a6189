-- attempts_capped: how many of the chosen runs' attempts asked for an output cap (max_tokens > 0).
-- Parameters: $runs VARCHAR[].  Relations: attempts.
SELECT count(*) AS n FROM attempts WHERE run IN (SELECT unnest($runs)) AND max_tokens > 0

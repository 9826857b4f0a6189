-- missing_items: every expected item x stage of the chosen runs that did not finish ok, from the replay `items`
-- table (its rules decide what each stage expects); a run without records has none.  Why each is missing is
-- missing.sql (one run, with the harness's last attempt and the server's evidence).
-- Parameters: $runs VARCHAR[].  Relations: items.
SELECT run, item, stage
FROM items
WHERE run IN (SELECT unnest($runs)) AND NOT coalesce(done, false)
ORDER BY run, item, stage

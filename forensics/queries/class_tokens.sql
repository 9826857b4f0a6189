-- class_tokens: the generated tokens of each run's server requests by the class the findings give them (the
-- registered relation fx_classes: run, instance, slot, task, class): what part of a run's throughput is normal
-- output and what part runaways, dead slots and failed requests produced.
-- Parameters: none.  Relations: fx_requests, fx_classes.
SELECT r.run, c.class, CAST(coalesce(sum(r.gen_tokens), 0) AS BIGINT) AS gen_tokens, count(*) AS requests
FROM fx_requests r
JOIN fx_classes c ON c.run = r.run AND c.instance = r.instance AND c.slot = r.slot AND c.task = r.task
GROUP BY r.run, c.class
ORDER BY r.run, c.class

-- precursors: what the store knows about each incident's first abnormal request and about every normal request of
-- the same runs, measured the same way, so that forensics.incidents can count which features set the onsets apart.
--
-- One row per request of $runs that is either an onset (the first abnormal request of an incident: fx_onsets, `kind`
-- its incident's kind, one row per incident) or normal (`kind` null: a clean request that is neither an onset nor
-- part of an incident, fx_bad).  Features of the request itself (what it was sent with and found):
--   no_cap        no output cap in force (request_facts.cap null: neither the log's n_predict nor the attempt's
--                 max_tokens)
--   prompt_fills  its prompt took >= $fill_share of the slot's context
--   cache_hit     part of its prompt came from the slot's cache (cached_tokens > 0)
--   cache_cold    none of it did (cached_tokens = 0, where logged)
--   all_busy      every slot of its instance was busy when it started (requests on the instance in flight at its
--                 start, itself included, >= the instance's slots)
--   early         its server had started less than $early_s seconds before (elapsed_start_s)
--   late          its server had been up $late_s seconds or more
--   stage         its stage (the join's), compared value by value
-- Features of the $before requests before it on the same instance and slot (its onset window):
--   prev_filled   one of them ended with the slot's context >= $full_share full (n_past at release)
--   prev_shift    one of them shifted the context
--   prev_failed   one of them failed
--   prev_no_cap   one of them carried no output cap
--   prev_long     one of them took a prompt >= $fill_share of the context
-- A feature the store cannot know for a request (no context size, no elapsed time, no cache count) is null, and
-- counts as absent.
-- Parameters: $runs VARCHAR[], $before BIGINT, $fill_share DOUBLE, $full_share DOUBLE, $early_s DOUBLE,
--   $late_s DOUBLE.  Relations: fx_requests (request_facts), fx_instance_facts (instance_facts), fx_onsets (run,
--   kind, instance, slot, task), fx_bad (run, instance, slot, task: requests that are part of an incident).
WITH req AS (
    SELECT r.*, row_number() OVER (ORDER BY r.run, r.instance, r.slot, r.seq, r.line_first, r.task) AS rid,
           CASE WHEN r.t_start IS NOT NULL THEN epoch(r.t_end) ELSE r.elapsed_end_s END AS end_key
    FROM fx_requests r WHERE r.run IN (SELECT unnest($runs))
),
marks AS (
    SELECT run, instance, rid, start_key AS t, 1 AS d FROM req WHERE start_key IS NOT NULL
    UNION ALL
    SELECT run, instance, rid, coalesce(end_key, start_key + seconds, start_key), -1 FROM req WHERE start_key IS NOT NULL
),
busy AS (  -- requests in flight on the instance at each start (ends first at the same instant)
    SELECT rid, busy FROM (
        SELECT rid, d, sum(d) OVER (PARTITION BY run, instance ORDER BY t, d, rid ROWS UNBOUNDED PRECEDING) AS busy
        FROM marks)
    WHERE d = 1
),
hist AS (
    SELECT r.*,
           bool_or(coalesce(r.n_past_end >= $full_share * r.ctx_slot, false)) OVER w AS prev_filled,
           bool_or(coalesce(r.context_shift, false)) OVER w AS prev_shift,
           bool_or(coalesce(r.failed, false)) OVER w AS prev_failed,
           bool_or(r.cap IS NULL) OVER w AS prev_no_cap,
           bool_or(coalesce(r.prompt_tokens >= $fill_share * r.ctx_slot, false)) OVER w AS prev_long
    FROM req r
    WINDOW w AS (PARTITION BY r.run, r.instance, r.slot ORDER BY r.seq, r.line_first
                 ROWS BETWEEN $before PRECEDING AND 1 PRECEDING)
),
bad AS (SELECT DISTINCT run, instance, slot, task FROM fx_bad),
picked AS (
    SELECT h.*, o.kind
    FROM hist h
    LEFT JOIN fx_onsets o ON o.run = h.run AND o.instance = h.instance AND o.slot IS NOT DISTINCT FROM h.slot
                         AND o.task IS NOT DISTINCT FROM h.task
    LEFT JOIN bad b ON b.run = h.run AND b.instance = h.instance AND b.slot IS NOT DISTINCT FROM h.slot
                   AND b.task IS NOT DISTINCT FROM h.task
    WHERE o.kind IS NOT NULL OR (h.clean AND b.run IS NULL)
)
SELECT p.run, p.kind, p.instance, p.slot, p.task, p.seq, p.stage,
       p.cap IS NULL AS no_cap,
       p.prompt_tokens >= $fill_share * p.ctx_slot AS prompt_fills,
       p.cached_tokens > 0 AS cache_hit,
       p.cached_tokens = 0 AS cache_cold,
       b.busy >= i.n_slots AS all_busy,
       p.elapsed_start_s < $early_s AS early,
       p.elapsed_start_s >= $late_s AS late,
       coalesce(p.prev_filled, false) AS prev_filled, coalesce(p.prev_shift, false) AS prev_shift,
       coalesce(p.prev_failed, false) AS prev_failed, coalesce(p.prev_no_cap, false) AS prev_no_cap,
       coalesce(p.prev_long, false) AS prev_long
FROM picked p
LEFT JOIN busy b ON b.rid = p.rid
LEFT JOIN fx_instance_facts i ON i.run = p.run AND i.instance_id = p.instance_id
ORDER BY p.run, p.instance, p.slot, p.seq, p.line_first

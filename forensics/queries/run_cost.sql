-- run_cost: what went wrong cost each run of the chosen runs in time, against what its requests needed.
--
-- A request went wrong when a finding says so: an abnormal request of a dead slot from the one it died on
-- (fx_dead_slot_sequence), or a runaway (fx_runaway).  It needed what a normal request of its kind takes: the
-- median duration of the clean requests of its baseline group (run and stage, else run and instance; the
-- whole run's when the group is small); every other request needed what it took, and one the client cancelled
-- needed nothing (it is sent again, and counted where it is done).  Two bounds of what the run
-- needed, the larger wins:
--   shared  the work spread over the slots: the units of work (an item x stage when the requests are matched to
--           the harness's records, so a retry is not work twice; else a request) / (slots x utilization), where
--           utilization = the busy seconds of the healthy slots (those that did not die) / (their count x the
--           time from the run's first start to their last end)
--   chained what the healthy slots needed: each healthy slot's own requests back to back at what they needed,
--           with the slot's median gap between requests, from its first start; the longest of them (the dead
--           slots' own when every slot died).  When the harness pins work to slots, the dead slot's items would
--           have taken about as long as any healthy slot's; when it shares the work, the healthy slots took over
--           the dead slot's and this bound is when they were done
-- `run_s` is the run's span: the harness's (first attempt sent to last answered) when the run has records, else
-- the server's (first request start to last end); `needed_s` the larger bound.  One row per run with timed
-- server requests.
-- Parameters: $min_group BIGINT.  Relations: fx_requests, fx_dead_slot_sequence, fx_runaway, attempts.
WITH bad AS (
    SELECT DISTINCT run, instance, slot, task FROM fx_dead_slot_sequence
    WHERE abnormal AND dead_seq IS NOT NULL AND seq >= dead_seq AND NOT recovered
    UNION
    SELECT DISTINCT run, instance, slot, task FROM fx_runaway
),
req AS (
    SELECT r.*, b.task IS NOT NULL AS wrong, r.start_key + r.seconds AS end_key
    FROM fx_requests r
    LEFT JOIN bad b ON b.run = r.run AND b.instance = r.instance AND b.slot = r.slot AND b.task = r.task
),
grp AS (
    SELECT run, bgroup, count(*) AS n, median(seconds) AS med FROM req WHERE clean AND NOT wrong GROUP BY run, bgroup
),
whole AS (SELECT run, median(seconds) AS med FROM req WHERE clean AND NOT wrong GROUP BY run),
need AS (
    SELECT r.run, r.instance, r.slot, r.seq, r.start_key, r.end_key,
           coalesce(r.item || '/' || coalesce(r.stage, ''), r.instance || '/' || r.slot || '/' || r.task) AS unit,
           CASE WHEN r.clean AND NOT r.wrong THEN r.seconds END AS own_s,
           CASE WHEN r.wrong OR r.seconds IS NULL THEN CASE WHEN coalesce(g.n, 0) >= $min_group THEN g.med ELSE w.med END
                ELSE r.seconds END AS need_s,
           CASE WHEN coalesce(g.n, 0) >= $min_group THEN g.med ELSE w.med END AS typical_s,
           r.start_key - lag(r.end_key) OVER (PARTITION BY r.run, r.instance, r.slot ORDER BY r.seq, r.line_first) AS gap_s
    FROM req r LEFT JOIN grp g USING (run, bgroup) LEFT JOIN whole w USING (run)
    -- a request the client cancelled is sent again (or lost): its work is counted where it is done
    WHERE NOT coalesce(r.stop_reason = 'cancelled', false)
),
units AS (
    SELECT run, unit, coalesce(min(own_s), any_value(typical_s)) AS need_s FROM need GROUP BY run, unit
),
span AS (SELECT run, min(start_key) AS first_start, max(end_key) AS last_end FROM req GROUP BY run),
chains AS (
    SELECT n.run, n.instance, n.slot,
           min(n.start_key) - any_value(p.first_start) + sum(n.need_s)
               + (count(*) - 1) * coalesce(median(greatest(n.gap_s, 0)), 0) AS chained_s
    FROM need n JOIN span p USING (run) GROUP BY n.run, n.instance, n.slot
),
dead AS (
    SELECT DISTINCT run, instance, slot FROM fx_dead_slot_sequence WHERE dead_seq IS NOT NULL AND NOT recovered
),
slots AS (
    SELECT r.run, r.instance, r.slot, sum(r.seconds) AS busy_s, max(r.end_key) AS last_end,
           d.slot IS NOT NULL AS died
    FROM req r LEFT JOIN dead d ON d.run = r.run AND d.instance = r.instance AND d.slot = r.slot
    GROUP BY r.run, r.instance, r.slot, d.slot
),
use AS (
    SELECT s.run, count(*) AS slots, count(*) FILTER (WHERE NOT s.died) AS healthy_slots,
           sum(s.busy_s) FILTER (WHERE NOT s.died)
               / nullif(sum(s.last_end - p.first_start) FILTER (WHERE NOT s.died), 0) AS utilization
    FROM slots s JOIN span p USING (run) GROUP BY s.run
),
client AS (  -- the harness's own span of the run, when it has records: the truth a log without time lacks
    SELECT run, epoch(max(ended_at)) - epoch(min(started_at)) AS run_s
    FROM attempts WHERE run IN (SELECT run FROM span) GROUP BY run
),
bounds AS (
    SELECT p.run, coalesce((SELECT c.run_s FROM client c WHERE c.run = p.run), p.last_end - p.first_start) AS run_s,
           (SELECT sum(u.need_s) FROM units u WHERE u.run = p.run)
               / nullif(x.slots * least(x.utilization, 1.0), 0) AS shared_s,
           coalesce((SELECT max(c.chained_s) FROM chains c
                     WHERE c.run = p.run AND NOT EXISTS (SELECT 1 FROM dead d WHERE d.run = c.run
                                                         AND d.instance = c.instance AND d.slot = c.slot)),
                    (SELECT max(c.chained_s) FROM chains c WHERE c.run = p.run)) AS chained_s,
           x.slots, x.healthy_slots, x.utilization,
           (SELECT count(*) FROM bad b WHERE b.run = p.run) AS wrong_requests
    FROM span p JOIN use x USING (run)
)
SELECT run, round(run_s, 3) AS run_s, round(greatest(shared_s, chained_s), 3) AS needed_s,
       round(shared_s, 3) AS shared_s, round(chained_s, 3) AS chained_s, slots, healthy_slots,
       round(utilization, 3) AS utilization, wrong_requests
FROM bounds
WHERE run_s IS NOT NULL
ORDER BY run

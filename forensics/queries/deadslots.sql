-- deadslots: the dead-slot rule, whole: the requests of the chosen runs in slot order, with whether each was
-- abnormal and why, and for each slot whether it died, where, and what it cost; only the slots that have two
-- abnormal requests in a row (the others cannot be dead).
--
-- A request is abnormal when (reasons listed in `why`):
--   runaway     it is in fx_runaway (the rows of runaways.sql)
--   context     its output reached the slot's context (fx_requests.ctx_full: a context shift, stop reason
--               `context`, "context shift is disabled", truncated at release)
--   long        seconds > $long_factor x the median seconds of the clean requests of its baseline
--               group, and seconds >= $min_seconds
--   slow        ms per generated token > $slow_factor x the group's median (2 or more tokens)
--   few_tokens  gen_tokens <= $few_tokens, no error, where the group's median is >= $few_normal tokens
--   same_error  it failed (error text, HTTP >= 500 or stop_reason 'error'; HTTP 4xx excluded: those are
--               the client's fault) with the same error shape as the slot's previous or next request
-- Baseline group: run and stage when stages are known, else run and instance; the whole run when the
-- group has fewer than $min_group clean requests.
-- Two kinds of request say nothing about the slot and are read past, like a cancelled one: a request whose own
-- prompt filled or was cut to the slot's context (fx_prompt_over_context: shorter prompts, not a restart, help),
-- and a runaway whose item and stage ran away on an earlier attempt (the fault travels with the request: a
-- failover of runaways to a backup's slot does not make that slot dead).
-- A slot is dead from the first of two consecutive abnormal requests on it that are not two attempts of the
-- same item and stage (a retry landing on the same slot says nothing about the slot), from the first request of
-- the streak of abnormal requests that pair is in.  A request the client
-- cancelled with nothing abnormal so far was cut short: it is neither normal nor abnormal, and the pairs (and
-- the two normal requests of `recovered`) are read over the other requests.  Per slot (the same on
-- each of its rows):
--   dead_seq           seq of the request it died on (null: no such pair, the slot is not dead)
--   dead_why           the reasons of the request it died on and of the next, the first's then the second's new ones
--   requests_affected  abnormal requests from dead_seq on
--   items_lost         items on the requests from dead_seq on whose stage never finished ok (fx_lost); null
--                      without matches, or when none of the slot's requests has an item
--   recovered          the slot ends with two normal requests in a row (one normal request after a dead
--                      streak can be chance: the same "twice in a row" rule that declares it dead)
--   not_dead           why a slot with such a pair is not dead: a dead slot goes bad while the others serve, so
--                      when two or more slots of one instance would die the same way (the same first reason,
--                      none recovered) the requests were bad, not the slots (dead_seq is then null)
-- Parameters: $long_factor DOUBLE, $min_seconds DOUBLE, $slow_factor DOUBLE, $few_tokens BIGINT,
--   $few_normal DOUBLE, $min_group BIGINT, $has_matches BOOLEAN.
-- Relations: fx_requests (the requests of the chosen runs), fx_runaway (run, instance, slot, task),
-- fx_prompt_over_context (run, instance, slot, task), fx_lost.
WITH req AS NOT MATERIALIZED (
    SELECT * FROM fx_requests
),
grp AS (
    SELECT run, bgroup, count(*) AS n,
           median(seconds) AS sec_q, median(tpot_ms) AS tpot_med, median(gen_tokens) AS gen_med
    FROM req WHERE clean GROUP BY run, bgroup
),
whole AS (
    SELECT run, median(seconds) AS sec_q, median(tpot_ms) AS tpot_med,
           median(gen_tokens) AS gen_med
    FROM req WHERE clean GROUP BY run
),
base AS (
    SELECT r.*,
           CASE WHEN coalesce(g.n, 0) >= $min_group THEN g.sec_q ELSE w.sec_q END AS sec_q,
           CASE WHEN coalesce(g.n, 0) >= $min_group THEN g.tpot_med ELSE w.tpot_med END AS tpot_med,
           CASE WHEN coalesce(g.n, 0) >= $min_group THEN g.gen_med ELSE w.gen_med END AS gen_med,
           (r.error IS NOT NULL OR coalesce(r.http_status >= 500, false) OR coalesce(r.stop_reason = 'error', false))
           AND NOT coalesce(r.http_status BETWEEN 400 AND 499, false) AS same_err,
           coalesce(r.err_shape, 'HTTP ' || r.http_status, r.stop_reason) AS fail_shape
    FROM req r
    LEFT JOIN grp g USING (run, bgroup)
    LEFT JOIN whole w USING (run)
),
flags0 AS (
    SELECT b.*, x.task IS NOT NULL AS ran_away, p.task IS NOT NULL AS by_prompt
    FROM base b
    LEFT JOIN (SELECT DISTINCT run, instance, slot, task FROM fx_runaway) x
           ON x.run = b.run AND x.instance = b.instance AND x.slot = b.slot AND x.task = b.task
    LEFT JOIN (SELECT DISTINCT run, instance, slot, task FROM fx_prompt_over_context) p
           ON p.run = b.run AND p.instance = b.instance AND p.slot = b.slot AND p.task = b.task
),
flags AS (
    SELECT b.*,
           b.ran_away AND NOT b.by_prompt AS f_runaway,
           coalesce(b.ctx_full AND NOT b.by_prompt, false) AS f_context,
           coalesce(b.seconds > $long_factor * b.sec_q AND b.seconds >= $min_seconds AND NOT b.by_prompt, false) AS f_long,
           coalesce(b.tpot_ms > $slow_factor * b.tpot_med, false) AS f_slow,
           coalesce(b.gen_tokens <= $few_tokens AND NOT b.same_err AND b.gen_med >= $few_normal AND NOT b.by_prompt,
                    false) AS f_few,
           CASE WHEN b.same_err AND NOT b.by_prompt THEN b.fail_shape END AS fail_of,
           -- said nothing about the slot: a request its own prompt filled or cut (prompt_over_context tells
           -- it), or a runaway whose item and stage ran away on an earlier attempt (elsewhere or here)
           b.by_prompt OR coalesce(b.ran_away AND b.attempt > min(CASE WHEN b.ran_away THEN b.attempt END)
                                       OVER (PARTITION BY b.run, b.item, b.stage), false) AS says_nothing
    FROM flags0 b
),
-- Only a slot with two abnormal requests in a row can be dead.  A first pass over narrow rows finds
-- those slots (one sort gives both neighbours of a request and whether the next one is abnormal too:
-- its same_error needs its own next request, lead 2); the full rows are then read for them only.
pairs AS (
    SELECT run, instance, slot,
           (flagged OR coalesce(fail_of = lag(fail_of) OVER w_slot OR fail_of = lead(fail_of) OVER w_slot, false))
           AND (lead(flagged) OVER w_slot
                OR coalesce(lead(fail_of) OVER w_slot = fail_of
                            OR lead(fail_of) OVER w_slot = lead(fail_of, 2) OVER w_slot, false)) AS pair
    FROM (SELECT run, instance, slot, seq, line_first, fail_of,
                 f_runaway OR f_context OR f_long OR f_slow OR f_few AS flagged
          FROM flags
          WHERE NOT (coalesce(stop_reason = 'cancelled', false)
                     AND NOT (f_runaway OR f_context OR f_long OR f_slow OR f_few))
            AND NOT says_nothing)
    WINDOW w_slot AS (PARTITION BY run, instance, slot ORDER BY seq, line_first)
),
seqd AS (
    SELECT f.*,
           coalesce(f.same_err AND (f.fail_shape = lag(f.fail_of) OVER w_slot
                                  OR f.fail_shape = lead(f.fail_of) OVER w_slot), false) AS f_error
    FROM flags f
    SEMI JOIN (SELECT DISTINCT run, instance, slot FROM pairs WHERE pair) s
           ON s.run IS NOT DISTINCT FROM f.run AND s.instance IS NOT DISTINCT FROM f.instance
          AND s.slot IS NOT DISTINCT FROM f.slot
    WINDOW w_slot AS (PARTITION BY f.run, f.instance, f.slot ORDER BY f.seq, f.line_first)
),
marked AS (
    SELECT *, (f_runaway OR f_context OR f_long OR f_slow OR f_few OR f_error) AS abnormal,
           -- a request the client cancelled, with nothing abnormal so far, was cut short: its state is unknown,
           -- and the pairs are read over the others; so are the requests that say nothing about the slot
           coalesce(stop_reason = 'cancelled', false)
           AND NOT (f_runaway OR f_context OR f_long OR f_slow OR f_few OR f_error) OR says_nothing AS unknown
    FROM seqd
),
known AS (
    SELECT m.run, m.instance, m.slot, m.seq, m.line_first,
           row_number() OVER w_slot AS pos,
           -- streaks of abnormal requests: a streak's rows share the count of normal requests before them
           sum(CASE WHEN abnormal THEN 0 ELSE 1 END) OVER (PARTITION BY run, instance, slot ORDER BY seq, line_first
                                                      ROWS UNBOUNDED PRECEDING) AS streak,
           abnormal AND coalesce(lead(abnormal) OVER w_slot, false)
           AND NOT coalesce(item IS NOT NULL AND item = lead(item) OVER w_slot
                            AND stage IS NOT DISTINCT FROM lead(stage) OVER w_slot, false) AS starts_pair,
           -- the reasons of this request and, after them, the next one's that this one has not
           concat_ws(',',
               CASE WHEN f_runaway THEN 'runaway' END, CASE WHEN f_context THEN 'context' END,
               CASE WHEN f_long THEN 'long' END,
               CASE WHEN f_slow THEN 'slow' END, CASE WHEN f_few THEN 'few_tokens' END,
               CASE WHEN f_error THEN 'same_error' END,
               CASE WHEN lead(f_runaway) OVER w_slot AND NOT f_runaway THEN 'runaway' END,
               CASE WHEN lead(f_context) OVER w_slot AND NOT f_context THEN 'context' END,
               CASE WHEN lead(f_long) OVER w_slot AND NOT f_long THEN 'long' END,
               CASE WHEN lead(f_slow) OVER w_slot AND NOT f_slow THEN 'slow' END,
               CASE WHEN lead(f_few) OVER w_slot AND NOT f_few THEN 'few_tokens' END,
               CASE WHEN lead(f_error) OVER w_slot AND NOT f_error THEN 'same_error' END) AS pair_why
    FROM marked m
    WHERE NOT unknown
    WINDOW w_slot AS (PARTITION BY run, instance, slot ORDER BY seq, line_first)
),
paired AS (
    SELECT m.*, k.pos, k.streak, coalesce(k.starts_pair, false) AS starts_pair, k.pair_why
    FROM marked m
    LEFT JOIN known k ON k.run IS NOT DISTINCT FROM m.run AND k.instance IS NOT DISTINCT FROM m.instance
                     AND k.slot IS NOT DISTINCT FROM m.slot AND k.seq = m.seq
                     AND k.line_first IS NOT DISTINCT FROM m.line_first
),
first_pair AS (
    SELECT run, instance, slot, min(pos) FILTER (WHERE starts_pair) AS pair_pos
    FROM paired GROUP BY run, instance, slot
),
-- the slot died with the streak of its first pair, from that streak's first request (a retry of a bad item
-- before the pair is part of it)
slots AS (
    SELECT p.run, p.instance, p.slot, count(p.pos) AS n,
           min(p.pos) FILTER (WHERE p.abnormal AND p.streak = d.streak) AS dead_pos,
           max(p.pos) FILTER (WHERE p.abnormal) AS last_bad,
           count(p.item) AS with_item
    FROM paired p
    JOIN first_pair f ON f.run IS NOT DISTINCT FROM p.run AND f.instance IS NOT DISTINCT FROM p.instance
                     AND f.slot IS NOT DISTINCT FROM p.slot
    LEFT JOIN paired d ON d.run IS NOT DISTINCT FROM p.run AND d.instance IS NOT DISTINCT FROM p.instance
                      AND d.slot IS NOT DISTINCT FROM p.slot AND d.pos = f.pair_pos
    GROUP BY p.run, p.instance, p.slot
),
candidates AS (
    SELECT p.run, p.instance, p.slot,
           max(CASE WHEN p.pos = s.dead_pos THEN p.seq END) AS dead_seq,  -- one row: the one it died on
           max(CASE WHEN p.pos = s.dead_pos THEN p.pair_why END) AS dead_why,
           any_value(s.n) - any_value(s.last_bad) >= 2 AS recovered
    FROM paired p
    JOIN slots s ON s.run IS NOT DISTINCT FROM p.run AND s.instance IS NOT DISTINCT FROM p.instance
                AND s.slot IS NOT DISTINCT FROM p.slot
    GROUP BY p.run, p.instance, p.slot
),
-- A dead slot goes bad while the others serve: when several slots of one instance would die the same way (the
-- same first reason, none of them recovered), the requests were bad, not a slot (the runaways finding tells them)
verdict AS (
    SELECT c.run, c.instance, c.slot,
           CASE WHEN NOT same_way THEN c.dead_seq END AS dead_seq, c.dead_why, c.recovered,
           CASE WHEN same_way THEN 'several slots went bad the same way' END AS not_dead
    FROM (SELECT c.*, NOT c.recovered AND c.dead_seq IS NOT NULL
                      AND count(*) FILTER (WHERE NOT c.recovered AND c.dead_seq IS NOT NULL) OVER
                          (PARTITION BY c.run, c.instance, split_part(c.dead_why, ',', 1)) > 1 AS same_way
          FROM candidates c) c
),
costs AS (
    SELECT p.run, p.instance, p.slot,
           count(*) FILTER (WHERE p.abnormal AND p.seq >= v.dead_seq) AS requests_affected,
           CASE WHEN $has_matches AND count(p.item) > 0 THEN
               count(DISTINCT p.item) FILTER (WHERE p.seq >= v.dead_seq AND l.item IS NOT NULL) END AS items_lost
    FROM paired p
    JOIN verdict v ON v.run IS NOT DISTINCT FROM p.run AND v.instance IS NOT DISTINCT FROM p.instance
                  AND v.slot IS NOT DISTINCT FROM p.slot
    LEFT JOIN fx_lost l ON l.run = p.run AND l.item = p.item AND l.stage IS NOT DISTINCT FROM p.stage
    GROUP BY p.run, p.instance, p.slot
)
SELECT p.run, p.instance, p.slot, p.seq, p.task, p.item, p.stage, p.gen_tokens, round(p.seconds, 3) AS seconds,
       p.stop_reason, p.http_status, p.abnormal, p.unknown,
       concat_ws(',',
           CASE WHEN p.f_runaway THEN 'runaway' END,
           CASE WHEN p.f_context THEN 'context' END,
           CASE WHEN p.f_long THEN 'long' END,
           CASE WHEN p.f_slow THEN 'slow' END,
           CASE WHEN p.f_few THEN 'few_tokens' END,
           CASE WHEN p.f_error THEN 'same_error' END) AS why,
       p.t_start, p.elapsed_start_s, p.path, p.line_first, p.line_last,
       v.dead_seq, v.dead_why, c.requests_affected, c.items_lost, v.recovered, v.not_dead
FROM paired p
JOIN verdict v ON v.run IS NOT DISTINCT FROM p.run AND v.instance IS NOT DISTINCT FROM p.instance
              AND v.slot IS NOT DISTINCT FROM p.slot
JOIN costs c ON c.run IS NOT DISTINCT FROM p.run AND c.instance IS NOT DISTINCT FROM p.instance
            AND c.slot IS NOT DISTINCT FROM p.slot
ORDER BY p.run, p.instance, p.slot, p.seq, p.line_first

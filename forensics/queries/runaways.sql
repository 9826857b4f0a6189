-- runaways: requests whose output ran away.
--
-- A request counts when one of these holds (all that hold are listed in `why`):
--   tokens           gen_tokens >= $min_tokens (or the client cancelled it: cut short, it would have gone on)
--                    and gen_tokens > $factor x the $quantile quantile of
--                    gen_tokens over the clean requests of its baseline group (run and stage when stages
--                    are known, else run and instance; the whole run when the group has fewer than
--                    $min_group clean requests)
--   context          it generated at least $min_tokens tokens, or more than $factor x its group's quantile (a
--                    small context fills with fewer), and reached the context (fx_requests.ctx_full: a
--                    context shift, stop_reason 'context', the server's "context shift is disabled" (HTTP 500,
--                    b3812-b5408 with --no-context-shift: the output filled the context, the prompt fitted),
--                    truncated at release unless the prompt was cut; or n_past_end >= the slot's context -
--                    $ctx_slack).  A request that reached the context with an output that was not long was
--                    filled by its prompt: prompt_over_context.sql.  gen_tokens of a request the server ended with an error
--                    (no timings) is n_past at release - the prompt (findings_base.sql)
--   n_ctx_train_cap  the server cut it at the model's training context (an n_ctx_train_cap line for its task)
--   repetition       its matched attempt's output text is degenerate (relation fx_degenerate)
-- followed_by (what came next, comma list): cancel (a cancel line for its task, or it ended cancelled: the client
--   went away; not the server's own cleanup after it answered with an error, whose error is the row's `error`),
--   slot_next_http_500 / slot_next_error (the slot's next request got HTTP >= 500 / an error, unless that request
--   ran away too: its error is its own),
--   item_next_context_error (the item's next request, via matches, failed with a context-size error).
-- Parameters: $factor DOUBLE, $quantile DOUBLE, $min_tokens BIGINT, $min_group BIGINT,
--   $ctx_slack BIGINT.  Relations: fx_requests (the requests of the chosen runs), fx_events, fx_degenerate.
WITH req AS NOT MATERIALIZED (
    SELECT * FROM fx_requests
),
grp AS (
    SELECT run, bgroup, count(*) AS n,
           quantile_cont(gen_tokens, $quantile) AS q
    FROM req WHERE clean GROUP BY run, bgroup
),
whole AS (
    SELECT run, quantile_cont(gen_tokens, $quantile) AS q FROM req WHERE clean GROUP BY run
),
base AS (
    SELECT r.*,
           CASE WHEN coalesce(g.n, 0) >= $min_group THEN g.q ELSE w.q END AS normal_q
    FROM req r
    LEFT JOIN grp g USING (run, bgroup)
    LEFT JOIN whole w USING (run)
),
task_ev AS (  -- one scan of the events for both kinds
    SELECT run, instance, task, bool_or(kind = 'n_ctx_train_cap') AS cap, bool_or(kind = 'cancel') AS cancel
    FROM fx_events WHERE kind IN ('n_ctx_train_cap', 'cancel') AND task IS NOT NULL
    GROUP BY run, instance, task
),
flags AS NOT MATERIALIZED (
    SELECT b.*,
           ((b.gen_tokens >= $min_tokens OR coalesce(b.stop_reason = 'cancelled', false)) AND b.normal_q IS NOT NULL
            AND b.gen_tokens > $factor * b.normal_q) AS f_tokens,
           (coalesce(b.gen_tokens >= $min_tokens OR (b.normal_q IS NOT NULL AND b.gen_tokens > $factor * b.normal_q),
                     false)
            AND (b.ctx_full OR coalesce(b.n_past_end >= b.ctx_slot - $ctx_slack, false))) AS f_context,
           coalesce(e.cap, false) AS f_cap,
           coalesce(d.degenerate, false) AS f_rep,
           (coalesce(e.cancel, false) OR coalesce(b.stop_reason = 'cancelled', false)) AS cancelled
    FROM base b
    LEFT JOIN task_ev e ON e.run = b.run AND e.instance = b.instance AND e.task = b.task
    LEFT JOIN fx_degenerate d ON d.run = b.run AND d.instance = b.instance AND d.slot = b.slot AND d.task = b.task
),
-- What came next is looked up only where something ran away: the windows read only the slots and
-- items that have a runaway (whole partitions, so lead() sees the same neighbours as over every
-- request) instead of sorting all requests of the store.
hit AS (
    SELECT run, instance, slot, item FROM flags WHERE f_tokens OR f_context OR f_cap OR f_rep
),
slot_next AS (
    SELECT f.*,
           lead(f.http_status) OVER w_slot AS next_status,
           lead(f.error) OVER w_slot AS next_error,
           lead(f.f_tokens OR f.f_context OR f.f_cap OR f.f_rep) OVER w_slot AS next_ran_away
    FROM flags f
    SEMI JOIN (SELECT DISTINCT run, instance, slot FROM hit) h
           ON h.run IS NOT DISTINCT FROM f.run AND h.instance IS NOT DISTINCT FROM f.instance
          AND h.slot IS NOT DISTINCT FROM f.slot
    WINDOW w_slot AS (PARTITION BY f.run, f.instance, f.slot ORDER BY f.seq, f.line_first)
),
item_next AS (
    SELECT r.run, r.instance, r.slot, r.task,
           lead(r.error) OVER (PARTITION BY r.run, r.item ORDER BY r.start_key, r.instance, r.line_first)
               AS item_next_error
    FROM req r
    SEMI JOIN (SELECT DISTINCT run, item FROM hit WHERE item IS NOT NULL) h
           ON h.run IS NOT DISTINCT FROM r.run AND h.item = r.item
    WHERE r.item IS NOT NULL
)
SELECT f.run, f.instance, f.slot, f.task, f.seq, f.item, f.stage, f.gen_tokens,
       round(f.seconds, 3) AS seconds,
       concat_ws(',',
           CASE WHEN f.f_tokens THEN 'tokens' END,
           CASE WHEN f.f_context THEN 'context' END,
           CASE WHEN f.f_cap THEN 'n_ctx_train_cap' END,
           CASE WHEN f.f_rep THEN 'repetition' END) AS why,
       CAST(round(f.normal_q) AS BIGINT) AS normal_tokens,
       f.line_first || '-' || f.line_last AS evidence,
       nullif(concat_ws(',',
           CASE WHEN f.cancelled AND f.error IS NULL THEN 'cancel' END,
           CASE WHEN coalesce(f.next_ran_away, false) THEN NULL
                WHEN f.next_status >= 500 THEN 'slot_next_http_' || f.next_status
                WHEN f.next_error IS NOT NULL THEN 'slot_next_error' END,
           CASE WHEN regexp_matches(lower(n.item_next_error),
                                    'context (size|length|window)|exceeds the available context|kv cache is full')
                THEN 'item_next_context_error' END), '') AS followed_by,
       f.error, f.http_status, f.stop_cause, coalesce(f.context_shift, false) AS context_shift, f.path,
       f.line_first, f.line_last
FROM slot_next f
LEFT JOIN item_next n ON n.run = f.run AND n.instance = f.instance AND n.slot = f.slot AND n.task = f.task
WHERE f.f_tokens OR f.f_context OR f.f_cap OR f.f_rep
ORDER BY f.run, f.instance, f.slot, f.seq, f.line_first

-- prompt_cache: how much of each prompt the slot's cache served, per run and server instance, and the prompt tokens
-- (and the time) the server computed again that it could have reused.
-- A request's reuse is the log's own number (`cached_tokens`: `cached n_tokens = N, memory_seq_rm [N, end)`,
-- `kv cache rm [N, end)`, `in cache: N tokens`); requests whose log does not say are left out, and an instance none
-- of whose requests says has no row.
-- cold start: the first request on its slot in the instance (nothing cached yet: not counted as waste).
-- The reuse a request could have had: what the server itself found its slot's cached prompt shared with it (the
-- last `checking sim = 0.602 (476/791)` line of its slot since the slot's previous request: 476; 2026 builds at
-- -lv 4), else its group's (bgroup: its stage, else its instance) usual reuse, the median `cached_tokens` of the
-- group's requests that reused anything, at most its prompt (`could_from`: server or usual).  A later request that
-- reused less than half of that is a miss, and `could_reuse - cached_tokens` of its prompt was computed again:
--   after a context shift: the slot's previous request filled its context (shifted, truncated, or ended full),
--   and the cache went with it;
--   slot switch: the item's previous request (its conversation so far) ran on another slot of the instance;
--   not reused: the server did not reuse the slot's prefix (`cache_prompt` off in the request, or a prefix that
--   changed).
-- `misses_measured`: the misses whose reusable tokens the server printed (the others': their group's usual reuse).
-- `recomputed_s`: those tokens at the request's own prompt speed (prompt_ms / prompt tokens evaluated).
-- `costly`: the recomputed tokens are at least $cache_waste of the instance's prompt tokens (the verdict tells only
-- those).  `fix`: the flag or request field for the commonest cause of its misses.
-- `lines`: the line ranges of the misses in `path`.
-- Parameters: $runs VARCHAR[], $cache_waste DOUBLE.  Relations: fx_requests, fx_events, requests.
WITH sims AS (
    SELECT run, instance, path, slot, line_no, sim_lcp FROM fx_events WHERE kind = 'slot_sim'
),
f AS (
    SELECT *, lag(line_first) OVER (PARTITION BY run, instance_id, slot ORDER BY seq) AS slot_before
    FROM fx_requests WHERE run IN (SELECT unnest($runs)) AND cached_tokens IS NOT NULL AND prompt_tokens > 0
),
fj AS (  -- the slot's last similarity line since its previous request (a plain join: Spark has no ASOF join)
    SELECT f.*, s.sim_lcp,
           row_number() OVER (PARTITION BY f.run, f.instance_id, f.path, f.slot, f.seq, f.line_first
                              ORDER BY s.line_no DESC NULLS LAST) AS sim_rank
    FROM f LEFT JOIN sims s ON s.run = f.run AND s.instance = f.instance AND s.path = f.path AND s.slot = f.slot
                           AND s.line_no < f.line_first AND s.line_no > coalesce(f.slot_before, 0)
),
fs AS (
    SELECT * FROM fj WHERE sim_rank = 1
),
r AS (
    SELECT f.run, f.instance, f.instance_id, f.path, f.slot, f.seq, f.item, f.bgroup, f.prompt_tokens, f.cached_tokens,
           f.line_first, f.line_last, f.sim_lcp, q.prompt_ms, q.prompt_eval_tokens,
           row_number() OVER (PARTITION BY f.run, f.instance_id, f.slot ORDER BY f.seq) = 1 AS cold,
           coalesce(lag(coalesce(f.context_shift, false) OR coalesce(f.truncated, false) OR coalesce(f.ctx_full, false)
                        OR coalesce(f.ctx_error, false))
                        OVER (PARTITION BY f.run, f.instance_id, f.slot ORDER BY f.seq), false) AS after_shift,
           CASE WHEN f.item IS NOT NULL THEN lag(f.slot) OVER (PARTITION BY f.run, f.instance_id, f.item
                                                             ORDER BY f.start_key, f.line_first) END AS item_slot
    FROM fs f
    LEFT JOIN requests q ON q.run = f.run AND q.instance = f.instance_id AND q.slot = f.slot AND q.seq = f.seq
),
usual AS (
    SELECT run, instance_id, bgroup, quantile_disc(cached_tokens, 0.5) AS reuse
    FROM r WHERE cached_tokens > 0 GROUP BY ALL
),
m AS (
    SELECT r.*, CASE WHEN r.sim_lcp IS NOT NULL THEN least(r.sim_lcp, r.prompt_tokens)  -- least() skips a NULL
                     WHEN u.reuse IS NOT NULL THEN least(u.reuse, r.prompt_tokens) END AS could_reuse,
           CASE WHEN r.sim_lcp IS NOT NULL THEN 'server' WHEN u.reuse IS NOT NULL THEN 'usual' END AS could_from,
           CASE WHEN r.after_shift THEN 'context shift'
                WHEN r.item_slot IS NOT NULL AND r.item_slot <> r.slot THEN 'slot switch'
                ELSE 'not reused' END AS why
    FROM r LEFT JOIN usual u USING (run, instance_id, bgroup)
),
mm AS (
    SELECT *, NOT cold AND coalesce(could_reuse, 0) > 0 AND cached_tokens < could_reuse / 2 AS miss FROM m
),
w AS (
    SELECT *, CASE WHEN miss THEN CAST(greatest(could_reuse - cached_tokens, 0) AS BIGINT) ELSE 0 END AS lost,
           CASE WHEN miss AND prompt_eval_tokens > 0 THEN greatest(could_reuse - cached_tokens, 0) * prompt_ms
                / prompt_eval_tokens / 1000.0 END AS lost_s
    FROM mm
),
per AS (
    SELECT run, instance, any_value(path) AS path, count(*) AS requests, count(DISTINCT slot) AS slots,
           CAST(sum(prompt_tokens) AS BIGINT) AS prompt_tokens, CAST(sum(cached_tokens) AS BIGINT) AS cached_tokens,
           round(CAST(sum(cached_tokens) AS DOUBLE) / sum(prompt_tokens), 3) AS reused,
           count(*) FILTER (WHERE cold) AS cold_starts,
           count(*) FILTER (WHERE miss) AS misses,
           count(*) FILTER (WHERE miss AND could_from = 'server') AS misses_measured,
           count(*) FILTER (WHERE miss AND why = 'context shift') AS after_shift,
           count(*) FILTER (WHERE miss AND why = 'slot switch') AS slot_switches,
           count(*) FILTER (WHERE miss AND why = 'not reused') AS not_reused,
           CAST(sum(lost) AS BIGINT) AS recomputed_tokens, round(sum(lost_s), 3) AS recomputed_s,
           mode(why) FILTER (WHERE miss) AS cause,
           string_agg(CASE WHEN line_first = line_last THEN CAST(line_first AS VARCHAR)
                           ELSE line_first || '-' || line_last END, ', ' ORDER BY line_first) FILTER (WHERE miss)
               AS lines
    FROM w GROUP BY run, instance
)
SELECT run, instance, path, requests, slots, prompt_tokens, cached_tokens, reused, cold_starts, misses, misses_measured,
       after_shift,
       slot_switches, not_reused, recomputed_tokens, recomputed_s,
       round(CAST(recomputed_tokens AS DOUBLE) / prompt_tokens, 3) AS recomputed_share,
       recomputed_tokens > 0 AND recomputed_tokens >= $cache_waste * prompt_tokens AS costly,
       CASE cause
           WHEN 'not reused' THEN 'send cache_prompt: true with every request and keep the shared prefix identical'
           WHEN 'slot switch' THEN 'pin each conversation to one slot (id_slot), or --slot-prompt-similarity so the '
                                   || 'server picks the slot holding its prefix'
           WHEN 'context shift' THEN '--cache-reuse 256 reuses the shifted chunks; an output cap (n_predict) keeps '
                                     || 'the context from filling'
       END AS fix, lines
FROM per
ORDER BY run, instance

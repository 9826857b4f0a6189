-- prompt_over_context: requests whose prompt did not fit the slot's context (not an output that ran too long).
--
-- A request counts when one of these holds (all that hold are listed in `how`):
--   truncated   the server cut the prompt to fit (`input truncated`, builds before b6723 with context shift on)
--   rejected    the server refused it for its length ("request (N tokens) exceeds the available context size",
--               "Input prompt is too big compared to KV size", ...): HTTP 400 and no output
--   filled      the prompt left the output less room than a normal one needs: the slot's context less the prompt
--               is under its group's normal output (the median generated tokens of the clean requests of its
--               baseline group) and under its cap (when capped); and it reached the context
--               (fx_requests.ctx_full, "context shift is disabled", or n_past_end within $ctx_slack of the
--               context) without ending by itself (EOS, a stop word), having generated fewer than $min_tokens
--               tokens, its prompt's size known, and it is not a runaway (fx_runaway).  A request whose prompt left
--               room for a normal output and that ran to the context anyway is an output that ran long, not a
--               prompt that filled the slot
-- `prompt_tokens` is the prompt as the server received it when the log says so, `ctx_slot` the slot's context.
-- Parameters: $min_tokens BIGINT, $ctx_slack BIGINT.  Relations: fx_requests, fx_runaway.
WITH normal AS (
    SELECT run, bgroup, median(gen_tokens) AS normal_out FROM fx_requests WHERE clean GROUP BY run, bgroup
)
SELECT run, instance, slot, task, seq, item, stage, prompt_tokens, ctx_slot, gen_tokens,
       concat_ws(',',
           CASE WHEN prompt_truncated THEN 'truncated' END,
           CASE WHEN prompt_rejected THEN 'rejected' END,
           CASE WHEN NOT prompt_truncated AND NOT prompt_rejected THEN 'filled' END) AS how,
       error, path || ':' || line_first || '-' || line_last AS evidence, path, line_first, line_last
FROM fx_requests r
LEFT JOIN normal n USING (run, bgroup)
WHERE prompt_truncated OR prompt_rejected
   OR (prompt_tokens IS NOT NULL AND coalesce(gen_tokens, 0) < $min_tokens
       AND coalesce(stop_cause NOT IN ('eos', 'word'), true)
       AND (ctx_full OR ctx_error OR coalesce(n_past_end >= ctx_slot - $ctx_slack, false))
       AND coalesce(ctx_slot - prompt_tokens < least(CASE WHEN cap > 0 THEN cap END, n.normal_out), false)
       AND NOT EXISTS (SELECT 1 FROM fx_runaway x WHERE x.run = r.run AND x.instance = r.instance
                                                    AND x.slot = r.slot AND x.task = r.task))
ORDER BY run, instance, slot, seq, line_first

-- prompt_over_context: requests whose prompt did not fit the slot's context (not an output that ran too long).
--
-- A request counts when one of these holds (all that hold are listed in `how`):
--   truncated   the server cut the prompt to fit (`input truncated`, builds before b6723 with context shift on)
--   rejected    the server refused it for its length ("request (N tokens) exceeds the available context size",
--               "Input prompt is too big compared to KV size", ...): HTTP 400 and no output
--   filled      it reached the slot's context (fx_requests.ctx_full, or n_past_end within $ctx_slack of the
--               context) having generated fewer than $min_tokens tokens, its prompt's size known (a request cut
--               off with no prompt line is not said to have a long prompt), and it is not a runaway (an output
--               far longer than its group's, fx_runaway): the prompt filled it.  Never a request the server
--               ended with "context shift is disabled": there the output filled the context, whatever the
--               prompt's length
-- `prompt_tokens` is the prompt as the server received it when the log says so, `ctx_slot` the slot's context.
-- Parameters: $min_tokens BIGINT, $ctx_slack BIGINT.  Relations: fx_requests, fx_runaway.
SELECT run, instance, slot, task, seq, item, stage, prompt_tokens, ctx_slot, gen_tokens,
       concat_ws(',',
           CASE WHEN prompt_truncated THEN 'truncated' END,
           CASE WHEN prompt_rejected THEN 'rejected' END,
           CASE WHEN NOT prompt_truncated AND NOT prompt_rejected THEN 'filled' END) AS how,
       error, path || ':' || line_first || '-' || line_last AS evidence, path, line_first, line_last
FROM fx_requests r
WHERE prompt_truncated OR prompt_rejected
   OR (prompt_tokens IS NOT NULL AND coalesce(gen_tokens, 0) < $min_tokens AND NOT ctx_error
       AND (ctx_full OR coalesce(n_past_end >= ctx_slot - $ctx_slack, false))
       AND NOT EXISTS (SELECT 1 FROM fx_runaway x WHERE x.run = r.run AND x.instance = r.instance
                                                    AND x.slot = r.slot AND x.task = r.task))
ORDER BY run, instance, slot, seq, line_first

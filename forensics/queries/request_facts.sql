-- request_facts: each server request of the chosen runs as every finding reads it (the rows of fx_requests,
-- built by findings_base.sql), stored by the analysis (forensics.analyse) so that no reader works them out again.
-- Parameters: none.  Relations: fx_requests.
SELECT * FROM fx_requests ORDER BY run, instance, slot, seq, line_first

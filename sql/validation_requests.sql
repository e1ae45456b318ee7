-- validation_requests.sql
-- Request by request, how close was the simulator to the live engine (for a scatter)?
-- Reads:   validation_requests
-- Params:  validation_run  VARCHAR  the validate run (NULL: the latest validate run)
-- Grain:   one row per request
-- Columns: run_id, request_id, arrival_s, prompt_tokens, output_tokens, live_ttft_s,
--          sim_ttft_s, ttft_error, live_tpot_s, sim_tpot_s, tpot_error, live_e2e_s,
--          sim_e2e_s, e2e_error
-- *_error = simulated / live - 1; null where the live value is null or 0.
WITH run AS (
    SELECT coalesce(getvariable('validation_run')::VARCHAR,
        (SELECT max(run_id) FROM validation_requests)) AS run_id
)
SELECT
    r.run_id, r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens,
    r.live_ttft_s, r.sim_ttft_s, r.ttft_error,
    r.live_tpot_s, r.sim_tpot_s, r.tpot_error,
    r.live_e2e_s, r.sim_e2e_s, r.e2e_error
FROM validation_requests AS r
JOIN run USING (run_id)
ORDER BY r.arrival_s, r.request_id;

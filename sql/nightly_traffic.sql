-- nightly_traffic.sql
-- How much traffic did these days carry, and how fast did production serve it?
-- Reads:   requests
-- Params:  date_from  DATE  first day, UTC (NULL: the first day in the warehouse)
--          date_to    DATE  last day, UTC, inclusive (NULL: the last day)
-- Grain:   one row
-- Columns: num_days, num_requests, requests_per_day, mean_prompt_tokens,
--          mean_output_tokens, observed_ttft_p99_s, observed_tpot_p99_s
-- Observed latencies come from logs that carry them (gateway, OTel); NULL otherwise.
-- TPOT as in the replay: (e2e - ttft) / (output tokens - 1), requests of 2+ tokens.
SELECT
    count(DISTINCT date)                                   AS num_days,
    count(*)                                               AS num_requests,
    count(*) / nullif(count(DISTINCT date), 0)             AS requests_per_day,
    avg(prompt_tokens)                                     AS mean_prompt_tokens,
    avg(output_tokens)                                     AS mean_output_tokens,
    quantile_cont(observed_ttft_s, 0.99)                   AS observed_ttft_p99_s,
    quantile_cont(CASE WHEN output_tokens > 1
                       THEN (observed_e2e_s - observed_ttft_s) / (output_tokens - 1) END,
                  0.99)                                    AS observed_tpot_p99_s
FROM requests
WHERE (getvariable('date_from') IS NULL OR date >= getvariable('date_from')::DATE)
  AND (getvariable('date_to') IS NULL OR date <= getvariable('date_to')::DATE);

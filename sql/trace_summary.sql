-- trace_summary.sql
-- What trace is this: how many requests, over which dates, from which logs, how long?
-- Reads:   requests, sim_requests
-- Params:  run_id  VARCHAR  only the requests this replay run replayed (NULL: every request)
-- Grain:   one row
-- Columns: num_requests, first_arrival_time, last_arrival_time, first_date, last_date,
--          num_days, duration_s, mean_requests_per_s, num_models, num_tenants,
--          num_sessions, num_source_files, source_formats, total_prompt_tokens,
--          total_output_tokens, mean_prompt_tokens, p50_prompt_tokens, p99_prompt_tokens,
--          mean_output_tokens, p50_output_tokens, p99_output_tokens, share_with_prefix_hashes
WITH trace AS (
    SELECT *
    FROM requests
    WHERE getvariable('run_id') IS NULL
       OR request_id IN (
           SELECT request_id FROM sim_requests WHERE run_id = getvariable('run_id')::VARCHAR)
)
SELECT
    count(*)                                                   AS num_requests,
    min(arrival_time)                                          AS first_arrival_time,
    max(arrival_time)                                          AS last_arrival_time,
    min(date)                                                  AS first_date,
    max(date)                                                  AS last_date,
    count(DISTINCT date)                                       AS num_days,
    epoch(max(arrival_time)) - epoch(min(arrival_time))        AS duration_s,
    count(*) / nullif(epoch(max(arrival_time)) - epoch(min(arrival_time)), 0)
                                                               AS mean_requests_per_s,
    count(DISTINCT model)                                      AS num_models,
    count(DISTINCT tenant)                                     AS num_tenants,
    count(DISTINCT session_id)                                 AS num_sessions,
    count(DISTINCT source_file)                                AS num_source_files,
    string_agg(DISTINCT source_format, ', ' ORDER BY source_format) AS source_formats,
    sum(prompt_tokens)::BIGINT                                 AS total_prompt_tokens,
    sum(output_tokens)::BIGINT                                 AS total_output_tokens,
    avg(prompt_tokens)                                         AS mean_prompt_tokens,
    quantile_cont(prompt_tokens, 0.5)                          AS p50_prompt_tokens,
    quantile_cont(prompt_tokens, 0.99)                         AS p99_prompt_tokens,
    avg(output_tokens)                                         AS mean_output_tokens,
    quantile_cont(output_tokens, 0.5)                          AS p50_output_tokens,
    quantile_cont(output_tokens, 0.99)                         AS p99_output_tokens,
    avg(CASE WHEN len(prefix_hashes) > 0 THEN 1.0 ELSE 0.0 END) AS share_with_prefix_hashes
FROM trace;

-- compare_requests.sql
-- Which requests did two runs replay, and with what latency: the rows the 90% intervals of
-- `compare` resample (paired by request id where both runs replayed the same requests).
-- Reads:   sim_requests
-- Params:  run_id          VARCHAR  run A, the baseline (NULL: the latest run)
--          compare_run_id  VARCHAR  run B (NULL: the latest run before run A)
-- Grain:   one row per run, scenario and completed request, in arrival order
-- Columns: run_id, scenario, request_id, arrival_s, ttft_s, tpot_s (null for one output
--          token), e2e_s
-- NOTE: per request, not aggregated: a bootstrap of a percentile needs the values. The
-- intervals are computed from these rows in pipeline/report/changes.py, and never drawn.
WITH replayed AS (
    SELECT DISTINCT run_id FROM sim_requests
),
baseline AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, max(run_id)) AS run_id FROM replayed
),
pair AS (
    SELECT run_id FROM baseline
    UNION ALL
    SELECT coalesce(getvariable('compare_run_id')::VARCHAR, max(r.run_id))
    FROM replayed AS r, baseline AS b
    WHERE getvariable('compare_run_id') IS NOT NULL OR r.run_id < b.run_id
)
SELECT run_id, scenario, request_id, arrival_s, ttft_s, tpot_s, e2e_s
FROM sim_requests
WHERE run_id IN (SELECT run_id FROM pair)
  -- NOTE: isfinite(), not NOT isnan(): DuckDB folds isnan() to false from the Parquet
  -- statistics, which leave NaN out, and so kept the unfinished requests
  AND isfinite(finished_s)
ORDER BY run_id, scenario, arrival_s, request_id;

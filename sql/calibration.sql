-- calibration.sql
-- How far is the simulator from what production observed, before and after
-- `tracereplay calibrate observed` scaled the profile?
-- Reads:   calibration
-- Params:  calibration_run_id  VARCHAR  the calibration run (NULL: the latest one)
-- Grain:   one row per metric (ttft, tpot) and statistic (p50, p90, p99)
-- Columns: run_id, scenario, profile (the starting profile), calibrated_profile (the file
--          written), metric, statistic, num_requests, observed_s, before_s, after_s,
--          before_error (before_s / observed_s - 1), after_error, scale (the fitted
--          factor on the metric's side of the profile: prefill for ttft, decode for tpot),
--          iterations
WITH run AS (
    SELECT coalesce(getvariable('calibration_run_id')::VARCHAR,
                    (SELECT max(run_id) FROM calibration)) AS run_id
)
SELECT
    run_id, scenario, profile, calibrated_profile, metric, statistic, num_requests,
    observed_s, before_s, after_s, before_error, after_error, scale, iterations
FROM calibration
WHERE run_id = (SELECT run_id FROM run)
ORDER BY
    CASE metric WHEN 'ttft' THEN 1 ELSE 2 END,
    CASE statistic WHEN 'p50' THEN 1 WHEN 'p90' THEN 2 ELSE 3 END;

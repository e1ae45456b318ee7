-- validation_cdf.sql
-- The live and simulated latency distributions of a validate run, for overlaid CDFs.
-- Reads:   validation_requests
-- Params:  validation_run  VARCHAR  the validate run (NULL: the latest validate run)
-- Grain:   one row per request, metric and source (live or simulated)
-- Columns: run_id, metric, source, value_s, cdf
-- cdf is the share of the run's requests with a value at or below value_s (per metric
-- and source; a request without a value, e.g. TPOT of a one-token output, is left out).
WITH run AS (
    SELECT coalesce(getvariable('validation_run')::VARCHAR,
        (SELECT max(run_id) FROM validation_requests)) AS run_id
),
long AS (
    SELECT r.run_id, m.metric, m.source, m.value_s
    FROM validation_requests AS r
    JOIN run USING (run_id),
    LATERAL (VALUES
        ('ttft', 'live', r.live_ttft_s), ('ttft', 'simulated', r.sim_ttft_s),
        ('tpot', 'live', r.live_tpot_s), ('tpot', 'simulated', r.sim_tpot_s),
        ('e2e', 'live', r.live_e2e_s), ('e2e', 'simulated', r.sim_e2e_s)
    ) AS m(metric, source, value_s)
    WHERE m.value_s IS NOT NULL
)
SELECT
    run_id,
    metric,
    source,
    value_s,
    cume_dist() OVER (PARTITION BY metric, source ORDER BY value_s) AS cdf
FROM long
ORDER BY metric, source, value_s;

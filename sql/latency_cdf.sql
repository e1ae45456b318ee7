-- latency_cdf.sql
-- How are TTFT and TPOT distributed in each scenario? The empirical CDF at log-spaced
-- points.
-- Reads:   sim_requests, scenarios
-- Params:  run_id            VARCHAR  the replay run (NULL: the latest run)
--          bins_per_decade   INTEGER  points per factor of ten in time (NULL: 20)
-- Grain:   one row per scenario, metric (ttft_s, tpot_s) and point at which some
--          request falls: the points are 10^(i / bins_per_decade) seconds, values
--          below 1 microsecond count at 1 microsecond
-- Columns: scenario, metric, value_s (the point), num_requests (requests with the metric
--          <= value_s), fraction (num_requests / requests with the metric)
-- NOTE: exact at every point, and linear in the number of requests (one grouping, no
-- sort), so it stays cheap on millions of requests; latency_percentiles.sql gives the
-- exact interpolated percentiles.
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
params AS (
    SELECT coalesce(getvariable('bins_per_decade')::INTEGER, 20) AS k
),
long AS (
    SELECT scenario, 'ttft_s' AS metric, ttft_s AS v
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
    UNION ALL
    SELECT scenario, 'tpot_s' AS metric, tpot_s AS v
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run) AND tpot_s IS NOT NULL
),
binned AS (
    SELECT
        scenario,
        metric,
        ceil(log10(greatest(v, 1e-6)) * (SELECT k FROM params))::INTEGER AS bin,
        count(*) AS n
    FROM long
    GROUP BY ALL
)
SELECT
    scenario,
    metric,
    pow(10, bin / (SELECT k FROM params)) AS value_s,
    sum(n) OVER w::BIGINT AS num_requests,
    sum(n) OVER w / sum(n) OVER (PARTITION BY scenario, metric) AS fraction
FROM binned
WINDOW w AS (PARTITION BY scenario, metric ORDER BY bin)
ORDER BY scenario, metric DESC, bin;

-- live_metrics.sql
-- What did the server (and the client) report while a live run ran: each metric's range?
-- Reads:   live_metrics
-- Params:  run_id  VARCHAR  the live run (NULL: the latest live run with metrics)
-- Grain:   one row per metric of the run
-- Columns: run_id, metric, num_samples, first_s, last_s, min_value, mean_value,
--          max_value, last_value, change
-- Metric names: num_requests_running, num_requests_waiting, kv_cache_usage (0..1),
-- prefix_cache_queries and prefix_cache_hits (counters since the server started),
-- prefix_cache_hit_rate, client_in_flight, client_waiting. mean_value is the plain
-- mean of the samples (they are taken at a fixed interval); change = last - first
-- sample, so for the counters the run's own hits and queries (their ratio: the run's
-- prefix-cache hit rate).
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM live_metrics))
        AS run_id
)
SELECT
    run_id,
    metric,
    count(*)                  AS num_samples,
    min(time_s)               AS first_s,
    max(time_s)               AS last_s,
    min(value)                AS min_value,
    avg(value)                AS mean_value,
    max(value)                AS max_value,
    arg_max(value, time_s)    AS last_value,
    arg_max(value, time_s) - arg_min(value, time_s) AS change
FROM live_metrics
WHERE run_id = (SELECT run_id FROM run)
GROUP BY run_id, metric
ORDER BY metric;

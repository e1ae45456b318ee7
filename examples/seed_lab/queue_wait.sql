-- queue_wait.sql
-- Queue depth against p99 wait: how long do requests wait for their first step, by how
-- many requests were already waiting when they arrived, in each scenario of the latest sweep?
-- Reads:   runs, sim_requests
-- Params:  run_id    VARCHAR  the sweep run (NULL: the latest sweep)
--          scenario  VARCHAR  one scenario (NULL: every scenario)
-- Grain:   one row per scenario and queue-depth bucket (0, 1-3, 4-15, 16-63, 64-255, 256+)
-- Columns: scenario, queue_depth (the bucket), num_requests, p50_wait_s, p99_wait_s,
--          p99_ttft_s
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR,
                    (SELECT max(run_id) FROM runs WHERE command = 'sweep')) AS run_id
),
bucketed AS (
    SELECT
        scenario,
        CASE
            WHEN queue_depth_at_arrival = 0 THEN 0
            WHEN queue_depth_at_arrival < 4 THEN 1
            WHEN queue_depth_at_arrival < 16 THEN 4
            WHEN queue_depth_at_arrival < 64 THEN 16
            WHEN queue_depth_at_arrival < 256 THEN 64
            ELSE 256
        END AS lo,
        queue_s,
        ttft_s
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
      AND (getvariable('scenario') IS NULL OR scenario = getvariable('scenario')::VARCHAR)
)
SELECT
    scenario,
    CASE lo WHEN 0 THEN '0' WHEN 1 THEN '1-3' WHEN 4 THEN '4-15' WHEN 16 THEN '16-63'
            WHEN 64 THEN '64-255' ELSE '256+' END  AS queue_depth,
    count(*)                                       AS num_requests,
    round(quantile_cont(queue_s, 0.5), 3)          AS p50_wait_s,
    round(quantile_cont(queue_s, 0.99), 3)         AS p99_wait_s,
    round(quantile_cont(ttft_s, 0.99), 3)          AS p99_ttft_s
FROM bucketed
GROUP BY scenario, lo
ORDER BY scenario, lo;

-- ttft_by_queue_depth.sql
-- How does tail TTFT grow with the queue a request met on arrival?
-- Reads:   sim_requests, scenarios
-- Params:  run_id        VARCHAR  the replay run (NULL: the latest run)
--          min_requests  INTEGER  leave out buckets with fewer requests (NULL: 20), as
--                                 their p99 is noise
-- Grain:   one row per scenario and queue-depth bucket: depths 0 to 7 each have their
--          own bucket, deeper queues share power-of-two buckets [8, 15], [16, 31], ...
-- Columns: scenario, queue_depth_lo, queue_depth_hi (inclusive), num_requests,
--          p50_ttft_s, p99_ttft_s
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
bucketed AS (
    SELECT
        scenario,
        ttft_s,
        CASE WHEN queue_depth_at_arrival < 8 THEN queue_depth_at_arrival
             ELSE (1::BIGINT << floor(log2(queue_depth_at_arrival))::INTEGER) END
            AS queue_depth_lo
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
)
SELECT
    scenario,
    queue_depth_lo,
    CASE WHEN queue_depth_lo < 8 THEN queue_depth_lo ELSE 2 * queue_depth_lo - 1 END
        AS queue_depth_hi,
    count(*)                    AS num_requests,
    quantile_cont(ttft_s, 0.50) AS p50_ttft_s,
    quantile_cont(ttft_s, 0.99) AS p99_ttft_s
FROM bucketed
GROUP BY scenario, queue_depth_lo
HAVING count(*) >= coalesce(getvariable('min_requests')::INTEGER, 20)
ORDER BY scenario, queue_depth_lo;

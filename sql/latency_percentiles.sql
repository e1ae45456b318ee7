-- latency_percentiles.sql
-- What latency does each scenario give: TTFT, TPOT, E2E and queue-time percentiles?
-- Reads:   sim_requests, scenarios
-- Params:  run_id  VARCHAR  the replay run (NULL: the latest run)
-- Grain:   one row per scenario
-- Columns: scenario, num_requests, p50_ttft_s, p90_ttft_s, p99_ttft_s, p50_tpot_s,
--          p99_tpot_s, p50_e2e_s, p99_e2e_s, p99_queue_s, max_queue_depth,
--          num_preemptions
-- Percentiles interpolate linearly (quantile_cont, numpy's default); TPOT leaves out
-- requests with one output token (tpot_s is null for them).
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
per_scenario AS (
    -- NOTE: one list of quantiles per column sorts each column once, not once per quantile
    SELECT
        scenario,
        count(*)                                    AS num_requests,
        quantile_cont(ttft_s, [0.50, 0.90, 0.99])   AS ttft_q,
        quantile_cont(tpot_s, [0.50, 0.99])         AS tpot_q,
        quantile_cont(e2e_s, [0.50, 0.99])          AS e2e_q,
        quantile_cont(queue_s, 0.99)                AS p99_queue_s,
        max(queue_depth_at_arrival)                 AS max_queue_depth,
        sum(num_preemptions)::BIGINT                AS num_preemptions
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY scenario
)
SELECT
    scenario,
    num_requests,
    ttft_q[1] AS p50_ttft_s,
    ttft_q[2] AS p90_ttft_s,
    ttft_q[3] AS p99_ttft_s,
    tpot_q[1] AS p50_tpot_s,
    tpot_q[2] AS p99_tpot_s,
    e2e_q[1]  AS p50_e2e_s,
    e2e_q[2]  AS p99_e2e_s,
    p99_queue_s,
    max_queue_depth,
    num_preemptions
FROM per_scenario
ORDER BY scenario;

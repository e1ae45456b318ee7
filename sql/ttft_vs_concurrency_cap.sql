-- ttft_vs_concurrency_cap.sql
-- Across scenarios: how does p99 TTFT move with the concurrency cap (max_num_seqs, or
-- max_batch_size for static batching) at the load each scenario was offered?
-- Reads:   scenarios, sim_requests
-- Params:  run_id  VARCHAR  the replay run (NULL: the latest run)
-- Grain:   one row per scenario that has a concurrency cap
-- Columns: scenario, policy, replicas, max_concurrency, offered_requests_per_s (requests
--          over the arrival span), num_requests, p50_ttft_s, p99_ttft_s,
--          mean_queue_depth (met on arrival)
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
served AS (
    SELECT
        scenario,
        count(*)                                          AS num_requests,
        count(*) / nullif(max(arrival_s) - min(arrival_s), 0) AS offered_requests_per_s,
        quantile_cont(ttft_s, 0.50)                       AS p50_ttft_s,
        quantile_cont(ttft_s, 0.99)                       AS p99_ttft_s,
        avg(queue_depth_at_arrival)                       AS mean_queue_depth
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY scenario
)
SELECT
    s.scenario,
    s.policy,
    s.replicas,
    coalesce(TRY_CAST(s.config_json ->> 'max_num_seqs' AS BIGINT),
             TRY_CAST(s.config_json ->> 'max_batch_size' AS BIGINT)) AS max_concurrency,
    v.offered_requests_per_s,
    v.num_requests,
    v.p50_ttft_s,
    v.p99_ttft_s,
    v.mean_queue_depth
FROM scenarios AS s
JOIN served AS v USING (scenario)
WHERE s.run_id = (SELECT run_id FROM run)
  AND max_concurrency IS NOT NULL
ORDER BY s.policy, max_concurrency, s.scenario;

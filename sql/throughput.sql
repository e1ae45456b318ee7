-- throughput.sql
-- How much does each scenario serve: requests/s and tokens/s, static vs continuous batching?
-- Reads:   sim_requests, scenarios
-- Params:  run_id      VARCHAR  the replay run (NULL: the latest run)
--          slo_ttft_s  DOUBLE   TTFT objective for goodput, seconds (NULL: 0.2)
-- Grain:   one row per scenario
-- Columns: scenario, policy, batching (static | continuous), replicas, num_requests,
--          duration_s (first arrival to last token), requests_per_s, output_tokens_per_s,
--          total_tokens_per_s (prompt + output), goodput_per_s (requests/s with
--          ttft_s <= slo_ttft_s)
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
served AS (
    SELECT
        scenario,
        count(*)                                        AS num_requests,
        max(finished_s) - min(arrival_s)                AS duration_s,
        sum(output_tokens)::BIGINT                      AS output_tokens,
        sum(prompt_tokens + output_tokens)::BIGINT      AS total_tokens,
        count(*) FILTER (WHERE ttft_s <= coalesce(getvariable('slo_ttft_s')::DOUBLE, 0.2))
                                                        AS num_good
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY scenario
)
SELECT
    s.scenario,
    s.policy,
    CASE WHEN s.policy = 'static' THEN 'static' ELSE 'continuous' END AS batching,
    s.replicas,
    v.num_requests,
    v.duration_s,
    v.num_requests / nullif(v.duration_s, 0)  AS requests_per_s,
    v.output_tokens / nullif(v.duration_s, 0) AS output_tokens_per_s,
    v.total_tokens / nullif(v.duration_s, 0)  AS total_tokens_per_s,
    v.num_good / nullif(v.duration_s, 0)      AS goodput_per_s
FROM scenarios AS s
JOIN served AS v USING (scenario)
WHERE s.run_id = (SELECT run_id FROM run)
ORDER BY batching DESC, s.scenario;

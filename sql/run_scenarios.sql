-- run_scenarios.sql
-- What exactly did each scenario of a replay run simulate (every resolved parameter)?
-- Reads:   scenarios, sim_requests
-- Params:  run_id  VARCHAR  the replay run (NULL: the latest run)
-- Grain:   one row per scenario
-- Columns: run_id, scenario, policy, replicas, profile, max_concurrency (max_num_seqs,
--          or max_batch_size for static batching), num_kv_blocks, block_size,
--          num_requests, config_json, summary_json
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
served AS (
    SELECT scenario, count(*) AS num_requests
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY scenario
)
SELECT
    s.run_id,
    s.scenario,
    s.policy,
    s.replicas,
    s.profile,
    coalesce(TRY_CAST(s.config_json ->> 'max_num_seqs' AS BIGINT),
             TRY_CAST(s.config_json ->> 'max_batch_size' AS BIGINT)) AS max_concurrency,
    TRY_CAST(s.config_json ->> 'num_kv_blocks' AS BIGINT)        AS num_kv_blocks,
    TRY_CAST(s.config_json ->> 'block_size' AS BIGINT)           AS block_size,
    coalesce(v.num_requests, 0)                                  AS num_requests,
    s.config_json,
    s.summary_json
FROM scenarios AS s
LEFT JOIN served AS v USING (scenario)
WHERE s.run_id = (SELECT run_id FROM run)
ORDER BY s.scenario;

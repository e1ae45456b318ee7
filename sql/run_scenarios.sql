-- run_scenarios.sql
-- What exactly did each scenario of a replay run simulate (every resolved parameter)?
-- Reads:   scenarios, sim_requests
-- Params:  run_id  VARCHAR  the replay run (NULL: the latest run)
-- Grain:   one row per scenario
-- Columns: run_id, scenario, policy, replicas, profile, max_concurrency (max_num_seqs,
--          or max_batch_size for static batching), num_kv_blocks, block_size,
--          num_requests, label (every configuration key whose value differs between the
--          run's scenarios that have it, with this scenario's value (a key it lacks, as
--          another policy's, left out): 'max_num_batched_tokens=2048,
--          policy=vllm'; policy first, then by name; a float to four significant digits; a null
--          value as 'rate unset'; '' when
--          the run has one scenario or none differ), config_json, summary_json
-- The label leaves out the keys that name a scenario (name, description) and those derived
-- from others (num_kv_blocks, the profile's cost and frontend tables,
-- cost_uncertainty_source); report/layout.py labels legends the same way.
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
served AS (
    SELECT scenario, count(*) AS num_requests
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY scenario
),
config AS (
    SELECT scenario, config_json FROM scenarios WHERE run_id = (SELECT run_id FROM run)
),
-- every top-level key of every scenario's configuration, with its value as text
kv AS (
    SELECT
        c.scenario, k.key,
        -- a float to four significant digits, as report/layout.py writes it (84.11, 1)
        CASE WHEN json_type(c.config_json -> k.key) = 'DOUBLE'
             THEN printf('%.4g', (c.config_json ->> k.key)::DOUBLE)
             ELSE c.config_json ->> k.key END AS value
    FROM config AS c, unnest(json_keys(c.config_json)) AS k(key)
    WHERE k.key NOT IN ('name', 'description', 'num_kv_blocks', 'cost', 'frontend',
                        'cost_uncertainty_source')
),
-- a key varies when two scenarios that have it differ in it (a key only some policies
-- have, at one value, follows from the policy)
varying AS (
    SELECT key
    FROM kv
    GROUP BY key
    HAVING count(DISTINCT value) + max(CASE WHEN value IS NULL THEN 1 ELSE 0 END) > 1
),
labels AS (
    SELECT
        c.scenario,
        coalesce(string_agg(
            CASE WHEN kv.value IS NULL THEN v.key || ' unset' ELSE v.key || '=' || kv.value END,
            ', ' ORDER BY v.key <> 'policy', v.key), '') AS label
    FROM config AS c
    CROSS JOIN varying AS v
    JOIN kv ON kv.scenario = c.scenario AND kv.key = v.key
    GROUP BY c.scenario
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
    coalesce(l.label, '')                                        AS label,
    s.config_json,
    s.summary_json
FROM scenarios AS s
LEFT JOIN served AS v USING (scenario)
LEFT JOIN labels AS l USING (scenario)
WHERE s.run_id = (SELECT run_id FROM run)
ORDER BY s.scenario;

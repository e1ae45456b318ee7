-- cost.sql
-- What does each scenario's deployment cost: dollars per hour, per 1M output tokens and
-- per 1M prompt + output tokens, at the throughput the replay reached?
-- Reads:   sim_requests, scenarios
-- Params:  run_id       VARCHAR  the replay run (NULL: the latest run)
--          prices_json  VARCHAR  dollars per GPU-hour per GPU kind as a JSON object, e.g.
--                                {"h100-80gb": 2.49}; key "*" prices any kind (NULL: no
--                                price, so every cost is null)
-- Grain:   one row per scenario
-- Columns: scenario, profile, gpu (the GPU kind in the profile name, null when it names
--          none), gpus (replicas x tensor parallel), usd_per_gpu_hour, usd_per_hour,
--          output_tokens_per_s, total_tokens_per_s, usd_per_1m_output_tokens,
--          usd_per_1m_total_tokens
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
served AS (
    SELECT
        scenario,
        sum(output_tokens) / nullif(max(finished_s) - min(arrival_s), 0) AS output_tokens_per_s,
        sum(prompt_tokens + output_tokens) / nullif(max(finished_s) - min(arrival_s), 0)
            AS total_tokens_per_s
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY scenario
),
deployment AS (
    SELECT
        scenario, profile, replicas,
        nullif(regexp_extract(profile, '_([a-z0-9][a-z0-9-]*)_tp(\d+)$', 1), '') AS gpu,
        coalesce(TRY_CAST(nullif(regexp_extract(profile, '_tp(\d+)$', 1), '') AS INTEGER), 1)
            AS tp
    FROM scenarios
    WHERE run_id = (SELECT run_id FROM run)
),
priced AS (
    SELECT
        d.*,
        coalesce(TRY_CAST(getvariable('prices_json')::JSON ->> d.gpu AS DOUBLE),
                 TRY_CAST(getvariable('prices_json')::JSON ->> '*' AS DOUBLE)) AS usd_per_gpu_hour
    FROM deployment AS d
)
SELECT
    p.scenario,
    p.profile,
    p.gpu,
    p.replicas * p.tp                                             AS gpus,
    p.usd_per_gpu_hour,
    p.replicas * p.tp * p.usd_per_gpu_hour                        AS usd_per_hour,
    v.output_tokens_per_s,
    v.total_tokens_per_s,
    p.replicas * p.tp * p.usd_per_gpu_hour / nullif(v.output_tokens_per_s * 3600, 0) * 1e6
                                                                  AS usd_per_1m_output_tokens,
    p.replicas * p.tp * p.usd_per_gpu_hour / nullif(v.total_tokens_per_s * 3600, 0) * 1e6
                                                                  AS usd_per_1m_total_tokens
FROM priced AS p
JOIN served AS v USING (scenario)
ORDER BY p.scenario;

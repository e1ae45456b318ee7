-- trace_groups.sql
-- Who sends the traffic: requests and tokens per model and per tenant?
-- Reads:   requests, sim_requests
-- Params:  run_id      VARCHAR  only the requests this replay run replayed (NULL: every request)
--          max_groups  INTEGER  groups shown per dimension, by requests; the rest are summed
--                               as '(other)' (NULL: 12)
-- Grain:   one row per dimension (model, tenant) and group, the largest first; requests
--          without a model or tenant form the group '(none)'
-- Columns: dimension, group_name, num_requests, prompt_tokens, output_tokens, share
--          (of the dimension's requests)
WITH trace AS (
    SELECT *
    FROM requests
    WHERE getvariable('run_id') IS NULL
       OR request_id IN (
           SELECT request_id FROM sim_requests WHERE run_id = getvariable('run_id')::VARCHAR)
),
long AS (
    SELECT 'model' AS dimension, coalesce(model, '(none)') AS group_name, prompt_tokens,
           output_tokens
    FROM trace
    UNION ALL
    SELECT 'tenant' AS dimension, coalesce(tenant, '(none)') AS group_name, prompt_tokens,
           output_tokens
    FROM trace
),
-- NOTE: each group is summed once, then the small groups are folded: ranking and folding
-- the request rows themselves joined 2M rows back to their rank at 1M requests
grouped AS (
    SELECT dimension, group_name, count(*) AS num_requests,
           sum(prompt_tokens) AS prompt_tokens, sum(output_tokens) AS output_tokens
    FROM long
    GROUP BY dimension, group_name
),
ranked AS (
    SELECT *,
           row_number() OVER (PARTITION BY dimension ORDER BY num_requests DESC, group_name)
               AS rank
    FROM grouped
),
folded AS (
    SELECT
        dimension,
        CASE WHEN rank <= coalesce(getvariable('max_groups')::INTEGER, 12) THEN group_name
             ELSE '(other)' END        AS group_name,
        sum(num_requests)::BIGINT      AS num_requests,
        sum(prompt_tokens)::BIGINT     AS prompt_tokens,
        sum(output_tokens)::BIGINT     AS output_tokens
    FROM ranked
    GROUP BY ALL
)
SELECT
    dimension,
    group_name,
    num_requests,
    prompt_tokens,
    output_tokens,
    num_requests / sum(num_requests) OVER (PARTITION BY dimension) AS share
FROM folded
ORDER BY dimension, num_requests DESC, group_name;

-- prefix_cache_hit_rate_by_group.sql
-- Which models and tenants get their prompts served from the prefix cache?
-- Reads:   sim_requests, requests, scenarios
-- Params:  run_id      VARCHAR  the replay run (NULL: the latest run)
--          max_groups  INTEGER  groups shown per dimension, by prompt tokens; the rest are
--                               summed as '(other)' (NULL: 12)
-- Grain:   one row per scenario, dimension (model, tenant) and group; requests without a
--          model or tenant form the group '(none)'
-- Columns: scenario, dimension, group_name, num_requests, prompt_tokens, cached_tokens,
--          hit_rate (cached_tokens / prompt_tokens: weighted by tokens)
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
joined AS (
    SELECT s.scenario, s.prompt_tokens, s.cached_tokens, r.model, r.tenant
    FROM sim_requests AS s
    JOIN requests AS r USING (request_id)
    WHERE s.run_id = (SELECT run_id FROM run)
),
long AS (
    SELECT scenario, 'model' AS dimension, coalesce(model, '(none)') AS group_name,
           prompt_tokens, cached_tokens
    FROM joined
    UNION ALL
    SELECT scenario, 'tenant' AS dimension, coalesce(tenant, '(none)') AS group_name,
           prompt_tokens, cached_tokens
    FROM joined
),
ranked AS (
    SELECT dimension, group_name,
           row_number() OVER (PARTITION BY dimension ORDER BY sum(prompt_tokens) DESC, group_name)
               AS rank
    FROM long
    GROUP BY dimension, group_name
)
SELECT
    l.scenario,
    l.dimension,
    CASE WHEN k.rank <= coalesce(getvariable('max_groups')::INTEGER, 12) THEN l.group_name
         ELSE '(other)' END                      AS group_name,
    count(*)                                     AS num_requests,
    sum(l.prompt_tokens)::BIGINT                         AS prompt_tokens,
    sum(l.cached_tokens)::BIGINT                         AS cached_tokens,
    sum(l.cached_tokens) / nullif(sum(l.prompt_tokens), 0) AS hit_rate
FROM long AS l
JOIN ranked AS k USING (dimension, group_name)
GROUP BY ALL
ORDER BY l.scenario, l.dimension, prompt_tokens DESC, group_name;

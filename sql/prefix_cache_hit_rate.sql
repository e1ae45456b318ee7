-- prefix_cache_hit_rate.sql
-- How much of the prompt work did the prefix cache save in each scenario, and how does
-- that depend on the cache size?
-- Reads:   scenarios, sim_steps, sim_requests
-- Params:  run_id  VARCHAR  the replay run (NULL: the latest run)
-- Grain:   one row per scenario
-- Columns: scenario, policy, replicas, num_kv_blocks (per replica), block_size,
--          cache_tokens (KV cache capacity of one replica in tokens), query_tokens,
--          hit_tokens, hit_rate (hit_tokens / query_tokens: weighted by tokens over
--          every replica and step, never an average of per-replica rates; null when the
--          scenario made no lookups), prompt_tokens, cached_tokens, cached_share
--          (cached_tokens / prompt_tokens over the scenario's requests), bridging (how
--          the trace's hash blocks map onto the engine's KV blocks when their sizes
--          differ; null when they do not)
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
lookups AS (
    SELECT
        scenario,
        sum(num_prefix_query_tokens)::BIGINT AS query_tokens,
        sum(num_prefix_hit_tokens)::BIGINT   AS hit_tokens
    FROM sim_steps
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY scenario
),
served AS (
    SELECT
        scenario,
        sum(prompt_tokens)::BIGINT AS prompt_tokens,
        sum(cached_tokens)::BIGINT AS cached_tokens
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY scenario
)
SELECT
    s.scenario,
    s.policy,
    s.replicas,
    TRY_CAST(s.config_json ->> 'num_kv_blocks' AS BIGINT) AS num_kv_blocks,
    TRY_CAST(s.config_json ->> 'block_size' AS BIGINT)    AS block_size,
    num_kv_blocks * block_size                            AS cache_tokens,
    coalesce(l.query_tokens, 0)                           AS query_tokens,
    coalesce(l.hit_tokens, 0)                             AS hit_tokens,
    l.hit_tokens / nullif(l.query_tokens, 0)              AS hit_rate,
    coalesce(v.prompt_tokens, 0)                          AS prompt_tokens,
    coalesce(v.cached_tokens, 0)                          AS cached_tokens,
    v.cached_tokens / nullif(v.prompt_tokens, 0)          AS cached_share,
    CASE WHEN (s.summary_json ->> 'prefix_bridged') = 'true'
         THEN s.summary_json ->> 'prefix_bridging' END   AS bridging
FROM scenarios AS s
LEFT JOIN lookups AS l USING (scenario)
LEFT JOIN served AS v USING (scenario)
WHERE s.run_id = (SELECT run_id FROM run)
ORDER BY s.scenario;

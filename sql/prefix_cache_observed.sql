-- prefix_cache_observed.sql
-- Did the simulated prefix cache have anything to work with, and how does its share of
-- cached prompt tokens compare with the cached_tokens the production logs report?
-- Reads:   sim_requests, requests, scenarios
-- Params:  run_id  VARCHAR  the replay run (NULL: the latest run)
-- Grain:   one row per scenario
-- Columns: scenario, prefix_caching (the scenario's enable_prefix_caching), num_requests,
--          hashed_requests (replayed requests whose trace record has prefix hashes),
--          simulated_cached_share (simulated cached / prompt tokens), observed_requests
--          (replayed requests whose log gives cached_tokens), observed_cached_share
--          (logged cached / prompt tokens of those), warning (caching on but no hash:
--          no hit can be simulated)
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
per_scenario AS (
    SELECT
        s.scenario,
        count(*)                                                        AS num_requests,
        count(*) FILTER (WHERE len(r.prefix_hashes) > 0)                AS hashed_requests,
        sum(s.cached_tokens) / nullif(sum(s.prompt_tokens), 0)          AS simulated_cached_share,
        count(r.cached_tokens)                                          AS observed_requests,
        sum(r.cached_tokens) / nullif(sum(r.prompt_tokens) FILTER (WHERE r.cached_tokens IS NOT NULL), 0)
                                                                        AS observed_cached_share
    FROM sim_requests AS s
    LEFT JOIN requests AS r USING (request_id)
    WHERE s.run_id = (SELECT run_id FROM run)
    GROUP BY s.scenario
)
SELECT
    p.scenario,
    coalesce(TRY_CAST(c.config_json ->> 'enable_prefix_caching' AS BOOLEAN), false)
                                                                        AS prefix_caching,
    p.num_requests,
    p.hashed_requests,
    p.simulated_cached_share,
    p.observed_requests,
    p.observed_cached_share,
    CASE WHEN coalesce(TRY_CAST(c.config_json ->> 'enable_prefix_caching' AS BOOLEAN), false)
              AND p.hashed_requests = 0
         THEN 'prefix caching is on but the trace has no prefix hashes: no hit can be simulated'
    END                                                                 AS warning
FROM per_scenario AS p
JOIN scenarios AS c ON c.run_id = (SELECT run_id FROM run) AND c.scenario = p.scenario
ORDER BY p.scenario;

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
-- Runs made since these facts are in the replay summary read them from scenarios; older
-- runs get them by joining sim_requests with requests (slower on millions of rows).
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
meta AS (
    SELECT
        scenario,
        coalesce(TRY_CAST(config_json ->> 'enable_prefix_caching' AS BOOLEAN), false)
                                                                        AS prefix_caching,
        TRY_CAST(summary_json ->> 'prefix_hashed_requests' AS BIGINT)   AS hashed_requests,
        TRY_CAST(summary_json ->> 'observed_cached_requests' AS BIGINT) AS observed_requests,
        TRY_CAST(summary_json ->> 'observed_cached_share' AS DOUBLE)    AS observed_cached_share
    FROM scenarios
    WHERE run_id = (SELECT run_id FROM run)
),
simulated AS (
    SELECT
        scenario,
        count(*)                                               AS num_requests,
        sum(cached_tokens) / nullif(sum(prompt_tokens), 0)     AS simulated_cached_share
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY scenario
),
joined AS (
    -- only the scenarios whose summary lacks the facts
    SELECT
        s.scenario,
        count(*) FILTER (WHERE len(r.prefix_hashes) > 0)       AS hashed_requests,
        count(r.cached_tokens)                                 AS observed_requests,
        sum(r.cached_tokens)
            / nullif(sum(r.prompt_tokens) FILTER (WHERE r.cached_tokens IS NOT NULL), 0)
                                                               AS observed_cached_share
    FROM sim_requests AS s
    LEFT JOIN requests AS r USING (request_id)
    WHERE s.run_id = (SELECT run_id FROM run)
      AND s.scenario IN (SELECT scenario FROM meta WHERE hashed_requests IS NULL)
    GROUP BY s.scenario
)
SELECT
    m.scenario,
    m.prefix_caching,
    v.num_requests,
    coalesce(m.hashed_requests, j.hashed_requests)             AS hashed_requests,
    v.simulated_cached_share,
    coalesce(m.observed_requests, j.observed_requests)         AS observed_requests,
    CASE WHEN m.hashed_requests IS NOT NULL THEN m.observed_cached_share
         ELSE j.observed_cached_share END                      AS observed_cached_share,
    CASE WHEN m.prefix_caching AND coalesce(m.hashed_requests, j.hashed_requests) = 0
         THEN 'prefix caching is on but the trace has no prefix hashes: no hit can be simulated'
    END                                                        AS warning
FROM meta AS m
JOIN simulated AS v USING (scenario)
LEFT JOIN joined AS j USING (scenario)
ORDER BY m.scenario;

-- prefix_cache_hit_rate_over_time.sql
-- How does the prefix-cache hit rate evolve over simulated time (warm-up, drift)?
-- Reads:   sim_steps, scenarios
-- Params:  run_id    VARCHAR  the replay run (NULL: the latest run)
--          bucket_s  DOUBLE   bucket width in simulated seconds (NULL: the smallest round
--                             width that gives at most 300 buckets)
-- Grain:   one row per scenario and time bucket with at least one lookup (steps count in
--          the bucket where they start)
-- Columns: scenario, bucket_start_s, bucket_s, query_tokens, hit_tokens, hit_rate
--          (hit_tokens / query_tokens over every replica: weighted by tokens)
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
steps AS (
    SELECT scenario, start_s, duration_s, num_prefix_query_tokens, num_prefix_hit_tokens
    FROM sim_steps
    WHERE run_id = (SELECT run_id FROM run)
),
width AS (
    SELECT coalesce(
        getvariable('bucket_s')::DOUBLE,
        (SELECT min(w) FROM unnest([0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900,
                                    1800, 3600, 7200, 10800, 21600, 43200, 86400]) AS u(w)
         WHERE w * 300 >= (SELECT max(start_s + duration_s) FROM steps)),
        86400.0) AS bucket_s
)
SELECT
    scenario,
    floor(start_s / bucket_s) * bucket_s        AS bucket_start_s,
    any_value(bucket_s)                         AS bucket_s,
    sum(num_prefix_query_tokens)::BIGINT                AS query_tokens,
    sum(num_prefix_hit_tokens)::BIGINT                  AS hit_tokens,
    sum(num_prefix_hit_tokens) / sum(num_prefix_query_tokens) AS hit_rate
FROM steps, width
GROUP BY scenario, bucket_start_s
HAVING sum(num_prefix_query_tokens) > 0
ORDER BY scenario, bucket_start_s;

-- kv_tiers.sql
-- Where did the prefix hits come from over simulated time: the GPU prefix cache, the CPU
-- KV offloading tier or the disk tier below it, and how many bytes did the tiers load?
-- Reads:   sim_steps, scenarios
-- Params:  run_id    VARCHAR  the replay run (NULL: the latest run)
--          bucket_s  DOUBLE   bucket width in simulated seconds (NULL: the smallest round
--                             width that gives at most 300 buckets)
-- Grain:   one row per scenario and time bucket with a prefix lookup or a tier load, every
--          replica together, for the scenarios of the run with a CPU tier configured
--          (kv_offloading_size_gb > 0; none for a run without one); a row of sim_steps
--          counts in the bucket where it starts
-- Columns: scenario, pool (null: one pool), bucket_start_s, bucket_s, query_tokens
--          (prompt tokens looked up), gpu_hit_tokens (found in the GPU prefix cache),
--          cpu_hit_tokens, disk_hit_tokens (loaded from the CPU tier, from the disk tier,
--          past the GPU's hits), gpu_hit_rate, cpu_hit_rate, disk_hit_rate (each over
--          query_tokens), tier_load_bytes (KV bytes the loads moved; the steps waited for
--          them), cpu_tier_blocks, disk_tier_blocks (the tiers' sizes in KV blocks, per
--          replica; 0: no disk tier)
-- The tiers' sizes come from the scenario's resolved configuration (config_json
-- kv_tier_cpu_blocks, kv_tier_disk_blocks; docs/replay.md, "KV offloading tiers").
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
config AS (
    SELECT scenario,
           TRY_CAST(config_json ->> 'kv_tier_cpu_blocks' AS BIGINT) AS cpu_tier_blocks,
           coalesce(TRY_CAST(config_json ->> 'kv_tier_disk_blocks' AS BIGINT), 0)
                                                                   AS disk_tier_blocks
    FROM scenarios
    WHERE run_id = (SELECT run_id FROM run) AND json_valid(config_json)
        AND TRY_CAST(config_json ->> 'kv_tier_cpu_blocks' AS BIGINT) > 0
),
steps AS (
    SELECT scenario, pool, start_s, duration_s,
           coalesce(num_prefix_query_tokens, 0) AS query_tokens,
           coalesce(num_prefix_hit_tokens, 0) AS gpu_hit_tokens,
           coalesce(cpu_hit_tokens, 0) AS cpu_hit_tokens,
           coalesce(disk_hit_tokens, 0) AS disk_hit_tokens,
           coalesce(tier_load_bytes, 0) AS tier_load_bytes
    FROM sim_steps
    WHERE run_id = (SELECT run_id FROM run) AND scenario IN (SELECT scenario FROM config)
),
width AS (
    SELECT coalesce(
        getvariable('bucket_s')::DOUBLE,
        (SELECT min(w) FROM unnest([0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900,
                                    1800, 3600, 7200, 10800, 21600, 43200, 86400]) AS u(w)
         WHERE w * 300 >= (SELECT max(start_s + duration_s) FROM steps)),
        86400.0) AS bucket_s
),
grouped AS (
    SELECT
        s.scenario,
        any_value(s.pool)                                   AS pool,
        floor(s.start_s / w.bucket_s) * w.bucket_s          AS bucket_start_s,
        any_value(w.bucket_s)                               AS bucket_s,
        sum(s.query_tokens)::BIGINT                         AS query_tokens,
        sum(s.gpu_hit_tokens)::BIGINT                       AS gpu_hit_tokens,
        sum(s.cpu_hit_tokens)::BIGINT                       AS cpu_hit_tokens,
        sum(s.disk_hit_tokens)::BIGINT                      AS disk_hit_tokens,
        sum(s.tier_load_bytes)::BIGINT                      AS tier_load_bytes
    FROM steps AS s, width AS w
    GROUP BY s.scenario, bucket_start_s
    HAVING sum(s.query_tokens) > 0 OR sum(s.tier_load_bytes) > 0
)
SELECT
    g.scenario, g.pool, g.bucket_start_s, g.bucket_s, g.query_tokens,
    g.gpu_hit_tokens, g.cpu_hit_tokens, g.disk_hit_tokens,
    g.gpu_hit_tokens / nullif(g.query_tokens, 0)            AS gpu_hit_rate,
    g.cpu_hit_tokens / nullif(g.query_tokens, 0)            AS cpu_hit_rate,
    g.disk_hit_tokens / nullif(g.query_tokens, 0)           AS disk_hit_rate,
    g.tier_load_bytes, c.cpu_tier_blocks, c.disk_tier_blocks
FROM grouped AS g
JOIN config AS c USING (scenario)
ORDER BY g.scenario, g.bucket_start_s;

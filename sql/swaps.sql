-- swaps.sql
-- How much KV did swap preemption move to host memory and back over simulated time, and
-- how long did the steps wait for the copies?
-- Reads:   sim_steps, scenarios
-- Params:  run_id    VARCHAR  the replay run (NULL: the latest run)
--          bucket_s  DOUBLE   bucket width in simulated seconds (NULL: the smallest round
--                             width that gives at most 300 buckets)
-- Grain:   one row per scenario, replica and time bucket in which that replica swapped
--          (out or in), for the scenarios of the run that swapped at all (none for a run
--          without preemption_mode = "swap"); a row of sim_steps counts in the bucket
--          where it starts
-- Columns: scenario, pool (null: one pool), replica, bucket_start_s, bucket_s,
--          num_preemptions (every preemption of the bucket's steps: swapped, or
--          recomputed when host memory was full), swap_out_bytes, swap_in_bytes,
--          swap_out_blocks, swap_in_blocks (bytes / the scenario's KV block bytes),
--          swap_s (seconds the steps waited for the copies: bytes / the host link's
--          bytes per second; null where the scenario's configuration lacks the link, as a
--          fleet's pool), swap_share (swap_s / the replica's step time in the bucket:
--          the share of it spent waiting for copies)
-- The block bytes and the link come from the scenario's resolved configuration
-- (config_json swap_block_bytes, swap_link_bytes_per_s; docs/replay.md, "Swap preemption").
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
steps AS (
    SELECT scenario, pool, replica, start_s, duration_s, num_preemptions,
           coalesce(swap_out_bytes, 0) AS swap_out_bytes,
           coalesce(swap_in_bytes, 0) AS swap_in_bytes
    FROM sim_steps
    WHERE run_id = (SELECT run_id FROM run)
),
swapping AS (
    SELECT scenario FROM steps GROUP BY scenario HAVING sum(swap_out_bytes) > 0
),
config AS (
    SELECT scenario,
           TRY_CAST(config_json ->> 'swap_block_bytes' AS BIGINT) AS block_bytes,
           TRY_CAST(config_json ->> 'swap_link_bytes_per_s' AS DOUBLE) AS link_bytes_per_s
    FROM scenarios
    WHERE run_id = (SELECT run_id FROM run) AND json_valid(config_json)
),
width AS (
    SELECT coalesce(
        getvariable('bucket_s')::DOUBLE,
        (SELECT min(w) FROM unnest([0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900,
                                    1800, 3600, 7200, 10800, 21600, 43200, 86400]) AS u(w)
         WHERE w * 300 >= (SELECT max(start_s + duration_s) FROM steps
                           WHERE scenario IN (SELECT scenario FROM swapping))),
        86400.0) AS bucket_s
),
grouped AS (
    SELECT
        s.scenario,
        any_value(s.pool)                                   AS pool,
        s.replica,
        floor(s.start_s / w.bucket_s) * w.bucket_s          AS bucket_start_s,
        any_value(w.bucket_s)                               AS bucket_s,
        sum(s.duration_s)                                   AS busy_s,
        sum(s.num_preemptions)::BIGINT                      AS num_preemptions,
        sum(s.swap_out_bytes)::BIGINT                       AS swap_out_bytes,
        sum(s.swap_in_bytes)::BIGINT                        AS swap_in_bytes
    FROM steps AS s, width AS w
    WHERE s.scenario IN (SELECT scenario FROM swapping)
    GROUP BY s.scenario, s.replica, bucket_start_s
    HAVING sum(s.swap_out_bytes) + sum(s.swap_in_bytes) > 0
)
SELECT
    g.scenario, g.pool, g.replica, g.bucket_start_s, g.bucket_s, g.num_preemptions,
    g.swap_out_bytes, g.swap_in_bytes,
    (g.swap_out_bytes / nullif(c.block_bytes, 0))::BIGINT   AS swap_out_blocks,
    (g.swap_in_bytes / nullif(c.block_bytes, 0))::BIGINT    AS swap_in_blocks,
    (g.swap_out_bytes + g.swap_in_bytes) / nullif(c.link_bytes_per_s, 0) AS swap_s,
    (g.swap_out_bytes + g.swap_in_bytes) / nullif(c.link_bytes_per_s, 0)
        / nullif(g.busy_s, 0)                               AS swap_share
FROM grouped AS g
LEFT JOIN config AS c USING (scenario)
ORDER BY g.scenario, g.replica, g.bucket_start_s;

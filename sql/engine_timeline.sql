-- engine_timeline.sql
-- What did the engines do over simulated time: KV cache usage, running and waiting
-- requests, preemptions?
-- Reads:   sim_steps, scenarios
-- Params:  run_id    VARCHAR  the replay run (NULL: the latest run)
--          bucket_s  DOUBLE   bucket width in simulated seconds (NULL: per scenario, the
--                             smallest round width that gives it at most 300 buckets, so
--                             one long capacity probe does not coarsen every scenario)
-- Grain:   one row per scenario and time bucket in which some replica stepped
-- Columns: scenario, bucket_start_s, bucket_s, kv_usage (KV blocks used / blocks the
--          replicas have, time-weighted over the time they were stepping, 0-1),
--          mean_running, mean_waiting (summed over replicas, time-weighted over the
--          bucket), max_waiting (deepest queue of one replica, as met by a step
--          overlapping the bucket),
--          num_preemptions
-- A row of sim_steps spread over several buckets is weighted by its overlap with each;
-- its preemptions count in the bucket where it starts.
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
steps AS (
    SELECT
        scenario, start_s, start_s + duration_s AS end_s, num_running, num_waiting,
        num_kv_blocks_used, num_kv_blocks_total, num_preemptions
    FROM sim_steps
    WHERE run_id = (SELECT run_id FROM run)
),
span AS (
    SELECT scenario, max(end_s) AS t1_s FROM steps GROUP BY scenario
),
width AS (
    SELECT
        scenario,
        t1_s,
        coalesce(
            getvariable('bucket_s')::DOUBLE,
            (SELECT min(w) FROM unnest([0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600,
                                        900, 1800, 3600, 7200, 10800, 21600, 43200, 86400]) AS u(w)
             WHERE w * 300 >= span.t1_s),
            86400.0) AS bucket_s
    FROM span
),
-- NOTE: nearly every row lies inside one bucket and needs no splitting; only the few
-- that cross a bucket boundary are cut into one piece per bucket they touch.
single AS (
    SELECT
        s.scenario, s.num_running, s.num_waiting, s.num_kv_blocks_used,
        s.num_kv_blocks_total, s.num_preemptions,
        floor(s.start_s / w.bucket_s)::BIGINT AS bucket,
        s.end_s - s.start_s AS overlap_s,
        true AS is_first
    FROM steps AS s JOIN width AS w USING (scenario)
    WHERE ceil(s.end_s / w.bucket_s) <= floor(s.start_s / w.bucket_s) + 1
),
crossing AS (
    SELECT
        s.*,
        unnest(range(floor(s.start_s / w.bucket_s)::BIGINT,
                     ceil(s.end_s / w.bucket_s)::BIGINT)) AS bucket,
        w.bucket_s
    FROM steps AS s JOIN width AS w USING (scenario)
    WHERE ceil(s.end_s / w.bucket_s) > floor(s.start_s / w.bucket_s) + 1
),
pieces AS (
    SELECT * FROM single
    UNION ALL
    SELECT
        scenario, num_running, num_waiting, num_kv_blocks_used, num_kv_blocks_total,
        num_preemptions, bucket,
        greatest(0.0, least(end_s, (bucket + 1) * bucket_s) - greatest(start_s, bucket * bucket_s))
            AS overlap_s,
        bucket = floor(start_s / bucket_s)::BIGINT AS is_first
    FROM crossing
)
SELECT
    p.scenario,
    p.bucket * w.bucket_s AS bucket_start_s,
    w.bucket_s,
    sum(p.num_kv_blocks_used * p.overlap_s) / nullif(sum(p.num_kv_blocks_total * p.overlap_s), 0)
        AS kv_usage,
    sum(p.num_running * p.overlap_s)
        / least(w.bucket_s, w.t1_s - p.bucket * w.bucket_s) AS mean_running,
    sum(p.num_waiting * p.overlap_s)
        / least(w.bucket_s, w.t1_s - p.bucket * w.bucket_s) AS mean_waiting,
    max(p.num_waiting) AS max_waiting,
    coalesce(sum(p.num_preemptions) FILTER (WHERE p.is_first), 0)::BIGINT AS num_preemptions
FROM pieces AS p JOIN width AS w USING (scenario)
GROUP BY p.scenario, p.bucket, w.bucket_s, w.t1_s
ORDER BY p.scenario, p.bucket;

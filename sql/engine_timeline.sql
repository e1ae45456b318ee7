-- engine_timeline.sql
-- What did the engines do over simulated time: KV cache usage, running and waiting
-- requests, preemptions?
-- Reads:   sim_steps, scenarios
-- Params:  run_id    VARCHAR  the replay run (NULL: the latest run)
--          bucket_s  DOUBLE   bucket width in simulated seconds (NULL: the smallest round
--                             width that gives at most 300 buckets over the time axis)
-- Grain:   one row per scenario and time bucket in which some replica stepped. The time
--          axis ends where the last scenario ends, or, when one runs more than four times
--          as long as the median scenario (a capacity search's slowest rate), at four times
--          the median: later steps are left out, so one long probe does not squeeze the rest
-- Columns: scenario, bucket_start_s, bucket_s, kv_usage (KV blocks used / blocks the
--          replicas have, time-weighted over the time they were stepping, 0-1),
--          mean_running, mean_waiting (summed over replicas, time-weighted over the
--          bucket), max_waiting (deepest queue of one replica, as met by a step
--          overlapping the bucket),
--          num_preemptions, scenario_end_s (the scenario's last step end, also when
--          beyond the time axis)
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
ends AS (
    SELECT scenario, max(end_s) AS scenario_end_s FROM steps GROUP BY scenario
),
span AS (
    SELECT least(max(scenario_end_s), 4 * median(scenario_end_s)) AS t1_s FROM ends
),
width AS (
    SELECT coalesce(
        getvariable('bucket_s')::DOUBLE,
        (SELECT min(w) FROM unnest([0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900,
                                    1800, 3600, 7200, 10800, 21600, 43200, 86400]) AS u(w)
         WHERE w * 300 >= (SELECT t1_s FROM span)),
        86400.0) AS bucket_s
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
    FROM steps AS s, width AS w
    WHERE ceil(s.end_s / w.bucket_s) <= floor(s.start_s / w.bucket_s) + 1
),
crossing AS (
    SELECT
        s.*,
        unnest(range(floor(s.start_s / w.bucket_s)::BIGINT,
                     ceil(s.end_s / w.bucket_s)::BIGINT)) AS bucket,
        w.bucket_s
    FROM steps AS s, width AS w
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
),
grouped AS (
    SELECT
        p.scenario,
        p.bucket * w.bucket_s AS bucket_start_s,
        w.bucket_s,
        sum(p.num_kv_blocks_used * p.overlap_s)
            / nullif(sum(p.num_kv_blocks_total * p.overlap_s), 0) AS kv_usage,
        sum(p.num_running * p.overlap_s)
            / least(w.bucket_s, (SELECT t1_s FROM span) - p.bucket * w.bucket_s) AS mean_running,
        sum(p.num_waiting * p.overlap_s)
            / least(w.bucket_s, (SELECT t1_s FROM span) - p.bucket * w.bucket_s) AS mean_waiting,
        max(p.num_waiting) AS max_waiting,
        coalesce(sum(p.num_preemptions) FILTER (WHERE p.is_first), 0)::BIGINT AS num_preemptions
    FROM pieces AS p, width AS w
    WHERE p.bucket * w.bucket_s < (SELECT t1_s FROM span)
    GROUP BY p.scenario, p.bucket, w.bucket_s
)
SELECT g.*, e.scenario_end_s
FROM grouped AS g
JOIN ends AS e USING (scenario)
ORDER BY g.scenario, g.bucket_start_s;

-- autoscale_timeline.sql
-- How did an autoscaled scenario's (or pool's) replicas follow the load: active and
-- starting replicas over time beside the requests arriving per interval?
-- Reads:   scenarios, sim_requests
-- Params:  run_id    VARCHAR  the replay run (NULL: the latest run)
--          bucket_s  DOUBLE   width of the arrival buckets, simulated seconds (NULL: the
--                             autoscaler's interval_s, widened to a round width when the
--                             span would need more than 300 buckets)
-- Grain:   one row per autoscaled scenario or pool, measure and time point
-- Columns: scenario, pool (null: a plain autoscaled scenario), label (scenario, or
--          "scenario / pool"), measure (active | starting | arrivals), t_s, value
--          (active, starting: replicas from t_s on, a step function, with a last point
--          at the replay's end; arrivals: requests arriving in [t_s, t_s + bucket_s)),
--          bucket_s, end_s (the replay's end: the last finish)
-- The timeline is the summary's autoscale.timeline, [time, active, starting] at each
-- change (pipeline/sim/autoscale.py, timeline); a fleet's pools carry theirs under
-- pools.<name>.autoscale, on the fleet's clock.
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
sc AS (
    SELECT scenario, summary_json, config_json
    FROM scenarios
    WHERE run_id = (SELECT run_id FROM run) AND json_valid(summary_json)
),
pool_names AS (
    SELECT scenario, summary_json, config_json,
           unnest(json_keys(summary_json, '$.pools')) AS pool
    FROM sc
    WHERE json_type(summary_json, '$.pools') = 'OBJECT'
),
entries AS (
    SELECT scenario, NULL::VARCHAR AS pool, summary_json -> '$.autoscale' AS a,
           TRY_CAST(config_json ->> '$.autoscale.interval_s' AS DOUBLE) AS interval_s
    FROM sc
    WHERE json_type(summary_json, '$.autoscale') = 'OBJECT'
    UNION ALL
    SELECT scenario, pool,
           summary_json -> ('/pools/' || replace(replace(pool, '~', '~0'), '/', '~1')
                            || '/autoscale') AS a,
           TRY_CAST(json_extract_string(
               config_json,
               '$.pools[' || (list_position(json_extract_string(config_json, '$.pools[*].name'),
                                            pool) - 1) || '].config.autoscale.interval_s')
               AS DOUBLE) AS interval_s
    FROM pool_names
),
auto AS (
    SELECT scenario, pool,
           CASE WHEN pool IS NULL THEN scenario ELSE scenario || ' / ' || pool END AS label,
           CAST(a -> '$.timeline' AS DOUBLE[][]) AS tl,
           TRY_CAST(a ->> '$.end_s' AS DOUBLE) AS end_s,
           interval_s
    FROM entries
    WHERE json_type(a) = 'OBJECT'
),
width AS (
    SELECT scenario, pool, label, tl, end_s,
           coalesce(
               getvariable('bucket_s')::DOUBLE,
               CASE WHEN coalesce(interval_s, 30.0) * 300 >= end_s THEN coalesce(interval_s, 30.0)
                    ELSE (SELECT min(w) FROM unnest([60, 120, 300, 600, 900, 1800, 3600, 7200,
                                                     10800, 21600, 43200, 86400]) AS u(w)
                          WHERE w * 300 >= end_s) END,
               86400.0) AS bucket_s
    FROM auto
),
points AS (
    SELECT scenario, pool, label, bucket_s, end_s, unnest(tl) AS p FROM width
),
steps AS (
    SELECT scenario, pool, label, 'active' AS measure, p[1] AS t_s, p[2] AS value, bucket_s, end_s
    FROM points
    UNION ALL
    SELECT scenario, pool, label, 'starting', p[1], p[3], bucket_s, end_s FROM points
    UNION ALL  -- the last state held to the replay's end
    SELECT scenario, pool, label, m.measure, end_s,
           CASE m.measure WHEN 'active' THEN list_last(tl)[2] ELSE list_last(tl)[3] END,
           bucket_s, end_s
    FROM width, (VALUES ('active'), ('starting')) AS m(measure)
    WHERE len(tl) > 0 AND end_s > list_last(tl)[1]
),
arrivals AS (
    SELECT w.scenario, w.pool, w.label, 'arrivals' AS measure,
           floor(r.arrival_s / w.bucket_s) * w.bucket_s AS t_s,
           count(*)::DOUBLE AS value, w.bucket_s, w.end_s
    FROM sim_requests AS r
    JOIN width AS w
      ON r.scenario = w.scenario AND (w.pool IS NULL OR r.pool = w.pool)
    WHERE r.run_id = (SELECT run_id FROM run)
    GROUP BY ALL
)
SELECT scenario, pool, label, measure, t_s, value, bucket_s, end_s FROM steps
UNION ALL
SELECT scenario, pool, label, measure, t_s, value, bucket_s, end_s FROM arrivals
ORDER BY label, measure, t_s;

-- autoscale_summary.sql
-- What did each autoscaled scenario (or pool) of a run pay and miss: GPU-hours against
-- max_replicas the whole replay (and, in a capacity run, against the fewest fixed
-- replicas that meet the SLOs), its scale-ups and downs, and the requests that arrived
-- while replicas were starting and how many of those were over each SLO?
-- Reads:   scenarios, runs
-- Params:  run_id  VARCHAR  the replay run (NULL: the latest run)
-- Grain:   one row per autoscaled scenario or pool of the run
-- Columns: scenario, pool (null: a plain autoscaled scenario), label, gpus_per_replica,
--          gpu_hours (start to drain, or to the replay's end), gpu_hours_at_max,
--          saved_share (1 - gpu_hours / gpu_hours_at_max), mean_active (time-weighted),
--          peak_active, scale_ups, scale_downs, startup_s, end_s, during_requests
--          (arrived while a replica was starting), during_completed, during_over
--          (per SLO: "ttft_p99 12; tpot_p99 0"; null without SLOs), fixed_replicas
--          (the capacity run's fixed answer; null outside such a run), fixed_gpu_hours
--          (that count over the same span), slo_met (the capacity run's verdict on the
--          autoscaled replay; null outside it)
-- The figures are the summary's autoscale entry (scenarios.summary_json; a fleet's pools
-- carry theirs under pools.<name>.autoscale); the fixed ones the runs row's
-- details.autoscale of a capacity run on an autoscaled scenario (plan/autoscale_plan.py).
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
sc AS (
    SELECT scenario, summary_json
    FROM scenarios
    WHERE run_id = (SELECT run_id FROM run) AND json_valid(summary_json)
),
pool_names AS (
    SELECT scenario, summary_json, unnest(json_keys(summary_json, '$.pools')) AS pool
    FROM sc
    WHERE json_type(summary_json, '$.pools') = 'OBJECT'
),
entries AS (
    SELECT scenario, NULL::VARCHAR AS pool, summary_json -> '$.autoscale' AS a
    FROM sc
    WHERE json_type(summary_json, '$.autoscale') = 'OBJECT'
    UNION ALL
    SELECT scenario, pool,
           summary_json -> ('/pools/' || replace(replace(pool, '~', '~0'), '/', '~1')
                            || '/autoscale')
    FROM pool_names
),
capacity AS (  -- a capacity run's autoscaled-against-fixed comparison
    SELECT details -> '$.autoscale' AS c
    FROM runs
    WHERE run_id = (SELECT run_id FROM run) AND json_valid(details)
      AND json_type(details, '$.autoscale') = 'OBJECT'
),
over AS (
    SELECT e.scenario, e.pool,
           string_agg(k || ' ' || (e.a -> '$.during_scale_ups.over_limit' ->> k), '; ' ORDER BY k)
               AS during_over
    FROM (SELECT *, unnest(json_keys(a, '$.during_scale_ups.over_limit')) AS k
          FROM entries WHERE json_type(a, '$.during_scale_ups.over_limit') = 'OBJECT') AS e
    GROUP BY e.scenario, e.pool
)
SELECT
    e.scenario, e.pool,
    CASE WHEN e.pool IS NULL THEN e.scenario ELSE e.scenario || ' / ' || e.pool END AS label,
    TRY_CAST(e.a ->> '$.gpus_per_replica' AS INTEGER)  AS gpus_per_replica,
    TRY_CAST(e.a ->> '$.gpu_hours' AS DOUBLE)          AS gpu_hours,
    TRY_CAST(e.a ->> '$.gpu_hours_at_max' AS DOUBLE)   AS gpu_hours_at_max,
    1 - TRY_CAST(e.a ->> '$.gpu_hours' AS DOUBLE)
        / nullif(TRY_CAST(e.a ->> '$.gpu_hours_at_max' AS DOUBLE), 0) AS saved_share,
    TRY_CAST(e.a ->> '$.mean_active' AS DOUBLE)        AS mean_active,
    TRY_CAST(e.a ->> '$.peak_active' AS INTEGER)       AS peak_active,
    TRY_CAST(e.a ->> '$.scale_ups' AS INTEGER)         AS scale_ups,
    TRY_CAST(e.a ->> '$.scale_downs' AS INTEGER)       AS scale_downs,
    TRY_CAST(e.a ->> '$.startup_s' AS DOUBLE)          AS startup_s,
    TRY_CAST(e.a ->> '$.end_s' AS DOUBLE)              AS end_s,
    TRY_CAST(e.a ->> '$.during_scale_ups.num_requests' AS BIGINT) AS during_requests,
    TRY_CAST(e.a ->> '$.during_scale_ups.completed' AS BIGINT)    AS during_completed,
    o.during_over,
    TRY_CAST(c.c ->> '$.fixed_replicas' AS INTEGER)    AS fixed_replicas,
    TRY_CAST(c.c ->> '$.fixed_gpu_hours' AS DOUBLE)    AS fixed_gpu_hours,
    TRY_CAST(c.c ->> '$.slo_met' AS BOOLEAN)           AS slo_met
FROM entries AS e
LEFT JOIN over AS o
  ON o.scenario = e.scenario AND o.pool IS NOT DISTINCT FROM e.pool
LEFT JOIN capacity AS c
  ON e.pool IS NULL AND c.c ->> '$.scenario' = e.scenario
WHERE json_type(e.a) = 'OBJECT'
ORDER BY label;

-- class_slos.sql
-- Per traffic class (each tenant, each model) of each scenario of a run: its latency
-- percentiles, each SLO that judges the class with its statistic there and verdict, and the
-- class's goodput against those SLOs.
-- Reads:   class_latency, sim_requests, requests, runs, scenarios
-- Params:  run_id  VARCHAR  the replay run (NULL: the latest run)
--          slos    VARCHAR  the SLOs, a JSON list as `capacity` and `sweep` store them, e.g.
--                           '["ttft_p99<=500ms", "ttft_p99@tenant=chat<=300ms"]' (NULL: the
--                           run's own SLOs; for a run without any, none: goodput is then the
--                           class's completed requests per second)
-- Grain:   one row per scenario, class and SLO that judges the class (a class no SLO
--          judges has one row, its SLO columns null)
-- Columns: scenario, class_kind (tenant | model), class_name, class_label ('tenant=chat'),
--          requests, completed, ttft_p50_s, ttft_p90_s, ttft_p99_s, tpot_p50_s, tpot_p90_s,
--          tpot_p99_s, e2e_p50_s, e2e_p90_s, e2e_p99_s, queue_p50_s, queue_p90_s,
--          queue_p99_s (class_latency's), slo (e.g. ttft_p99@tenant=chat), slo_label
--          ('ttft_p99 of tenant=chat <= 300ms'), metric (ttft | tpot | e2e | queue), stat
--          (p99, mean, ...), limit_s, measured_s (the SLO's statistic over the class's
--          completed requests; null when none has the metric), meets_slo (an SLO with
--          nothing to judge is met), slos_met, slos_missed (names, comma-separated),
--          meets_all, num_good (completed requests meeting every SLO that judges the class
--          on their own), goodput_per_s (num_good per second of the scenario's span, first
--          arrival to last completion, as throughput.sql), is_first (the class's first row)
-- Which SLOs judge a class, as the replay summaries say: the unscoped ones and those scoped
-- to that class (ttft_p99@tenant=chat judges tenant chat); SLOs scoped to another class or
-- to prompt lengths are left out. Statistics as in `capacity` (linear percentiles, TPOT
-- without one-token outputs); a request's class comes from `requests`, as class_latency's.
-- NOTE: the report and `tracereplay sql` create the class_latency view; in the duckdb shell
-- read sql/class_latency.sql after views.sql first.
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
given AS (
    SELECT unnest(from_json(getvariable('slos')::VARCHAR, '["VARCHAR"]')) AS text
),
of_run AS (
    SELECT unnest(from_json(details -> 'slos', '["VARCHAR"]')) AS text
    FROM runs
    WHERE run_id = (SELECT run_id FROM run) AND json_valid(details)
),
texts AS (
    SELECT text FROM given
    UNION ALL
    SELECT text FROM of_run WHERE NOT EXISTS (SELECT 1 FROM given)
),
-- name<=limit: the limit follows the last '<=' (a scope may hold one: prompt<=2000)
split AS (
    SELECT regexp_extract(trim(text), '^(.+)<=\s*([0-9.]+(?:e[+-]?[0-9]+)?)\s*(us|ms|s)$',
                          ['name', 'num', 'unit']) AS p
    FROM texts
),
slo_list AS (
    SELECT
        slo, limit_s,
        regexp_extract(slo, '^([a-z0-9]+)_', 1)                          AS metric,
        regexp_extract(slo, '^[a-z0-9]+_(p[0-9.]+|mean)', 1)             AS stat,
        nullif(regexp_extract(slo, '@(.+)$', 1), '')                     AS scope,
        CASE WHEN slo LIKE '%@tenant=%' THEN 'tenant'
             WHEN slo LIKE '%@model=%' THEN 'model'
             WHEN slo LIKE '%@prompt%' THEN 'prompt' END                  AS dim,
        regexp_extract(slo, '@(?:tenant|model)=(.+)$', 1)                AS group_name,
        TRY_CAST(regexp_extract(slo, '^[a-z0-9]+_p([0-9.]+)', 1) AS DOUBLE) / 100 AS q
    FROM (
        SELECT
            trim(p['name']) AS slo,
            p['num']::DOUBLE
                * CASE p['unit'] WHEN 'us' THEN 1e-6 WHEN 'ms' THEN 1e-3 ELSE 1.0 END AS limit_s
        FROM split
        WHERE p['name'] <> ''
    )
),
req AS (
    SELECT request_id, any_value(tenant) AS tenant, any_value(model) AS model
    FROM requests
    GROUP BY request_id
),
sims AS (
    SELECT
        s.scenario, s.request_id, s.arrival_s, s.finished_s, s.ttft_s, s.tpot_s, s.e2e_s,
        s.queue_s,
        -- NOTE: not isnan(): DuckDB folds it to false from the Parquet statistics
        coalesce(s.finished_s::VARCHAR <> 'nan', false) AS done,
        CASE WHEN s.request_id IN (SELECT request_id FROM req) THEN s.request_id
             ELSE regexp_replace(s.request_id, '#[0-9]+$', '') END AS base_id
    FROM sim_requests AS s
    WHERE s.run_id = (SELECT run_id FROM run)
),
span AS (
    SELECT scenario, max(finished_s) FILTER (WHERE done) - min(arrival_s) AS duration_s
    FROM sims
    GROUP BY scenario
),
long AS (
    SELECT s.*, 'tenant' AS class_kind, coalesce(r.tenant, '(none)') AS class_name
    FROM sims AS s LEFT JOIN req AS r ON r.request_id = s.base_id
    UNION ALL
    SELECT s.*, 'model' AS class_kind, coalesce(r.model, '(none)') AS class_name
    FROM sims AS s LEFT JOIN req AS r ON r.request_id = s.base_id
),
classes AS (
    SELECT * FROM class_latency WHERE run_id = (SELECT run_id FROM run)
),
-- (class, SLO): the unscoped SLOs and those scoped to the class
judging AS (
    SELECT c.scenario, c.class_kind, c.class_name, l.*
    FROM classes AS c
    JOIN slo_list AS l
        ON l.dim IS NULL OR (l.dim = c.class_kind AND l.group_name = c.class_name)
),
judged AS (
    SELECT
        j.scenario, j.class_kind, j.class_name, j.slo, j.stat, j.q, j.limit_s, g.request_id,
        CASE j.metric WHEN 'ttft' THEN g.ttft_s WHEN 'tpot' THEN g.tpot_s
                      WHEN 'e2e' THEN g.e2e_s WHEN 'queue' THEN g.queue_s END AS v
    FROM judging AS j
    JOIN long AS g USING (scenario, class_kind, class_name)
    WHERE g.done
),
stats AS (
    SELECT
        scenario, class_kind, class_name, slo, any_value(stat) AS stat, any_value(q) AS q,
        avg(v) AS mean_v, list_sort(list(v) FILTER (WHERE v IS NOT NULL)) AS vs
    FROM judged
    GROUP BY scenario, class_kind, class_name, slo
),
measured AS (
    SELECT
        scenario, class_kind, class_name, slo,
        CASE WHEN len(vs) = 0 THEN NULL
             WHEN stat = 'mean' THEN mean_v
             ELSE vs[floor((len(vs) - 1) * q)::BIGINT + 1]
                  + ((len(vs) - 1) * q - floor((len(vs) - 1) * q))
                    * (vs[least(floor((len(vs) - 1) * q)::BIGINT + 2, len(vs))]
                       - vs[floor((len(vs) - 1) * q)::BIGINT + 1]) END AS measured_s
    FROM stats
),
bad AS (
    SELECT scenario, class_kind, class_name, count(DISTINCT request_id) AS num_bad
    FROM judged
    WHERE v > limit_s
    GROUP BY scenario, class_kind, class_name
),
rows AS (
    SELECT
        c.*,
        c.class_kind || '=' || c.class_name AS class_label,
        j.slo, j.metric, j.stat, j.limit_s, m.measured_s,
        CASE WHEN j.slo IS NULL THEN NULL ELSE coalesce(m.measured_s <= j.limit_s, true) END
            AS meets_slo,
        regexp_extract(j.slo, '^([a-z0-9]+_[a-z0-9.]+)', 1)
            || CASE WHEN j.scope IS NULL THEN '' ELSE ' of ' || j.scope END || ' <= '
            || CASE WHEN j.limit_s >= 1 THEN printf('%gs', j.limit_s)
                    WHEN j.limit_s >= 1e-3 THEN printf('%gms', j.limit_s * 1e3)
                    ELSE printf('%gus', j.limit_s * 1e6) END AS slo_label,
        c.completed - coalesce(b.num_bad, 0) AS num_good,
        (c.completed - coalesce(b.num_bad, 0)) / nullif(p.duration_s, 0) AS goodput_per_s
    FROM classes AS c
    LEFT JOIN judging AS j USING (scenario, class_kind, class_name)
    LEFT JOIN measured AS m USING (scenario, class_kind, class_name, slo)
    LEFT JOIN bad AS b USING (scenario, class_kind, class_name)
    LEFT JOIN span AS p USING (scenario)
)
SELECT
    scenario, class_kind, class_name, class_label, requests, completed,
    ttft_p50_s, ttft_p90_s, ttft_p99_s, tpot_p50_s, tpot_p90_s, tpot_p99_s,
    e2e_p50_s, e2e_p90_s, e2e_p99_s, queue_p50_s, queue_p90_s, queue_p99_s,
    slo, slo_label, metric, stat, limit_s, measured_s, meets_slo,
    string_agg(slo, ', ' ORDER BY slo) FILTER (WHERE meets_slo) OVER c AS slos_met,
    string_agg(slo, ', ' ORDER BY slo) FILTER (WHERE NOT meets_slo) OVER c AS slos_missed,
    coalesce(bool_and(meets_slo) OVER c, true) AS meets_all,
    num_good, goodput_per_s,
    row_number() OVER (c ORDER BY slo NULLS FIRST) = 1 AS is_first
FROM rows
WINDOW c AS (PARTITION BY scenario, class_kind, class_name)
ORDER BY scenario, class_kind DESC, class_name, slo NULLS FIRST;

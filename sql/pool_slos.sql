-- pool_slos.sql
-- Per replica pool of each fleet scenario of a run: its replicas and engine settings, its
-- latency percentiles and throughput, each whole-traffic SLO with its statistic over the
-- pool's requests and verdict, and the pool's goodput against those SLOs.
-- Reads:   pool_latency, sim_requests, runs, scenarios
-- Params:  run_id  VARCHAR  the replay run (NULL: the latest run)
--          slos    VARCHAR  the SLOs, a JSON list as `capacity` and `sweep` store them, e.g.
--                           '["ttft_p99<=500ms", "tpot_p99<=50ms"]' (NULL: the run's own
--                           SLOs; for a run without any, none: goodput is then the pool's
--                           completed requests per second)
-- Grain:   one row per fleet scenario, pool and unscoped SLO (a pool with no SLO to judge
--          it has one row, its SLO columns null); a run without fleets has no row
-- Columns: scenario, pool, pool_order, policy, profile, replicas, requests, completed,
--          ttft_p50_s, ttft_p90_s, ttft_p99_s, tpot_p50_s, tpot_p90_s, tpot_p99_s,
--          e2e_p50_s, e2e_p90_s, e2e_p99_s, requests_per_s (pool_latency's), pool_label
--          ('pool=long'), slo (e.g. ttft_p99), slo_label ('ttft_p99 <= 300ms'), metric
--          (ttft | tpot | e2e | queue), stat (p99, mean, ...), limit_s, measured_s (the
--          SLO's statistic over the pool's completed requests; null when none has the
--          metric), meets_slo (an SLO with nothing to judge is met), num_good (completed
--          requests meeting every SLO on their own), goodput_per_s (num_good per second of
--          the pool's span, first arrival to last completion, as pool_latency's
--          throughput), slos_met, slos_missed (names, comma-separated), meets_all,
--          is_first (the pool's first row)
-- Which SLOs judge a pool: the unscoped ones (the per-class section judges the scoped
-- ones, and the replay summary's pools entry judges those too). Statistics as in
-- `capacity` (linear percentiles, TPOT without one-token outputs).
-- NOTE: the report and `tracereplay sql` create the pool_latency view; in the duckdb shell
-- read sql/pool_latency.sql after views.sql first.
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
-- name<=limit: the limit follows the last '<='
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
        TRY_CAST(regexp_extract(slo, '^[a-z0-9]+_p([0-9.]+)', 1) AS DOUBLE) / 100 AS q
    FROM (
        SELECT
            trim(p['name']) AS slo,
            p['num']::DOUBLE
                * CASE p['unit'] WHEN 'us' THEN 1e-6 WHEN 'ms' THEN 1e-3 ELSE 1.0 END AS limit_s
        FROM split
        WHERE p['name'] <> ''
    )
    WHERE NOT contains(slo, '@')  -- a scoped SLO judges its class, not a pool
),
sims AS (
    SELECT
        scenario, pool, request_id, ttft_s, tpot_s, e2e_s, queue_s,
        -- NOTE: not isnan(): DuckDB folds it to false from the Parquet statistics
        coalesce(finished_s::VARCHAR <> 'nan', false) AS done
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run) AND pool IS NOT NULL
),
pools AS (
    SELECT * FROM pool_latency WHERE run_id = (SELECT run_id FROM run)
),
judged AS (
    SELECT
        g.scenario, g.pool, l.slo, l.stat, l.q, l.limit_s, g.request_id,
        CASE l.metric WHEN 'ttft' THEN g.ttft_s WHEN 'tpot' THEN g.tpot_s
                      WHEN 'e2e' THEN g.e2e_s WHEN 'queue' THEN g.queue_s END AS v
    FROM sims AS g
    CROSS JOIN slo_list AS l
    WHERE g.done
),
stats AS (
    SELECT
        scenario, pool, slo, any_value(stat) AS stat, any_value(q) AS q,
        avg(v) AS mean_v, list_sort(list(v) FILTER (WHERE v IS NOT NULL)) AS vs
    FROM judged
    GROUP BY scenario, pool, slo
),
measured AS (
    SELECT
        scenario, pool, slo,
        CASE WHEN len(vs) = 0 THEN NULL
             WHEN stat = 'mean' THEN mean_v
             ELSE vs[floor((len(vs) - 1) * q)::BIGINT + 1]
                  + ((len(vs) - 1) * q - floor((len(vs) - 1) * q))
                    * (vs[least(floor((len(vs) - 1) * q)::BIGINT + 2, len(vs))]
                       - vs[floor((len(vs) - 1) * q)::BIGINT + 1]) END AS measured_s
    FROM stats
),
bad AS (
    SELECT scenario, pool, count(DISTINCT request_id) AS num_bad
    FROM judged
    WHERE v > limit_s
    GROUP BY scenario, pool
),
rows AS (
    SELECT
        c.* EXCLUDE (run_id, duration_s, output_tokens_per_s, total_tokens_per_s),
        'pool=' || c.pool AS pool_label,
        j.slo,
        j.slo || ' <= '
            || CASE WHEN j.limit_s >= 1 THEN printf('%gs', j.limit_s)
                    WHEN j.limit_s >= 1e-3 THEN printf('%gms', j.limit_s * 1e3)
                    ELSE printf('%gus', j.limit_s * 1e6) END AS slo_label,
        j.metric, j.stat, j.limit_s, m.measured_s,
        CASE WHEN j.slo IS NULL THEN NULL ELSE coalesce(m.measured_s <= j.limit_s, true) END
            AS meets_slo,
        c.completed - coalesce(b.num_bad, 0) AS num_good,
        (c.completed - coalesce(b.num_bad, 0)) / nullif(c.duration_s, 0) AS goodput_per_s
    FROM pools AS c
    LEFT JOIN slo_list AS j ON true
    LEFT JOIN measured AS m USING (scenario, pool, slo)
    LEFT JOIN bad AS b USING (scenario, pool)
)
-- NOTE: the pool's columns by * (one of them is named as a table is, which the header's
-- Reads line would take for one)
SELECT
    *,
    string_agg(slo, ', ' ORDER BY slo) FILTER (WHERE meets_slo) OVER c AS slos_met,
    string_agg(slo, ', ' ORDER BY slo) FILTER (WHERE NOT meets_slo) OVER c AS slos_missed,
    coalesce(bool_and(meets_slo) OVER c, true) AS meets_all,
    row_number() OVER (c ORDER BY slo NULLS FIRST) = 1 AS is_first
FROM rows
WINDOW c AS (PARTITION BY scenario, pool)
ORDER BY scenario, pool_order NULLS LAST, pool, slo NULLS FIRST;

-- slo_capacity.sql
-- SLO capacity: in each sweep of a run, the highest concurrency cap and the highest
-- request rate that still meet every SLO (by default p99 TTFT <= 200 ms), the least swap
-- space and the fewest draft tokens per step (k) that do, and where each SLO, scoped ones
-- included (p99 TTFT of tenant chat), stands at each point.
-- Reads:   scenarios, sim_requests, runs, requests
-- Params:  run_id         VARCHAR  the replay run (NULL: the latest run)
--          slos           VARCHAR  the SLOs, a JSON list as `capacity` and `sweep` write them
--                                  in the runs row, e.g. '["ttft_p99<=200ms",
--                                  "ttft_p99@tenant=chat<=500ms", "tpot_p99@prompt>2000<=50ms"]'
--                                  (NULL: the run's own SLOs, from `sweep --slo` or
--                                  `capacity --slo` / [slo]; for a run without any, one TTFT
--                                  SLO from the next two parameters)
--          slo_ttft_s     DOUBLE   that TTFT SLO's limit in seconds (NULL: 0.2)
--          ttft_quantile  DOUBLE   which TTFT quantile it bounds (NULL: 0.99)
-- Grain:   one row per sweep point and SLO. A sweep is a set of two or more scenarios of
--          the run whose configurations are equal except for the swept knob: the
--          concurrency cap (max_num_seqs, max_batch_size) for a 'concurrency' sweep, the
--          arrival rate (rate, time_scale, num_requests, seed) for a 'rate' sweep, the host
--          swap space (swap_space_gb, of preemption_mode = "swap") for a 'swap_space'
--          sweep, speculative decoding's k ([speculative] num_tokens, its acceptance
--          as one rate) for a 'spec_k' sweep. The scenario name never counts.
-- Columns: sweep (concurrency | rate | swap_space | spec_k), sweep_id (1, 2, ... within
--          each kind), sweep_label
--          (what the sweep holds fixed: each configuration key that varies across the run,
--          but the swept knob, at this sweep's value, as run_scenarios.sql's label:
--          'max_num_batched_tokens=2048, policy=vllm'; 'no other key varies'), num_points (scenarios in the sweep), scenario,
--          value (max_concurrency, offered requests/s, swap GiB per GPU, or k),
--          num_requests, slo (its name,
--          e.g. ttft_p99@tenant=chat), slo_label (e.g. 'ttft_p99 of tenant=chat <= 500ms'),
--          scope (tenant=chat, model=..., prompt<=N, prompt>N; null: every request),
--          limit_s, scope_requests (completed requests in the scope with the metric),
--          measured_s (the statistic over them; null when there are none), meets_slo
--          (measured_s <= limit_s; an SLO with no request to judge is met), meets_all
--          (every SLO met at this point), slos_met, slos_missed (names, comma-separated),
--          slos (every SLO with its limit), capacity (the sweep's highest value that meets
--          every SLO, the lowest for swap_space and spec_k: the least host memory or
--          drafting that does; null when none does), capacity_scenario, capacity_measured_s (this
--          SLO's statistic there), is_capacity (this row is that point), is_first (the
--          sweep's first row: one row per sweep for a summary)
-- Statistics as in `capacity`: p<q> interpolates linearly (numpy's default, DuckDB's
-- quantile_cont), mean is the mean; requests without the metric (TPOT of a one-token
-- output) are left out. A scope on tenant or model reads it from `requests`, by the
-- request id (a '#n' suffix, from drawing with replacement, dropped).
-- NOTE: to add an explicit sweep table later, replace the `points` and `sweeps` CTEs;
-- the capacity logic below them stays.
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
written AS (
    SELECT
        trim(p['name']) AS slo,
        p['num']::DOUBLE * CASE p['unit'] WHEN 'us' THEN 1e-6 WHEN 'ms' THEN 1e-3 ELSE 1.0 END
            AS limit_s
    FROM split
    WHERE p['name'] <> ''
    UNION ALL
    SELECT
        'ttft_p' || printf('%g', 100 * coalesce(getvariable('ttft_quantile')::DOUBLE, 0.99)),
        coalesce(getvariable('slo_ttft_s')::DOUBLE, 0.2)
    WHERE NOT EXISTS (SELECT 1 FROM texts)
),
slo_list AS (
    SELECT
        slo, limit_s,
        regexp_extract(slo, '^([a-z0-9]+)_', 1)                        AS metric,
        regexp_extract(slo, '^[a-z0-9]+_(p[0-9.]+|mean)', 1)           AS stat,
        nullif(regexp_extract(slo, '@(.+)$', 1), '')                   AS scope,
        CASE WHEN slo LIKE '%@tenant=%' THEN 'tenant'
             WHEN slo LIKE '%@model=%' THEN 'model'
             WHEN slo LIKE '%@prompt%' THEN 'prompt' END                AS dim,
        CASE WHEN slo LIKE '%@prompt<=%' THEN '<=' WHEN slo LIKE '%@prompt>%' THEN '>' END
                                                                       AS op,
        regexp_extract(slo, '@(?:tenant|model)=(.+)$', 1)              AS group_name,
        TRY_CAST(regexp_extract(slo, '@prompt(?:<=|>)([0-9]+)$', 1) AS BIGINT)
                                                                       AS prompt_limit,
        TRY_CAST(regexp_extract(slo, '^[a-z0-9]+_p([0-9.]+)', 1) AS DOUBLE) / 100 AS q,
        row_number() OVER (ORDER BY slo)                               AS id
    FROM written
),
sims AS NOT MATERIALIZED (
    SELECT scenario, request_id, prompt_tokens, ttft_s, tpot_s, e2e_s, queue_s
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
),
-- the requests of each tenant or model a scope names; without such a scope this is empty
-- and the request ids of sim_requests are never read
in_group AS (
    SELECT r.request_id, l.slo
    FROM requests AS r JOIN slo_list AS l ON l.dim = 'tenant' AND r.tenant = l.group_name
    UNION ALL
    SELECT r.request_id, l.slo
    FROM requests AS r JOIN slo_list AS l ON l.dim = 'model' AND r.model = l.group_name
),
-- (scenario, SLO, the request's value of the SLO's metric) for every request an SLO judges.
-- NOTE: an SLO on every request has a branch per metric, so that only the columns the SLOs
-- name are read and no row is tested; a branch whose SLO list is empty ends before it
-- scans (so do the prompt and group branches without such a scope)
metric_values AS (
    SELECT s.scenario, l.id, s.ttft_s AS v
    FROM sims AS s, (SELECT id FROM slo_list WHERE dim IS NULL AND metric = 'ttft') AS l
    UNION ALL
    SELECT s.scenario, l.id, s.tpot_s AS v
    FROM sims AS s, (SELECT id FROM slo_list WHERE dim IS NULL AND metric = 'tpot') AS l
    UNION ALL
    SELECT s.scenario, l.id, s.e2e_s AS v
    FROM sims AS s, (SELECT id FROM slo_list WHERE dim IS NULL AND metric = 'e2e') AS l
    UNION ALL
    SELECT s.scenario, l.id, s.queue_s AS v
    FROM sims AS s, (SELECT id FROM slo_list WHERE dim IS NULL AND metric = 'queue') AS l
    UNION ALL
    SELECT s.scenario, l.id,
           CASE l.metric WHEN 'ttft' THEN s.ttft_s WHEN 'tpot' THEN s.tpot_s
                         WHEN 'e2e' THEN s.e2e_s WHEN 'queue' THEN s.queue_s END AS v
    FROM sims AS s, (SELECT * FROM slo_list WHERE dim = 'prompt') AS l
    WHERE (l.op = '<=' AND s.prompt_tokens <= l.prompt_limit)
       OR (l.op = '>' AND s.prompt_tokens > l.prompt_limit)
    UNION ALL
    SELECT s.scenario, l.id,
           CASE l.metric WHEN 'ttft' THEN s.ttft_s WHEN 'tpot' THEN s.tpot_s
                         WHEN 'e2e' THEN s.e2e_s WHEN 'queue' THEN s.queue_s END AS v
    FROM sims AS s
    JOIN in_group AS g ON g.request_id = split_part(s.request_id, '#', 1)
    JOIN slo_list AS l ON l.slo = g.slo
),
-- NOTE: quantile_cont takes constant quantiles and the SLOs' differ: the usual ones are
-- selected in one call (no full sort); only an SLO on another percentile has its values
-- sorted into a list, read at (n - 1) q as quantile_cont interpolates
aggregated AS (
    SELECT
        m.scenario, m.id,
        count(m.v)                                                AS scope_requests,
        avg(m.v)                                                  AS mean_v,
        quantile_cont(m.v, [0.5, 0.75, 0.9, 0.95, 0.99, 0.999])   AS usual,
        list(m.v) FILTER (WHERE m.id IN (SELECT id FROM slo_list
                                         WHERE q NOT IN (0.5, 0.75, 0.9, 0.95, 0.99, 0.999)))
                                                                  AS other
    FROM metric_values AS m
    WHERE m.v IS NOT NULL
    GROUP BY m.scenario, m.id
),
stats AS (
    SELECT a.*, l.slo, l.stat, l.q FROM aggregated AS a JOIN slo_list AS l USING (id)
),
at_rank AS (
    SELECT *, list_sort(other) AS vs, (len(other) - 1) * q AS h FROM stats
),
measured AS (
    SELECT
        scenario, slo, scope_requests,
        CASE WHEN stat = 'mean' THEN mean_v
             WHEN list_position([0.5, 0.75, 0.9, 0.95, 0.99, 0.999], q) IS NOT NULL
                 THEN usual[list_position([0.5, 0.75, 0.9, 0.95, 0.99, 0.999], q)]
             ELSE vs[floor(h)::BIGINT + 1]
                  + (h - floor(h)) * (vs[least(floor(h)::BIGINT + 2, len(vs))]
                                      - vs[floor(h)::BIGINT + 1]) END AS measured_s
    FROM at_rank
),
served AS (
    SELECT
        scenario,
        count(*)                                              AS num_requests,
        count(*) / nullif(max(arrival_s) - min(arrival_s), 0) AS offered_requests_per_s
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY scenario
),
points AS (
    SELECT
        s.scenario, s.policy, s.replicas, s.profile, s.config_json,
        coalesce(TRY_CAST(s.config_json ->> 'max_num_seqs' AS BIGINT),
                 TRY_CAST(s.config_json ->> 'max_batch_size' AS BIGINT)) AS max_concurrency,
        CASE WHEN s.config_json ->> 'preemption_mode' = 'swap'
             THEN TRY_CAST(s.config_json ->> 'swap_space_gb' AS DOUBLE) END AS swap_space_gb,
        TRY_CAST(s.config_json ->> '$.speculative.num_tokens' AS BIGINT) AS spec_k,
        v.offered_requests_per_s, v.num_requests
    FROM scenarios AS s
    JOIN served AS v USING (scenario)
    WHERE s.run_id = (SELECT run_id FROM run)
),
-- the run's varying keys, as run_scenarios.sql finds them: every top-level configuration
-- key whose value differs between the scenarios that have it
kv AS (
    SELECT
        p.scenario, k.key,
        CASE WHEN json_type(p.config_json -> k.key) = 'DOUBLE'
             THEN printf('%.4g', (p.config_json ->> k.key)::DOUBLE)
             ELSE p.config_json ->> k.key END AS value
    FROM points AS p, unnest(json_keys(p.config_json)) AS k(key)
    WHERE k.key NOT IN ('name', 'description', 'num_kv_blocks', 'cost', 'frontend',
                        'cost_uncertainty_source')
),
varying AS (
    SELECT key
    FROM kv
    GROUP BY key
    HAVING count(DISTINCT value) + max(CASE WHEN value IS NULL THEN 1 ELSE 0 END) > 1
),
-- per scenario and sweep kind: the varying keys that kind of sweep holds fixed, at this
-- scenario's values ('max_num_batched_tokens=2048, policy=vllm')
held AS (
    SELECT
        p.scenario, kind.sweep,
        string_agg(
            CASE WHEN kv.value IS NULL THEN v.key || ' unset' ELSE v.key || '=' || kv.value END,
            ', ' ORDER BY v.key <> 'policy', v.key)
            FILTER (WHERE NOT list_contains(kind.knobs, v.key)) AS label
    FROM points AS p
    CROSS JOIN (VALUES ('concurrency', ['max_num_seqs', 'max_batch_size']),
                       ('rate', ['rate', 'time_scale', 'num_requests', 'seed']),
                       ('swap_space', ['swap_space_gb', 'swap_host_blocks']),
                       ('spec_k', ['speculative'])) AS kind(sweep, knobs)
    CROSS JOIN varying AS v
    JOIN kv ON kv.scenario = p.scenario AND kv.key = v.key
    GROUP BY p.scenario, kind.sweep
),
sweeps AS (
    SELECT
        'concurrency' AS sweep,
        json_merge_patch(config_json,
            '{"name": null, "max_num_seqs": null, "max_batch_size": null}')::VARCHAR AS base,
        scenario, max_concurrency::DOUBLE AS value, num_requests
    FROM points
    WHERE max_concurrency IS NOT NULL
    UNION ALL
    SELECT
        'rate' AS sweep,
        json_merge_patch(config_json,
            '{"name": null, "rate": null, "time_scale": null, "num_requests": null, "seed": null}'
        )::VARCHAR AS base,
        scenario, offered_requests_per_s AS value, num_requests
    FROM points
    WHERE offered_requests_per_s IS NOT NULL
    UNION ALL
    SELECT
        'swap_space' AS sweep,
        json_merge_patch(config_json,
            '{"name": null, "swap_space_gb": null, "swap_host_blocks": null}')::VARCHAR AS base,
        scenario, swap_space_gb AS value, num_requests
    FROM points
    WHERE swap_space_gb IS NOT NULL
    UNION ALL
    -- k and the acceptance's list of k rates go; one rate at every position stays
    SELECT
        'spec_k' AS sweep,
        json_merge_patch(config_json, json_object('name', NULL, 'speculative', json_object(
            'num_tokens', NULL,
            'acceptance', to_json(list_sort(list_distinct(from_json(
                config_json -> '$.speculative.acceptance', '["DOUBLE"]')))))))::VARCHAR AS base,
        scenario, spec_k::DOUBLE AS value, num_requests
    FROM points
    WHERE spec_k IS NOT NULL
),
labelled AS (
    SELECT w.*, coalesce(nullif(h.label, ''), 'no other key varies') AS sweep_label
    FROM sweeps AS w
    LEFT JOIN held AS h USING (scenario, sweep)
),
swept AS (
    SELECT *, count(DISTINCT value) OVER (PARTITION BY sweep, base) AS num_values
    FROM labelled
),
-- every sweep point with every SLO, and whether the point meets it
point_slos AS (
    SELECT
        w.*, l.slo, l.scope, l.limit_s,
        coalesce(m.scope_requests, 0) AS scope_requests,
        m.measured_s,
        coalesce(m.measured_s <= l.limit_s, true) AS meets_slo,
        regexp_extract(l.slo, '^([a-z0-9]+_[a-z0-9.]+)', 1)
            || CASE WHEN l.scope IS NULL THEN '' ELSE ' of ' || l.scope END || ' <= '
            || CASE WHEN l.limit_s >= 1 THEN printf('%gs', l.limit_s)
                    WHEN l.limit_s >= 1e-3 THEN printf('%gms', l.limit_s * 1e3)
                    ELSE printf('%gus', l.limit_s * 1e6) END AS slo_label
    FROM swept AS w
    CROSS JOIN slo_list AS l
    LEFT JOIN measured AS m ON m.scenario = w.scenario AND m.slo = l.slo
    WHERE w.num_values >= 2
),
per_point AS (
    SELECT
        *,
        bool_and(meets_slo) OVER p AS meets_all,
        string_agg(slo, ', ' ORDER BY slo) FILTER (WHERE meets_slo) OVER p AS slos_met,
        string_agg(slo, ', ' ORDER BY slo) FILTER (WHERE NOT meets_slo) OVER p AS slos_missed,
        string_agg(slo_label, ', ' ORDER BY slo) OVER p AS slos
    FROM point_slos
    WINDOW p AS (PARTITION BY sweep, base, scenario)
),
judged AS (
    SELECT
        sweep,
        dense_rank() OVER (PARTITION BY sweep ORDER BY base) AS sweep_id,
        first(sweep_label ORDER BY value) OVER w AS sweep_label,
        count(DISTINCT scenario) OVER (PARTITION BY sweep, base) AS num_points,
        scenario, value, num_requests, slo, slo_label, scope, limit_s, scope_requests,
        measured_s, meets_slo, meets_all, slos_met, slos_missed, slos,
        -- a load knob: its highest value meeting every SLO; a resource knob (swap space,
        -- k): its lowest
        CASE WHEN sweep IN ('swap_space', 'spec_k')
             THEN min(value) FILTER (WHERE meets_all) OVER w
             ELSE max(value) FILTER (WHERE meets_all) OVER w END AS capacity,
        CASE WHEN sweep IN ('swap_space', 'spec_k')
             THEN arg_min(scenario, value) FILTER (WHERE meets_all) OVER w
             ELSE arg_max(scenario, value) FILTER (WHERE meets_all) OVER w END
            AS capacity_scenario,
        CASE WHEN sweep IN ('swap_space', 'spec_k')
             THEN arg_min(measured_s, value) FILTER (WHERE meets_all) OVER w
             ELSE arg_max(measured_s, value) FILTER (WHERE meets_all) OVER w END
            AS capacity_measured_s,
        row_number() OVER (PARTITION BY sweep, base ORDER BY value, scenario, slo) = 1
            AS is_first
    FROM per_point
    WINDOW w AS (PARTITION BY sweep, base, slo)
)
SELECT
    sweep, sweep_id, sweep_label, num_points, scenario, value, num_requests, slo, slo_label,
    scope, limit_s, scope_requests, measured_s, meets_slo, meets_all, slos_met, slos_missed,
    slos, capacity, capacity_scenario, capacity_measured_s,
    coalesce(value = capacity, false) AS is_capacity,
    is_first
FROM judged
ORDER BY sweep, sweep_id, value, scenario, slo;

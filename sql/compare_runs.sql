-- compare_runs.sql
-- How does run B differ from run A: throughput, TTFT/TPOT percentiles, preemptions,
-- prefix-cache hits and capacity answers, scenario by scenario, with signed changes?
-- Reads:   sim_requests, scenarios, capacity_search
-- Params:  run_id          VARCHAR  run A, the baseline (NULL: the latest run)
--          compare_run_id  VARCHAR  run B (NULL: the latest run before run A)
--          prices_json     VARCHAR  dollars per GPU-hour per GPU kind, as for cost.sql
--                                   (NULL: no price, so no cost metrics)
--          pairs_json      VARCHAR  which scenario of A pairs with which of B, as a JSON
--                                   list of [name in A, name in B] (`compare` works it
--                                   out: --by, --pair); NULL: by name, and two runs of one
--                                   scenario each pair whatever their names
-- Grain:   one row per scenario and metric; a scenario no pair names comes alone (the
--          other run's values null); capacity answers come as scenario '(capacity)' and
--          metric capacity_<search>
-- Columns: run_a, run_b, scenario (name in A, else in B), scenario_b (its name in B),
--          metric, value_a, value_b (null: the scenario or metric is missing from that
--          run), change (B - A), relative_change ((B - A) / |A|; null when A is 0 or
--          missing), metric_order (the order to show metrics in)
WITH ids AS (
    SELECT DISTINCT run_id FROM sim_requests
    UNION
    SELECT DISTINCT run_id FROM capacity_search
),
a AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM ids)) AS run_id
),
b AS (
    SELECT coalesce(getvariable('compare_run_id')::VARCHAR,
                    (SELECT max(run_id) FROM ids WHERE run_id < (SELECT run_id FROM a)))
               AS run_id
),
per_scenario AS (
    SELECT
        run_id, scenario,
        count(*)::DOUBLE                                                 AS num_requests,
        count(*) / nullif(max(finished_s) - min(arrival_s), 0)           AS requests_per_s,
        sum(output_tokens) / nullif(max(finished_s) - min(arrival_s), 0) AS output_tokens_per_s,
        quantile_cont(ttft_s, [0.50, 0.90, 0.99])                        AS ttft_q,
        quantile_cont(tpot_s, [0.50, 0.99])                              AS tpot_q,
        sum(num_preemptions)::DOUBLE                                     AS num_preemptions,
        sum(cached_tokens) / nullif(sum(prompt_tokens), 0)               AS prefix_hit_rate,
        sum(prompt_tokens + output_tokens) / nullif(max(finished_s) - min(arrival_s), 0)
                                                                         AS total_tokens_per_s
    FROM sim_requests
    WHERE run_id IN ((SELECT run_id FROM a), (SELECT run_id FROM b))
    GROUP BY run_id, scenario
),
priced AS (
    SELECT
        run_id, scenario,
        replicas * coalesce(TRY_CAST(nullif(regexp_extract(profile, '_tp(\d+)$', 1), '')
                                     AS INTEGER), 1)
        * coalesce(
            TRY_CAST(getvariable('prices_json')::JSON
                     ->> nullif(regexp_extract(profile, '_([a-z0-9][a-z0-9-]*)_tp(\d+)$', 1), '')
                     AS DOUBLE),
            TRY_CAST(getvariable('prices_json')::JSON ->> '*' AS DOUBLE)) AS usd_per_hour
    FROM scenarios
    WHERE run_id IN ((SELECT run_id FROM a), (SELECT run_id FROM b))
),
long AS (
    SELECT run_id, scenario, metric, value, metric_order
    FROM per_scenario LEFT JOIN priced USING (run_id, scenario),
    LATERAL (VALUES
        ('num_requests', num_requests, 1),
        ('requests_per_s', requests_per_s, 2),
        ('output_tokens_per_s', output_tokens_per_s, 3),
        ('p50_ttft_s', ttft_q[1], 4),
        ('p90_ttft_s', ttft_q[2], 5),
        ('p99_ttft_s', ttft_q[3], 6),
        ('p50_tpot_s', tpot_q[1], 7),
        ('p99_tpot_s', tpot_q[2], 8),
        ('num_preemptions', num_preemptions, 9),
        ('prefix_hit_rate', prefix_hit_rate, 10),
        ('usd_per_hour', usd_per_hour, 11),
        ('usd_per_1m_output_tokens',
         usd_per_hour / nullif(output_tokens_per_s * 3600, 0) * 1e6, 12),
        ('usd_per_1m_total_tokens', usd_per_hour / nullif(total_tokens_per_s * 3600, 0) * 1e6, 13)
    ) AS m(metric, value, metric_order)
    WHERE metric NOT LIKE 'usd%' OR getvariable('prices_json') IS NOT NULL
    UNION ALL
    SELECT run_id, '(capacity)', 'capacity_' || search, any_value(answer),
           20 + CASE search WHEN 'concurrency' THEN 1 WHEN 'rate' THEN 2 ELSE 3 END
    FROM capacity_search
    WHERE run_id IN ((SELECT run_id FROM a), (SELECT run_id FROM b))
    GROUP BY run_id, search
),
single AS (
    -- two runs of one scenario each: pair them whatever their names
    SELECT count(DISTINCT scenario) FILTER (WHERE run_id = (SELECT run_id FROM a)) = 1
       AND count(DISTINCT scenario) FILTER (WHERE run_id = (SELECT run_id FROM b)) = 1
               AS yes
    FROM long WHERE scenario <> '(capacity)'
),
given AS (
    SELECT p[1] AS scenario_a, p[2] AS scenario_b
    FROM (SELECT unnest(from_json(getvariable('pairs_json'), '[["VARCHAR"]]')) AS p)
),
keyed AS (
    SELECT *,
        CASE
            WHEN scenario = '(capacity)' THEN scenario
            WHEN getvariable('pairs_json') IS NULL THEN
                CASE WHEN (SELECT yes FROM single) THEN '' ELSE scenario END
            WHEN run_id = (SELECT run_id FROM a) THEN
                coalesce((SELECT any_value(scenario_a) FROM given WHERE scenario_a = scenario),
                         'A only: ' || scenario)
            ELSE coalesce((SELECT any_value(scenario_a) FROM given WHERE scenario_b = scenario),
                          'B only: ' || scenario)
        END AS pair
    FROM long
),
la AS (SELECT * FROM keyed WHERE run_id = (SELECT run_id FROM a)),
lb AS (SELECT * FROM keyed WHERE run_id = (SELECT run_id FROM b))
SELECT
    (SELECT run_id FROM a)                          AS run_a,
    (SELECT run_id FROM b)                          AS run_b,
    coalesce(la.scenario, lb.scenario)              AS scenario,
    lb.scenario                                     AS scenario_b,
    coalesce(la.metric, lb.metric)                  AS metric,
    la.value                                        AS value_a,
    lb.value                                        AS value_b,
    lb.value - la.value                             AS change,
    (lb.value - la.value) / nullif(abs(la.value), 0) AS relative_change,
    coalesce(la.metric_order, lb.metric_order)      AS metric_order
FROM la
FULL OUTER JOIN lb ON la.pair = lb.pair AND la.metric = lb.metric
ORDER BY scenario, metric_order;

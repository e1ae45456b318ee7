-- slo_capacity.sql
-- SLO capacity: in each sweep of a run, the highest concurrency cap and the highest
-- request rate whose tail TTFT still meets the objective (p99 TTFT <= 200 ms by default).
-- Reads:   scenarios, sim_requests
-- Params:  run_id         VARCHAR  the replay run (NULL: the latest run)
--          slo_ttft_s     DOUBLE   the TTFT objective in seconds (NULL: 0.2)
--          ttft_quantile  DOUBLE   which TTFT quantile must meet it (NULL: 0.99)
-- Grain:   one row per sweep point. A sweep is a set of two or more scenarios of the run
--          whose configurations are equal except for the swept knob: the concurrency cap
--          (max_num_seqs, max_batch_size) for a 'concurrency' sweep, the arrival rate
--          (rate, time_scale, num_requests, seed) for a 'rate' sweep. The scenario name
--          never counts.
-- Columns: sweep (concurrency | rate), sweep_id (1, 2, ... within each kind), sweep_label
--          (what the sweep holds fixed), num_points (scenarios in the sweep), scenario,
--          value (max_concurrency, or offered requests/s), num_requests, ttft_q_s (the
--          TTFT quantile), meets_slo, capacity (the sweep's highest value that meets the
--          SLO; null when none does), capacity_scenario, capacity_ttft_q_s (the
--          scenario at that point and its TTFT quantile), is_capacity (this row is that
--          point), is_first (the sweep's first row: one row per sweep for a summary)
-- NOTE: to add an explicit sweep table later, replace the `points` and `sweeps` CTEs;
-- the capacity logic below them stays.
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
params AS (
    SELECT
        coalesce(getvariable('slo_ttft_s')::DOUBLE, 0.2) AS slo_ttft_s
),
served AS (
    SELECT
        scenario,
        count(*)                                              AS num_requests,
        count(*) / nullif(max(arrival_s) - min(arrival_s), 0) AS offered_requests_per_s,
        quantile_cont(ttft_s, coalesce(getvariable('ttft_quantile')::DOUBLE, 0.99))         AS ttft_q_s
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY scenario
),
points AS (
    SELECT
        s.scenario, s.policy, s.replicas, s.profile, s.config_json,
        coalesce(TRY_CAST(s.config_json ->> 'max_num_seqs' AS BIGINT),
                 TRY_CAST(s.config_json ->> 'max_batch_size' AS BIGINT)) AS max_concurrency,
        v.offered_requests_per_s, v.num_requests, v.ttft_q_s
    FROM scenarios AS s
    JOIN served AS v USING (scenario)
    WHERE s.run_id = (SELECT run_id FROM run)
),
sweeps AS (
    SELECT
        'concurrency' AS sweep,
        json_merge_patch(config_json,
            '{"name": null, "max_num_seqs": null, "max_batch_size": null}')::VARCHAR AS base,
        policy || ', ' || replicas || ' replica(s), ' || profile || ', '
            || round(offered_requests_per_s, 2) || ' req/s' AS sweep_label,
        scenario, max_concurrency::DOUBLE AS value, num_requests, ttft_q_s
    FROM points
    WHERE max_concurrency IS NOT NULL
    UNION ALL
    SELECT
        'rate' AS sweep,
        json_merge_patch(config_json,
            '{"name": null, "rate": null, "time_scale": null, "num_requests": null, "seed": null}'
        )::VARCHAR AS base,
        policy || ', ' || replicas || ' replica(s), ' || profile
            || coalesce(', cap ' || max_concurrency, '') AS sweep_label,
        scenario, offered_requests_per_s AS value, num_requests, ttft_q_s
    FROM points
    WHERE offered_requests_per_s IS NOT NULL
),
swept AS (
    SELECT *, count(DISTINCT value) OVER (PARTITION BY sweep, base) AS num_values
    FROM sweeps
),
judged AS (
    SELECT
        sweep,
        dense_rank() OVER (PARTITION BY sweep ORDER BY base) AS sweep_id,
        first(sweep_label ORDER BY value) OVER w AS sweep_label,
        count(*) OVER w AS num_points,
        scenario, value, num_requests, ttft_q_s,
        ttft_q_s <= (SELECT slo_ttft_s FROM params) AS meets_slo,
        max(value) FILTER (WHERE ttft_q_s <= (SELECT slo_ttft_s FROM params)) OVER w
            AS capacity,
        arg_max(scenario, value) FILTER (WHERE ttft_q_s <= (SELECT slo_ttft_s FROM params))
            OVER w AS capacity_scenario,
        arg_max(ttft_q_s, value) FILTER (WHERE ttft_q_s <= (SELECT slo_ttft_s FROM params))
            OVER w AS capacity_ttft_q_s,
        row_number() OVER (PARTITION BY sweep, base ORDER BY value, scenario) = 1 AS is_first
    FROM swept
    WHERE num_values >= 2
    WINDOW w AS (PARTITION BY sweep, base)
)
SELECT
    sweep, sweep_id, sweep_label, num_points, scenario, value, num_requests, ttft_q_s,
    meets_slo, capacity, capacity_scenario, capacity_ttft_q_s,
    coalesce(value = capacity, false) AS is_capacity,
    is_first
FROM judged
ORDER BY sweep, sweep_id, value, scenario;

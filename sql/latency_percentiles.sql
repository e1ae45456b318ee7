-- latency_percentiles.sql
-- What latency does each scenario give: TTFT, TPOT, E2E and queue-time percentiles, and
-- at which concurrency cap and offered load?
-- Reads:   sim_requests, scenarios
-- Params:  run_id  VARCHAR  the replay run (NULL: the latest run)
-- Grain:   one row per scenario
-- Columns: scenario, num_requests, p50_ttft_s, p90_ttft_s, p99_ttft_s, p50_tpot_s,
--          p99_tpot_s, p50_e2e_s, p99_e2e_s, p50_engine_ttft_s, p99_engine_ttft_s,
--          p99_queue_s, max_queue_depth,
--          num_preemptions, policy, replicas, max_concurrency (max_num_seqs, or
--          max_batch_size for static batching; null without a cap),
--          offered_requests_per_s (requests over the arrival span), mean_queue_depth (met
--          on arrival), p50_ttft_lo_s, p50_ttft_hi_s, p90_ttft_lo_s, p90_ttft_hi_s,
--          p99_ttft_lo_s, p99_ttft_hi_s, p50_tpot_lo_s, p50_tpot_hi_s, p99_tpot_lo_s,
--          p99_tpot_hi_s, p50_e2e_lo_s, p50_e2e_hi_s, p99_e2e_lo_s, p99_e2e_hi_s (the 90%
--          interval of each percentile, from the scenario's summary; null for a run
--          replayed without intervals, e.g. a sweep), interval_cost_sd_default (the
--          interval's profile term is a default: the profile states no calibration error)
-- Percentiles interpolate linearly (quantile_cont, numpy's default); TPOT leaves out
-- requests with one output token (tpot_s is null for them). TTFT, TPOT and E2E are what a
-- client sees (the engine's times plus the profile's front end); *_engine_ttft_s the
-- engine core's alone (null for runs written before the front end existed).
-- NOTE: the report draws "p99 TTFT against the concurrency cap" from these rows too, so
-- that the TTFT of 5M simulated requests is sorted once per report, not once per chart.
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
per_scenario AS (
    -- NOTE: one list of quantiles per column sorts each column once, not once per quantile
    SELECT
        scenario,
        count(*)                                    AS num_requests,
        quantile_cont(ttft_s, [0.50, 0.90, 0.99])   AS ttft_q,
        quantile_cont(tpot_s, [0.50, 0.99])         AS tpot_q,
        quantile_cont(e2e_s, [0.50, 0.99])          AS e2e_q,
        quantile_cont(engine_ttft_s, [0.50, 0.99])  AS engine_ttft_q,
        quantile_cont(queue_s, 0.99)                AS p99_queue_s,
        max(queue_depth_at_arrival)                 AS max_queue_depth,
        sum(num_preemptions)::BIGINT                AS num_preemptions,
        count(*) / nullif(max(arrival_s) - min(arrival_s), 0) AS offered_requests_per_s,
        avg(queue_depth_at_arrival)                 AS mean_queue_depth
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY scenario
)
SELECT
    v.scenario,
    v.num_requests,
    v.ttft_q[1] AS p50_ttft_s,
    v.ttft_q[2] AS p90_ttft_s,
    v.ttft_q[3] AS p99_ttft_s,
    v.tpot_q[1] AS p50_tpot_s,
    v.tpot_q[2] AS p99_tpot_s,
    v.e2e_q[1]  AS p50_e2e_s,
    v.e2e_q[2]  AS p99_e2e_s,
    v.engine_ttft_q[1] AS p50_engine_ttft_s,
    v.engine_ttft_q[2] AS p99_engine_ttft_s,
    v.p99_queue_s,
    v.max_queue_depth,
    v.num_preemptions,
    s.policy,
    s.replicas,
    coalesce(TRY_CAST(s.config_json ->> 'max_num_seqs' AS BIGINT),
             TRY_CAST(s.config_json ->> 'max_batch_size' AS BIGINT)) AS max_concurrency,
    v.offered_requests_per_s,
    v.mean_queue_depth,
    TRY_CAST(s.summary_json ->> '$.intervals.stats.ttft_p50_s.lo' AS DOUBLE) AS p50_ttft_lo_s,
    TRY_CAST(s.summary_json ->> '$.intervals.stats.ttft_p50_s.hi' AS DOUBLE) AS p50_ttft_hi_s,
    TRY_CAST(s.summary_json ->> '$.intervals.stats.ttft_p90_s.lo' AS DOUBLE) AS p90_ttft_lo_s,
    TRY_CAST(s.summary_json ->> '$.intervals.stats.ttft_p90_s.hi' AS DOUBLE) AS p90_ttft_hi_s,
    TRY_CAST(s.summary_json ->> '$.intervals.stats.ttft_p99_s.lo' AS DOUBLE) AS p99_ttft_lo_s,
    TRY_CAST(s.summary_json ->> '$.intervals.stats.ttft_p99_s.hi' AS DOUBLE) AS p99_ttft_hi_s,
    TRY_CAST(s.summary_json ->> '$.intervals.stats.tpot_p50_s.lo' AS DOUBLE) AS p50_tpot_lo_s,
    TRY_CAST(s.summary_json ->> '$.intervals.stats.tpot_p50_s.hi' AS DOUBLE) AS p50_tpot_hi_s,
    TRY_CAST(s.summary_json ->> '$.intervals.stats.tpot_p99_s.lo' AS DOUBLE) AS p99_tpot_lo_s,
    TRY_CAST(s.summary_json ->> '$.intervals.stats.tpot_p99_s.hi' AS DOUBLE) AS p99_tpot_hi_s,
    TRY_CAST(s.summary_json ->> '$.intervals.stats.e2e_p50_s.lo' AS DOUBLE) AS p50_e2e_lo_s,
    TRY_CAST(s.summary_json ->> '$.intervals.stats.e2e_p50_s.hi' AS DOUBLE) AS p50_e2e_hi_s,
    TRY_CAST(s.summary_json ->> '$.intervals.stats.e2e_p99_s.lo' AS DOUBLE) AS p99_e2e_lo_s,
    TRY_CAST(s.summary_json ->> '$.intervals.stats.e2e_p99_s.hi' AS DOUBLE) AS p99_e2e_hi_s,
    TRY_CAST(s.summary_json ->> '$.intervals.cost_sd_default' AS BOOLEAN)
        AS interval_cost_sd_default
FROM per_scenario AS v
LEFT JOIN scenarios AS s
    ON s.scenario = v.scenario AND s.run_id = (SELECT run_id FROM run)
ORDER BY v.scenario;

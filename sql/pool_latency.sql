-- pool_latency.sql
-- The view pool_latency: in each run and fleet scenario, per replica pool (its [[pool]]
-- tables), the pool's replicas and engine settings, how many requests it served and
-- completed, their TTFT, TPOT and E2E percentiles and its throughput, as the replay
-- summary gives them per pool.
-- Reads:   sim_requests, scenarios
-- Params:  none (a view: filter it, e.g. WHERE run_id = '...' AND scenario = 'split')
-- Grain:   one row per run, scenario and pool; a scenario without pools (sim_requests.pool
--          null) has no row here: its figures are latency_percentiles' and throughput's
-- Columns: run_id, scenario, pool, pool_order (its place among the scenario's [[pool]]
--          tables, from 1: the first match wins; from its config), policy, profile, replicas (the pool's,
--          from the scenario's summary), requests (replayed), completed, ttft_p50_s, ttft_p90_s,
--          ttft_p99_s, tpot_p50_s, tpot_p90_s, tpot_p99_s, e2e_p50_s, e2e_p90_s,
--          e2e_p99_s (over the completed requests; TPOT leaves out one-token outputs),
--          duration_s (the pool's first arrival to its last completion), requests_per_s,
--          output_tokens_per_s, total_tokens_per_s (completed requests' tokens per second
--          of duration_s, as the summary's throughput)
-- Percentiles interpolate linearly (quantile_cont, numpy's default). A pool's requests
-- are on the fleet's clock and its replicas are numbered after the pools before it.
-- NOTE: `tracereplay sql` and the report create this view after views.sql; in the duckdb
-- shell read this file after views.sql.
CREATE OR REPLACE VIEW pool_latency AS
WITH served AS (
    SELECT
        run_id, scenario, pool, prompt_tokens, output_tokens, arrival_s, finished_s,
        ttft_s, tpot_s, e2e_s,
        -- NOTE: not isnan(): DuckDB folds it to false from the Parquet statistics, which
        -- leave NaN out; the text of the value cannot be folded
        coalesce(finished_s::VARCHAR <> 'nan', false) AS done
    FROM sim_requests
    WHERE pool IS NOT NULL
),
-- NOTE: one list of quantiles per column sorts each column once, not once per quantile
per_pool AS (
    SELECT
        run_id, scenario, pool,
        count(*)                                                              AS requests,
        count(*) FILTER (WHERE done)                                          AS completed,
        quantile_cont(ttft_s, [0.50, 0.90, 0.99]) FILTER (WHERE done)         AS ttft_q,
        quantile_cont(tpot_s, [0.50, 0.90, 0.99]) FILTER (WHERE done)         AS tpot_q,
        quantile_cont(e2e_s, [0.50, 0.90, 0.99]) FILTER (WHERE done)          AS e2e_q,
        max(finished_s) FILTER (WHERE done) - min(arrival_s)                  AS duration_s,
        sum(output_tokens) FILTER (WHERE done)                                AS output_tokens,
        sum(prompt_tokens + output_tokens) FILTER (WHERE done)                AS total_tokens
    FROM served
    GROUP BY run_id, scenario, pool
),
-- the pool's entry of the scenario's summary, by a JSON pointer (any name: '~' and '/'
-- escaped as RFC 6901 says)
settings AS (
    SELECT
        p.run_id, p.scenario, p.pool,
        '/pools/' || replace(replace(p.pool, '~', '~0'), '/', '~1') AS ptr,
        s.summary_json, s.config_json
    FROM (SELECT DISTINCT run_id, scenario, pool FROM per_pool) AS p
    LEFT JOIN scenarios AS s USING (run_id, scenario)
)
SELECT
    p.run_id, p.scenario, p.pool,
    CASE WHEN json_valid(t.config_json)
         THEN list_position(json_extract_string(t.config_json, '$.pools[*].name'), p.pool) END
        AS pool_order,
    CASE WHEN json_valid(t.summary_json) THEN t.summary_json ->> (t.ptr || '/policy') END
        AS policy,
    CASE WHEN json_valid(t.summary_json) THEN t.summary_json ->> (t.ptr || '/profile') END
        AS profile,
    CASE WHEN json_valid(t.summary_json)
         THEN TRY_CAST(t.summary_json ->> (t.ptr || '/replicas') AS INTEGER) END AS replicas,
    p.requests, p.completed,
    p.ttft_q[1] AS ttft_p50_s,
    p.ttft_q[2] AS ttft_p90_s,
    p.ttft_q[3] AS ttft_p99_s,
    p.tpot_q[1] AS tpot_p50_s,
    p.tpot_q[2] AS tpot_p90_s,
    p.tpot_q[3] AS tpot_p99_s,
    p.e2e_q[1]  AS e2e_p50_s,
    p.e2e_q[2]  AS e2e_p90_s,
    p.e2e_q[3]  AS e2e_p99_s,
    p.duration_s,
    p.completed / nullif(p.duration_s, 0)          AS requests_per_s,
    p.output_tokens / nullif(p.duration_s, 0)      AS output_tokens_per_s,
    p.total_tokens / nullif(p.duration_s, 0)       AS total_tokens_per_s
FROM per_pool AS p
LEFT JOIN settings AS t USING (run_id, scenario, pool);

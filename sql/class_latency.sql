-- class_latency.sql
-- The view class_latency: in each run and scenario, per traffic class (each tenant, each
-- model), how many requests were replayed and completed, and their TTFT, TPOT, E2E and
-- queue-time percentiles, as the replay, sweep and capacity summaries give them per class.
-- Reads:   sim_requests, requests
-- Params:  none (a view: filter it, e.g. WHERE run_id = '...' AND class_kind = 'tenant')
-- Grain:   one row per run, scenario, class kind (tenant, model) and class; requests
--          without a tenant (or model) form the class '(none)'
-- Columns: run_id, scenario, class_kind (tenant | model), class_name, requests (replayed),
--          completed, ttft_p50_s, ttft_p90_s, ttft_p99_s, tpot_p50_s, tpot_p90_s,
--          tpot_p99_s, e2e_p50_s, e2e_p90_s, e2e_p99_s, queue_p50_s, queue_p90_s,
--          queue_p99_s (over the completed requests; TPOT leaves out one-token outputs)
-- Percentiles interpolate linearly (quantile_cont, numpy's default). A request's tenant and
-- model come from `requests` by its id (a '#n' suffix, from drawing with replacement,
-- dropped where the id itself is not found); a run replayed from a file outside the
-- warehouse finds none and shows only '(none)'.
-- NOTE: `tracereplay sql` and the report create this view after views.sql; in the duckdb
-- shell read this file after views.sql.
CREATE OR REPLACE VIEW class_latency AS
WITH req AS (
    SELECT request_id, any_value(tenant) AS tenant, any_value(model) AS model
    FROM requests
    GROUP BY request_id
),
keyed AS (
    SELECT
        s.*,
        CASE WHEN s.request_id IN (SELECT request_id FROM req) THEN s.request_id
             ELSE regexp_replace(s.request_id, '#[0-9]+$', '') END AS base_id
    FROM sim_requests AS s
),
labelled AS (
    SELECT
        k.run_id, k.scenario, r.tenant, r.model, k.ttft_s, k.tpot_s, k.e2e_s, k.queue_s,
        -- NOTE: not isnan(): DuckDB folds it to false from the Parquet statistics, which
        -- leave NaN out; the text of the value cannot be folded
        coalesce(k.finished_s::VARCHAR <> 'nan', false) AS done
    FROM keyed AS k
    LEFT JOIN req AS r ON r.request_id = k.base_id
),
long AS (
    SELECT run_id, scenario, 'tenant' AS class_kind, coalesce(tenant, '(none)') AS class_name,
           done, ttft_s, tpot_s, e2e_s, queue_s
    FROM labelled
    UNION ALL
    SELECT run_id, scenario, 'model' AS class_kind, coalesce(model, '(none)') AS class_name,
           done, ttft_s, tpot_s, e2e_s, queue_s
    FROM labelled
),
-- NOTE: one list of quantiles per column sorts each column once, not once per quantile
per_class AS (
    SELECT
        run_id, scenario, class_kind, class_name,
        count(*)                                                         AS requests,
        count(*) FILTER (WHERE done)                                     AS completed,
        quantile_cont(ttft_s, [0.50, 0.90, 0.99]) FILTER (WHERE done)    AS ttft_q,
        quantile_cont(tpot_s, [0.50, 0.90, 0.99]) FILTER (WHERE done)    AS tpot_q,
        quantile_cont(e2e_s, [0.50, 0.90, 0.99]) FILTER (WHERE done)     AS e2e_q,
        quantile_cont(queue_s, [0.50, 0.90, 0.99]) FILTER (WHERE done)   AS queue_q
    FROM long
    GROUP BY run_id, scenario, class_kind, class_name
)
SELECT
    run_id, scenario, class_kind, class_name, requests, completed,
    ttft_q[1]  AS ttft_p50_s,
    ttft_q[2]  AS ttft_p90_s,
    ttft_q[3]  AS ttft_p99_s,
    tpot_q[1]  AS tpot_p50_s,
    tpot_q[2]  AS tpot_p90_s,
    tpot_q[3]  AS tpot_p99_s,
    e2e_q[1]   AS e2e_p50_s,
    e2e_q[2]   AS e2e_p90_s,
    e2e_q[3]   AS e2e_p99_s,
    queue_q[1] AS queue_p50_s,
    queue_q[2] AS queue_p90_s,
    queue_q[3] AS queue_p99_s
FROM per_class;

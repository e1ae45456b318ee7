-- live_latency.sql
-- What latency and throughput did a live engine give: TTFT, TPOT and E2E percentiles?
-- Reads:   live_requests
-- Params:  run_id  VARCHAR  the live run (NULL: the latest live run)
-- Grain:   one row per live run's engine
-- Columns: run_id, engine, num_requests, num_ok, num_failed, duration_s,
--          request_throughput, output_token_throughput, p50_ttft_s, p90_ttft_s,
--          p99_ttft_s, mean_ttft_s, p50_tpot_s, p90_tpot_s, p99_tpot_s, mean_tpot_s,
--          p50_e2e_s, p99_e2e_s, max_late_s
-- Latencies and throughput count completed requests (ok) only, over the span from the
-- first arrival to the last completion (as replay's summary does); percentiles
-- interpolate linearly (quantile_cont). max_late_s: the longest a request was sent
-- after its arrival time (the client's own delay, failures included).
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM live_requests))
        AS run_id
),
per_engine AS (
    SELECT
        run_id,
        engine,
        count(*)                                                  AS num_requests,
        count(*) FILTER (WHERE ok)                                AS num_ok,
        max(finished_s) FILTER (WHERE ok) - min(arrival_s)        AS duration_s,
        sum(output_tokens_received) FILTER (WHERE ok)             AS ok_output_tokens,
        quantile_cont(ttft_s, [0.50, 0.90, 0.99]) FILTER (WHERE ok) AS ttft_q,
        avg(ttft_s) FILTER (WHERE ok)                             AS mean_ttft_s,
        quantile_cont(tpot_s, [0.50, 0.90, 0.99]) FILTER (WHERE ok) AS tpot_q,
        avg(tpot_s) FILTER (WHERE ok)                             AS mean_tpot_s,
        quantile_cont(e2e_s, [0.50, 0.99]) FILTER (WHERE ok)      AS e2e_q,
        max(sent_s - arrival_s)                                   AS max_late_s
    FROM live_requests
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY run_id, engine
)
SELECT
    run_id,
    engine,
    num_requests,
    num_ok,
    num_requests - num_ok                                    AS num_failed,
    duration_s,
    CASE WHEN duration_s > 0 THEN num_ok / duration_s END    AS request_throughput,
    CASE WHEN duration_s > 0 THEN ok_output_tokens / duration_s END AS output_token_throughput,
    ttft_q[1] AS p50_ttft_s,
    ttft_q[2] AS p90_ttft_s,
    ttft_q[3] AS p99_ttft_s,
    mean_ttft_s,
    tpot_q[1] AS p50_tpot_s,
    tpot_q[2] AS p90_tpot_s,
    tpot_q[3] AS p99_tpot_s,
    mean_tpot_s,
    e2e_q[1]  AS p50_e2e_s,
    e2e_q[2]  AS p99_e2e_s,
    max_late_s
FROM per_engine
ORDER BY engine;

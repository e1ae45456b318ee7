-- validation.sql
-- How far is the simulator from the live engine: TTFT, TPOT, E2E and throughput errors?
-- Reads:   validation
-- Params:  validation_run  VARCHAR  the validate run (NULL: the latest validate run)
-- Grain:   one row per metric and statistic
-- Columns: run_id, live_run_id, metric, stat, live, simulated, error, abs_error
-- error = simulated / live - 1 (negative: the simulator is faster than the engine).
-- Latencies are in seconds; throughputs per second (request_throughput in requests,
-- output_token_throughput in tokens), over the span from the first arrival to the last
-- completion. Rows come in a fixed order: ttft, tpot, e2e (p50, p90, p99, mean), then
-- the throughputs.
WITH run AS (
    SELECT coalesce(getvariable('validation_run')::VARCHAR, (SELECT max(run_id) FROM validation))
        AS run_id
)
SELECT
    v.run_id,
    v.live_run_id,
    v.metric,
    v.stat,
    v.live,
    v.simulated,
    v.error,
    abs(v.error) AS abs_error
FROM validation AS v
JOIN run USING (run_id)
ORDER BY
    list_position(['ttft', 'tpot', 'e2e', 'request_throughput', 'output_token_throughput'],
        v.metric),
    list_position(['p50', 'p90', 'p99', 'mean', 'overall'], v.stat);

-- prefill_decode.sql
-- Prefill and decode cost, separated: how much engine time goes to steps that compute
-- prompt tokens, and how much to pure decode steps, in each scenario of the latest sweep?
-- Reads:   runs, sim_steps, sim_requests
-- Params:  run_id  VARCHAR  the sweep run (NULL: the latest sweep)
-- Grain:   one row per scenario
-- Columns: scenario, prefill_tokens, decode_tokens, busy_s (engine time, all replicas),
--          prefill_step_s (steps that computed prompt tokens, decodes riding along),
--          decode_step_s (steps that only decoded), prefill_share (of busy_s),
--          prefill_ms_per_1k_tokens, decode_step_ms (mean time of a pure decode step),
--          ttft_p50_s, tpot_p50_s
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR,
                    (SELECT max(run_id) FROM runs WHERE command = 'sweep')) AS run_id
),
steps AS (
    SELECT
        scenario,
        sum(num_prefill_tokens * num_steps)                             AS prefill_tokens,
        sum(num_decode_tokens * num_steps)                              AS decode_tokens,
        sum(duration_s)                                                 AS busy_s,
        sum(duration_s) FILTER (WHERE num_prefill_tokens > 0)          AS prefill_step_s,
        sum(duration_s) FILTER (WHERE num_prefill_tokens = 0)          AS decode_step_s,
        sum(num_steps) FILTER (WHERE num_prefill_tokens = 0)           AS decode_steps
    FROM sim_steps
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY scenario
),
latency AS (
    SELECT scenario, median(ttft_s) AS ttft_p50_s, median(tpot_s) AS tpot_p50_s
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY scenario
)
SELECT
    scenario,
    prefill_tokens,
    decode_tokens,
    round(busy_s, 1)                                              AS busy_s,
    round(prefill_step_s, 1)                                      AS prefill_step_s,
    round(decode_step_s, 1)                                       AS decode_step_s,
    round(prefill_step_s / busy_s, 3)                             AS prefill_share,
    round(1e6 * prefill_step_s / nullif(prefill_tokens, 0), 1)    AS prefill_ms_per_1k_tokens,
    round(1e3 * decode_step_s / nullif(decode_steps, 0), 2)       AS decode_step_ms,
    round(ttft_p50_s, 3)                                          AS ttft_p50_s,
    round(tpot_p50_s, 4)                                          AS tpot_p50_s
FROM steps JOIN latency USING (scenario)
ORDER BY scenario;

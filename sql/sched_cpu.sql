-- sched_cpu.sql
-- How much scheduler CPU time did each scenario's engine steps pay, and how much of it
-- did the overlap of scheduling with the GPU hide?
-- Reads:   sim_steps, scenarios
-- Params:  run_id  VARCHAR  the replay run (NULL: the latest run)
-- Grain:   one row per scenario of the run whose steps carry scheduler CPU time (cost
--          model v4 with sched_cpu_s or sched_cpu_per_seq_s not 0; none otherwise)
-- Columns: scenario, policy, overlap (vllm async_scheduling, sglang overlap_schedule;
--          false for the synchronous engines), num_steps, busy_s (the steps' time, all
--          replicas), sched_cpu_s (CPU time of the steps), exposed_s (on the critical
--          path: all of it synchronous, what exceeded the GPU's time asynchronous),
--          hidden_s (sched_cpu_s - exposed_s), hidden_share (hidden_s / sched_cpu_s),
--          exposed_share (exposed_s / busy_s: the share of the step time the GPU waited
--          for the CPU)
-- See docs/replay.md, "Scheduler CPU time".
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
steps AS (
    SELECT scenario,
           sum(num_steps)::BIGINT AS num_steps,
           sum(duration_s) AS busy_s,
           sum(sched_cpu_s) AS sched_cpu_s,
           sum(sched_cpu_exposed_s) AS exposed_s
    FROM sim_steps
    WHERE run_id = (SELECT run_id FROM run)
    GROUP BY scenario
    HAVING sum(sched_cpu_s) > 0
),
config AS (
    SELECT scenario, policy,
           coalesce(TRY_CAST(config_json ->> 'async_scheduling' AS BOOLEAN),
                    TRY_CAST(config_json ->> 'overlap_schedule' AS BOOLEAN), false) AS overlap
    FROM scenarios
    WHERE run_id = (SELECT run_id FROM run) AND json_valid(config_json)
)
SELECT
    s.scenario, c.policy, c.overlap, s.num_steps, s.busy_s, s.sched_cpu_s, s.exposed_s,
    s.sched_cpu_s - s.exposed_s                   AS hidden_s,
    (s.sched_cpu_s - s.exposed_s) / s.sched_cpu_s AS hidden_share,
    s.exposed_s / nullif(s.busy_s, 0)             AS exposed_share
FROM steps AS s
LEFT JOIN config AS c USING (scenario)
ORDER BY s.scenario;

-- speculation.sql
-- How many draft tokens did speculative decoding verify, and accept, per step over
-- simulated time?
-- Reads:   sim_steps, scenarios
-- Params:  run_id    VARCHAR  the replay run (NULL: the latest run)
--          bucket_s  DOUBLE   bucket width in simulated seconds (NULL: the smallest round
--                             width that gives at most 300 buckets)
-- Grain:   one row per scenario and time bucket with at least one step that verified
--          drafts (no row for a scenario without a [speculative] table: its
--          num_draft_tokens are null); a row of sim_steps counts in the bucket where it
--          starts; all replicas of a scenario together
-- Columns: scenario, bucket_start_s, bucket_s, num_steps (steps that verified drafts),
--          draft_tokens, accepted_tokens, acceptance_rate (accepted_tokens /
--          draft_tokens: weighted by tokens, vLLM's
--          spec_decode_num_accepted_tokens_total / spec_decode_num_draft_tokens_total),
--          draft_per_step, accepted_per_step (tokens / num_steps), num_tokens (k),
--          method (the scenario's [speculative] table)
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
steps AS (
    SELECT scenario, start_s, duration_s, num_steps, num_draft_tokens, num_accepted_tokens
    FROM sim_steps
    WHERE run_id = (SELECT run_id FROM run) AND num_draft_tokens > 0
),
config AS (
    SELECT scenario,
           TRY_CAST(config_json ->> '$.speculative.num_tokens' AS BIGINT) AS num_tokens,
           config_json ->> '$.speculative.method' AS method
    FROM scenarios
    WHERE run_id = (SELECT run_id FROM run) AND json_valid(config_json)
),
width AS (
    SELECT coalesce(
        getvariable('bucket_s')::DOUBLE,
        (SELECT min(w) FROM unnest([0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900,
                                    1800, 3600, 7200, 10800, 21600, 43200, 86400]) AS u(w)
         WHERE w * 300 >= (SELECT max(start_s + duration_s) FROM steps)),
        86400.0) AS bucket_s
),
grouped AS (
    SELECT
        s.scenario,
        floor(s.start_s / w.bucket_s) * w.bucket_s          AS bucket_start_s,
        any_value(w.bucket_s)                               AS bucket_s,
        sum(s.num_steps)::BIGINT                            AS num_steps,
        sum(s.num_draft_tokens)::BIGINT                     AS draft_tokens,
        sum(coalesce(s.num_accepted_tokens, 0))::BIGINT     AS accepted_tokens
    FROM steps AS s, width AS w
    GROUP BY s.scenario, bucket_start_s
)
SELECT
    g.scenario, g.bucket_start_s, g.bucket_s, g.num_steps, g.draft_tokens, g.accepted_tokens,
    g.accepted_tokens / g.draft_tokens                      AS acceptance_rate,
    g.draft_tokens / g.num_steps                            AS draft_per_step,
    g.accepted_tokens / g.num_steps                         AS accepted_per_step,
    c.num_tokens, c.method
FROM grouped AS g
LEFT JOIN config AS c USING (scenario)
ORDER BY g.scenario, g.bucket_start_s;

-- capacity_search.sql
-- Where did each capacity search of a run end, and along which probes: the highest
-- concurrency cap and request rate, and the fewest replicas, that meet every SLO?
-- Reads:   capacity_search
-- Params:  run_id  VARCHAR  the capacity run (NULL: the latest capacity run)
--          slo     VARCHAR  only this SLO's rows, e.g. ttft_p99 (NULL: every SLO)
-- Grain:   one row per search, probe and SLO, ordered by search and knob value
-- Columns: search (concurrency | rate | replicas), knob (max_num_seqs, rate, replicas, ...),
--          probe (order within the search, 0 first), value (the knob at this probe;
--          requests/s for rate), scenario, slo (e.g. ttft_p99), limit_s, measured_s,
--          slo_met, met (every SLO met), offered_rate, request_throughput,
--          output_token_throughput, goodput (requests/s meeting every SLO),
--          num_preemptions, answer (null: nothing meets), is_answer, monotone, note
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR,
                    (SELECT max(run_id) FROM capacity_search)) AS run_id
)
SELECT
    search, knob, probe, value, scenario, slo, limit_s, measured_s, slo_met, met,
    offered_rate, request_throughput, output_token_throughput, goodput, num_preemptions,
    answer, is_answer, monotone, note
FROM capacity_search
WHERE run_id = (SELECT run_id FROM run)
  AND (getvariable('slo') IS NULL OR slo = getvariable('slo')::VARCHAR)
ORDER BY
    CASE search WHEN 'concurrency' THEN 1 WHEN 'rate' THEN 2 ELSE 3 END,
    value, slo;

-- capacity_search.sql
-- Where did each capacity search of a run end, and along which probes: the highest
-- concurrency cap and request rate, and the fewest replicas, that meet every SLO?
-- Reads:   capacity_search
-- Params:  run_id  VARCHAR  the capacity run (NULL: the latest capacity run)
--          slo     VARCHAR  only this SLO's rows, e.g. ttft_p99 (NULL: every SLO)
-- Grain:   one row per search, probe and SLO, ordered by search and probe: in the order
--          each search ran them (the interval's probes last)
-- Columns: search (concurrency | rate | replicas | swap_space), knob (max_num_seqs, rate,
--          replicas, swap_space_gb, ...),
--          probe (order within the search, 0 first), value (the knob at this probe;
--          requests/s for rate), scenario, slo (e.g. ttft_p99), limit_s, measured_s,
--          slo_met, met (every SLO met), offered_rate, request_throughput,
--          output_token_throughput, goodput (requests/s meeting every SLO),
--          num_preemptions, answer (null: nothing meets), is_answer, monotone, note,
--          probe_role (search: the bisection's; interval: made for the interval's ends),
--          measured_lo_s, measured_hi_s (measured_s's interval: the answer's relative spread
--          applied here), interval_level (0.9), answer_lo, answer_hi (the answer's
--          interval), answer_safe (the answer meets every SLO at its upper bounds too),
--          reversal_beyond_interval (verdicts against the search's shape that the interval
--          does not explain); the interval columns are null for runs without intervals
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR,
                    (SELECT max(run_id) FROM capacity_search)) AS run_id
)
SELECT
    search, knob, probe, value, scenario, slo, limit_s, measured_s, slo_met, met,
    offered_rate, request_throughput, output_token_throughput, goodput, num_preemptions,
    answer, is_answer, monotone, note,
    coalesce(probe_role, 'search') AS probe_role, measured_lo_s, measured_hi_s,
    interval_level, answer_lo, answer_hi, answer_safe, reversal_beyond_interval
FROM capacity_search
WHERE run_id = (SELECT run_id FROM run)
  AND (getvariable('slo') IS NULL OR slo = getvariable('slo')::VARCHAR)
ORDER BY
    CASE search WHEN 'concurrency' THEN 1 WHEN 'rate' THEN 2 WHEN 'replicas' THEN 3 ELSE 4 END,
    probe, slo;

-- capacity_answers.sql
-- What did each capacity search of a run find: under which SLOs, after how many probes,
-- which cap, rate or replica count, and the throughput and goodput there?
-- Reads:   capacity_search, scenarios
-- Params:  run_id       VARCHAR  the capacity run (NULL: the latest capacity run)
--          prices_json  VARCHAR  dollars per GPU-hour per GPU kind, as for cost.sql (NULL: no
--                                price, so the cost columns are null)
-- Grain:   one row per search (concurrency, rate, replicas, swap_space), in that order
-- Columns: search, knob, slos (every SLO of the run, e.g. ttft_p99<=200ms, tpot_p99<=40ms),
--          num_probes, answer (null: nothing in the range meets every SLO),
--          answer_scenario, replicas (of the answer's scenario), offered_rate,
--          request_throughput, output_token_throughput, goodput (requests/s meeting every
--          SLO, at the answer), gpus (replicas x tensor parallel there), usd_per_hour,
--          usd_per_1m_output_tokens (the deployment's cost at the answer), monotone, note
--          (range end, monotony, and for no answer the unloaded value of the failing SLO
--          and what sets it), answer_lo, answer_hi (the answer's interval; null: none in
--          the range, or a run without intervals), interval_level (0.9), answer_safe (the
--          answer meets every SLO at the upper bounds too), at_answer (each SLO there:
--          'ttft_p99 199.9 ms (162.0-252.1 ms)'), reversal_beyond_interval,
--          num_interval_probes (probes made for the interval's ends), cost_log_sd,
--          cost_sd_default (the profile term's sd, and whether it is a default because the
--          profile states none)
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR,
                    (SELECT max(run_id) FROM capacity_search)) AS run_id
),
rows AS (
    SELECT * FROM capacity_search WHERE run_id = (SELECT run_id FROM run)
),
slos AS (
    SELECT string_agg(label, ', ' ORDER BY label) AS slos
    FROM (SELECT DISTINCT slo || '<=' || CASE WHEN limit_s >= 1 THEN printf('%gs', limit_s)
                                              ELSE printf('%gms', limit_s * 1000) END AS label
          FROM rows)
),
searches AS (
    SELECT
        search, any_value(knob) AS knob,
        count(DISTINCT probe) FILTER (WHERE coalesce(probe_role, 'search') = 'search')
            AS num_probes,
        count(DISTINCT probe) FILTER (WHERE probe_role = 'interval') AS num_interval_probes,
        any_value(answer) AS answer, bool_and(monotone) AS monotone, any_value(note) AS note,
        any_value(answer_lo) AS answer_lo, any_value(answer_hi) AS answer_hi,
        any_value(interval_level) AS interval_level, bool_and(answer_safe) AS answer_safe,
        bool_or(reversal_beyond_interval) AS reversal_beyond_interval,
        any_value(cost_log_sd) AS cost_log_sd, bool_or(cost_sd_default) AS cost_sd_default,
        string_agg(slo || ' ' || printf('%.1f ms', measured_s * 1000)
                   || CASE WHEN measured_lo_s IS NULL THEN ''
                           ELSE printf(' (%.1f-%.1f ms)', measured_lo_s * 1000,
                                       measured_hi_s * 1000) END, ', ' ORDER BY slo)
            FILTER (WHERE is_answer AND measured_s IS NOT NULL) AS at_answer
    FROM rows
    GROUP BY search
),
at_answer AS (
    SELECT DISTINCT ON (search)
        search, scenario AS answer_scenario, offered_rate, request_throughput,
        output_token_throughput, goodput
    FROM rows
    WHERE is_answer
    ORDER BY search, probe
),
deployment AS (
    SELECT
        scenario, replicas,
        replicas * coalesce(TRY_CAST(nullif(regexp_extract(profile, '_tp(\d+)$', 1), '')
                                     AS INTEGER), 1) AS gpus,
        coalesce(
            TRY_CAST(getvariable('prices_json')::JSON
                     ->> nullif(regexp_extract(profile, '_([a-z0-9][a-z0-9-]*)_tp(\d+)$', 1), '')
                     AS DOUBLE),
            TRY_CAST(getvariable('prices_json')::JSON ->> '*' AS DOUBLE)) AS usd_per_gpu_hour
    FROM scenarios
    WHERE run_id = (SELECT run_id FROM run)
)
SELECT
    s.search, s.knob, (SELECT slos FROM slos) AS slos, s.num_probes, s.answer,
    a.answer_scenario, d.replicas, a.offered_rate, a.request_throughput,
    a.output_token_throughput, a.goodput, d.gpus,
    d.gpus * d.usd_per_gpu_hour AS usd_per_hour,
    d.gpus * d.usd_per_gpu_hour / nullif(a.output_token_throughput * 3600, 0) * 1e6
        AS usd_per_1m_output_tokens,
    s.monotone, s.note, s.answer_lo, s.answer_hi, s.interval_level, s.answer_safe,
    s.at_answer, s.reversal_beyond_interval, s.num_interval_probes, s.cost_log_sd,
    s.cost_sd_default
FROM searches AS s
LEFT JOIN at_answer AS a USING (search)
LEFT JOIN deployment AS d ON d.scenario = a.answer_scenario
ORDER BY CASE s.search WHEN 'concurrency' THEN 1 WHEN 'rate' THEN 2 WHEN 'replicas' THEN 3
              ELSE 4 END;

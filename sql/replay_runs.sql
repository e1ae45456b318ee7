-- replay_runs.sql
-- Which replay runs does the warehouse hold, newest first?
-- Reads:   scenarios, sim_requests, runs
-- Params:  none
-- Grain:   one row per replay run
-- Columns: run_id, started_at, version, num_scenarios, scenario_names, num_sim_requests,
--          rows_read (requests the run read, before any was dropped), inputs (JSON list
--          of the requests files it read), slos (the SLOs the run was judged by, a JSON
--          list as `sweep --slo`, `capacity --slo` or [slo] store them; NULL for a plain
--          replay)
SELECT
    s.run_id,
    any_value(r.started_at)                  AS started_at,
    any_value(r.version)                     AS version,
    count(*)                                 AS num_scenarios,
    string_agg(s.scenario, ', ' ORDER BY s.scenario) AS scenario_names,
    (SELECT count(*) FROM sim_requests AS q WHERE q.run_id = s.run_id) AS num_sim_requests,
    any_value(r.rows_read)                   AS rows_read,
    any_value(r.inputs)                      AS inputs,
    any_value(CASE WHEN json_valid(r.details) THEN (r.details -> 'slos')::VARCHAR END) AS slos
FROM scenarios AS s
LEFT JOIN runs AS r USING (run_id)
GROUP BY s.run_id
ORDER BY s.run_id DESC;

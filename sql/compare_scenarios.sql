-- compare_scenarios.sql
-- Which scenarios did two runs replay, each in the order its run replayed them (what
-- `compare --by position` pairs)?
-- Reads:   scenarios, sim_requests
-- Params:  run_id          VARCHAR  run A, the baseline (NULL: the latest run)
--          compare_run_id  VARCHAR  run B (NULL: the latest run before run A)
-- Grain:   one row per run and scenario
-- Columns: run_id, scenario, position (1 = the run's first scenario)
-- NOTE: a run writes its scenarios in the order it replayed them (a sweep: its grid's
-- order), so the position is the row's place in the run's scenarios file; a scenario with
-- simulated requests and no scenarios row comes after those, by name.
WITH ids AS (
    SELECT DISTINCT run_id FROM scenarios
),
a AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM ids)) AS run_id
),
b AS (
    SELECT coalesce(getvariable('compare_run_id')::VARCHAR,
                    (SELECT max(run_id) FROM ids WHERE run_id < (SELECT run_id FROM a)))
               AS run_id
),
listed AS (
    SELECT run_id, scenario, row_number() OVER () AS seen
    FROM scenarios
    WHERE run_id IN ((SELECT run_id FROM a), (SELECT run_id FROM b))
),
rows AS (
    SELECT * FROM listed
    UNION ALL
    SELECT run_id, scenario,
           (SELECT count(*) FROM listed) + row_number() OVER (ORDER BY run_id, scenario)
    FROM (SELECT DISTINCT run_id, scenario FROM sim_requests
          WHERE run_id IN ((SELECT run_id FROM a), (SELECT run_id FROM b))) AS r
    WHERE NOT EXISTS (SELECT 1 FROM listed AS l
                      WHERE l.run_id = r.run_id AND l.scenario = r.scenario)
)
SELECT run_id, scenario, row_number() OVER (PARTITION BY run_id ORDER BY seen) AS position
FROM rows
ORDER BY run_id, position;

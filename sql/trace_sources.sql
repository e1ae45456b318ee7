-- trace_sources.sql
-- Which log files does the trace come from, in which format, covering which times?
-- Reads:   requests, sim_requests, quarantine
-- Params:  run_id  VARCHAR  only the requests this replay run replayed (NULL: every request)
-- Grain:   one row per source file, the largest first
-- Columns: source_file, source_format, num_requests, num_quarantined,
--          first_arrival_time, last_arrival_time
WITH trace AS (
    SELECT *
    FROM requests
    WHERE getvariable('run_id') IS NULL
       OR request_id IN (
           SELECT request_id FROM sim_requests WHERE run_id = getvariable('run_id')::VARCHAR)
),
files AS (
    SELECT
        source_file,
        any_value(source_format) AS source_format,
        count(*)                 AS num_requests,
        min(arrival_time)        AS first_arrival_time,
        max(arrival_time)        AS last_arrival_time
    FROM trace
    GROUP BY source_file
),
rejected AS (
    SELECT source_file, count(*) AS num_quarantined
    FROM quarantine
    GROUP BY source_file
)
SELECT
    f.source_file,
    f.source_format,
    f.num_requests,
    coalesce(q.num_quarantined, 0) AS num_quarantined,
    f.first_arrival_time,
    f.last_arrival_time
FROM files AS f
LEFT JOIN rejected AS q USING (source_file)
ORDER BY f.num_requests DESC, f.source_file;

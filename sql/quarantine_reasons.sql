-- quarantine_reasons.sql
-- Which input records did ingest reject, and why?
-- Reads:   quarantine, requests, sim_requests
-- Params:  run_id  VARCHAR  only the source files of the requests this replay run replayed
--                           (NULL: every quarantined record)
-- Grain:   one row per kind of reason and log format, the most frequent first; a kind
--          is the reason with its parenthesised details dropped and its numbers written
--          as N ('invalid UTF-8 at byte N of the line; ...')
-- Columns: reason (the kind), source_format, num_records, num_files, example_reason,
--          example_file, example_line
WITH trace_files AS (
    SELECT DISTINCT source_file
    FROM requests
    WHERE request_id IN (
        SELECT request_id FROM sim_requests WHERE run_id = getvariable('run_id')::VARCHAR)
),
kinds AS (
    SELECT
        regexp_replace(regexp_replace(reason, ' \([^)]*\)', '', 'g'), '(\s)-?[0-9]+', '\1N', 'g')
            AS kind,
        *
    FROM quarantine
    WHERE getvariable('run_id') IS NULL
       OR source_file IN (SELECT source_file FROM trace_files)
)
SELECT
    kind                                              AS reason,
    source_format,
    count(*)                                          AS num_records,
    count(DISTINCT source_file)                       AS num_files,
    arg_min(reason, (source_file, source_line))       AS example_reason,
    arg_min(source_file, (source_file, source_line))  AS example_file,
    arg_min(source_line, (source_file, source_line))  AS example_line
FROM kinds
GROUP BY kind, source_format
ORDER BY num_records DESC, reason, source_format;

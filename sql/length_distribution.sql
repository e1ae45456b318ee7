-- length_distribution.sql
-- How long are prompts and outputs? A histogram on logarithmic bins.
-- Reads:   requests, sim_requests
-- Params:  run_id           VARCHAR  only the requests this replay run replayed
--                                    (NULL: every request)
--          bins_per_octave  INTEGER  bins per doubling of length (NULL: 4)
-- Grain:   one row per kind (prompt, output) and non-empty bin, shortest first;
--          lengths below one token fall in the bin [0, 1)
-- Columns: kind, bin_lo_tokens, bin_hi_tokens, num_requests, share
WITH trace AS (
    SELECT *
    FROM requests
    WHERE getvariable('run_id') IS NULL
       OR request_id IN (
           SELECT request_id FROM sim_requests WHERE run_id = getvariable('run_id')::VARCHAR)
),
params AS (
    SELECT coalesce(getvariable('bins_per_octave')::INTEGER, 4) AS k
),
lengths AS (
    SELECT 'prompt' AS kind, prompt_tokens AS num_tokens FROM trace
    UNION ALL
    SELECT 'output' AS kind, output_tokens AS num_tokens FROM trace
),
binned AS (
    SELECT
        kind,
        CASE WHEN num_tokens < 1 THEN NULL
             ELSE floor(log2(num_tokens) * (SELECT k FROM params))::INTEGER END AS bin,
        count(*) AS num_requests
    FROM lengths
    GROUP BY ALL
)
SELECT
    kind,
    CASE WHEN bin IS NULL THEN 0.0 ELSE pow(2, bin / (SELECT k FROM params)) END AS bin_lo_tokens,
    CASE WHEN bin IS NULL THEN 1.0 ELSE pow(2, (bin + 1) / (SELECT k FROM params)) END
        AS bin_hi_tokens,
    num_requests,
    num_requests / sum(num_requests) OVER (PARTITION BY kind) AS share
FROM binned
ORDER BY kind DESC, bin_lo_tokens;

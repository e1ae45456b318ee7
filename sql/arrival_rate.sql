-- arrival_rate.sql
-- How fast did requests (and their tokens) arrive over the trace's wall-clock time?
-- Reads:   requests, sim_requests
-- Params:  run_id    VARCHAR  only the requests this replay run replayed (NULL: every request)
--          bucket_s  DOUBLE   bucket width in seconds (NULL: the smallest round width
--                             that gives at most 300 buckets)
-- Grain:   one row per time bucket, empty buckets included, oldest first
-- Columns: bucket_start (UTC), bucket_s, num_requests, requests_per_s,
--          prompt_tokens_per_s, output_tokens_per_s
WITH trace AS (
    SELECT *
    FROM requests
    WHERE getvariable('run_id') IS NULL
       OR request_id IN (
           SELECT request_id FROM sim_requests WHERE run_id = getvariable('run_id')::VARCHAR)
),
span AS (
    SELECT epoch(min(arrival_time)) AS t0_s, epoch(max(arrival_time)) AS t1_s FROM trace
),
width AS (
    SELECT coalesce(
        getvariable('bucket_s')::DOUBLE,
        (SELECT min(w) FROM unnest([1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600,
                                    7200, 10800, 21600, 43200, 86400]) AS u(w)
         WHERE w * 300 >= (SELECT t1_s - t0_s FROM span)),
        86400.0) AS bucket_s
),
counts AS (
    SELECT
        floor(epoch(arrival_time) / (SELECT bucket_s FROM width))::BIGINT AS bucket,
        count(*)           AS num_requests,
        sum(prompt_tokens)::BIGINT AS prompt_tokens,
        sum(output_tokens)::BIGINT AS output_tokens
    FROM trace
    GROUP BY bucket
),
grid AS (
    SELECT unnest(range(floor(t0_s / bucket_s)::BIGINT, floor(t1_s / bucket_s)::BIGINT + 1))
        AS bucket
    FROM span, width
    WHERE t0_s IS NOT NULL
)
SELECT
    to_timestamp(g.bucket * w.bucket_s)           AS bucket_start,
    w.bucket_s,
    coalesce(c.num_requests, 0)                   AS num_requests,
    coalesce(c.num_requests, 0) / w.bucket_s      AS requests_per_s,
    coalesce(c.prompt_tokens, 0) / w.bucket_s     AS prompt_tokens_per_s,
    coalesce(c.output_tokens, 0) / w.bucket_s     AS output_tokens_per_s
FROM grid AS g
CROSS JOIN width AS w
LEFT JOIN counts AS c USING (bucket)
ORDER BY g.bucket;

-- throughput.sql
-- How much does each scenario serve: requests/s and tokens/s, static vs continuous batching,
-- and how many requests per second meet the SLOs (goodput)?
-- Reads:   sim_requests, scenarios, requests
-- Params:  run_id      VARCHAR  the replay run (NULL: the latest run)
--          slos        VARCHAR  the SLOs goodput counts against, a JSON list as `capacity`
--                               and `sweep` store them, e.g. '["ttft_p99<=200ms",
--                               "ttft_p99@tenant=chat<=500ms", "tpot_p90@prompt>2000<=50ms"]'
--                               (NULL: p99 TTFT <= slo_ttft_s)
--          slo_ttft_s  DOUBLE   without slos, the one TTFT limit goodput counts against,
--                               seconds (NULL: 0.2)
-- Grain:   one row per scenario
-- Columns: scenario, policy, batching (static | continuous), replicas, num_requests,
--          duration_s (first arrival to last token), requests_per_s, output_tokens_per_s,
--          total_tokens_per_s (prompt + output), num_good, goodput_per_s (completed
--          requests per second that meet every SLO that applies to them)
-- Goodput as vLLM's benchmark client counts it (and `capacity`): a completed request is
-- good when its own value of each SLO's metric is within that SLO's limit, for every SLO
-- whose scope holds it (tenant=, model=, prompt<=N, prompt>N; none: every request); a
-- request without the metric (TPOT of a one-token output) meets that SLO. A scope on tenant
-- or model reads it from `requests`, by the request id (a '#n' suffix dropped).
WITH run AS (
    SELECT coalesce(getvariable('run_id')::VARCHAR, (SELECT max(run_id) FROM scenarios)) AS run_id
),
given AS (
    SELECT unnest(from_json(getvariable('slos')::VARCHAR, '["VARCHAR"]')) AS text
),
-- name<=limit: the limit follows the last '<=' (a scope may hold one: prompt<=2000)
split AS (
    SELECT regexp_extract(trim(text), '^(.+)<=\s*([0-9.]+(?:e[+-]?[0-9]+)?)\s*(us|ms|s)$',
                          ['name', 'num', 'unit']) AS p
    FROM given
),
written AS (
    SELECT
        trim(p['name']) AS slo,
        p['num']::DOUBLE * CASE p['unit'] WHEN 'us' THEN 1e-6 WHEN 'ms' THEN 1e-3 ELSE 1.0 END
            AS limit_s
    FROM split
    WHERE p['name'] <> ''
    UNION ALL
    SELECT 'ttft_p99', coalesce(getvariable('slo_ttft_s')::DOUBLE, 0.2)
    WHERE NOT EXISTS (SELECT 1 FROM given)
),
slo_list AS (
    SELECT
        slo, limit_s,
        regexp_extract(slo, '^([a-z0-9]+)_', 1)                        AS metric,
        CASE WHEN slo LIKE '%@tenant=%' THEN 'tenant'
             WHEN slo LIKE '%@model=%' THEN 'model'
             WHEN slo LIKE '%@prompt%' THEN 'prompt' END                AS dim,
        CASE WHEN slo LIKE '%@prompt<=%' THEN '<=' WHEN slo LIKE '%@prompt>%' THEN '>' END
                                                                       AS op,
        regexp_extract(slo, '@(?:tenant|model)=(.+)$', 1)              AS group_name,
        TRY_CAST(regexp_extract(slo, '@prompt(?:<=|>)([0-9]+)$', 1) AS BIGINT)
                                                                       AS prompt_limit
    FROM written
),
sims AS NOT MATERIALIZED (
    SELECT scenario, request_id, prompt_tokens, output_tokens, arrival_s, finished_s,
           ttft_s, tpot_s, e2e_s, queue_s,
           -- NOTE: not isnan(): DuckDB folds it to false from the Parquet statistics
           coalesce(finished_s::VARCHAR <> 'nan', false) AS done
    FROM sim_requests
    WHERE run_id = (SELECT run_id FROM run)
),
-- the requests of each tenant or model a scope names (empty without such a scope)
in_group AS (
    SELECT r.request_id, l.slo
    FROM requests AS r JOIN slo_list AS l ON l.dim = 'tenant' AND r.tenant = l.group_name
    UNION ALL
    SELECT r.request_id, l.slo
    FROM requests AS r JOIN slo_list AS l ON l.dim = 'model' AND r.model = l.group_name
),
-- (scenario, request) of every completed request some SLO that holds it rejects
missed AS (
    SELECT s.scenario, s.request_id, s.ttft_s, s.tpot_s, s.e2e_s, s.queue_s, l.metric,
           l.limit_s
    FROM sims AS s
    JOIN slo_list AS l
        ON l.dim IS NULL
        OR (l.op = '<=' AND s.prompt_tokens <= l.prompt_limit)
        OR (l.op = '>' AND s.prompt_tokens > l.prompt_limit)
    WHERE s.done
    UNION ALL
    SELECT s.scenario, s.request_id, s.ttft_s, s.tpot_s, s.e2e_s, s.queue_s, l.metric,
           l.limit_s
    FROM sims AS s
    JOIN in_group AS g ON g.request_id = split_part(s.request_id, '#', 1)
    JOIN slo_list AS l ON l.slo = g.slo
    WHERE s.done
),
bad AS (
    SELECT scenario, count(DISTINCT request_id) AS num_bad
    FROM missed
    WHERE CASE metric WHEN 'ttft' THEN ttft_s WHEN 'tpot' THEN tpot_s
                      WHEN 'e2e' THEN e2e_s WHEN 'queue' THEN queue_s END > limit_s
    GROUP BY scenario
),
served AS (
    SELECT
        scenario,
        count(*)                                        AS num_requests,
        max(finished_s) - min(arrival_s)                AS duration_s,
        sum(output_tokens)::BIGINT                      AS output_tokens,
        sum(prompt_tokens + output_tokens)::BIGINT      AS total_tokens,
        count(*) FILTER (WHERE done)                    AS num_done
    FROM sims
    GROUP BY scenario
)
SELECT
    s.scenario,
    s.policy,
    CASE WHEN s.policy = 'static' THEN 'static' ELSE 'continuous' END AS batching,
    s.replicas,
    v.num_requests,
    v.duration_s,
    v.num_requests / nullif(v.duration_s, 0)  AS requests_per_s,
    v.output_tokens / nullif(v.duration_s, 0) AS output_tokens_per_s,
    v.total_tokens / nullif(v.duration_s, 0)  AS total_tokens_per_s,
    v.num_done - coalesce(b.num_bad, 0)      AS num_good,
    (v.num_done - coalesce(b.num_bad, 0)) / nullif(v.duration_s, 0) AS goodput_per_s
FROM scenarios AS s
JOIN served AS v USING (scenario)
LEFT JOIN bad AS b USING (scenario)
WHERE s.run_id = (SELECT run_id FROM run)
ORDER BY batching DESC, s.scenario;

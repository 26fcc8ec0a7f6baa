-- question: How long do nodes and slices stay out of service? Per pool: the stays in each
-- out-of-service state (cordoned, draining, repairing) and whole outages (from leaving service
-- to back in service: probation or healthy), counted in the period, with their p50 and p95 in
-- minutes; outages still open at the end are counted apart, with the longest so far.
-- "Repaired" means back in service, not repair requested.
WITH ordered AS (
    SELECT target_cluster, target_kind, target_name, target_pool, state, ts,
           state IN ('cordoned', 'draining', 'repairing') AS out,
           lag(state IN ('cordoned', 'draining', 'repairing'), 1, false) OVER target AS was_out
    FROM node_state
    WHERE ts < $until AND ($pool IS NULL OR target_pool = $pool)
    WINDOW target AS (PARTITION BY target_cluster, target_kind, target_name ORDER BY ts)
), outages AS (  -- each entry into service-out, with the next return to service after it
    SELECT o.target_cluster, o.target_kind, o.target_name, o.target_pool, o.ts AS left_at,
           (SELECT min(b.ts) FROM ordered AS b
            WHERE b.target_cluster = o.target_cluster AND b.target_kind = o.target_kind
              AND b.target_name = o.target_name AND b.ts > o.ts
              AND b.state IN ('probation', 'healthy')) AS back_at
    FROM ordered AS o
    WHERE o.out AND NOT o.was_out
), stays AS (
    SELECT target_pool AS pool, state AS stage,
           epoch(coalesce(until, $until) - ts) / 60 AS minutes, until IS NULL AS open
    FROM node_state
    WHERE state IN ('cordoned', 'draining', 'repairing')
      AND ts >= $since AND ts < $until AND ($pool IS NULL OR target_pool = $pool)
    UNION ALL
    SELECT target_pool, 'out of service (end to end)',
           epoch(coalesce(back_at, $until) - left_at) / 60, back_at IS NULL OR back_at >= $until
    FROM outages
    WHERE left_at >= $since AND left_at < $until
)
SELECT pool,
       stage,
       count(*) FILTER (WHERE NOT open) AS done,
       round(quantile_cont(minutes, 0.5) FILTER (WHERE NOT open), 1) AS p50_min,
       round(quantile_cont(minutes, 0.95) FILTER (WHERE NOT open), 1) AS p95_min,
       count(*) FILTER (WHERE open) AS still_open,
       round(max(minutes) FILTER (WHERE open), 1) AS open_longest_min
FROM stays
GROUP BY ALL
ORDER BY pool, stage;
